"""``python -m rocm_kpack.tools.split_artifacts``: ``kpack split`` (the same
flags), with the reference tool's progress and summary lines."""

import sys

from rocm_kpack._kpack import run_json


def _value(argv, flag):
    for i, a in enumerate(argv):
        if a == flag and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(flag + "="):
            return a[len(flag) + 1:]
    return None


def _print_single(argv, summary):
    art = summary["artifacts"][0]
    print(f"Splitting artifact: {_value(argv, '--artifact-dir')}")
    print(f"Artifact prefix: {art['artifact_prefix']}")
    print(f"Output directory: {_value(argv, '--output-dir')}")
    print("Splitting complete!")


def _print_batch(argv, summary):
    line = "=" * 70
    print(line)
    print("BATCH ARTIFACT SPLITTING")
    print(line)
    print(f"Shard directory: {_value(argv, '--batch-artifact-parent-dir')}")
    print(f"Output directory: {_value(argv, '--output-dir')}")
    print()
    arts = summary["artifacts"]
    for n, art in enumerate(arts, 1):
        name = art["input"].rstrip("/").rsplit("/", 1)[-1]
        print(f"[{n}] Processing: {name} (artifact_prefix: {art['artifact_prefix']})")
        if art["status"] == "ok":
            print("    \u2713 Success")
        else:
            print(f"    \u2717 Failed: {art['error']}", file=sys.stderr)
    failed = summary["failed"]
    print()
    print(line)
    print("BATCH SPLITTING SUMMARY")
    print(line)
    print(f"Processed: {len(arts)}")
    print(f"Successful: {len(arts) - failed}")
    print(f"Failed: {failed}")
    print(f"Skipped: {len(summary['skipped_directories'])}")
    print()
    print("\u2713 BATCH SPLITTING COMPLETED SUCCESSFULLY" if failed == 0 else "\u2717 BATCH SPLITTING COMPLETED WITH ERRORS")


def main(argv):
    code, summary = run_json(["split", *argv])
    if summary is not None:
        if "--batch-artifact-parent-dir" in argv or any(a.startswith("--batch-artifact-parent-dir=") for a in argv):
            _print_batch(argv, summary)
        else:
            _print_single(argv, summary)
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
