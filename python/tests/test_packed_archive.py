"""rocm_kpack.kpack.PackedKernelArchive: the reference API, archives that
are the kpack command's byte for byte."""

import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgpack
import pytest
import zstandard

import kpack
from rocm_kpack.compression import NoOpCompressor, ZstdCompressor
from rocm_kpack.kpack import PackedKernelArchive, PreparedKernel

COMPRESSORS = [pytest.param(NoOpCompressor, id="noop"), pytest.param(lambda: ZstdCompressor(3), id="zstd")]


def toc_of(path):
    raw = Path(path).read_bytes()
    magic, version, toc_offset = struct.unpack_from("<4sIQ", raw, 0)
    assert (magic, version) == (b"KPAK", 1)
    return raw, msgpack.unpackb(raw[toc_offset:], raw=False)


@pytest.mark.parametrize("make", COMPRESSORS)
def test_roundtrip(tmp_path, make):
    a = PackedKernelArchive(group_name="blas", gfx_arch_family="gfx100X", gfx_arches=["gfx1030", "gfx1001"], compressor=make())
    a.add_kernel(a.prepare_kernel("bin/hipcc", "gfx1030", b"code for gfx1030"))
    a.add_kernel(a.prepare_kernel("bin/hipcc", "gfx1001", b"code for gfx1001"))
    a.add_kernel(a.prepare_kernel("lib/libx.so", "gfx1030", b"x" * 5000, metadata={"version": "1.0", "n": 3}))
    assert a.toc["lib/libx.so"]["gfx1030"] == {
        "type": "hsaco", "ordinal": 2, "original_size": 5000, "metadata": {"version": "1.0", "n": 3}}
    a.finalize_archive()
    assert a.get_kernel("bin/hipcc", "gfx1001") == b"code for gfx1001"
    out = tmp_path / "sub" / "dir" / PackedKernelArchive.compute_pack_filename("blas", "gfx100X")
    a.write(out)
    r = PackedKernelArchive.read(out)
    assert (r.group_name, r.gfx_arch_family, r.gfx_arches) == ("blas", "gfx100X", ["gfx1030", "gfx1001"])
    assert r.toc == a.toc
    assert r.get_kernel("bin/hipcc", "gfx1030") == b"code for gfx1030"
    assert r.get_kernel("lib\\libx.so", "gfx1030") == b"x" * 5000
    assert r.get_kernel("bin/hipcc", "gfx1100") is None
    assert r.get_kernel("nothing", "gfx1030") is None
    # The file as a reader of the format sees it (upstream's reader decodes
    # the TOC with msgpack and the frames with zstandard).
    raw, toc = toc_of(out)
    assert toc["compression_scheme"] == a._compressor.SCHEME_NAME
    assert list(toc) == ["format_version", "group_name", "gfx_arch_family", "gfx_arches", "toc", "compression_scheme"] + (
        ["blobs"] if toc["compression_scheme"] == "none" else ["zstd_offset", "zstd_size"])
    if toc["compression_scheme"] == "none":
        b = toc["blobs"][2]
        assert raw[b["offset"] : b["offset"] + b["size"]] == b"x" * 5000
    else:
        off = toc["zstd_offset"]
        assert off == 64
        n = struct.unpack_from("<I", raw, off)[0]
        assert n == 3
        pos = off + 4
        frames = []
        for _ in range(n):
            size = struct.unpack_from("<I", raw, pos)[0]
            frames.append(raw[pos + 4 : pos + 4 + size])
            pos += 4 + size
        assert zstandard.ZstdDecompressor().decompress(frames[2]) == b"x" * 5000


