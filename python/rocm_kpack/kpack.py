"""``.kpack`` archives with the API of the reference ``rocm_kpack.kpack``:
:class:`PackedKernelArchive`, written by kpack's archive writer and read by
kpack's reader.

Packing kernels on a thread pool::

    >>> from concurrent.futures import ThreadPoolExecutor
    >>> from rocm_kpack.compression import ZstdCompressor
    >>> a = PackedKernelArchive("blas", "gfx110X", ["gfx1100"], compressor=ZstdCompressor(3))
    >>> kernels = [("lib/libfoo.so", "gfx1100", b"code" * 100), ("lib/libbar.so", "gfx1100", b"more" * 100)]
    >>> with ThreadPoolExecutor(2) as pool:
    ...     for p in pool.map(lambda k: a.prepare_kernel(*k), kernels):
    ...         a.add_kernel(p)
    >>> a.finalize_archive()
    >>> a.toc["lib/libbar.so"]["gfx1100"]["ordinal"]
    1
    >>> a.write(Path(tmp) / PackedKernelArchive.compute_pack_filename("blas", "gfx110X"))  # doctest: +SKIP

The archive is what the ``kpack`` command writes for the same kernels and
options, byte for byte: header, blob and MessagePack TOC come from
kpack-host's ``ArchiveWriter``. Like every kpack writer, it stores a code
object once when the same bytes are added again for the same
architecture: the later entry gets the earlier one's ordinal (every reader
follows ordinals, so nothing changes for them).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from kpack import _native

from .compression import (
    CompressionInput,
    Compressor,
    NoOpCompressionInput,
    NoOpCompressor,
    ZstdCompressionInput,
    ZstdCompressor,
    create_compressor_from_toc,
)

PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class PreparedKernel:
    """A kernel after :meth:`PackedKernelArchive.prepare_kernel` (compressed
    already with a compressing compressor), for
    :meth:`PackedKernelArchive.add_kernel`."""

    relative_path: str
    gfx_arch: str
    compression_input: CompressionInput
    kernel_id: str
    original_size: int
    metadata: Optional[Dict[str, Any]] = None


class PackedKernelArchive:
    """A ``.kpack`` archive of the kernels of one architecture family.

    Build one: :meth:`prepare_kernel` (any thread) and :meth:`add_kernel`
    (one at a time) per kernel, then :meth:`finalize_archive` and
    :meth:`write`. Read one: :meth:`read` and :meth:`get_kernel`. ``toc``
    maps each binary's relative path to its architectures' entries
    (``type``, ``ordinal``, ``original_size``, ``metadata``).
    """

    MAGIC = b"KPAK"
    FORMAT_VERSION = 1
    HEADER_SIZE = 16
    BLOB_ALIGNMENT = 64

    def __init__(
        self,
        group_name: str,
        gfx_arch_family: str,
        gfx_arches: List[str],
        output_path: Optional[Path] = None,
        compressor: Optional[Compressor] = None,
    ) -> None:
        self.group_name = group_name
        self.gfx_arch_family = gfx_arch_family
        self.gfx_arches = gfx_arches
        self.toc: Dict[str, Dict[str, Dict[str, Any]]] = {}
        self._file_path: Optional[Path] = None
        self._compressor: Compressor = compressor if compressor is not None else NoOpCompressor()
        self._builder: Optional[_native.ArchiveBuilder] = None
        self._reader: Optional[_native.NativeArchive] = None
        self._archive_finalized = False
        if output_path is not None:
            raise ValueError(
                "Streaming write mode not yet supported. "
                "Use in-memory mode (output_path=None) and call write(path) when done."
            )

    def _scheme(self) -> tuple:
        c = self._compressor
        if isinstance(c, ZstdCompressor):
            return ZstdCompressor.SCHEME_NAME, int(c.compression_level)
        if isinstance(c, NoOpCompressor):
            return NoOpCompressor.SCHEME_NAME, 3
        raise TypeError(
            f"unsupported compressor {type(c).__name__}: kpack writes archives with "
            "NoOpCompressor or ZstdCompressor"
        )

    def _ensure_builder(self) -> "_native.ArchiveBuilder":
        if self._builder is None:
            scheme, level = self._scheme()
            self._builder = _native.ArchiveBuilder(
                self.group_name, self.gfx_arch_family, list(self.gfx_arches), scheme, level
            )
        return self._builder

    def prepare_kernel(
        self,
        relative_path: str,
        gfx_arch: str,
        hsaco_data: bytes,
        metadata: Optional[Dict[str, Any]] = None,
    ) -> PreparedKernel:
        """Compress (or keep) one kernel: safe to call from many threads at
        once (the compression runs without the GIL). ``\\`` in
        ``relative_path`` becomes ``/``."""
        relative_path = relative_path.replace("\\", "/")
        kernel_id = f"{relative_path}@{gfx_arch}"
        data = hsaco_data if isinstance(hsaco_data, bytes) else bytes(hsaco_data)
        return PreparedKernel(
            relative_path=relative_path,
            gfx_arch=gfx_arch,
            compression_input=self._compressor.prepare_kernel(data, kernel_id),
            kernel_id=kernel_id,
            original_size=len(data),
            metadata=metadata,
        )

    def add_kernel(self, prepared: PreparedKernel) -> None:
        """Add a prepared kernel; its ordinal is assigned now. Not
        thread-safe (hold a lock around it). ``ValueError`` if the archive
        has a kernel for this path and architecture already."""
        path, arch = prepared.relative_path, prepared.gfx_arch
        if arch in self.toc.get(path, {}):
            raise ValueError(f"Kernel already exists for {path} @ {arch}")
        if self._archive_finalized:
            raise RuntimeError("Archive already finalized: no kernel can be added")
        builder = self._ensure_builder()
        metadata = prepared.metadata or None
        inp = prepared.compression_input
        if isinstance(inp, ZstdCompressionInput):
            ordinal = builder.add_frame(path, arch, inp.compressed_frame, inp.original_size, metadata)
        elif isinstance(inp, NoOpCompressionInput):
            ordinal = builder.add_bytes(path, arch, inp.data, metadata)
        else:
            raise TypeError(f"unsupported compression input {type(inp).__name__}")
        entry: Dict[str, Any] = {"type": "hsaco", "ordinal": ordinal, "original_size": prepared.original_size}
        if metadata:
            entry["metadata"] = metadata
        self.toc.setdefault(path, {})[arch] = entry

    def finalize_archive(self) -> None:
        """Make the archive (what is left to compress is compressed now, in
        parallel). ``RuntimeError`` if finalized already."""
        if self._archive_finalized:
            raise RuntimeError("Archive already finalized")
        self._ensure_builder().finalize()
        self._archive_finalized = True

    def write(self, output_path: PathLike, *, durable: Optional[bool] = None) -> None:
        """Write the finalized archive to ``output_path`` (parent directories
        created; the file appears complete or not at all). Not fsynced, as
        the reference does not, unless ``durable`` (default: when
        ``KPACK_DURABLE=1``): then the file and its directory are fsynced
        before it returns. ``RuntimeError`` before :meth:`finalize_archive`."""
        if not self._archive_finalized or self._builder is None:
            raise RuntimeError("Archive not finalized. Call finalize_archive() first.")
        self._builder.write(os.fspath(output_path), durable)

    @staticmethod
    def read(input_path: PathLike) -> "PackedKernelArchive":
        """Open the archive ``input_path`` (its TOC is read and checked now,
        kernels when asked for). ``ValueError`` (a ``kpack.ArchiveError``)
        for a file that is not a valid archive, ``FileNotFoundError`` for a
        missing one."""
        native = _native.NativeArchive.open(os.fspath(input_path))
        archive = PackedKernelArchive(native.group_name, native.gfx_arch_family, native.gfx_arches)
        toc: Dict[str, Dict[str, Dict[str, Any]]] = {}
        for key, target, kind, ordinal, size, metadata in native.entries():
            entry: Dict[str, Any] = {}
            if kind is not None:
                entry["type"] = kind
            entry["ordinal"] = ordinal
            entry["original_size"] = size
            if metadata is not None:
                entry["metadata"] = metadata
            toc.setdefault(key, {})[target] = entry
        archive.toc = toc
        archive._file_path = input_path if isinstance(input_path, Path) else Path(input_path)
        archive._reader = native
        archive._archive_finalized = True
        if native.scheme == ZstdCompressor.SCHEME_NAME:
            archive._compressor = ZstdCompressor()
        return archive

    def get_kernel(self, relative_path: str, gfx_arch: str) -> Optional[bytes]:
        """The kernel's bytes (decompressed), or ``None`` if the archive has
        none for this path and architecture."""
        relative_path = relative_path.replace("\\", "/")
        if gfx_arch not in self.toc.get(relative_path, {}):
            return None
        if not self._archive_finalized:
            raise RuntimeError(
                "Cannot get_kernel() before archive is finalized. Call finalize_archive() first."
            )
        if self._reader is None:
            assert self._builder is not None
            self._reader = self._builder.reader()
        return self._reader.read(relative_path, gfx_arch)

    @staticmethod
    def compute_pack_filename(group_name: str, gfx_arch_family: str) -> str:
        """The file name of a group's archive for a family:
        ``<group>-<family>.kpack``."""
        return f"{group_name}-{gfx_arch_family}.kpack"

    def __repr__(self) -> str:
        kernels = sum(len(arches) for arches in self.toc.values())
        return (
            f"PackedKernelArchive(group={self.group_name}, family={self.gfx_arch_family}, "
            f"binaries={len(self.toc)}, kernels={kernels})"
        )


__all__ = ["PackedKernelArchive", "PreparedKernel", "create_compressor_from_toc"]
