"""Compressors of ``.kpack`` archives, with the API of the reference
``rocm_kpack.compression``: a map phase (:meth:`Compressor.prepare_kernel`,
safe to call from a thread pool; kpack's compresses with the GIL released)
and a reduce phase (:meth:`Compressor.finalize`), plus reading kernels back
by ordinal (:meth:`Compressor.from_toc`, :meth:`Compressor.decompress_kernel`).

The zstd frames are kpack's (kpack-host's ``zstd_frame``: the frames the
``kpack`` command writes at the same level), so archives packed through
:class:`rocm_kpack.kpack.PackedKernelArchive` are the command's, byte for
byte::

    >>> c = ZstdCompressor(compression_level=3)
    >>> inp = c.prepare_kernel(b"A" * 10000, "bin/app@gfx942")
    >>> inp.original_size, len(inp.compressed_frame) < 100
    (10000, True)
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from kpack import _native


class CompressionInput:
    """What :meth:`Compressor.prepare_kernel` returns for one kernel (the
    map phase's result), consumed by :meth:`Compressor.finalize`."""


class NoOpCompressionInput(CompressionInput):
    """A kernel stored as it is: ``data``."""

    def __init__(self, data: bytes) -> None:
        self.data = data


class ZstdCompressionInput(CompressionInput):
    """A kernel compressed already: ``compressed_frame`` (one zstd frame)
    of ``original_size`` bytes."""

    def __init__(self, kernel_id: str, compressed_frame: bytes, original_size: int) -> None:
        self.kernel_id = kernel_id
        self.compressed_frame = compressed_frame
        self.original_size = original_size


class Compressor(ABC):
    """A compression scheme of archives (``SCHEME_NAME`` in the TOC)."""

    SCHEME_NAME: str = NotImplemented

    @abstractmethod
    def prepare_kernel(self, kernel_data: bytes, kernel_id: str) -> CompressionInput:
        """Map phase for one kernel; may run on several threads at once."""

    @abstractmethod
    def finalize(self, inputs: List[Tuple[str, CompressionInput]]) -> Tuple[bytes, Dict[str, Any]]:
        """Reduce phase: the blob of all kernels in order, and the TOC fields
        that locate them (offsets relative to the blob)."""

    @staticmethod
    @abstractmethod
    def from_toc(toc_data: Dict[str, Any], file_path: Path) -> "Compressor":
        """A compressor that reads the kernels of the archive ``file_path``
        whose decoded TOC is ``toc_data``."""

    @abstractmethod
    def decompress_kernel(self, ordinal: int) -> bytes:
        """The kernel stored at ``ordinal``, as it was added."""


def _as_bytes(data: Any) -> bytes:
    return data if isinstance(data, bytes) else bytes(data)


class _Reading:
    """What a compressor made by ``from_toc`` reads with: the archive, opened
    by kpack's reader on first use."""

    def __init__(self, file_path: Path, count: int) -> None:
        self.file_path = Path(file_path)
        self.count = count
        self._archive: Optional[_native.NativeArchive] = None

    def read(self, ordinal: int) -> bytes:
        if not isinstance(ordinal, int) or ordinal < 0 or ordinal >= self.count:
            raise ValueError(f"Ordinal {ordinal} out of range (0..{self.count - 1})")
        if self._archive is None:
            self._archive = _native.NativeArchive.open(self.file_path)
        return self._archive.read_ordinal(ordinal)


class NoOpCompressor(Compressor):
    """Kernels stored uncompressed (scheme ``none``): the TOC's ``blobs``
    gives each kernel's ``offset`` and ``size``."""

    SCHEME_NAME = "none"

    def __init__(self) -> None:
        self._reading: Optional[_Reading] = None

    def prepare_kernel(self, kernel_data: bytes, kernel_id: str) -> CompressionInput:
        return NoOpCompressionInput(_as_bytes(kernel_data))

    def finalize(self, inputs: List[Tuple[str, CompressionInput]]) -> Tuple[bytes, Dict[str, Any]]:
        blobs = []
        offset = 0
        parts = []
        for kernel_id, inp in inputs:
            if not isinstance(inp, NoOpCompressionInput):
                raise TypeError(f"{kernel_id}: not an input of NoOpCompressor")
            parts.append(inp.data)
            blobs.append({"offset": offset, "size": len(inp.data)})
            offset += len(inp.data)
        return b"".join(parts), {"blobs": blobs}

    @staticmethod
    def from_toc(toc_data: Dict[str, Any], file_path: Path) -> "NoOpCompressor":
        c = NoOpCompressor()
        c._reading = _Reading(file_path, len(toc_data["blobs"]))
        return c

    def decompress_kernel(self, ordinal: int) -> bytes:
        if self._reading is None:
            raise RuntimeError("Compressor not initialized from TOC")
        return self._reading.read(ordinal)


class ZstdCompressor(Compressor):
    """One zstd frame per kernel (scheme ``zstd-per-kernel``), at
    ``compression_level`` (1-22). The blob is a ``u32`` frame count, then
    each frame after its ``u32`` length; the TOC gives ``zstd_offset`` and
    ``zstd_size``."""

    SCHEME_NAME = "zstd-per-kernel"

    def __init__(self, compression_level: int = 3) -> None:
        self.compression_level = compression_level
        self._reading: Optional[_Reading] = None

    def prepare_kernel(self, kernel_data: bytes, kernel_id: str) -> CompressionInput:
        data = _as_bytes(kernel_data)
        frame = _native.zstd_frame(data, self.compression_level)
        return ZstdCompressionInput(kernel_id=kernel_id, compressed_frame=frame, original_size=len(data))

    def finalize(self, inputs: List[Tuple[str, CompressionInput]]) -> Tuple[bytes, Dict[str, Any]]:
        frames = []
        for kernel_id, inp in inputs:
            if not isinstance(inp, ZstdCompressionInput):
                raise TypeError(f"{kernel_id}: not an input of ZstdCompressor")
            frames.append(inp.compressed_frame)
        blob = _native.zstd_blob(frames)
        return blob, {"zstd_offset": 0, "zstd_size": len(blob)}

    @staticmethod
    def from_toc(toc_data: Dict[str, Any], file_path: Path) -> "ZstdCompressor":
        c = ZstdCompressor()
        offset = int(toc_data["zstd_offset"])
        with open(file_path, "rb") as f:
            f.seek(offset)
            head = f.read(4)
        count = struct.unpack("<I", head)[0] if len(head) == 4 else 0
        c._reading = _Reading(file_path, count)
        return c

    def decompress_kernel(self, ordinal: int) -> bytes:
        if self._reading is None:
            raise RuntimeError("Compressor not initialized from TOC")
        return self._reading.read(ordinal)


COMPRESSION_SCHEMES = {
    NoOpCompressor.SCHEME_NAME: NoOpCompressor,
    ZstdCompressor.SCHEME_NAME: ZstdCompressor,
}


def create_compressor_from_toc(toc_data: Dict[str, Any], file_path: Path) -> Compressor:
    """The compressor of the scheme the TOC names (``none`` if it names
    none); ``ValueError`` for an unknown one."""
    scheme = toc_data.get("compression_scheme", "none")
    if scheme not in COMPRESSION_SCHEMES:
        raise ValueError(f"Unknown compression scheme: {scheme}")
    return COMPRESSION_SCHEMES[scheme].from_toc(toc_data, file_path)
