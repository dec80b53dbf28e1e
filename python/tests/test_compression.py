"""rocm_kpack.compression: the reference compressor API over kpack's
frames."""

import struct

import msgpack
import pytest
import zstandard

from rocm_kpack.compression import (
    COMPRESSION_SCHEMES,
    CompressionInput,
    Compressor,
    NoOpCompressor,
    ZstdCompressor,
    create_compressor_from_toc,
)
from rocm_kpack.kpack import PackedKernelArchive


def test_scheme_names_and_classes():
    assert NoOpCompressor.SCHEME_NAME == "none"
    assert ZstdCompressor.SCHEME_NAME == "zstd-per-kernel"
    assert issubclass(NoOpCompressor, Compressor) and issubclass(ZstdCompressor, Compressor)
    assert COMPRESSION_SCHEMES == {"none": NoOpCompressor, "zstd-per-kernel": ZstdCompressor}
    with pytest.raises(TypeError):
        Compressor()
    assert ZstdCompressor().compression_level == 3
    assert ZstdCompressor(compression_level=19).compression_level == 19


def test_noop_prepare_and_finalize():
    c = NoOpCompressor()
    inputs = [(f"k{i}", c.prepare_kernel(d, f"k{i}")) for i, d in enumerate([b"one", b"second!", b""])]
    assert all(isinstance(i, CompressionInput) for _, i in inputs)
    assert inputs[1][1].data == b"second!"
    blob, meta = c.finalize(inputs)
    assert blob == b"onesecond!"
    assert meta == {"blobs": [{"offset": 0, "size": 3}, {"offset": 3, "size": 7}, {"offset": 10, "size": 0}]}


def test_zstd_prepare_and_finalize():
    c = ZstdCompressor(compression_level=3)
    data = b"ROCM_KERNEL_" * 1000
    inp = c.prepare_kernel(data, "bin/x@gfx942")
    assert isinstance(inp, CompressionInput)
    assert inp.original_size == len(data) and inp.kernel_id == "bin/x@gfx942"
    assert len(inp.compressed_frame) < len(data) / 10
    # A standard frame: any zstd decoder reads it, content size recorded.
    assert zstandard.ZstdDecompressor().decompress(inp.compressed_frame) == data
    other = c.prepare_kernel(b"abc", "y")
    blob, meta = c.finalize([("x", inp), ("y", other)])
    assert meta == {"zstd_offset": 0, "zstd_size": len(blob)}
    assert struct.unpack_from("<I", blob, 0) == (2,)
    n0 = struct.unpack_from("<I", blob, 4)[0]
    assert blob[8 : 8 + n0] == inp.compressed_frame
    n1 = struct.unpack_from("<I", blob, 8 + n0)[0]
    assert blob[12 + n0 :] == other.compressed_frame and n1 == len(other.compressed_frame)


def test_inputs_of_the_wrong_compressor_are_refused():
    with pytest.raises(TypeError):
        ZstdCompressor().finalize([("x", NoOpCompressor().prepare_kernel(b"x", "x"))])
    with pytest.raises(TypeError):
        NoOpCompressor().finalize([("x", ZstdCompressor().prepare_kernel(b"x", "x"))])


def test_bad_level_raises_value_error():
    with pytest.raises(ValueError, match="invalid zstd level"):
        ZstdCompressor(compression_level=100).prepare_kernel(b"x", "x")


@pytest.mark.parametrize("compressor", [NoOpCompressor(), ZstdCompressor(5)], ids=["noop", "zstd"])
def test_from_toc_reads_by_ordinal(tmp_path, compressor):
    a = PackedKernelArchive("g", "gfx942", ["gfx942"], compressor=compressor)
    kernels = [b"first" * 50, b"second" * 70, b"third" * 10]
    for i, k in enumerate(kernels):
        a.add_kernel(a.prepare_kernel(f"bin/k{i}", "gfx942", k))
    a.finalize_archive()
    p = tmp_path / "a.kpack"
    a.write(p)
    raw = p.read_bytes()
    toc = msgpack.unpackb(raw[struct.unpack_from("<Q", raw, 8)[0] :], raw=False)
    c = create_compressor_from_toc(toc, p)
    assert type(c) is type(compressor)
    assert [c.decompress_kernel(i) for i in range(3)] == kernels
    for bad in (-1, 3):
        with pytest.raises(ValueError, match="out of range"):
            c.decompress_kernel(bad)
    with pytest.raises(RuntimeError, match="not initialized"):
        type(compressor)().decompress_kernel(0)
    with pytest.raises(ValueError, match="Unknown compression scheme"):
        create_compressor_from_toc({"compression_scheme": "lz4"}, p)
