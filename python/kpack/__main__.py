"""``python -m kpack ...``: the ``kpack`` command."""

from kpack._cli import main

main()
