"""kpack's own API: Archive, the operations, the exceptions, the command."""

import json
import subprocess
import sys
import threading

import pytest

import kpack
from rocm_kpack.compression import NoOpCompressor, ZstdCompressor
from rocm_kpack.kpack import PackedKernelArchive


def make_archive(path, compressor, kernels):
    a = PackedKernelArchive("g", "gfx942", ["gfx942", "gfx90a"], compressor=compressor)
    for (b, t), d in kernels.items():
        a.add_kernel(a.prepare_kernel(b, t, d, metadata={"target": "hipv4-" + t}))
    a.finalize_archive()
    a.write(path)
    return path


KERNELS = {("lib/a.so#0", "gfx942"): b"A" * 3000, ("lib/a.so#0", "gfx90a"): b"B" * 10, ("bin/t#1", "gfx942"): b"C" * 77}


@pytest.mark.parametrize("compressor", [NoOpCompressor(), ZstdCompressor(3)], ids=["none", "zstd"])
def test_archive_is_a_mapping(tmp_path, compressor):
    p = make_archive(tmp_path / "a.kpack", compressor, KERNELS)
    with kpack.Archive(p) as a:
        assert len(a) == 3
        assert list(a) == list(KERNELS)
        assert ("bin/t#1", "gfx942") in a and ("bin/t#1", "gfx90a") not in a and "x" not in a
        assert dict(a.items()) == KERNELS
        assert a["lib/a.so#0", "gfx90a"] == b"B" * 10
        assert a.read("bin/t#1", "gfx942") == b"C" * 77
        assert a.get(("nope", "gfx942")) is None
        with pytest.raises(KeyError):
            a["nope", "gfx942"]
        with pytest.raises(TypeError):
            a["lib/a.so#0"]
        assert (a.group_name, a.gfx_arch_family, a.gfx_arches) == ("g", "gfx942", ["gfx942", "gfx90a"])
        assert a.scheme == compressor.SCHEME_NAME
        assert a.binaries == ["lib/a.so#0", "bin/t#1"]
        e = a.entries()[2]
        assert (e.binary, e.arch, e.ordinal, e.original_size, e.metadata) == ("bin/t#1", "gfx942", 2, 77, {"target": "hipv4-gfx942"})
        v = a.view(("lib/a.so#0", "gfx942"))
        assert isinstance(v, memoryview) and v.readonly and bytes(v) == b"A" * 3000
        if a.scheme == "none":
            # Zero-copy: a view of the mapped file itself.
            raw = p.read_bytes()
            off = raw.index(b"A" * 3000)
            assert v.obj is not None and bytes(v.obj[off : off + 3000]) == b"A" * 3000
        with pytest.raises(KeyError):
            a.view(("nope", "gfx942"))
        assert "kernels=3" in repr(a)
    assert a.closed
    assert bytes(v) == b"A" * 3000  # views outlive the archive
    with pytest.raises(ValueError, match="closed"):
        len(a)


def test_archive_errors(tmp_path):
    with pytest.raises(kpack.NotFoundError) as e:
        kpack.Archive(tmp_path / "missing.kpack")
    assert isinstance(e.value, FileNotFoundError) and "missing.kpack" in str(e.value)
    bad = tmp_path / "bad.kpack"
    bad.write_bytes(b"KPAK\x01\x00\x00\x00" + (10**6).to_bytes(8, "little") + bytes(48))
    with pytest.raises(kpack.ArchiveError, match="TOC offset"):
        kpack.Archive(bad)
    # A damaged frame: the read fails with an ArchiveError, nothing crashes.
    p = make_archive(tmp_path / "z.kpack", ZstdCompressor(3), KERNELS)
    data = bytearray(p.read_bytes())
    data[80] ^= 0xFF
    data[90] ^= 0xFF
    p.write_bytes(bytes(data))
    with kpack.Archive(p) as a:
        with pytest.raises(kpack.ArchiveError):
            a["lib/a.so#0", "gfx942"]


def test_reading_from_threads(tmp_path):
    p = make_archive(tmp_path / "t.kpack", ZstdCompressor(3), KERNELS)
    errors = []
    with kpack.Archive(p) as a:
        def work():
            try:
                for _ in range(50):
                    assert dict(a.items()) == KERNELS
            except Exception as e:  # pragma: no cover
                errors.append(e)
        ts = [threading.Thread(target=work) for _ in range(4)]
        [t.start() for t in ts]
        [t.join() for t in ts]
    assert not errors


def test_exception_hierarchy():
    assert issubclass(kpack.UsageError, ValueError) and issubclass(kpack.InputError, ValueError)
    assert issubclass(kpack.ArchiveError, kpack.InputError) and issubclass(kpack.BinaryError, kpack.InputError)
    assert issubclass(kpack.NotFoundError, FileNotFoundError) and issubclass(kpack.OutputExistsError, FileExistsError)
    assert issubclass(kpack.PermissionDeniedError, PermissionError)
    for name in kpack.__all__:
        obj = getattr(kpack, name)
        if isinstance(obj, type) and issubclass(obj, Warning):
            assert not issubclass(obj, kpack.Error), name
        elif isinstance(obj, type) and issubclass(obj, BaseException):
            assert issubclass(obj, kpack.Error), name
    assert issubclass(kpack.HrxLimitWarning, UserWarning)


