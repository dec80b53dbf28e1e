"""Offloading binaries with the reference ``rocm_kpack`` API, ELF and PE
alike: :func:`kpack_offload_binary`, :func:`read_kpack_ref_marker`,
:func:`is_fat_binary`. The rewrite is kpack-host's (the ``kpack offload``
command's), checked by its verifier before the output is written.

    >>> r = kpack_offload_binary(Path("libfoo.so"), Path("out/libfoo.so"),   # doctest: +SKIP
    ...                          ["../.kpack/foo_@GFXARCH@.kpack"], "libfoo.so")
    >>> r["format"], r["removed"] > 0                                         # doctest: +SKIP
    ('elf', True)
    >>> read_kpack_ref_marker(Path("out/libfoo.so"))                          # doctest: +SKIP
    {'kpack_search_paths': ['../.kpack/foo_@GFXARCH@.kpack'], 'kernel_name': 'libfoo.so'}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from kpack import _native
from kpack._errors import BinaryError, NotFatBinaryError

from .format_detect import UnsupportedBinaryFormat, detect_binary_format

PathLike = Union[str, "os.PathLike[str]"]


def kpack_offload_binary(
    input_path: PathLike,
    output_path: PathLike,
    kpack_search_paths: Optional[List[str]] = None,
    kernel_name: Optional[str] = None,
    verbose: bool = False,
    *,
    durable: Optional[bool] = None,
) -> Dict[str, Any]:
    """Rewrite the fat binary ``input_path`` (ELF or PE) into the host-only
    ``output_path`` (may be the same path): its wrappers point (``HIPK``) at
    a metadata section naming ``kpack_search_paths`` and ``kernel_name``,
    its bundle section's pages are dropped. No archive is written (pack the
    code objects with :class:`rocm_kpack.kpack.PackedKernelArchive`).

    Returns ``format`` (``"elf"`` or ``"coff"``), ``removed``,
    ``original_size``, ``new_size`` and the metadata's address
    (``kpack_ref_vaddr`` for ELF, ``kpack_ref_rva`` for PE).

    The output is atomic; with ``durable`` (default: when
    ``KPACK_DURABLE=1``) it is also fsynced before this returns.

    Raises :class:`NotFatBinaryError` for a binary without device code,
    :class:`UnsupportedBinaryFormat` for neither ELF nor PE, ``ValueError``
    (``kpack.InputError``) for a binary kpack cannot rewrite.
    """
    fmt = detect_binary_format(input_path)
    if kpack_search_paths is None:
        raise ValueError("kpack_search_paths is required: kpack writes the marker section itself")
    if kernel_name is None:
        raise ValueError("kernel_name required when kpack_search_paths provided")
    if not _native.has_fatbin_section(os.fspath(input_path)):
        section = _native.fatbin_section_name(fmt == "coff")
        raise NotFatBinaryError(
            f"Binary {input_path} has no {section} section. "
            "Cannot add kpack marker to binary without device code."
        )
    fmt, original_size, new_size, address = _native.rewrite_binary(
        os.fspath(input_path), os.fspath(output_path), [str(p) for p in kpack_search_paths], kernel_name, durable
    )
    result: Dict[str, Any] = {
        "removed": original_size - new_size,
        "original_size": original_size,
        "new_size": new_size,
        ("kpack_ref_vaddr" if fmt == "elf" else "kpack_ref_rva"): address,
        "format": fmt,
    }
    if verbose:
        print(f"{input_path} -> {output_path} ({fmt})")
        print(f"  Original size: {original_size:,} bytes")
        print(f"  Final size:    {new_size:,} bytes")
        print(f"  Removed:       {original_size - new_size:,} bytes")
    return result


def read_kpack_ref_marker(binary_path: PathLike) -> Optional[Dict[str, Any]]:
    """The metadata section of an offloaded binary (ELF ``.rocm_kpack_ref``,
    PE ``.kpackrf``): ``{"kpack_search_paths": [...], "kernel_name": ...}``,
    or ``None`` if the binary has none. ``RuntimeError`` if it cannot be
    parsed."""
    detect_binary_format(binary_path)
    try:
        return _native.read_marker(os.fspath(binary_path))
    except BinaryError as e:
        raise RuntimeError(f"Failed to parse kpack marker data from {binary_path}: {e}") from e


def is_fat_binary(binary_path: PathLike) -> bool:
    """Whether ``binary_path`` is an ELF or PE binary with a bundle section
    (``.hip_fatbin``, ``.hip_fat``); ``False`` for other files."""
    try:
        detect_binary_format(binary_path)
    except UnsupportedBinaryFormat:
        return False
    return _native.has_fatbin_section(os.fspath(binary_path))


__all__ = ["NotFatBinaryError", "kpack_offload_binary", "read_kpack_ref_marker", "is_fat_binary"]
