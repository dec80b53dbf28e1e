"""rocm_kpack.format_detect."""

import pytest

import kpack
from rocm_kpack import format_detect as fd
from rocm_kpack import UnsupportedBinaryFormat, detect_binary_format, is_elf_binary, is_pe_binary


def pe(tmp_path, offset, sig=b"PE\x00\x00", name="x.dll"):
    head = bytearray(max(offset + 4, 0x40))
    head[0:2] = b"MZ"
    head[0x3C:0x40] = offset.to_bytes(4, "little")
    if offset + 4 <= len(head):
        head[offset : offset + 4] = sig
    p = tmp_path / name
    p.write_bytes(bytes(head))
    return p


def test_constants():
    assert fd.ELF_MAGIC == b"\x7fELF" and fd.DOS_MAGIC == b"MZ" and fd.PE_SIGNATURE == b"PE\x00\x00"


def test_elf_and_coff(tmp_path, fixtures):
    assert detect_binary_format(fixtures / "libvadd.so") == "elf"
    assert detect_binary_format(str(fixtures / "windows" / "multi.dll")) == "coff"
    assert detect_binary_format(pe(tmp_path, 0x80)) == "coff"
    assert is_elf_binary(fixtures / "libvadd.so") is True
    assert is_pe_binary(fixtures / "libvadd.so") is False
    assert is_pe_binary(fixtures / "windows" / "multi.dll") is True
    assert is_elf_binary(fixtures / "windows" / "multi.dll") is False


def test_unsupported(tmp_path):
    small = tmp_path / "small"
    small.write_bytes(b"\x7fEL")
    with pytest.raises(UnsupportedBinaryFormat, match=r"^File too small to be a valid binary: .*small$"):
        detect_binary_format(small)
    text = tmp_path / "text"
    text.write_text("hello world, not a binary\n")
    with pytest.raises(UnsupportedBinaryFormat, match=r"^Binary is neither ELF nor PE/COFF format: .*text$"):
        detect_binary_format(text)
    for off in (0x10, 0x200000):
        p = pe(tmp_path, 0x80, name=f"bad{off}.dll")
        data = bytearray(p.read_bytes())
        data[0x3C:0x40] = off.to_bytes(4, "little")
        p.write_bytes(bytes(data))
        with pytest.raises(UnsupportedBinaryFormat, match=rf"^Invalid PE header offset {off:#x}: "):
            detect_binary_format(p)
    nosig = pe(tmp_path, 0x80, sig=b"NE\x00\x00", name="ne.dll")
    with pytest.raises(UnsupportedBinaryFormat, match="neither ELF nor PE/COFF"):
        detect_binary_format(nosig)
    # A ValueError, and one of kpack's errors.
    assert issubclass(UnsupportedBinaryFormat, ValueError)
    assert issubclass(UnsupportedBinaryFormat, kpack.Error)
    for f in (small, text, nosig):
        assert is_elf_binary(f) is False and is_pe_binary(f) is False


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        detect_binary_format(tmp_path / "missing")
    assert is_elf_binary(tmp_path / "missing") is False
    assert is_pe_binary(tmp_path / "missing") is False