def test_offload(tmp_path, fixtures):
    s = kpack.offload(fixtures / "libvadd.so", tmp_path / "lib" / "libvadd.so", archive_dir=tmp_path / ".kpack", group="vadd")
    assert isinstance(s, kpack.OffloadSummary)
    assert s.outcome == "offloaded" and s.kernel_name == "libvadd.so"
    assert s.search_paths == ["../.kpack/vadd_@GFXARCH@.kpack"]
    assert s["input_size"] == (fixtures / "libvadd.so").stat().st_size
    targets = sorted(a.target for a in s.archives)
    assert targets and all((tmp_path / ".kpack" / f"vadd_{t}.kpack").is_file() for t in targets)
    assert json.loads(json.dumps(s.to_dict()))["outcome"] == "offloaded"
    with pytest.raises(AttributeError):
        s.nothing
    # The archives read back through Archive.
    with kpack.Archive(tmp_path / ".kpack" / f"vadd_{targets[0]}.kpack") as a:
        assert ("libvadd.so#0", targets[0]) in a
    # Errors: the command's message, the matching class.
    with pytest.raises(kpack.NotFoundError, match="missing.so"):
        kpack.offload(tmp_path / "missing.so", tmp_path / "o.so", archive_dir=tmp_path / "ar")
    # A host-only library is copied unchanged, with a note (no archive).
    h = kpack.offload(fixtures / "libhostonly.so", tmp_path / "o.so", archive_dir=tmp_path / "ar")
    assert h.outcome == "host_only" and "no device code" in h.note
    assert (tmp_path / "o.so").read_bytes() == (fixtures / "libhostonly.so").read_bytes()
    with pytest.raises(kpack.UsageError):
        kpack.offload(fixtures / "libvadd.so", tmp_path / "o.so", archive_dir=tmp_path / "ar", compression_level=99)
    with pytest.raises(TypeError):
        kpack.offload(fixtures / "libvadd.so", tmp_path / "o.so", archive_dir=tmp_path / "ar", bogus=1)


def test_pack_tree_and_split(tmp_path, fixtures):
    tree = tmp_path / "tree" / "lib"
    tree.mkdir(parents=True)
    for f in ("libvadd.so", "libmulti.so"):
        (tree / f).write_bytes((fixtures / f).read_bytes())
    s = kpack.pack_tree(tmp_path / "tree", tmp_path / "packed", group_name="rocm", jobs=2)
    assert isinstance(s, kpack.PackTreeSummary)
    assert s.binaries == 2 and s.archives
    with pytest.raises(kpack.Error):
        kpack.pack_tree(tmp_path / "tree", tmp_path / "packed", group_name="rocm")
    again = kpack.pack_tree(tmp_path / "tree", tmp_path / "packed", group_name="rocm", overwrite=True)
    assert again.code_objects == s.code_objects
    with pytest.raises(kpack.InputError):
        kpack.split(artifact_dir=tmp_path / "tree", output_dir=tmp_path / "split")


def test_run_and_the_command(tmp_path, fixtures, kpack_cli):
    listing = kpack.run(["ls", fixtures / "libvadd.so"])
    assert listing.kind if "kind" in listing else listing
    v = kpack_cli("--version")
    assert v.stdout.startswith("kpack ")
    r = kpack_cli("ls", tmp_path / "missing", check=False)
    assert r.returncode == 1 and r.stderr.startswith("kpack: error: ") and "missing" in r.stderr
    r = kpack_cli("no-such-command", check=False)
    assert r.returncode == 2
    m = subprocess.run([sys.executable, "-m", "kpack", "ls", fixtures / "libvadd.so"], capture_output=True, text=True)
    assert m.returncode == 0 and "fat binary" in m.stdout
    # The output of a closed pipe ends the command quietly.
    p = subprocess.run(f"'{sys.executable}' -m kpack ls '{fixtures / 'libmulti.so'}' | head -1", shell=True,
                       capture_output=True, text=True)
    assert p.stdout.count("\n") == 1 and "Traceback" not in p.stderr


def test_doctor(tmp_path, fixtures, kpack_cli):
    tree = tmp_path / "tree" / "lib"
    tree.mkdir(parents=True)
    (tree / "libmulti.so").write_bytes((fixtures / "libmulti.so").read_bytes())
    packed = tmp_path / "packed"
    kpack.pack_tree(tmp_path / "tree", packed, group_name="rocm")
    ok = kpack.doctor(packed, arch="gfx942")
    assert isinstance(ok, kpack.DoctorSummary)
    assert ok.targets == ["gfx942"] and ok.problems == [] and ok.offloaded == 1
    (packed / ".kpack" / "rocm_gfx942.kpack").unlink()
    s = kpack.doctor(packed, arch=["gfx942", "gfx1151"])
    kinds = {(p.target, p.kind) for p in s.problems}
    assert kinds == {("gfx942", "missing_archive"), ("gfx1151", "no_code_for_target")}
    missing = next(p for p in s.problems if p.target == "gfx942")
    assert missing.binary.endswith("lib/libmulti.so") and "rocm_gfx942.kpack" in missing.fix
    # The same data as the command's --json.
    r = kpack_cli("doctor", packed, "--arch", "gfx942", "--arch", "gfx1151", "--json", check=False)
    assert r.returncode == 1
    assert json.loads(r.stdout) == s.to_dict()
    # Nothing to check: an error, exit status 2 from the command.
    with pytest.raises(kpack.InputError, match="no GPU found"):
        kpack.doctor(packed, sysfs_root=tmp_path / "no-sys")
    assert kpack_cli("doctor", tmp_path / "nope", "--arch", "gfx942", check=False).returncode == 2
