"""kpack's exceptions: one hierarchy under :class:`Error`.

The native extension maps every Rust error to one of these classes in one
place (``kpack-python/src/errors.rs``); the message is the one the ``kpack``
command prints after ``kpack: error:``. Each class also derives from the
builtin exception Python code already catches for that kind of problem::

    try:
        kpack.Archive("missing.kpack")
    except FileNotFoundError as e:     # kpack.NotFoundError is one
        print(e)
"""


class Error(Exception):
    """Base class of every error kpack raises."""


class UsageError(Error, ValueError):
    """Options or arguments that are wrong whatever the input (an unknown
    option, a zstd level out of range, an unknown database handler)."""


class InputError(Error, ValueError):
    """An input file that is not what the operation accepts."""


class ArchiveError(InputError):
    """A malformed ``.kpack`` archive, or a kernel that does not read back."""


class BinaryError(InputError):
    """A malformed host binary (ELF, PE), offload bundle or HIPK metadata."""


class NotFatBinaryError(InputError):
    """A binary without device code where a fat binary is needed."""


class FileError(Error, OSError):
    """An I/O error."""


class NotFoundError(FileError, FileNotFoundError):
    """A file or directory that does not exist."""


class PermissionDeniedError(FileError, PermissionError):
    """A file or directory kpack may not read or write."""


class OutputExistsError(FileError, FileExistsError):
    """An output that exists and is not replaced (pass ``overwrite=True``)."""


class VerificationError(Error):
    """A check that ran and failed (``verify``), or artifacts that failed
    to split. ``summary``, when set, is what the command reported."""

    summary = None


class HrxLimitWarning(UserWarning):
    """An archive written past a limit of ROCm's HRX runtime (a key over
    1,024 bytes, a target string over 64 bytes or 4 features, a code object
    over 256 MiB decompressed; docs/formats.md): it is valid and loads with
    kpack's runtime, but HRX's reader refuses it. Warned when an archive is
    finalized, as the ``kpack`` command warns for the archives it writes."""


__all__ = [
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
