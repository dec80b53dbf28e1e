"""``python -m rocm_kpack.tools.pack_tree``: ``kpack pack-tree`` (the same
flags)."""

from rocm_kpack._kpack import main

if __name__ == "__main__":
    main("pack-tree")
