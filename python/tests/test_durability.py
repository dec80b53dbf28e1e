"""Durability on request: nothing is fsynced by default; ``durable=True`` or
``KPACK_DURABLE=1`` fsyncs each output file and each distinct directory
once, at the end of the call (counted by kpack's own fsync counter)."""

import pytest

import kpack
from kpack import _native
from rocm_kpack import kpack_offload_binary
from rocm_kpack.compression import ZstdCompressor
from rocm_kpack.kpack import PackedKernelArchive


def _archive():
    a = PackedKernelArchive("g", "gfx942", ["gfx942"], compressor=ZstdCompressor(3))
    a.add_kernel(a.prepare_kernel("lib/libfoo.so", "gfx942", b"code" * 1000))
    a.finalize_archive()
    return a


def _fsyncs(f):
    before = _native.sync_calls()
    f()
    return _native.sync_calls() - before


def test_archive_write(tmp_path, monkeypatch):
    monkeypatch.delenv("KPACK_DURABLE", raising=False)
    a = _archive()
    assert _fsyncs(lambda: a.write(tmp_path / "default.kpack")) == 0
    assert _fsyncs(lambda: a.write(tmp_path / "off.kpack", durable=False)) == 0
    # The file, then its directory.
    assert _fsyncs(lambda: a.write(tmp_path / "on.kpack", durable=True)) == 2
    monkeypatch.setenv("KPACK_DURABLE", "1")
    assert _fsyncs(lambda: a.write(tmp_path / "env.kpack")) == 2
    assert _fsyncs(lambda: a.write(tmp_path / "env-off.kpack", durable=False)) == 0
    monkeypatch.setenv("KPACK_DURABLE", "0")
    assert _fsyncs(lambda: a.write(tmp_path / "env0.kpack")) == 0
    data = {(tmp_path / n).read_bytes() for n in ["default.kpack", "on.kpack", "env.kpack"]}
    assert len(data) == 1


def test_commands_and_offload_binary(tmp_path, fixtures, monkeypatch):
    monkeypatch.delenv("KPACK_DURABLE", raising=False)
    lib = fixtures / "libvadd.so"

    def offload(name, **kw):
        kpack.offload(lib, tmp_path / name / "lib/libvadd.so", archive_dir=tmp_path / name / ".kpack", **kw)

    assert _fsyncs(lambda: offload("default")) == 0
    # Three archives and the binary, then their two directories.
    assert _fsyncs(lambda: offload("durable", durable=True)) == 6
    monkeypatch.setenv("KPACK_DURABLE", "1")
    assert _fsyncs(lambda: offload("env")) == 6
    out = tmp_path / "bin" / "libvadd.so"
    out.parent.mkdir()
    assert _fsyncs(lambda: kpack_offload_binary(lib, out, ["x_@GFXARCH@.kpack"], "libvadd.so")) == 2
    monkeypatch.delenv("KPACK_DURABLE")
    assert _fsyncs(lambda: kpack_offload_binary(lib, out, ["x_@GFXARCH@.kpack"], "libvadd.so")) == 0
    n = _fsyncs(lambda: kpack_offload_binary(lib, out, ["x_@GFXARCH@.kpack"], "libvadd.so", durable=True))
    assert n == 2


@pytest.mark.parametrize("flag", [True, False])
def test_pack_tree(tmp_path, fixtures, monkeypatch, flag):
    monkeypatch.delenv("KPACK_DURABLE", raising=False)
    tree = tmp_path / "tree" / "lib"
    tree.mkdir(parents=True)
    (tree / "libvadd.so").write_bytes((fixtures / "libvadd.so").read_bytes())
    n = _fsyncs(lambda: kpack.pack_tree(tmp_path / "tree", tmp_path / "out", group_name="g", durable=flag))
    assert (n > 0) == flag
