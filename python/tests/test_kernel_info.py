"""``kpack.Archive.info``: a code object's sizes and scheme from the table of
contents, on archives ``kpack offload`` and ``kpack split`` made of real
fixtures (the C API's ``kpack_get_kernel_info``)."""

import pytest

import kpack

LIBS = ("libvadd.so", "libmulti.so")


def make_archives(tmp_path, fixtures, kpack_cli):
    for scheme in ("zstd", "none"):
        for lib in LIBS:
            kpack_cli("offload", fixtures / lib, "-o", tmp_path / f"host-{scheme}" / lib,
                      "--archive-dir", tmp_path / f"offload-{scheme}", "--compression", scheme)
        art = tmp_path / f"shard-{scheme}" / "fft_lib_gfx110X-dgpu"
        (art / "stage" / "lib").mkdir(parents=True)
        (art / "artifact_manifest.txt").write_text("stage\n")
        for lib in LIBS:
            (art / "stage" / "lib" / lib).write_bytes((fixtures / lib).read_bytes())
        kpack_cli("split", "--artifact-dir", art, "--output-dir", tmp_path / f"split-{scheme}",
                  "--compression", scheme)
    return sorted(p for p in tmp_path.rglob("*.kpack") if p.is_file())


def test_info_is_what_a_read_gives(tmp_path, fixtures, kpack_cli):
    archives = make_archives(tmp_path, fixtures, kpack_cli)
    assert len(archives) >= 4
    schemes = set()
    checked = 0
    for path in archives:
        with kpack.Archive(path) as a:
            for key in a:
                info = a.info(key)
                assert info.original_size == len(a[key]) == len(a.view(key))
                assert info.scheme == a.scheme
                if info.scheme == "none":
                    assert info.stored_size == info.original_size
                else:
                    assert 4 + 6 < info.stored_size
                schemes.add(info.scheme)
                checked += 1
            binary, arch = next(iter(a))
            with pytest.raises(KeyError):
                a.info(("no/such/binary.so#0", arch))
            with pytest.raises(KeyError):
                a.info((binary, "gfx0"))
            with pytest.raises(TypeError):
                a.info(binary)
    assert schemes == {"none", "zstd-per-kernel"}
    assert checked > len(archives)


def test_info_of_a_closed_archive(tmp_path, fixtures, kpack_cli):
    kpack_cli("offload", fixtures / "libvadd.so", "-o", tmp_path / "o.so", "--archive-dir", tmp_path / "ar")
    path = sorted((tmp_path / "ar").glob("*.kpack"))[0]
    a = kpack.Archive(path)
    key = next(iter(a))
    size = a.info(key).original_size
    a.close()
    with pytest.raises(ValueError, match="closed"):
        a.info(key)
    assert size > 0
