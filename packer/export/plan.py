"""Where every exported sample goes, and whether a build reads it back, decided before a byte is written.

``SampleNamer.entries(i)`` gives sample ``i``'s output entries (the image first, then its side
files or WebDataset members), the one naming rule every target writes by; ``plan_export`` walks
the selected samples once and keeps a sample only if all of these hold:

1. **Safe names** (``unsafe-name``). Every entry is a relative path of components that are not
   empty, ``.`` or ``..``, hold no NUL (or ``/``: it separates them), do not start with ``.``
   (a build skips hidden names), are at most ``MAX_COMPONENT_BYTES`` bytes, in a path of at most
   ``MAX_PATH_BYTES``; a class folder is a valid component (and valid Unicode). In an archive
   (tar, WebDataset) a name holds no ``\\`` and does not start with a drive (``C:/``): archive
   readers turn those into other paths.
2. **Unique names** (``name-collision``). No two entries of the export share a path, no entry is
   also a folder of another's path, a sample's own side file never takes its image's name
   (``a.json``, ``b.mask.png``), and where files are grouped into samples by key (WebDataset
   always, folders and tars of a dataset with declared fields) no two samples share a key (the
   path up to the first ``.`` of the file name, ``sources/sidefiles.py``).
3. **One label per class folder** (``label-collision``, folder and tar): a folder build labels a
   file by its first folder, so a folder may not hold samples of two labels (an unlabeled
   sample's own folder named like a class).
4. **Read back as written** (``unrepresentable``). Where files are grouped, the build's own rule
   (``sources.sidefiles.assemble_sample``) is run on the entries: it must take the image entry as
   the image, each image field from its side file, and give each value field exactly the stored
   value (so a NaN, which strict JSON cannot hold, a text that a text member would lose, or an
   image field whose format has no image extension, are found here). Without fields, a
   WebDataset image needs an image extension and a tar image must not end in ``.json``,
   ``.txt`` or ``.cls`` (a build would read the tar as WebDataset).

The first sample (in dataset order) to use a name keeps it; later ones are the collisions.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from .. import format as fmt
from ..errors import IndexMismatchError, OptionError
from ..fields import FieldSpec, FieldValueError, decode_value
from .._internal.names import ESCAPED_FIELD, unescape_key
from ..sources.fieldvalues import FieldRowBuilder
from ..sources.sidefiles import (IMAGE_EXTENSIONS, TEXT_EXTENSIONS, SideMember, assemble_sample, extension,
                                 read_limit, split_key)

__all__ = ["Target", "TARGETS", "Entry", "SampleEntries", "SampleNamer", "ExportPlan", "plan_export",
           "SKIP_REASONS", "MAX_COMPONENT_BYTES", "MAX_PATH_BYTES", "name_problem"]

#: Longest component of an exported name (NAME_MAX of every common file system).
MAX_COMPONENT_BYTES = 255
#: Longest exported path (PATH_MAX less its NUL), so an extracted tar fits on any file system.
MAX_PATH_BYTES = 4095

#: Why a sample is not exported (the ``skipped`` counts of ``ExportResult``).
SKIP_REASONS = {
    "unsafe-name": "a name the target cannot hold safely (empty, '.', '..', NUL, hidden, too long, ...)",
    "name-collision": "the same path, folder or sample key as another exported sample, or as its own side file",
    "label-collision": "a class folder that would hold samples of two labels",
    "unrepresentable": "the target cannot hold the sample so that a build reads it back as it is",
}

#: Image format -> the extension its side file is written with (a build finds image fields by it).
_FORMAT_EXTENSIONS = {"jpeg": "jpg", "png": "png", "webp": "webp", "gif": "gif", "bmp": "bmp", "tiff": "tif",
                      "ppm": "ppm", "jpeg2000": "jp2", "avif": "avif", "heif": "heif", "tga": "tga", "ico": "ico",
                      "qoi": "qoi", "psd": "psd"}
_DRIVE = re.compile(rb"^[A-Za-z]:/")


@dataclass(frozen=True)
class Target:
    """The naming rules of one export target.

    Attributes:
        name: ``folder``, ``tar`` or ``webdataset``.
        class_folders: the label is the first folder of the path (a folder build's rule).
        archive: names go into tar members.
        webdataset: samples are WebDataset member groups (``.cls`` label, ``.json``/``.txt``).
    """

    name: str
    class_folders: bool
    archive: bool
    webdataset: bool


TARGETS = {
    "folder": Target("folder", class_folders=True, archive=False, webdataset=False),
    "tar": Target("tar", class_folders=True, archive=True, webdataset=False),
    "webdataset": Target("webdataset", class_folders=False, archive=True, webdataset=True),
}


@dataclass
class Entry:
    """One exported file (or archive member) of a sample.

    Attributes:
        name: its relative path, as bytes (a name that was not UTF-8 keeps its original bytes).
        body: its bytes; None for the sample's image (``field`` None) or an image field's
            payload (``field`` its name), read from the shards when written.
        field: the image field whose payload this is.
    """

    name: bytes
    body: bytes | None = None
    field: str | None = None


@dataclass
class SampleEntries:
    """Sample ``row``'s entries (the image first), or why it cannot be exported (``problem``:
    ``(reason, message)``, a ``SKIP_REASONS`` key)."""

    row: int
    key: str
    label: int
    entries: list[Entry] = field(default_factory=list)
    problem: tuple[str, str] | None = None


def _component_problem(part: bytes) -> str | None:
    if part in (b"", b".", b".."):
        return f"{'an empty' if not part else repr(os.fsdecode(part))} path component"
    if b"\x00" in part:
        return "a NUL byte"
    if part.startswith(b"."):
        return f"the hidden component {os.fsdecode(part)!r} (a build skips names starting with '.')"
    if len(part) > MAX_COMPONENT_BYTES:
        return f"a component of {len(part)} bytes (at most {MAX_COMPONENT_BYTES})"
    return None


def name_problem(name: bytes, *, archive: bool) -> str | None:
    """Why ``name`` cannot be an exported path (rule 1 of the module docstring), or None."""
    if not name:
        return "an empty name"
    if name.startswith(b"/"):
        return "an absolute path"
    if len(name) > MAX_PATH_BYTES:
        return f"a path of {len(name)} bytes (at most {MAX_PATH_BYTES})"
    for part in name.split(b"/"):
        problem = _component_problem(part)
        if problem is not None:
            return problem
    if archive and b"\\" in name:
        return "a backslash (archive readers take it for a folder separator)"
    if archive and _DRIVE.match(name):
        return "a drive-letter start (archive readers take it for an absolute path)"
    return None


def _group_key(name: bytes) -> bytes:
    """A name's key in the side-file rule: its path up to the first dot of its file name."""
    folder, _, base = name.rpartition(b"/")
    return (folder + b"/" if folder else b"") + base.partition(b".")[0]


