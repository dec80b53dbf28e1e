"""kpack's drop-in for ROCm's ``rocm_kpack`` package: the reference
library API, backed by kpack's Rust crates, and the
``python -m rocm_kpack.tools.*`` entry points.

- :mod:`rocm_kpack.kpack`: ``PackedKernelArchive``
- :mod:`rocm_kpack.compression`: ``NoOpCompressor``, ``ZstdCompressor``, ...
- :mod:`rocm_kpack.format_detect`: ``detect_binary_format``, ...
- here: ``kpack_offload_binary``, ``read_kpack_ref_marker``,
  ``is_fat_binary`` and the exceptions.

kpack's own API is the ``kpack`` package of the same wheel. See
docs/python.md.
"""

from .format_detect import (
    UnsupportedBinaryFormat,
    detect_binary_format,
    is_elf_binary,
    is_pe_binary,
)
from .kpack_transform import (
    NotFatBinaryError,
    is_fat_binary,
    kpack_offload_binary,
    read_kpack_ref_marker,
)

__all__ = [
    "detect_binary_format",
    "is_elf_binary",
    "is_pe_binary",
    "UnsupportedBinaryFormat",
    "kpack_offload_binary",
    "read_kpack_ref_marker",
    "is_fat_binary",
    "NotFatBinaryError",
]
