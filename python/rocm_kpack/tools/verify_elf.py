"""``python -m rocm_kpack.tools.verify_elf BINARY [--verbose]``: ``kpack
verify-elf --offloaded``, with the reference tool's lines (``Verifying: ...``,
``Overall: PASSED``/``FAILED``) and exit code."""

import argparse
import os
import sys

from rocm_kpack._kpack import run


def main(argv):
    p = argparse.ArgumentParser(description="Verify an offloaded ELF binary (kpack verify-elf)")
    p.add_argument("binary")
    p.add_argument("--verbose", "-v", action="store_true")
    args = p.parse_args(argv)
    if not os.path.exists(args.binary):
        print(f"Error: {args.binary} does not exist", file=sys.stderr)
        return 1
    print(f"Verifying: {args.binary}")
    print("-" * 60)
    sys.stdout.flush()
    code = run(["verify-elf", "--offloaded", args.binary])
    print("-" * 60)
    print(f"Overall: {'PASSED' if code == 0 else 'FAILED'}")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
