"""kpack's operations as functions: the ``kpack`` command's options as
keyword arguments, its ``--json`` summary as the result.

Each function runs the command in-process (kpack-cli, with the GIL
released) and returns a :class:`Summary`; a failure raises the
:class:`kpack.Error` subclass for it, with the command's message. Outputs
are atomic; ``durable=True`` (or ``KPACK_DURABLE=1`` in the environment)
also fsyncs them all before the function returns (``--durable``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Union

from . import _native
from ._errors import VerificationError

PathLike = Union[str, "os.PathLike[str]"]


class Summary(Mapping):
    """A command's JSON summary: a read-only mapping whose keys are also
    attributes (nested maps are summaries too, lists are lists)::

        >>> s = kpack.offload("libfoo.so", "out/libfoo.so", archive_dir="out/.kpack")  # doctest: +SKIP
        >>> s.outcome, s.input_size, s.archives[0].path                                  # doctest: +SKIP
        ('offloaded', 1052672, 'out/.kpack/libfoo_gfx942.kpack')

    ``dict(summary)`` or :meth:`to_dict` gives plain data (as ``kpack ...
    --json`` prints it).
    """

    __slots__ = ("_data",)

    def __init__(self, data: dict) -> None:
        object.__setattr__(self, "_data", data)

    def __getitem__(self, key: str) -> Any:
        return _wrap(self._data[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __getattr__(self, name: str) -> Any:
        try:
            return _wrap(self._data[name])
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("summaries are read-only")

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | set(self._data))

    def to_dict(self) -> dict:
        """The summary as plain data (a deep copy)."""
        return json.loads(json.dumps(self._data))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._data!r})"


class OffloadSummary(Summary):
    """What :func:`offload` did: ``outcome`` (``offloaded``,
    ``already_offloaded``, ``link_input``, ``debug_only``), ``input_size``,
    ``output_size``, ``kernel_name``, ``search_paths``, ``bundles``,
    ``wrappers``, ``archives`` (``path``, ``target``, ``kernels``,
    ``bytes_in``, ``bytes_out``, ...), ``note``."""


class SplitSummary(Summary):
    """What :func:`split` did: ``artifacts`` (one per input artifact:
    ``input``, ``artifact_prefix``, ``status``, ``outputs``, the counts,
    ``error``), ``totals``, ``failed``, ``skipped_directories``,
    ``seconds``."""


class PackTreeSummary(Summary):
    """What :func:`pack_tree` did: ``input``, ``output``, the counts
    (``files``, ``binaries``, ``code_objects``, ``bytes_in``,
    ``bytes_out``, ...) and ``archives`` (``path``, ``code_objects``,
    ``bytes_in``, ``bytes_out``)."""


class WheelSummary(Summary):
    """What :func:`split_wheels` did: ``fat_binaries``, ``architectures``,
    ``host`` (``path``, ...), ``variant``, ``devices`` (``bundle_key``,
    ``wheel``)."""


class VerifySummary(Summary):
    """What :func:`verify` found: ``problems`` (empty when all is well),
    ``artifacts``, ``archives``, ``code_objects``, ``wrappers_resolved``,
    ``targets``."""


class DoctorSummary(Summary):
    """What :func:`doctor` found: ``targets`` (the GPU targets checked),
    ``problems`` (each with ``binary``, ``target``, ``message``, ``fix`` and
    ``kind``; empty when every binary resolves), ``binaries``,
    ``offloaded``, ``archives``."""


def _wrap(v: Any) -> Any:
    if isinstance(v, dict):
        return Summary(v)
    if isinstance(v, list):
        return [_wrap(x) for x in v]
    return v


def run(args: Sequence[str], summary: type = Summary) -> Summary:
    """Run ``kpack ARGS --json`` in-process and return its summary; raise
    its error. The lowest-level entry: ``kpack.run(["ls", "x.kpack"])``."""
    text, error = _native.run_captured([os.fspath(a) for a in args] + ["--json"])
    result = summary(json.loads(text)) if text is not None else None
    if error is not None:
        if isinstance(error, VerificationError):
            error.summary = result
        raise error
    if result is None:
        raise RuntimeError(f"kpack {' '.join(map(str, args))}: no summary")
    return result


class _Args:
    """Build a command line from keyword arguments."""

    def __init__(self, *words: Any) -> None:
        self.argv: List[str] = [os.fspath(w) if not isinstance(w, str) else w for w in words]

    def opt(self, flag: str, value: Any) -> "_Args":
        if value is not None:
            self.argv += [flag, os.fspath(value) if not isinstance(value, (str, int)) else str(value)]
        return self

    def flag(self, flag: str, on: bool) -> "_Args":
        if on:
            self.argv.append(flag)
        return self

    def many(self, flag: str, values: Optional[Iterable[Any]], *, empty_ok: bool = False) -> "_Args":
        """``--flag v1 v2 ...`` (with ``empty_ok``, a given empty list is
        ``--flag`` alone)."""
        if values is None:
            return self
        values = [str(os.fspath(v)) for v in _listify(values)]
        if values or empty_ok:
            self.argv += [flag, *values]
        return self

    def repeat(self, flag: str, values: Optional[Iterable[Any]]) -> "_Args":
        """``--flag v1 --flag v2``."""
        for v in _listify(values or []):
            self.argv += [flag, str(os.fspath(v))]
        return self

    def common(self, jobs: Optional[int], compression: str, compression_level: int, verbose: bool) -> "_Args":
        return (
            self.opt("--jobs", jobs)
            .opt("--compression", compression)
            .opt("--compression-level", compression_level)
            .flag("--verbose", verbose)
        )


def _listify(values: Any) -> list:
    if isinstance(values, (str, bytes, os.PathLike)):
        return [values]
    return list(values)


def offload(
    input: PathLike,
    output: PathLike,
    *,
    archive_dir: PathLike,
    kernel_name: Optional[str] = None,
    search_paths: Sequence[str] = (),
    extra_search_paths: Sequence[str] = (),
    group: Optional[str] = None,
    compression: str = "zstd",
    compression_level: int = 3,
    durable: bool = False,
) -> OffloadSummary:
    """Move the device code of the fat binary ``input`` into
    ``archive_dir/<group>_<target>.kpack`` archives and write the host-only
    binary ``output`` (``kpack offload``)::

        >>> s = kpack.offload("libfoo.so", "out/libfoo.so", archive_dir="out/.kpack")  # doctest: +SKIP
        >>> [a.path for a in s.archives]                                                 # doctest: +SKIP
        ['out/.kpack/libfoo_gfx1100.kpack', 'out/.kpack/libfoo_gfx942.kpack']
    """
    a = (
        _Args("offload", input, "--output", output, "--archive-dir", archive_dir)
        .opt("--kernel-name", kernel_name)
        .repeat("--search-path", search_paths)
        .repeat("--extra-search-path", extra_search_paths)
        .opt("--group", group)
        .opt("--compression", compression)
        .opt("--compression-level", compression_level)
        .flag("--durable", durable)
    )
    return run(a.argv, OffloadSummary)  # type: ignore[return-value]


def split(
    *,
    output_dir: PathLike,
    artifact_dir: Optional[PathLike] = None,
    artifact_prefix: Optional[str] = None,
    batch_artifact_parent_dir: Optional[PathLike] = None,
    split_databases: Sequence[str] = (),
    gpu_targets: Optional[Sequence[str]] = None,
    jobs: Optional[int] = None,
    compression: str = "zstd",
    compression_level: int = 3,
    keep_going: bool = False,
    overwrite: bool = False,
    tmp_dir: Optional[PathLike] = None,
    verbose: bool = False,
    durable: bool = False,
) -> SplitSummary:
    """Split TheRock build artifacts into ``<prefix>_generic`` and
    ``<prefix>_<target>`` artifacts (``kpack split``); give ``artifact_dir``
    or ``batch_artifact_parent_dir``. Failed artifacts (with
    ``keep_going``) raise :class:`kpack.VerificationError` whose
    ``summary`` says which::

        >>> s = kpack.split(artifact_dir="blas_lib_gfx110X-dgpu", output_dir="out")  # doctest: +SKIP
        >>> s.artifacts[0].outputs                                                     # doctest: +SKIP
        ['blas_lib_generic', 'blas_lib_gfx1100', 'blas_lib_gfx1101']
    """
    a = (
        _Args("split", "--output-dir", output_dir)
        .opt("--artifact-dir", artifact_dir)
        .opt("--artifact-prefix", artifact_prefix)
        .opt("--batch-artifact-parent-dir", batch_artifact_parent_dir)
        .many("--split-databases", split_databases)
        .many("--gpu-targets", gpu_targets)
        .common(jobs, compression, compression_level, verbose)
        .flag("--keep-going", keep_going)
        .flag("--overwrite", overwrite)
        .opt("--tmp-dir", tmp_dir)
        .flag("--durable", durable)
    )
    return run(a.argv, SplitSummary)  # type: ignore[return-value]


def pack_tree(
    input: PathLike,
    output: PathLike,
    *,
    group_name: str,
    gfx_arch_family: Optional[str] = None,
    gfx_arches: Sequence[str] = (),
    jobs: Optional[int] = None,
    compression: str = "zstd",
    compression_level: int = 3,
    overwrite: bool = False,
    tmp_dir: Optional[PathLike] = None,
    verbose: bool = False,
    durable: bool = False,
) -> PackTreeSummary:
    """Pack a whole install tree into a host-only tree plus
    ``.kpack/<group_name>_<target>.kpack`` archives (``kpack pack-tree``)::

        >>> s = kpack.pack_tree("install", "packed", group_name="rocm")  # doctest: +SKIP
        >>> s.binaries, [a.path for a in s.archives]                      # doctest: +SKIP
        (12, ['packed/.kpack/rocm_gfx942.kpack'])
    """
    a = (
        _Args("pack-tree", "--input", input, "--output", output, "--group-name", group_name)
        .opt("--gfx-arch-family", gfx_arch_family)
        .many("--gfx-arches", gfx_arches)
        .common(jobs, compression, compression_level, verbose)
        .flag("--overwrite", overwrite)
        .opt("--tmp-dir", tmp_dir)
        .flag("--durable", durable)
    )
    return run(a.argv, PackTreeSummary)  # type: ignore[return-value]


def split_wheels(
    input: PathLike,
    output_dir: PathLike,
    *,
    device_package_prefix: str,
    overlay_root: str,
    device_requires_dist: Optional[Sequence[str]] = None,
    output_format: str = "wheel",
    wheel_type: Optional[str] = None,
    databases: Optional[Sequence[str]] = None,
    compression: str = "zstd",
    compression_level: int = 3,
    tmp_dir: Optional[PathLike] = None,
    jobs: Optional[int] = None,
    generate_variant_wheel: bool = False,
    variant_label: Optional[str] = None,
    verbose: bool = False,
    durable: bool = False,
) -> WheelSummary:
    """Split a wheel whose package carries fat binaries into a host wheel
    and one device wheel per GPU bundle (``kpack split-wheels``)::

        >>> s = kpack.split_wheels("torch-2.10.0-cp311-cp311-linux_x86_64.whl", "out",   # doctest: +SKIP
        ...                        device_package_prefix="amd-torch-device",
        ...                        overlay_root="torch/", wheel_type="torch-fat")
        >>> s.host.path, [d.bundle_key for d in s.devices]                                # doctest: +SKIP
        ('out/torch-2.10.0-cp311-cp311-linux_x86_64.whl', ['gfx1100', 'gfx942'])
    """
    a = (
        _Args(
            "split-wheels",
            "--input",
            input,
            "--output-dir",
            output_dir,
            "--device-package-prefix",
            device_package_prefix,
            "--overlay-root",
            overlay_root,
        )
        .many("--device-requires-dist", device_requires_dist)
        .opt("--output-format", output_format)
        .opt("--wheel-type", wheel_type)
        .many("--databases", databases, empty_ok=True)
        .opt("--compression", compression)
        .opt("--compression-level", compression_level)
        .opt("--tmp-dir", tmp_dir)
        .opt("--jobs", jobs)
        .flag("--generate-variant-wheel", generate_variant_wheel)
        .opt("--variant-label", variant_label)
        .flag("--verbose", verbose)
        .flag("--durable", durable)
    )
    return run(a.argv, WheelSummary)  # type: ignore[return-value]


def verify(
    artifacts_dir: PathLike,
    *,
    config: Optional[PathLike] = None,
    split_databases: Sequence[str] = (),
    jobs: Optional[int] = None,
) -> VerifySummary:
    """Check split (or recombined) artifacts (``kpack verify``); problems
    raise :class:`kpack.VerificationError` with the report as
    ``summary``."""
    a = (
        _Args("verify", "--artifacts-dir", artifacts_dir)
        .opt("--config", config)
        .many("--split-databases", split_databases)
        .opt("--jobs", jobs)
    )
    return run(a.argv, VerifySummary)  # type: ignore[return-value]


def doctor(
    *paths: PathLike,
    arch: Optional[Union[str, Sequence[str]]] = None,
    sysfs_root: Optional[PathLike] = None,
) -> DoctorSummary:
    """What keeps the GPU code under ``paths`` (a site-packages, an install
    prefix, an application folder, files) from loading on this machine's
    GPUs, or on the targets ``arch`` names (``kpack doctor``). Problems are
    returned, not raised: ``summary.problems`` is empty when every
    offloaded binary resolves for every target::

        >>> s = kpack.doctor(site.getsitepackages()[0])                      # doctest: +SKIP
        >>> [(p.binary, p.fix) for p in s.problems]                           # doctest: +SKIP
        [('.../torch/lib/libtorch_hip.so', 'pip install "torch[device-gfx1151]"')]

    Nothing to check (no GPU and no ``arch``, a path that does not exist)
    raises :class:`kpack.InputError`.
    """
    if not paths:
        raise TypeError("doctor() needs at least one path")
    a = _Args("doctor", *paths).repeat("--arch", arch).opt("--sysfs-root", sysfs_root)
    try:
        return run(a.argv, DoctorSummary)  # type: ignore[return-value]
    except VerificationError as e:
        if e.summary is None:
            raise
        return e.summary  # type: ignore[return-value]