def _json_bytes(value: Any) -> bytes:
    """Strict JSON (what a build reads side files as); ValueError for NaN and infinities."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False).encode("utf-8")


def _text_member_safe(text: str) -> bool:
    """Whether a text member gives ``text`` back (a build strips line ends and a leading BOM)."""
    return not text.endswith(("\r", "\n")) and not text.startswith("\ufeff")


class SampleNamer:
    """Sample entries for one dataset and target (module docstring): the one naming rule.

    Args:
        dataset: an open ``packer.dataset.Dataset``.
        target: one of ``TARGETS``.
    """

    def __init__(self, dataset: Any, target: Target) -> None:
        self.ds = dataset
        self.target = target
        self.classes: tuple[str, ...] = dataset.classes
        self.specs: tuple[FieldSpec, ...] = dataset.fields
        self.grouped = target.webdataset or bool(self.specs)
        self._builder = FieldRowBuilder(self.specs) if self.specs else None
        self._format_column = {spec.name: dataset.index.field_columns[spec.image_column("format")]
                               for spec in self.specs if spec.kind == "image"}
        self._size_column = {spec.name: dataset.index.field_columns[spec.image_column("size")]
                             for spec in self.specs if spec.kind == "image"}

    # --- names ---
    def class_folder(self, label: int) -> str:
        if self.classes and 0 <= label < len(self.classes):
            return self.classes[label]
        return "unlabeled" if label == -1 else str(label)

    def main_name(self, key: str, name: bytes, label: int) -> tuple[bytes | None, str]:
        """The image's path, or ``(None, why)``. A folder build's key already starts with its class
        folder and is kept; any other key goes under its class folder (a rebuild takes the first
        folder as the class), and an unlabeled key that has a folder keeps it."""
        if not self.target.class_folders:
            return name, ""
        folder = self.class_folder(label)
        if b"/" in name and (label == -1 or key.split("/", 1)[0] == folder):
            return name, ""
        try:
            folder_bytes = folder.encode("utf-8")
        except UnicodeEncodeError:
            return None, f"its class name {folder!r} is not valid Unicode"
        problem = _component_problem(folder_bytes) or ("a '/'" if b"/" in folder_bytes else None)
        if problem is not None:
            return None, f"its class name {folder!r} cannot be a folder name: {problem}"
        return folder_bytes + b"/" + name, ""

    def entries(self, row: int) -> SampleEntries:
        """Sample ``row``'s entries, with ``problem`` set when rule 1 or a value rules it out."""
        ds = self.ds
        key = ds.key(row)
        label = int(ds.labels[row])
        out = SampleEntries(row, key, label)
        try:
            meta = ds.metadata(row)
        except IndexMismatchError as exc:  # a hand-damaged index: reported with the sample, not a crash
            out.problem = ("unrepresentable", f"its stored metadata cannot be read: {exc.message}")
            return out
        name = unescape_key(key, bool(meta.get(ESCAPED_FIELD)))
        problem = name_problem(name, archive=False)  # the key itself, before a class folder is put in front
        if problem is not None:
            out.problem = ("unsafe-name", f"its key: {problem}")
            return out
        main, why = self.main_name(key, name, label)
        if main is None:
            out.problem = ("unsafe-name", why)
            return out
        out.entries.append(Entry(main))
        try:
            if self.specs:
                out.entries.extend(self._field_entries(row, main, meta))
            if self.target.webdataset:
                out.entries.extend(self._webdataset_members(main, label, meta, out.entries))
        except ValueError as exc:  # a value strict JSON cannot hold
            out.problem = ("unrepresentable", str(exc))
            return out
        except IndexMismatchError as exc:  # a stored value that cannot be decoded (text that is not UTF-8)
            out.problem = ("unrepresentable", f"a stored value cannot be read: {exc.message}")
            return out
        for entry in out.entries:
            problem = name_problem(entry.name, archive=self.target.archive)
            if problem is not None:
                out.problem = ("unsafe-name", f"{os.fsdecode(entry.name)!r}: {problem}")
                break
        return out

    def _field_entries(self, row: int, main: bytes, meta: dict[str, Any]) -> list[Entry]:
        """Declared fields as side files a build reads back (``sources/sidefiles.py``): an image field
        with source ``S`` as ``<key>.S`` (``S`` ending in an image extension) or
        ``<key>.S.<ext>``; a value field whose source ends in ``.json`` as that member, one ending
        in ``txt`` as a text member (unless a text member would lose its ends), every other in the
        ``<key>.json`` object under ``S`` (with a WebDataset sample's own ``.json`` metadata)."""
        ds = self.ds
        group = _group_key(main)
        entries: list[Entry] = []
        document: dict[str, Any] = {}
        whole_json: Any = None
        for spec in self.specs:
            source = spec.source or spec.name
            if spec.kind == "image":
                if extension(source) in IMAGE_EXTENSIONS:  # "mask.png": that suffix exactly
                    suffix = source
                else:
                    image_format = fmt.ImageFormat.NAMES.get(int(self._format_column[spec.name][row]), "unknown")
                    suffix = f"{source}.{_FORMAT_EXTENSIONS.get(image_format, image_format)}"
                entries.append(Entry(group + b"." + suffix.encode("utf-8"), field=spec.name))
                continue
            value = ds.field_value(spec.name, row)
            if spec.kind == "text":
                plain: Any = value
            elif spec.kind == "classes" and spec.classes:
                plain = [spec.classes[k] for k in value.tolist()]
            else:
                plain = value.tolist()
            try:
                encoded_json = _json_bytes(plain)
            except ValueError:
                raise ValueError(f"field {spec.name!r} holds NaN or an infinity, which JSON (what a build reads "
                                 f"side files as) cannot hold") from None
            lower = source.lower()
            if lower == "json":
                whole_json = plain
            elif extension(lower) == "json":
                entries.append(Entry(group + b"." + source.encode("utf-8"), encoded_json))
            elif extension(lower) == "txt" and (spec.kind != "text" or _text_member_safe(value)):
                text = value if spec.kind == "text" else encoded_json.decode("utf-8")
                entries.append(Entry(group + b"." + source.encode("utf-8"), text.encode("utf-8")))
            else:
                document[source] = plain
        if self.target.webdataset and isinstance(meta.get("json"), dict):
            for name, value in meta["json"].items():
                document.setdefault(name, value)
        if whole_json is not None:
            if document:
                raise ValueError("a field reads the whole .json member while other values go into it")
            document = whole_json
        if document or whole_json is not None:
            try:
                entries.append(Entry(group + b".json", _json_bytes(document)))
            except ValueError:
                raise ValueError("its .json metadata holds NaN or an infinity, which strict JSON cannot hold") from None
        return entries

    def _webdataset_members(self, main: bytes, label: int, meta: dict[str, Any], have: list[Entry]) -> list[Entry]:
        """The ``.cls`` label (the number, as WebDataset readers expect) and the ``.json``/``.txt``
        metadata a WebDataset build kept (a field's member of the same name wins)."""
        group = _group_key(main)
        taken = {entry.name for entry in have}
        members = [Entry(group + b".cls", str(label).encode())]
        if not self.specs and "json" in meta:
            try:
                members.append(Entry(group + b".json", _json_bytes(meta["json"])))
            except ValueError:
                raise ValueError("its .json metadata holds NaN or an infinity, which strict JSON cannot hold") from None
        if isinstance(meta.get("txt"), str) and group + b".txt" not in taken:
            members.append(Entry(group + b".txt", meta["txt"].encode("utf-8")))
        return [member for member in members if member.name not in taken]

    def planned(self, rows: np.ndarray) -> Iterator[SampleEntries]:
        """The entries of samples ``rows`` that ``plan_export`` kept, in order, for writing.

        Raises:
            OptionError: a sample's entries are no longer what the plan checked (cannot happen
                with an unchanged dataset: the names are a function of the index).
        """
        for row in rows.tolist():
            sample = self.entries(row)
            if sample.problem is not None:
                raise OptionError(f"sample {sample.key!r} changed since the export was planned: {sample.problem[1]}")
            yield sample

    def body(self, sample: SampleEntries, entry: Entry) -> Any:
        """The bytes of ``entry`` (the stored image or image field payload, zero-copy with mmap)."""
        if entry.body is not None:
            return entry.body
        if entry.field is not None:
            return self.ds.field_bytes(entry.field, sample.row)
        return self.ds.get(sample.row)

    # --- reading back (rule 4) ---
    def read_back_problem(self, sample: SampleEntries) -> str | None:
        """Why a build would not read ``sample``'s entries back as they are, or None."""
        names = [entry.name for entry in sample.entries]
        main = names[0]
        if not self.grouped:
            if self.target.archive and extension(os.fsdecode(main)) in TEXT_EXTENSIONS:
                return (f"{os.fsdecode(main)!r} ends in a WebDataset metadata extension: a build would read the tar "
                        f"as WebDataset")
            return None
        group = _group_key(main)
        for name in names[1:]:
            if _group_key(name) != group:
                return f"its side file {os.fsdecode(name)!r} does not share the key {os.fsdecode(group)!r}"
        suffix = split_key(os.fsdecode(main))[1]
        if extension(suffix) not in IMAGE_EXTENSIONS:
            return (f"{os.fsdecode(main)!r} has no image extension ({', '.join(sorted(IMAGE_EXTENSIONS)[:6])}, ...): "
                    f"a build grouping files by key would not find the image")
        if not self.specs:
            return None
        return self._assemble_problem(sample, group)

    def _assemble_problem(self, sample: SampleEntries, group: bytes) -> str | None:
        ds, row = self.ds, sample.row
        members = []
        for index, entry in enumerate(sample.entries):
            text_name = os.fsdecode(entry.name)
            suffix = split_key(text_name)[1]
            if entry.body is None:
                size = int(ds.sizes[row]) if index == 0 else int(self._size_column[entry.field][row])
                data = None
            else:
                size = len(entry.body)
                limit = read_limit(suffix, self.specs)
                data = entry.body if 0 <= size <= limit else None
            members.append(SideMember(text_name, suffix, size, data))
        if self._builder is None:
            return None
        parts = assemble_sample(os.fsdecode(group), members, self._builder)
        if parts.rejection is not None:
            return f"a build would reject it ({parts.rejection[1]}: {parts.rejection[2]})"
        if parts.unused:
            return f"a build would not use {parts.unused[0][0]!r} ({parts.unused[0][1]})"
        if parts.image is None or parts.image.name != members[0].name:
            return f"a build would take {parts.image.name if parts.image else None!r} as its image"
        for spec, value in zip(self.specs, parts.values):
            if spec.kind == "image":
                wanted = next(m.name for m, e in zip(members, sample.entries) if e.field == spec.name)
                if parts.field_members[spec.name].name != wanted:
                    return f"a build would read field {spec.name!r} from {parts.field_members[spec.name].name!r}"
                continue
            try:
                back = decode_value(spec, np.frombuffer(value, dtype=np.uint8))
            except FieldValueError as exc:
                return str(exc)
            stored = ds.field_value(spec.name, row)
            same = back == stored if spec.kind == "text" else (
                back.dtype == stored.dtype and back.shape == stored.shape and back.tobytes() == stored.tobytes())
            if not same:
                return f"a build would read field {spec.name!r} back as another value"
        return None


