"""The exception hierarchy and the error policy: every failure packer reports on purpose is a ``PackerError``.

The policy (what to raise, and what the CLI exits with):

========================  =====  ==============================================================
class                     exit   raised when
========================  =====  ==============================================================
``FormatError`` family    1      a dataset file breaks formats/SPEC.md (bad magic, version,
                                 header, index, manifest, path, checksum): the *data* is bad
``DecodeError``           1      stored image bytes cannot be decoded (damage, or a codec or
                                 format this reader cannot decode)
``OptionError``           2      an argument or option value is invalid (a codec option, a
                                 backend name, a seed, a worker count): the *call* is wrong;
                                 ``ClassListMismatchError`` (two class lists disagree),
                                 ``StateMismatchError`` (a saved reader position from another
                                 order or sample space), ``UnexpectedKeywordError`` (a
                                 keyword a reader never took; also a ``TypeError``) and
                                 ``UnsafeExportError`` (samples an export target cannot hold
                                 safely) and ``UnsupportedAttributeError`` (a name packer
                                 deliberately lacks, e.g. ``PackedDataset.samples``) are ones
``SourceError``           2      the build source cannot be used (missing, not a folder or
                                 manifest, no usable rows); ``EmptySourceError`` is one
``OutputExistsError``     2      a dataset exists and ``--overwrite`` was not given
``BuildError``            3      a build could not complete for a reason outside the input:
                                 I/O (disk full, permissions), a lock, a missing part
``MissingDependencyError`` 3     an optional dependency (torch, kvikio, DALI, Ray, the C
                                 extension) is not installed or cannot run here
``DirectIOUnsupportedError`` 3   the file system refuses ``O_DIRECT``
``GpuPathError``          3      a GPU path refused work it was asked to do: kvikio/cuFile
                                 cannot open a shard, or the GPU JPEG decoder (nvJPEG) failed
                                 with ``cpu_fallback="error"``
``DatasetChangedError``   3      the dataset was replaced while it was being read (locally, or
                                 a new manifest generation in object storage)
``RemoteStoreError``      3      object storage failed for good: a permanent answer (404, 403)
                                 or transient failures past the retries or deadline; names the
                                 object and the byte range
========================  =====  ==============================================================

Rules: a library function never lets a ``ValueError``, ``KeyError``, ``IndexError`` or a numpy
error escape for bad input; it raises the class above, naming the file, sample or option and
what was expected. One bad source image is never an exception at all: the build rejects it with
a reason (``RejectedImageError`` carries the reason inside the build). Errors keep their class
and fields across processes (``__reduce__``), so a DataLoader or build worker's error reaches
the caller intact.
"""

from __future__ import annotations

__all__ = [
    "PackerError",
    "FormatError",
    "NotAPackerFileError",
    "UnsupportedVersionError",
    "TruncatedFileError",
    "CorruptHeaderError",
    "OffsetOutOfBoundsError",
    "OverlappingRecordsError",
    "MisalignedRecordError",
    "UnsafePathError",
    "ManifestError",
    "ChecksumMismatchError",
    "IndexMismatchError",
    "DatasetChangedError",
    "OptionError",
    "ClassListMismatchError",
    "StateMismatchError",
    "UnexpectedKeywordError",
    "UnsafeExportError",
    "UnsupportedAttributeError",
    "SampleIndexError",
    "SampleIndexTypeError",
    "SampleKeyError",
    "SourceError",
    "EmptySourceError",
    "OutputExistsError",
    "BuildError",
    "BuildLockedError",
    "DecodeError",
    "MissingDependencyError",
    "RejectedImageError",
    "DirectIOUnsupportedError",
    "GpuPathError",
    "RemoteStoreError",
]


class PackerError(Exception):
    """Root of every error packer raises on purpose.

    Attributes:
        path: the file the error is about, when known.
        sample: the sample index, when known.
        offset: the byte offset, when known.
    """

    #: Exit code the CLI uses for this error class (see ``packer.cli``).
    exit_code = 3

    def __init__(self, message: str, *, path: object = None, sample: int | None = None,
                 offset: int | None = None) -> None:
        self.path = None if path is None else str(path)
        self.sample = sample
        self.offset = offset
        where = []
        if self.path is not None:
            where.append(self.path)
        if sample is not None:
            where.append(f"sample {sample}")
        if offset is not None:
            where.append(f"offset {offset}")
        self.message = message
        super().__init__(f"{': '.join([', '.join(where), message]) if where else message}")

    def __reduce__(self) -> tuple[object, ...]:
        # Errors cross process boundaries (build workers, DataLoader workers) intact: the place and
        # message rebuild the text; every other attribute a subclass sets (a rejection's reason, an
        # export refusal's counts) travels as the instance's state.
        state = {name: value for name, value in vars(self).items() if name not in _PLACE}
        return (_rebuild_error, (type(self), self.message, self.path, self.sample, self.offset), state or None)


_PLACE = ("message", "path", "sample", "offset")


def _rebuild_error(cls: type, message: str, path: object, sample: int | None, offset: int | None) -> "PackerError":
    error = cls.__new__(cls)
    PackerError.__init__(error, message, path=path, sample=sample, offset=offset)
    return error


class FormatError(PackerError):
    """A dataset file does not follow the format specification (formats/SPEC.md)."""

    exit_code = 1


class NotAPackerFileError(FormatError):
    """The file does not start with the expected magic (a different kind of file)."""


class UnsupportedVersionError(FormatError):
    """The file's format version is not one this reader accepts."""


