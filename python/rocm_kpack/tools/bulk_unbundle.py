"""``python -m rocm_kpack.tools.bulk_unbundle FILE... [-o DIR] [--gfx-arch A]``:
``kpack extract`` of each file (into DIR, or ``<file without suffix>.unbundled``),
printing ``Unbundled <dir>: <files>`` per input as the reference tool does.
``--gfx-arch`` keeps the code objects whose base architecture is A."""

import argparse
import os

from rocm_kpack._kpack import run_json


def _base(target):
    return target.split(":", 1)[0]


def _dest(path):
    root, _ = os.path.splitext(path)
    return root + ".unbundled"


def main(argv):
    p = argparse.ArgumentParser(description="Extract device code objects from fat binaries")
    p.add_argument("files", nargs="+")
    p.add_argument("-o", "--output-dir", help="write the contents of one input to this directory")
    p.add_argument("--gfx-arch", help="write only code objects for this base architecture (for example, gfx1250)")
    args = p.parse_args(argv)
    if args.output_dir is not None and len(args.files) != 1:
        p.error("--output-dir requires exactly one input file")
    for f in args.files:
        dest = args.output_dir or _dest(f)
        code, written = run_json(["extract", f, "--output", dest])
        if code != 0:
            return code
        names = []
        for w in written:
            target = w.get("target", "")
            if args.gfx_arch and _base(target) != args.gfx_arch:
                os.remove(os.path.join(dest, w["file"]))
                continue
            names.append(w["file"])
        print(f"Unbundled {dest}: {', '.join(names)}")
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
