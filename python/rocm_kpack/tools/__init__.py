"""Entry points with the names and flags of rocm_kpack's tools; each runs
``kpack``."""
