"""kpack's operations as functions: the ``kpack`` command's options as
keyword arguments, its ``--json`` summary as the result.

Each function calls kpack's engine through the native extension
(``kpack-python/src/ops.rs``: typed options, the GIL released; the
command line is not involved) and returns a :class:`Summary`, the same
data ``kpack ... --json`` prints; a failure raises the :class:`kpack.Error`
subclass for it, with the command's message. Outputs are atomic;
``durable=True`` (or ``KPACK_DURABLE=1`` in the environment) also fsyncs
them all before the function returns (``--durable``). :func:`run` runs a
command line instead, as the ``kpack`` command does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Iterator, List, Optional, Sequence, Union

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
    """Run the command line ``kpack ARGS --json`` in-process (as the
    ``kpack`` command does) and return its summary; raise its error. For
    the commands without a function here: ``kpack.run(["ls", "x.kpack"])``."""
    text, error = _native.run_captured([os.fspath(a) for a in args] + ["--json"])
    result = summary(json.loads(text)) if text is not None else None
    if error is not None:
        if isinstance(error, VerificationError):
            error.summary = result
        raise error
    if result is None:
        raise RuntimeError(f"kpack {' '.join(map(str, args))}: no summary")
    return result


def _strs(values: Any) -> List[str]:
    """A list of strings from one value or several (paths too)."""
    if isinstance(values, (str, bytes, os.PathLike)):
        values = [values]
    return [v if isinstance(v, str) else os.fsdecode(os.fspath(v)) for v in values]


def _call(op: Any, summary: type, args: dict) -> Summary:
    """Call the native operation ``op`` with the function's arguments
    (lists of strings normalized); its summary as ``summary``, and so is
    the summary a :class:`VerificationError` carries."""
    kw = {k: (_strs(v) if k in _LISTS and v is not None else v) for k, v in args.items()}
    try:
        return summary(op(kw))
    except VerificationError as e:
        if isinstance(e.summary, (dict, list)):
            e.summary = summary(e.summary)
        raise


# The arguments that take one value or several.
_LISTS = {
    "search_paths", "extra_search_paths", "split_databases", "gpu_targets", "gfx_arches",
    "device_requires_dist", "databases", "paths", "arch", "expect_targets",
}


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
    return _call(_native.offload, OffloadSummary, locals())  # type: ignore[return-value]


def split(
    *,
    output_dir: PathLike,
    artifact_dir: Optional[PathLike] = None,
    artifact_prefix: Optional[str] = None,
    batch_artifact_parent_dir: Optional[PathLike] = None,
    split_databases: Sequence[str] = (),
    gpu_targets: Optional[Sequence[str]] = None,
    expect_targets: Optional[Sequence[str]] = None,
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
    or ``batch_artifact_parent_dir``. ``expect_targets`` (as
    ``--expect-targets``) raises :class:`kpack.InputError`, before writing
    anything, when the input has no code object for one of those targets.
    Failed artifacts (with
    ``keep_going``) raise :class:`kpack.VerificationError` whose
    ``summary`` says which::

        >>> s = kpack.split(artifact_dir="blas_lib_gfx110X-dgpu", output_dir="out")  # doctest: +SKIP
        >>> s.artifacts[0].outputs                                                     # doctest: +SKIP
        ['blas_lib_generic', 'blas_lib_gfx1100', 'blas_lib_gfx1101']
    """
    return _call(_native.split, SplitSummary, locals())  # type: ignore[return-value]


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
    return _call(_native.pack_tree, PackTreeSummary, locals())  # type: ignore[return-value]


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
    expect_targets: Optional[Sequence[str]] = None,
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
    return _call(_native.split_wheels, WheelSummary, locals())  # type: ignore[return-value]


def verify(
    artifacts_dir: PathLike,
    *,
    config: Optional[PathLike] = None,
    split_databases: Sequence[str] = (),
    expect_targets: Optional[Sequence[str]] = None,
    jobs: Optional[int] = None,
) -> VerifySummary:
    """Check split (or recombined) artifacts (``kpack verify``); problems
    raise :class:`kpack.VerificationError` with the report as
    ``summary``."""
    return _call(_native.verify, VerifySummary, locals())  # type: ignore[return-value]


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
    args = {"paths": paths, "arch": [] if arch is None else arch, "sysfs_root": sysfs_root}
    return _call(_native.doctor, DoctorSummary, args)  # type: ignore[return-value]
