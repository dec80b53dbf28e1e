"""rocm_kpack.kpack_offload_binary, read_kpack_ref_marker, is_fat_binary."""

import os
import shutil

import pytest

import kpack
import rocm_kpack
from rocm_kpack import (
    NotFatBinaryError,
    UnsupportedBinaryFormat,
    is_fat_binary,
    kpack_offload_binary,
    read_kpack_ref_marker,
)


def test_exports():
    for name in ["detect_binary_format", "is_elf_binary", "is_pe_binary", "UnsupportedBinaryFormat",
                 "kpack_offload_binary", "read_kpack_ref_marker", "is_fat_binary", "NotFatBinaryError"]:
        assert name in rocm_kpack.__all__ and hasattr(rocm_kpack, name)
    assert issubclass(NotFatBinaryError, ValueError) and issubclass(UnsupportedBinaryFormat, ValueError)


@pytest.mark.parametrize("fixture,fmt,addr", [("libvadd.so", "elf", "kpack_ref_vaddr"),
                                               ("windows/multi.dll", "coff", "kpack_ref_rva")])
def test_offload_elf_and_pe(tmp_path, fixtures, kpack_cli, fixture, fmt, addr):
    src = fixtures / fixture
    out = tmp_path / "out" / os.path.basename(fixture)
    out.parent.mkdir()
    assert is_fat_binary(src) is True
    assert read_kpack_ref_marker(src) is None
    paths = ["../.kpack/vadd_@GFXARCH@.kpack", "/opt/rocm/.kpack/vadd_@GFXARCH@.kpack"]
    r = kpack_offload_binary(src, out, paths, "libvadd.so")
    assert r["format"] == fmt
    assert r["original_size"] == src.stat().st_size
    assert r["new_size"] == out.stat().st_size
    assert r["removed"] == r["original_size"] - r["new_size"]
    assert isinstance(r[addr], int) and r[addr] > 0
    targets = {"libvadd.so": ["gfx1100", "gfx1101", "gfx942"], "windows/multi.dll": ["gfx1100", "gfx942"]}
    assert read_kpack_ref_marker(out) == {
        "kpack_search_paths": paths,
        "kernel_name": "libvadd.so",
        "kpack_targets": targets[fixture],
    }
    # The reference's keys first, in its order; kpack's after them.
    assert list(read_kpack_ref_marker(str(out))) == ["kpack_search_paths", "kernel_name", "kpack_targets"]
    assert os.stat(out).st_mode == os.stat(src).st_mode
    # The command's verifier accepts it as an offloaded binary.
    v = kpack_cli("verify-elf", "--offloaded", out, check=False)
    assert v.returncode == 0, v.stderr


def test_offload_in_place(tmp_path, fixtures):
    p = tmp_path / "libvadd.so"
    shutil.copy(fixtures / "libvadd.so", p)
    kpack_offload_binary(str(p), str(p), ["x_@GFXARCH@.kpack"], "libvadd.so")
    assert read_kpack_ref_marker(p)["kpack_search_paths"] == ["x_@GFXARCH@.kpack"]


def test_offload_errors(tmp_path, fixtures):
    host = fixtures / "libhostonly.so"
    with pytest.raises(NotFatBinaryError, match=r"has no \.hip_fatbin section"):
        kpack_offload_binary(host, tmp_path / "o.so", ["a"], "k")
    assert not (tmp_path / "o.so").exists()
    assert is_fat_binary(host) is False
    text = tmp_path / "notes.txt"
    text.write_text("not a binary at all\n")
    with pytest.raises(UnsupportedBinaryFormat):
        kpack_offload_binary(text, tmp_path / "o", ["a"], "k")
    with pytest.raises(UnsupportedBinaryFormat):
        read_kpack_ref_marker(text)
    assert is_fat_binary(text) is False
    with pytest.raises(FileNotFoundError):
        kpack_offload_binary(tmp_path / "missing.so", tmp_path / "o", ["a"], "k")
    with pytest.raises(ValueError, match="kernel_name required"):
        kpack_offload_binary(fixtures / "libvadd.so", tmp_path / "o", ["a"], None)
    # A damaged fat binary: a ValueError naming the file, no crash, no output.
    bad = tmp_path / "bad.so"
    data = bytearray((fixtures / "libvadd.so").read_bytes())
    data[0x28:0x30] = (len(data) * 4).to_bytes(8, "little")  # e_shoff past the end
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError) as e:
        kpack_offload_binary(bad, tmp_path / "bad-out.so", ["a"], "k")
    assert isinstance(e.value, kpack.Error) and "bad.so" in str(e.value)
    assert not (tmp_path / "bad-out.so").exists()
