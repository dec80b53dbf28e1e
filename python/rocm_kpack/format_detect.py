"""Is a file ELF or PE/COFF? The reference ``rocm_kpack.format_detect``
API: :func:`detect_binary_format` (``"elf"`` or ``"coff"``),
:func:`is_elf_binary`, :func:`is_pe_binary`, :class:`UnsupportedBinaryFormat`.

Only the magic numbers are looked at (the first 64 bytes, and the PE
signature where the DOS header points)::

    >>> is_elf_binary("/bin/sh")   # doctest: +SKIP
    True
"""

from __future__ import annotations

import os
from typing import Union

from kpack._errors import InputError

ELF_MAGIC = b"\x7fELF"
DOS_MAGIC = b"MZ"
PE_SIGNATURE = b"PE\x00\x00"

# Where a DOS header keeps the offset of the PE header (e_lfanew), and the
# range that offset may take.
_E_LFANEW = 0x3C
_MIN_PE_OFFSET = 0x40
_MAX_PE_OFFSET = 0x100000

PathLike = Union[str, "os.PathLike[str]"]


class UnsupportedBinaryFormat(InputError):
    """A file that is neither ELF nor PE/COFF (a ``ValueError``, and a
    ``kpack.InputError``)."""


def detect_binary_format(path: PathLike) -> str:
    """``"elf"`` or ``"coff"``; :class:`UnsupportedBinaryFormat` for
    anything else, ``FileNotFoundError`` for a missing file."""
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 4:
            raise UnsupportedBinaryFormat(f"File too small to be a valid binary: {path}")
        if head.startswith(ELF_MAGIC):
            return "elf"
        if head.startswith(DOS_MAGIC) and len(head) >= _E_LFANEW + 4:
            pe_offset = int.from_bytes(head[_E_LFANEW : _E_LFANEW + 4], "little")
            if not _MIN_PE_OFFSET <= pe_offset <= _MAX_PE_OFFSET:
                raise UnsupportedBinaryFormat(f"Invalid PE header offset {pe_offset:#x}: {path}")
            f.seek(pe_offset)
            if f.read(4) == PE_SIGNATURE:
                return "coff"
    raise UnsupportedBinaryFormat(f"Binary is neither ELF nor PE/COFF format: {path}")


def is_elf_binary(path: PathLike) -> bool:
    """Whether ``path`` is an ELF file (``False`` for a missing one)."""
    try:
        return detect_binary_format(path) == "elf"
    except (UnsupportedBinaryFormat, FileNotFoundError):
        return False


def is_pe_binary(path: PathLike) -> bool:
    """Whether ``path`` is a PE/COFF file (``False`` for a missing one)."""
    try:
        return detect_binary_format(path) == "coff"
    except (UnsupportedBinaryFormat, FileNotFoundError):
        return False


__all__ = [
    "ELF_MAGIC",
    "DOS_MAGIC",
    "PE_SIGNATURE",
    "UnsupportedBinaryFormat",
    "detect_binary_format",
    "is_elf_binary",
    "is_pe_binary",
]
