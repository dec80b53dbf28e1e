"""kpack's drop-in for the ``rocm_kpack`` tools: the modules of
``rocm_kpack.tools`` run the ``kpack`` command this package installs."""
