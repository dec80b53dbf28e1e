"""kpack's Python API: ``.kpack`` archives and kpack's operations, backed
by kpack's Rust crates (the native extension ``kpack._native``).

Reading an archive::

    >>> import kpack
    >>> with kpack.Archive("out/.kpack/libfoo_gfx942.kpack") as a:   # doctest: +SKIP
    ...     code = a["libfoo.so#0", "gfx942"]

Running an operation (the ``kpack`` command's options as keyword
arguments, its JSON summary as the result)::

    >>> s = kpack.offload("libfoo.so", "out/libfoo.so", archive_dir="out/.kpack")  # doctest: +SKIP
    >>> s.outcome                                                                    # doctest: +SKIP
    'offloaded'

Errors are :class:`kpack.Error` subclasses carrying the command's message.
The reference package's API is ``rocm_kpack`` (same wheel). See
docs/python.md.
"""

from ._errors import (
    ArchiveError,
    BinaryError,
    Error,
    FileError,
    HrxLimitWarning,
    InputError,
    NotFatBinaryError,
    NotFoundError,
    OutputExistsError,
    PermissionDeniedError,
    UsageError,
    VerificationError,
)
from ._native import __version__
from ._archive import Archive, Entry
from ._api import (
    DoctorSummary,
    OffloadSummary,
    PackTreeSummary,
    SplitSummary,
    Summary,
    VerifySummary,
    WheelSummary,
    doctor,
    offload,
    pack_tree,
    run,
    split,
    split_wheels,
    verify,
)

__all__ = [
    "__version__",
    "Archive",
    "Entry",
    "offload",
    "split",
    "pack_tree",
    "split_wheels",
    "verify",
    "doctor",
    "run",
    "Summary",
    "OffloadSummary",
    "SplitSummary",
    "PackTreeSummary",
    "WheelSummary",
    "VerifySummary",
    "DoctorSummary",
    "Error",
    "UsageError",
    "InputError",
    "ArchiveError",
    "BinaryError",
    "NotFatBinaryError",
    "FileError",
    "NotFoundError",
    "PermissionDeniedError",
    "OutputExistsError",
    "VerificationError",
    "HrxLimitWarning",
]
