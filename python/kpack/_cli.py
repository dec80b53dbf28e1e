"""The ``kpack`` command of the pip package: kpack-cli run in-process by
the extension (one native artifact for the library and the command)."""

from __future__ import annotations

import os
import signal
import sys
from typing import Optional, Sequence


def run(argv: Sequence[str], error_prefix: str = "kpack: error: ") -> int:
    """Run ``kpack`` with ``argv`` (without the program name) in this
    process; a failure is reported on stderr as ``<error_prefix><message>``.
    Returns the exit status."""
    from . import _native

    sys.stdout.flush()
    sys.stderr.flush()
    return _native.cli_main(["kpack", *[os.fspath(a) for a in argv]], error_prefix)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point of the ``kpack`` console script and ``python -m kpack``."""
    # As the native command: Ctrl-C ends it at once.
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    except ValueError:  # not the main thread
        pass
    raise SystemExit(run(sys.argv[1:] if argv is None else argv))
