"""Running the ``kpack`` command installed with this package.

Every tool module is a thin entry point: it runs ``kpack <subcommand>`` with
its own arguments and returns kpack's exit code. kpack reports failures as
``kpack: error: <message>`` on stderr; the reference tools print
``Error: <message>``, so those lines are rewritten on the way through.
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig

_ERROR_PREFIX = "kpack: error: "


def kpack_command():
    """The ``kpack`` executable: the one installed beside this Python's
    scripts, else the first on PATH."""
    scripts = sysconfig.get_path("scripts")
    candidate = os.path.join(scripts, "kpack") if scripts else None
    if candidate and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("kpack")
    if found:
        return found
    sys.stderr.write("Error: the kpack command is not installed (pip install rocm-kpack)\n")
    raise SystemExit(1)


def _translate(line):
    if line.startswith(_ERROR_PREFIX):
        return "Error: " + line[len(_ERROR_PREFIX):]
    return line


def run(args):
    """Run ``kpack args...`` with stdout passed through; stderr with error
    lines in the reference tools' form. Returns the exit code."""
    proc = subprocess.Popen([kpack_command(), *args], stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        sys.stderr.write(_translate(line))
    return proc.wait()


def run_json(args):
    """Run ``kpack args... --json``; returns (exit code, parsed summary or
    None). stderr as in :func:`run`."""
    proc = subprocess.run(
        [kpack_command(), *args, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    for line in proc.stderr.splitlines(keepends=True):
        sys.stderr.write(_translate(line))
    try:
        return proc.returncode, json.loads(proc.stdout)
    except ValueError:
        # Not a summary (--help, a failure): shown as it is.
        sys.stdout.write(proc.stdout)
        return proc.returncode, None


def main(subcommand):
    """Entry point of a tool that takes exactly kpack's flags."""
    raise SystemExit(run([subcommand, *sys.argv[1:]]))
