"""kpack's API functions call the engine, not the command line: the command
line is never run (its entry points are replaced by ones that fail), option
values are checked by the engine (its messages, the typed exceptions), and
the results are the data ``kpack ... --json`` prints for the same inputs."""

import json

import pytest

import kpack
from kpack import _native


@pytest.fixture
def no_cli(monkeypatch):
    """Make any use of the in-process command line fail the test."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError(f"the command line was run: {args!r}")

    monkeypatch.setattr(_native, "run_captured", refuse)
    monkeypatch.setattr(_native, "cli_main", refuse)
    yield calls
    assert calls == []


def _tree(tmp_path, fixtures, names=("libvadd.so", "libmulti.so")):
    lib = tmp_path / "tree" / "lib"
    lib.mkdir(parents=True)
    for n in names:
        (lib / n).write_bytes((fixtures / n).read_bytes())
    return tmp_path / "tree"


def _cli_json(kpack_cli, *args):
    r = kpack_cli(*args, "--json", check=False)
    return r.returncode, json.loads(r.stdout)


def _without_seconds(d):
    """A summary without its timings (``seconds``, ``archive_seconds``, ...)."""
    return {k: v for k, v in d.items() if not k.endswith("seconds")}


def test_offload_equals_the_commands_json(tmp_path, fixtures, no_cli, kpack_cli):
    lib = fixtures / "libvadd.so"
    s = kpack.offload(lib, tmp_path / "a" / "libvadd.so", archive_dir=tmp_path / "a" / ".kpack", group="vadd")
    code, cli = _cli_json(kpack_cli, "offload", lib, "--output", tmp_path / "b" / "libvadd.so",
                          "--archive-dir", tmp_path / "b" / ".kpack", "--group", "vadd")
    assert code == 0
    # The same data, but for the paths of the two runs.
    text = json.dumps(s.to_dict()).replace(str(tmp_path / "a"), "<out>")
    theirs = json.loads(json.dumps(cli).replace(str(tmp_path / "b"), "<out>"))
    assert _without_seconds(json.loads(text)) == _without_seconds(theirs)
    assert s.outcome == "offloaded" and s.archives
    assert (tmp_path / "a" / "libvadd.so").read_bytes() == (tmp_path / "b" / "libvadd.so").read_bytes()


def test_pack_tree_and_doctor_equal_the_commands_json(tmp_path, fixtures, no_cli, kpack_cli):
    tree = _tree(tmp_path, fixtures)
    s = kpack.pack_tree(tree, tmp_path / "a", group_name="rocm", gfx_arches=["gfx942,gfx1100"], jobs=1)
    code, cli = _cli_json(kpack_cli, "pack-tree", "--input", tree, "--output", tmp_path / "b",
                          "--group-name", "rocm", "--gfx-arches", "gfx942,gfx1100", "--jobs", "1")
    assert code == 0
    ours = json.loads(json.dumps(s.to_dict()).replace(str(tmp_path / "a"), "<out>"))
    theirs = json.loads(json.dumps(cli).replace(str(tmp_path / "b"), "<out>"))
    assert _without_seconds(ours) == _without_seconds(theirs)
    assert s.archives and all(a.path.endswith(("gfx942.kpack", "gfx1100.kpack")) for a in s.archives)
    d = kpack.doctor(tmp_path / "a", arch=["gfx942", "gfx90a"])
    code, cli = _cli_json(kpack_cli, "doctor", tmp_path / "a", "--arch", "gfx942", "--arch", "gfx90a")
    assert code == (0 if not d.problems else 1)
    assert d.to_dict() == cli


def test_usage_errors_are_the_engines(tmp_path, fixtures, no_cli):
    lib = fixtures / "libvadd.so"
    out = dict(archive_dir=tmp_path / "ar")
    with pytest.raises(kpack.UsageError, match=r"^compression level: 99 is not in 1\.\.=22$"):
        kpack.offload(lib, tmp_path / "o.so", compression_level=99, **out)
    with pytest.raises(kpack.UsageError, match='unknown scheme "lz4"'):
        kpack.offload(lib, tmp_path / "o.so", compression="lz4", **out)
    # Nothing was written.
    assert not (tmp_path / "o.so").exists() and not (tmp_path / "ar").exists()
    tree = _tree(tmp_path, fixtures, ["libvadd.so"])
    with pytest.raises(kpack.UsageError, match=r"^jobs: 0 is not at least 1$"):
        kpack.pack_tree(tree, tmp_path / "p", group_name="g", jobs=0)
    with pytest.raises(kpack.UsageError, match='unknown database handler "tensile"'):
        kpack.split(artifact_dir=tree, output_dir=tmp_path / "s", split_databases=["tensile"])
    with pytest.raises(kpack.UsageError, match="not both"):
        kpack.split(artifact_dir=tree, batch_artifact_parent_dir=tree, output_dir=tmp_path / "s")
    with pytest.raises(kpack.UsageError, match="artifact directory or a batch"):
        kpack.split(output_dir=tmp_path / "s")
    with pytest.raises(kpack.UsageError, match="unknown format"):
        kpack.split_wheels(tmp_path / "x.whl", tmp_path / "w", device_package_prefix="p",
                           overlay_root="t/", output_format="zip")


def test_errors_name_the_file(tmp_path, fixtures, no_cli):
    missing = tmp_path / "missing.so"
    with pytest.raises(kpack.NotFoundError) as e:
        kpack.offload(missing, tmp_path / "o.so", archive_dir=tmp_path / "ar")
    assert str(missing) in str(e.value)
    art = tmp_path / "blas_lib_gfx942"
    art.mkdir()
    with pytest.raises(kpack.InputError) as e:
        kpack.split(artifact_dir=art, output_dir=tmp_path / "s")
    assert str(art) in str(e.value) and "artifact_manifest.txt" in str(e.value)
    with pytest.raises(kpack.InputError, match="nothing could be checked") as e:
        kpack.doctor(tmp_path / "nope", arch="gfx942")
    assert "nope" in str(e.value)


def test_a_failed_check_carries_its_report(tmp_path, fixtures, no_cli, kpack_cli):
    # An artifact directory with a manifest naming a prefix that is a fat
    # binary's tree: split works; then the generic artifact gets device
    # code back, which verify reports.
    art = tmp_path / "in" / "demo_gfx942"
    (art / "lib").mkdir(parents=True)
    (art / "lib" / "libvadd.so").write_bytes((fixtures / "libvadd.so").read_bytes())
    (art / "artifact_manifest.txt").write_text("lib\n")
    s = kpack.split(artifact_dir=art, output_dir=tmp_path / "out")
    assert s.failed == 0 and s.artifacts[0].artifact_prefix == "demo"
    # An empty target list filters nothing (as the flag left out).
    again = kpack.split(artifact_dir=art, output_dir=tmp_path / "out", gpu_targets=[], overwrite=True)
    assert again.artifacts[0].outputs == s.artifacts[0].outputs and again.gpu_targets is None
    assert kpack.verify(tmp_path / "out").problems == []
    generic = next((tmp_path / "out" / "demo_generic").rglob("libvadd.so"))
    generic.write_bytes((fixtures / "libvadd.so").read_bytes())
    with pytest.raises(kpack.VerificationError) as e:
        kpack.verify(tmp_path / "out")
    report = e.value.summary
    assert isinstance(report, kpack.VerifySummary) and report.problems
    code, cli = _cli_json(kpack_cli, "verify", "--artifacts-dir", tmp_path / "out")
    assert code == 1 and cli == report.to_dict()


def test_expected_targets_are_the_engines_check(tmp_path, fixtures, no_cli):
    # libvadd.so's targets pass; a target it has no code for is refused
    # naming it, before anything is written.
    art = tmp_path / "in" / "demo_gfx942"
    (art / "lib").mkdir(parents=True)
    (art / "lib" / "libvadd.so").write_bytes((fixtures / "libvadd.so").read_bytes())
    (art / "artifact_manifest.txt").write_text("lib\n")
    present = kpack.split(artifact_dir=art, output_dir=tmp_path / "ok").artifacts[0].outputs
    targets = [o[len("demo_"):] for o in present if o != "demo_generic"]
    s = kpack.split(artifact_dir=art, output_dir=tmp_path / "again", expect_targets=targets)
    assert s.artifacts[0].outputs == present
    assert kpack.verify(tmp_path / "again", expect_targets=targets).problems == []
    with pytest.raises(kpack.InputError, match="gfx1036") as e:
        kpack.split(artifact_dir=art, output_dir=tmp_path / "no", expect_targets=["gfx1036"])
    assert "partial" in str(e.value)
    assert not (tmp_path / "no").exists() or not any((tmp_path / "no").iterdir())
    with pytest.raises(kpack.InputError, match="gfx1036"):
        kpack.verify(tmp_path / "again", expect_targets=targets + ["gfx1036"])
    with pytest.raises(kpack.UsageError):
        kpack.split(artifact_dir=art, output_dir=tmp_path / "no", expect_targets=["not a target"])