@pytest.mark.parametrize("make", COMPRESSORS)
def test_errors(tmp_path, make):
    a = PackedKernelArchive("t", "gfx1100", ["gfx1100"], compressor=make())
    a.add_kernel(a.prepare_kernel("bin/t", "gfx1100", b"data"))
    with pytest.raises(ValueError, match="Kernel already exists"):
        a.add_kernel(a.prepare_kernel("bin/t", "gfx1100", b"other"))
    with pytest.raises(ValueError, match="Kernel already exists"):
        a.add_kernel(a.prepare_kernel("bin\\t", "gfx1100", b"other"))
    with pytest.raises(RuntimeError, match="not finalized"):
        a.write(tmp_path / "x.kpack")
    with pytest.raises(RuntimeError, match="before archive is finalized"):
        a.get_kernel("bin/t", "gfx1100")
    assert not (tmp_path / "x.kpack").exists()
    a.finalize_archive()
    with pytest.raises(RuntimeError, match="already finalized"):
        a.finalize_archive()
    with pytest.raises(RuntimeError):
        a.add_kernel(a.prepare_kernel("bin/u", "gfx1100", b"late"))
    with pytest.raises(ValueError, match="Streaming write mode not yet supported"):
        PackedKernelArchive("t", "gfx1100", ["gfx1100"], output_path=tmp_path / "s.kpack")


def test_ordinals_and_repr():
    a = PackedKernelArchive(group_name="blas", gfx_arch_family="gfx100X", gfx_arches=["gfx1030", "gfx1001"])
    for i, (p, arch) in enumerate([("bin/a", "gfx1030"), ("bin/a", "gfx1001"), ("bin/b", "gfx1030")]):
        a.add_kernel(a.prepare_kernel(p, arch, f"data {i}".encode()))
        assert a.toc[p][arch]["ordinal"] == i
    r = repr(a)
    assert r == "PackedKernelArchive(group=blas, family=gfx100X, binaries=2, kernels=3)"
    assert PackedKernelArchive.compute_pack_filename("blas", "gfx1100") == "blas-gfx1100.kpack"
    assert (PackedKernelArchive.MAGIC, PackedKernelArchive.FORMAT_VERSION) == (b"KPAK", 1)


def test_identical_code_objects_share_an_ordinal(tmp_path):
    # As every kpack writer: the same bytes for the same arch are stored once.
    a = PackedKernelArchive("g", "gfx942", ["gfx942"], compressor=ZstdCompressor())
    for p in ("a", "b"):
        a.add_kernel(a.prepare_kernel(f"bin/{p}", "gfx942", b"same" * 100))
    a.add_kernel(a.prepare_kernel("bin/c", "gfx90a", b"same" * 100))
    assert [a.toc[p][t]["ordinal"] for p, t in [("bin/a", "gfx942"), ("bin/b", "gfx942"), ("bin/c", "gfx90a")]] == [0, 0, 1]
    a.finalize_archive()
    a.write(tmp_path / "s.kpack")
    r = PackedKernelArchive.read(tmp_path / "s.kpack")
    assert r.get_kernel("bin/b", "gfx942") == b"same" * 100


def test_read_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        PackedKernelArchive.read(tmp_path / "missing.kpack")
    bad = tmp_path / "bad.kpack"
    bad.write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(ValueError, match="not a kpack archive"):
        PackedKernelArchive.read(bad)
    trunc = tmp_path / "trunc.kpack"
    trunc.write_bytes(b"KPAK\x01\x00\x00\x00")
    with pytest.raises(kpack.ArchiveError):
        PackedKernelArchive.read(trunc)


def test_thread_pool_of_prepare(tmp_path):
    kernels = [(f"lib/lib{i % 7}.so", f"gfx9{i % 3}0", bytes([i % 251]) * (1000 + 37 * i)) for i in range(60)]
    kernels = list({(p, t): d for p, t, d in kernels}.items())
    a = PackedKernelArchive("g", "gfx9X", ["gfx900", "gfx910", "gfx920"], compressor=ZstdCompressor(3))
    lock = threading.Lock()

    def work(k):
        (p, t), d = k
        prep = a.prepare_kernel(p, t, d)
        assert isinstance(prep, PreparedKernel)
        return prep

    with ThreadPoolExecutor(max_workers=2) as pool:
        prepared = list(pool.map(work, kernels))
    for prep in prepared:
        with lock:
            a.add_kernel(prep)
    a.finalize_archive()
    a.write(tmp_path / "p.kpack")
    r = PackedKernelArchive.read(tmp_path / "p.kpack")
    for (p, t), d in kernels:
        assert r.get_kernel(p, t) == d


