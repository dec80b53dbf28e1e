"""Shared fixtures of kpack's Python tests. They run against the installed
wheel (tests/tests/python_api.rs installs it into fresh environments and
runs pytest here); KPACK_FIXTURES_DIR names the HIP fixtures
(`cargo xtask fixtures`)."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def fixtures() -> Path:
    d = os.environ.get("KPACK_FIXTURES_DIR")
    if not d:
        here = Path(__file__).resolve().parents[2] / "target" / "fixtures"
        d = str(here)
    p = Path(d)
    if not (p / "libvadd.so").is_file():
        pytest.fail(f"no HIP fixtures in {p}: run `cargo xtask fixtures` or set KPACK_FIXTURES_DIR")
    return p


def kpack_cmd(*args, check=True):
    """Run the installed ``kpack`` console script."""
    exe = shutil.which("kpack", path=os.path.dirname(sys.executable)) or "kpack"
    return subprocess.run([exe, *map(str, args)], capture_output=True, text=True, check=check)


@pytest.fixture
def kpack_cli():
    return kpack_cmd
