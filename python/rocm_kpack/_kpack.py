"""Running ``kpack`` for the tool modules, in-process.

Every tool module is a thin entry point: it runs ``kpack <subcommand>``
with its own arguments and returns kpack's exit code. kpack reports
failures as ``kpack: error: <message>``; the reference tools print
``Error: <message>``, which is what these print.
"""

import json
import sys

from kpack import _cli, _native
from kpack._errors import UsageError

_ERROR_PREFIX = "Error: "


def run(args):
    """Run ``kpack args...``; failures on stderr as ``Error: <message>``.
    Returns the exit code."""
    return _cli.run(list(args), _ERROR_PREFIX)


def run_json(args):
    """Run ``kpack args... --json``; returns (exit code, parsed summary or
    None). Failures as in :func:`run`."""
    sys.stdout.flush()
    sys.stderr.flush()
    text, error = _native.run_captured([*args, "--json"])
    summary = json.loads(text) if text is not None else None
    if error is None:
        return 0, summary
    if isinstance(error, UsageError) and str(error).startswith("error:"):
        # clap's own usage message and status.
        sys.stderr.write(str(error) + "\n")
        return 2, summary
    sys.stderr.write(_ERROR_PREFIX + str(error) + "\n")
    return 1, summary


def main(subcommand):
    """Entry point of a tool that takes exactly kpack's flags."""
    raise SystemExit(run([subcommand, *sys.argv[1:]]))
