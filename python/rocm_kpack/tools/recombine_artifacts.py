"""``python -m rocm_kpack.tools.recombine_artifacts``: ``kpack recombine``
(the same flags)."""

from rocm_kpack._kpack import main

if __name__ == "__main__":
    main("recombine")