@dataclass
class ExportPlan:
    """The samples an export writes (``rows``, dataset order) and those it cannot (counts per
    ``SKIP_REASONS`` key, and the first ``examples``: ``(key, reason, message)``)."""

    rows: np.ndarray
    skipped: dict[str, int]
    examples: list[tuple[str, str, str]]

    @property
    def skipped_count(self) -> int:
        return sum(self.skipped.values())


#: Skipped samples named in an ``ExportPlan`` (and in the error or report that shows it).
MAX_EXAMPLES = 20


def plan_export(namer: SampleNamer, rows: np.ndarray) -> ExportPlan:
    """Check every selected sample against the module docstring's rules; nothing is written.

    Memory: the set of exported names (about 100 bytes per output file).
    """
    files: set[bytes] = set()
    folders: set[bytes] = set()
    groups: dict[bytes, str] = {}
    first_folder_label: dict[bytes, int] = {}
    kept: list[int] = []
    skipped: dict[str, int] = {}
    examples: list[tuple[str, str, str]] = []
    for sample in _samples(namer, rows):
        problem = sample.problem or _collision(sample, files, folders, groups, first_folder_label, namer)
        if problem is None:
            why = namer.read_back_problem(sample)
            problem = None if why is None else ("unrepresentable", why)
        if problem is not None:
            skipped[problem[0]] = skipped.get(problem[0], 0) + 1
            if len(examples) < MAX_EXAMPLES:
                examples.append((sample.key, problem[0], problem[1]))
            continue
        for entry in sample.entries:
            files.add(entry.name)
            folder = entry.name.rpartition(b"/")[0]
            while folder and folder not in folders:
                folders.add(folder)
                folder = folder.rpartition(b"/")[0]
        if namer.grouped:
            groups[_group_key(sample.entries[0].name)] = sample.key
        if namer.target.class_folders:
            first_folder_label.setdefault(sample.entries[0].name.split(b"/", 1)[0], sample.label)
        kept.append(sample.row)
    return ExportPlan(np.asarray(kept, dtype=np.int64), skipped, examples)


