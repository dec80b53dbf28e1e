"""``python -m rocm_kpack.tools.verify_artifacts``: ``kpack verify`` (the
same flags), with the reference tool's verdict line and exit codes (0 all
checks passed, 1 a check failed, 2 verification could not run)."""

import os
import sys

from rocm_kpack._kpack import run


def main(argv):
    for i, a in enumerate(argv):
        if a == "--artifacts-dir" and i + 1 < len(argv) and not os.path.isdir(argv[i + 1]):
            print(f"Error: Artifacts directory does not exist: {argv[i + 1]}", file=sys.stderr)
            return 2
    code = run(["verify", *argv])
    if code == 0:
        print("\u2713 ALL CHECKS PASSED")
    elif code == 1:
        print("\u2717 VERIFICATION FAILED")
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
