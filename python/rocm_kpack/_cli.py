"""The ``kpack`` command (``kpack._cli``), under the name the issue's
packaging notes give it."""

from kpack._cli import main, run

__all__ = ["main", "run"]