def _samples(namer: SampleNamer, rows: np.ndarray) -> Iterator[SampleEntries]:
    for row in rows.tolist():
        yield namer.entries(row)


def _collision(sample: SampleEntries, files: set[bytes], folders: set[bytes], groups: dict[bytes, str],
               first_folder_label: dict[bytes, int], namer: SampleNamer) -> tuple[str, str] | None:
    names = [entry.name for entry in sample.entries]
    if len(set(names)) != len(names):
        twice = next(name for name in names if names.count(name) > 1)
        return ("name-collision", f"its image and a side file would both be {os.fsdecode(twice)!r}")
    main = names[0]
    if namer.grouped:
        group = _group_key(main)
        if group in groups:
            return ("name-collision", f"it and sample {groups[group]!r} share the side-file key {os.fsdecode(group)!r} "
                                      f"(the path up to the first dot): a build would take them for one sample")
    for name in names:
        if name in files:
            return ("name-collision", f"{os.fsdecode(name)!r} is already written for another sample")
        if name in folders:
            return ("name-collision", f"{os.fsdecode(name)!r} is a folder of another sample's path")
        folder = name.rpartition(b"/")[0]
        while folder:
            if folder in files:
                return ("name-collision", f"{os.fsdecode(folder)!r} is another sample's file, not a folder")
            folder = folder.rpartition(b"/")[0]
    if namer.target.class_folders:
        top = main.split(b"/", 1)[0]
        label = first_folder_label.get(top, sample.label)
        if label != sample.label:
            return ("label-collision", f"its folder {os.fsdecode(top)!r} already holds samples of label {label} "
                                       f"(a build labels files by their first folder)")
    return None
