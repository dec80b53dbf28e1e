"""``kpack.Archive``: a ``.kpack`` archive as a read-only mapping."""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from typing import Any, Iterator, NamedTuple, Optional, Tuple, Union

from . import _native

Key = Tuple[str, str]
PathLike = Union[str, "os.PathLike[str]"]


class Entry(NamedTuple):
    """One kernel of an archive's table of contents."""

    binary: str
    """The binary's key (``lib/libfoo.so#0`` as kpack writes them)."""
    arch: str
    """The target ID (``gfx942``, ``gfx90a:xnack-``)."""
    ordinal: int
    """Index of the kernel's bytes in the blob (shared by identical kernels)."""
    original_size: int
    """Size of the kernel, uncompressed."""
    metadata: Optional[dict]
    """The entry's ``metadata`` map, if any."""


class KernelInfo(NamedTuple):
    """What :meth:`Archive.info` knows of a kernel before reading it."""

    original_size: int
    """Size of the kernel, uncompressed (``len(archive[key])``)."""
    stored_size: int
    """Bytes it takes in the archive (its zstd frame and the frame's 4-byte
    length, or its blob)."""
    scheme: str
    """How the archive stores it (``none``, ``zstd-per-kernel``)."""


class Archive(Mapping):
    """A ``.kpack`` archive, opened read-only and memory-mapped.

    A mapping of ``(binary, arch)`` to the code object's bytes: its table of
    contents is read and checked when opened, each kernel only when asked
    for (decompressed with the GIL released). Use it as a context manager to
    unmap it at once::

        >>> with kpack.Archive("blas_gfx942.kpack") as a:        # doctest: +SKIP
        ...     print(a.group_name, a.scheme, len(a))
        ...     for binary, arch in a:
        ...         code = a[binary, arch]                      # bytes
        ...     view = a.view(("lib/librocblas.so#0", "gfx942"))  # memoryview
        blas zstd-per-kernel 3

    ``view`` returns a read-only ``memoryview``: of the file's own pages for
    an uncompressed archive (scheme ``none``: no copy), of the decompressed
    bytes otherwise. Errors are :class:`kpack.Error` subclasses
    (:class:`kpack.NotFoundError` for a missing file,
    :class:`kpack.ArchiveError` for a malformed one).
    """

    def __init__(self, path: PathLike) -> None:
        self._path = os.fspath(path)
        self._native: Optional[_native.NativeArchive] = _native.NativeArchive.open(self._path)
        self._mmap: Optional[mmap.mmap] = None
        self._keys: Optional[list] = None

    @classmethod
    def _from_native(cls, native: "_native.NativeArchive", path: str = "<memory>") -> "Archive":
        self = cls.__new__(cls)
        self._path = path
        self._native = native
        self._mmap = None
        self._keys = None
        return self

    # -- the archive --------------------------------------------------------

    def _open(self) -> "_native.NativeArchive":
        if self._native is None:
            raise ValueError(f"archive {self._path} is closed")
        return self._native

    @property
    def path(self) -> str:
        """The file's path."""
        return self._path

    @property
    def group_name(self) -> str:
        return self._open().group_name

    @property
    def gfx_arch_family(self) -> str:
        return self._open().gfx_arch_family

    @property
    def gfx_arches(self) -> list:
        """The TOC's ``gfx_arches``, in file order."""
        return self._open().gfx_arches

    @property
    def scheme(self) -> str:
        """``"none"`` or ``"zstd-per-kernel"``."""
        return self._open().scheme

    @property
    def file_size(self) -> int:
        return self._open().file_size

    def entries(self) -> list:
        """Every :class:`Entry`, in TOC order."""
        return [Entry(k, t, o, s, m) for (k, t, _type, o, s, m) in self._open().entries()]

    @property
    def binaries(self) -> list:
        """The binary keys, in TOC order, each once."""
        return list(dict.fromkeys(k for k, _ in self))

    # -- the mapping --------------------------------------------------------

    def _key_list(self) -> list:
        if self._keys is None:
            self._keys = [(k, t) for (k, t, *_rest) in self._open().entries()]
        return self._keys

    def __len__(self) -> int:
        return len(self._open())

    def __iter__(self) -> Iterator[Key]:
        return iter(self._key_list())

    def __contains__(self, key: object) -> bool:
        if not (isinstance(key, tuple) and len(key) == 2):
            return False
        binary, arch = key
        if not isinstance(binary, str) or not isinstance(arch, str):
            return False
        return self._open().contains(binary, arch)

    def __getitem__(self, key: Key) -> bytes:
        binary, arch = _split_key(key)
        data = self._open().read(binary, arch)
        if data is None:
            raise KeyError(key)
        return data

    def get(self, key: Key, default: Any = None) -> Any:
        binary, arch = _split_key(key)
        data = self._open().read(binary, arch)
        return default if data is None else data

    def read(self, binary: str, arch: str) -> bytes:
        """The code object of ``binary`` for ``arch`` (``KeyError`` if none)."""
        return self[binary, arch]

    def info(self, key: Key) -> KernelInfo:
        """The sizes and scheme of the code object ``(binary, arch)``, from
        the table of contents, without decompressing it (``KeyError`` if
        none): what the C API's ``kpack_get_kernel_info`` reports."""
        binary, arch = _split_key(key)
        found = self._open().info(binary, arch)
        if found is None:
            raise KeyError(key)
        return KernelInfo(*found)

    def view(self, key: Key) -> memoryview:
        """The code object as a read-only ``memoryview``: zero-copy over the
        mapped file for an uncompressed archive."""
        binary, arch = _split_key(key)
        native = self._open()
        if not native.contains(binary, arch):
            raise KeyError(key)
        rng = native.stored_range(binary, arch)
        if rng is None:
            return memoryview(native.read(binary, arch))
        offset, size = rng
        if self._mmap is None:
            if native.file_size == 0 or self._path == "<memory>":
                return memoryview(native.read(binary, arch))
            with open(self._path, "rb") as f:
                self._mmap = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        return memoryview(self._mmap)[offset : offset + size]

    # -- lifetime -----------------------------------------------------------

    def close(self) -> None:
        """Unmap the archive. Views handed out stay valid (they keep their
        own mapping alive)."""
        self._native = None
        self._keys = None
        if self._mmap is not None:
            try:
                self._mmap.close()
            except BufferError:
                pass  # views still use it: it goes with the last of them
            self._mmap = None

    @property
    def closed(self) -> bool:
        return self._native is None

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._native is None:
            return f"<kpack.Archive {self._path!r} (closed)>"
        return (
            f"<kpack.Archive {self._path!r} group={self.group_name!r} "
            f"family={self.gfx_arch_family!r} scheme={self.scheme!r} kernels={len(self)}>"
        )

    # Mapping equality would read every kernel: identity instead.
    __eq__ = object.__eq__
    __hash__ = object.__hash__


def _split_key(key: object) -> Key:
    if not (isinstance(key, tuple) and len(key) == 2):
        raise TypeError("an archive is indexed by (binary, arch)")
    binary, arch = key
    if not isinstance(binary, str) or not isinstance(arch, str):
        raise TypeError("an archive is indexed by (binary, arch), both str")
    return binary, arch
