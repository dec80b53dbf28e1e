"""``python -m rocm_kpack.tools.split_python_wheels``: ``kpack split-wheels``
(the same flags; it prints the same summary)."""

from rocm_kpack._kpack import main

if __name__ == "__main__":
    main("split-wheels")