@pytest.mark.parametrize("compression", ["zstd", "none"])
@pytest.mark.parametrize("fixture", ["libvadd.so", "libmulti.so"])
def test_same_bytes_as_the_kpack_command(tmp_path, fixtures, kpack_cli, compression, fixture):
    """Offload a fixture with the command, then pack its code objects through
    PackedKernelArchive with the same keys, metadata and options: the same
    archive, byte for byte."""
    kpack_cli("offload", fixtures / fixture, "-o", tmp_path / "host.so", "--archive-dir", tmp_path / "ar",
              "--compression", compression, "--kernel-name", "libx.so", "--group", "x")
    archives = sorted((tmp_path / "ar").glob("*.kpack"))
    assert archives
    for path in archives:
        with kpack.Archive(path) as cli:
            comp = ZstdCompressor(3) if compression == "zstd" else NoOpCompressor()
            a = PackedKernelArchive(cli.group_name, cli.gfx_arch_family, cli.gfx_arches, compressor=comp)
            for e in cli.entries():  # TOC order: the order they were added
                a.add_kernel(a.prepare_kernel(e.binary, e.arch, cli[e.binary, e.arch], metadata=e.metadata))
            a.finalize_archive()
            out = tmp_path / ("py-" + path.name)
            a.write(out)
        assert out.read_bytes() == path.read_bytes(), path.name


@pytest.mark.parametrize("make", COMPRESSORS)
def test_kernels_are_shared_not_copied_and_written_the_same_way(tmp_path, make):
    """The writer holds the kernels' bytes objects (not copies) until the
    archive goes: dropping the caller's references changes nothing; reading
    back before writing, writing twice and ``to_bytes`` all give the same
    archive."""
    import gc

    def build():
        a = PackedKernelArchive("g", "gfx942", ["gfx942"], compressor=make())
        data = [bytes([i]) * (1000 + 7 * i) + b"tail" for i in range(5)]
        for i, d in enumerate(data):
            a.add_kernel(a.prepare_kernel(f"lib/lib{i}.so", "gfx942", bytearray(d) if i == 2 else d))
        a.finalize_archive()
        return a, data

    a, data = build()
    expected = list(data)
    del data
    gc.collect()
    assert a.get_kernel("lib/lib3.so", "gfx942") == expected[3]
    a.write(tmp_path / "one.kpack")
    a.write(tmp_path / "two.kpack")
    b, _ = build()
    b.write(tmp_path / "fresh.kpack")
    one = (tmp_path / "one.kpack").read_bytes()
    assert one == (tmp_path / "two.kpack").read_bytes() == (tmp_path / "fresh.kpack").read_bytes()
    assert one == a._builder.to_bytes()
    r = PackedKernelArchive.read(tmp_path / "fresh.kpack")
    assert [r.get_kernel(f"lib/lib{i}.so", "gfx942") for i in range(5)] == expected


def test_past_an_hrx_limit_is_warned_and_still_written(tmp_path, recwarn):
    # A key longer than HRX's 1,024 bytes and a target with five features.
    long_key = "lib/" + "x" * 1100 + ".so"
    target = "gfx942:a+:b+:c+:d+:e+"
    a = PackedKernelArchive("g", "gfx942", ["gfx942", target], compressor=NoOpCompressor())
    a.add_kernel(a.prepare_kernel(long_key, "gfx942", b"code"))
    a.add_kernel(a.prepare_kernel("lib/ok.so", target, b"more code"))
    a.finalize_archive()
    warned = [w for w in recwarn if issubclass(w.category, kpack.HrxLimitWarning)]
    assert len(warned) == 2, [str(w.message) for w in recwarn]
    assert issubclass(kpack.HrxLimitWarning, UserWarning)
    assert all('group "g"' in str(w.message) and "HRX" in str(w.message) for w in warned)
    assert any("key" in str(w.message) for w in warned)
    assert any("features" in str(w.message) or "target" in str(w.message) for w in warned)
    out = tmp_path / "g.kpack"
    a.write(out)
    assert PackedKernelArchive.read(out).get_kernel(long_key, "gfx942") == b"code"


def test_within_the_hrx_limits_nothing_is_warned(tmp_path):
    import warnings

    a = PackedKernelArchive("g", "gfx942", ["gfx942:sramecc+:xnack-"], compressor=NoOpCompressor())
    a.add_kernel(a.prepare_kernel("lib/ok.so", "gfx942:sramecc+:xnack-", b"code"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", kpack.HrxLimitWarning)
        a.finalize_archive()