class TruncatedFileError(FormatError):
    """The file is shorter (or longer) than its header says."""


class CorruptHeaderError(FormatError):
    """A header field holds a value the specification forbids."""


class OffsetOutOfBoundsError(FormatError):
    """A record points outside its file."""


class OverlappingRecordsError(FormatError):
    """Records are unsorted, overlap, or leave gaps the specification forbids."""


class MisalignedRecordError(FormatError):
    """A record does not start at a multiple of the dataset alignment."""


class UnsafePathError(FormatError):
    """A path stored in a dataset (or a source manifest) would leave its root folder."""


class ManifestError(FormatError):
    """The manifest JSON is missing, malformed, or contradicts the index/shards."""


class IndexMismatchError(FormatError):
    """The index disagrees with the manifest or the shards (counts, sizes)."""


class ChecksumMismatchError(FormatError):
    """Stored bytes do not match their recorded checksum: the data is damaged."""


class DatasetChangedError(PackerError):
    """The dataset was replaced (rebuilt with --overwrite) while a reader was using it."""


class OptionError(PackerError, ValueError):
    """An argument or option value is invalid; the message names it and what is allowed.

    Also a ``ValueError``, which is what Python code expects of a bad argument.
    """

    exit_code = 2


class ClassListMismatchError(OptionError):
    """Two datasets (or a dataset and a given list) disagree on the class list: labels would mean
    different classes. The message names what is missing, extra or renumbered."""


class StateMismatchError(OptionError):
    """A saved reader position (``state_dict``) was made with another order or sample space (order
    kind, seed, window, dataset size, block layout, mixture): resuming would read other samples.
    The message names the key that differs, its saved value and this reader's."""


class UnsafeExportError(OptionError):
    """Some selected samples cannot be exported safely to the chosen target: a name that is not
    safe there, two samples on one path or key, or a value a build would not read back. Nothing
    was written; ``--skip-unsafe`` exports the others. ``skipped`` counts them by reason,
    ``examples`` names the first ``(key, reason, message)``."""

    def __init__(self, message: str, *, skipped: dict[str, int] | None = None,
                 examples: list[tuple[str, str, str]] | None = None, **where: object) -> None:
        super().__init__(message, **where)  # type: ignore[arg-type]
        self.skipped = dict(skipped or {})
        self.examples = list(examples or [])


class UnsupportedAttributeError(OptionError, AttributeError):
    """A name another library's object has (torchvision's ``ImageFolder.samples``) that packer
    deliberately does not provide; the message says what to use instead. Also an
    ``AttributeError``, so ``hasattr`` and ``getattr(obj, name, default)`` behave as usual."""


class SampleIndexError(OptionError, IndexError):
    """A sample (or batch) index outside the dataset; the message says the range there is.

    Also an ``IndexError``, so a loop over ``dataset[i]`` ends where Python's sequence protocol
    expects, and ``except IndexError`` keeps working."""


class SampleIndexTypeError(OptionError, TypeError):
    """Sample indices that are not integers (a float, a string, a bool mask): ``1.7`` must not
    quietly read sample 1. Also a ``TypeError``, what Python's sequences raise for such an index."""


class UnexpectedKeywordError(OptionError, TypeError):
    """A keyword argument a reader never took (a typo, or an option of another reader), caught
    where a reader takes the old spellings of its options as ``**kwargs``. Also a ``TypeError``,
    with Python's own message for an unexpected keyword argument."""


class SampleKeyError(OptionError, KeyError):
    """No sample has the key asked for (``Dataset.find``). ``key`` is the key as given.

    Also a ``KeyError``, so ``except KeyError`` keeps working; its text is the message, not the
    ``repr`` a plain ``KeyError`` shows."""

    __str__ = Exception.__str__  # KeyError's own __str__ would quote the whole message

    def __init__(self, message: str, *, key: object = None, **where: object) -> None:
        super().__init__(message, **where)  # type: ignore[arg-type]
        self.key = key


class SourceError(PackerError):
    """The build source (image folder or manifest) cannot be used."""

    exit_code = 2


class EmptySourceError(SourceError):
    """The source holds no candidate image files."""


class OutputExistsError(PackerError):
    """The output folder already holds a dataset and --overwrite was not given."""

    exit_code = 2


class BuildError(PackerError):
    """The build could not complete; nothing that opens as a dataset was left behind."""


class BuildLockedError(BuildError):
    """Another build holds the output folder."""


class DirectIOUnsupportedError(PackerError):
    """The file system holding the dataset refuses ``O_DIRECT``; use another backend."""

    exit_code = 3


class GpuPathError(PackerError):
    """A GPU path (kvikio/cuFile reads, nvJPEG decodes) could not do what it was asked here."""

    exit_code = 3


class DecodeError(PackerError):
    """An image's bytes could not be decoded."""

    exit_code = 1


class RemoteStoreError(PackerError):
    """Object storage could not deliver (or store) an object or a range, after its retries."""

    exit_code = 3


class MissingDependencyError(PackerError):
    """An optional dependency is not installed; the message names the extra to install."""

    exit_code = 3


class RejectedImageError(DecodeError):
    """A source file is not a usable image; ``reason`` is the build report's short code.

    Reasons: ``empty-file``, ``not-an-image``, ``unsupported-format``, ``truncated``,
    ``decode-failed``, ``too-many-pixels``.
    """

    def __init__(self, reason: str, message: str, **where: object) -> None:
        super().__init__(message, **where)
        self.reason = reason
