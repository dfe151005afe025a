"""``packer export``: write a dataset's samples back out as a folder, a tar or WebDataset shards.

A user is never locked in: the stored bytes of a ``passthrough`` build are the source files,
written back verbatim, so folder -> packer -> folder reproduces every file byte for byte.

Names. A sample's path is its key when the key's first folder is the sample's class (a
folder build: ``cat/001.jpg``), else ``<class>/<key>``: a WebDataset or manifest key like
``000123.jpg``, and a manifest key whose folder is not its label (``images/0001.jpg``, label
``dog``, goes to ``dog/images/0001.jpg``, so rebuilding the folder gives the same labels). The
class is its class name, or its integer label; a sample without a label (-1) keeps a key that
has a folder, and goes under ``unlabeled/`` otherwise. A key packed under the escaped form of a name that was
not UTF-8 (``packer.names``) is written under the original bytes. Keys that would leave the
output (absolute, ``..``, empty parts) are skipped and counted, never written.

Targets:

* ``folder``: files under OUT (which must not exist, or be an empty folder).
* ``tar``: one uncompressed PAX tar at OUT, members in dataset order with mtime 0, uid/gid 0,
  mode 0644 (the same dataset gives the same bytes), written to a temp name and renamed.
* ``webdataset``: shards ``OUT/shard-000000.tar``, ... of ``samples_per_shard`` samples: per
  sample the image (``<stem>.<ext>``) and a ``.cls`` member holding the label, plus ``.json``
  and ``.txt`` members from the metadata a WebDataset build kept (``{"json": ..., "txt": ...}``).

Declared fields (``formats/SPEC.md`` §14) come out as the side files a build reads back
(``packer/build/sidefiles.py``): for a sample whose image is ``cat/001.jpg`` (its key ``cat/001``
being the path up to the first dot of the file name), each image field ``F`` is written as
``cat/001.F.<ext>`` (its stored bytes, the extension from its format), and the value fields as
one ``cat/001.json`` object ``{"F": value}`` (arrays as nested lists, class sets as their names
when the field has names, else their ids; captions as strings), merged with a WebDataset
sample's own ``.json`` metadata. ``packer build OUT NEW --field ...`` with the same declarations
rebuilds the fields. Two samples whose keys would share side files are refused before anything
is written (``OptionError``), never silently overwritten.

Filters: ``classes`` (names, or integer labels as text), ``samples`` (``"start:stop"``, in
dataset order, Python slice rules), ``keys`` (a file of keys, one per line); all apply together.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from . import format as fmt
from .dataset import open_dataset
from .errors import OptionError, OutputExistsError
from .names import ESCAPED_FIELD, unescape_key

__all__ = ["EXPORT_TARGETS", "ExportResult", "export", "select_samples", "sample_path"]

EXPORT_TARGETS = ("folder", "tar", "webdataset")


@dataclass
class ExportResult:
    """What an export wrote."""

    samples: int
    bytes: int
    skipped_unsafe: int
    files: int

    def to_json(self) -> dict[str, int]:
        return {"samples": self.samples, "bytes": self.bytes, "skipped_unsafe": self.skipped_unsafe,
                "files": self.files}


def select_samples(dataset: object, *, classes: list[str] | None = None, samples: str | None = None,
                   keys: str | os.PathLike[str] | None = None) -> np.ndarray:
    """Sample indices passing every filter, in dataset order.

    Raises:
        OptionError: an unknown class, a malformed range, an unreadable keys file.
    """
    ds = dataset
    count = len(ds)  # type: ignore[arg-type]
    keep = np.ones(count, dtype=bool)
    if samples:
        try:
            start_text, _, stop_text = samples.partition(":")
            start = int(start_text) if start_text else None
            stop = int(stop_text) if stop_text else None
        except ValueError:
            raise OptionError(f"--samples must be START:STOP (e.g. 0:1000), got {samples!r}") from None
        ranged = np.zeros(count, dtype=bool)
        ranged[slice(start, stop)] = True
        keep &= ranged
    if classes:
        names = ds.classes  # type: ignore[attr-defined]
        wanted = []
        for name in classes:
            if name in names:
                wanted.append(names.index(name))
            else:
                try:
                    wanted.append(int(name))
                except ValueError:
                    raise OptionError(f"--classes: {name!r} is not a class of this dataset "
                                      f"({', '.join(names[:10])}{', ...' if len(names) > 10 else ''})") from None
        keep &= np.isin(ds.labels, np.asarray(wanted, dtype=np.int64))  # type: ignore[attr-defined]
    if keys is not None:
        try:
            with open(keys, encoding="utf-8") as handle:
                wanted_keys = {line.rstrip("\n") for line in handle if line.strip()}
        except (OSError, UnicodeDecodeError) as exc:
            raise OptionError(f"--keys: cannot read {keys}: {exc}") from None
        keep &= np.fromiter((ds.key(i) in wanted_keys for i in range(count)), dtype=bool, count=count)  # type: ignore[attr-defined]
    return np.flatnonzero(keep)


def sample_path(key: str, label: int, classes: tuple[str, ...], escaped: bool, *,
                class_folders: bool = True) -> bytes | None:
    """The relative path (bytes) sample ``key`` is written under, or None if it would leave OUT.

    ``class_folders``: the path must name the class (folder and tar targets); a WebDataset's
    ``.cls`` member holds the label, so there a key that has a folder keeps it as it is.
    """
    name = unescape_key(key, escaped)
    parts = name.split(b"/")
    if name.startswith(b"/") or any(p in (b"", b".", b"..") for p in parts) or b"\x00" in name:
        return None
    folder = (classes[label] if classes and 0 <= label < len(classes)
              else "unlabeled" if label == -1 else str(label))
    # A folder build's keys start with their class folder (compared in the key's own, escaped
    # spelling, as the class name is); any other key is put under its class, or a rebuild of the
    # exported folder would take the key's first folder as the class.
    if len(parts) > 1 and (not class_folders or label == -1 or key.split("/", 1)[0] == folder):
        return name
    if folder in ("", ".", "..") or "/" in folder:
        return None
    return folder.encode("utf-8") + b"/" + name


def _samples(ds: object, rows: np.ndarray, class_folders: bool = True
             ) -> Iterator[tuple[int, bytes | None, bytes, dict]]:
    classes = ds.classes  # type: ignore[attr-defined]
    for i in rows.tolist():
        meta = ds.metadata(i)  # type: ignore[attr-defined]
        key = ds.key(i)  # type: ignore[attr-defined]
        label = int(ds.labels[i])  # type: ignore[attr-defined]
        path = sample_path(key, label, classes, bool(meta.get(ESCAPED_FIELD)), class_folders=class_folders)
        yield label, path, ds.read(i), meta  # type: ignore[attr-defined]


def _side_key(path: bytes) -> bytes:
    """A sample's key in the side-file rule: its path up to the first dot of the file name."""
    folder, _, base = path.rpartition(b"/")
    stem = base.split(b".", 1)[0]
    return (folder + b"/" if folder else b"") + stem


def _field_value_json(ds: Any, spec: Any, i: int) -> Any:
    value = ds.field_value(spec.name, i)
    if spec.kind == "text":
        return value
    if spec.kind == "classes" and spec.classes:
        return [spec.classes[k] for k in value.tolist()]
    return value.tolist()


def _side_files(ds: Any, i: int, key: bytes, meta_json: Any) -> list[tuple[bytes, bytes]]:
    """Sample ``i``'s declared fields as (relative path, bytes) side files (module docstring)."""
    files: list[tuple[bytes, bytes]] = []
    values: dict[str, Any] = dict(meta_json) if isinstance(meta_json, dict) else {}
    for spec in ds.fields:
        if spec.kind == "image":
            image_format = int(ds.index.field_columns[spec.image_column("format")][i])
            ext = fmt.ImageFormat.NAMES.get(image_format, "img")
            ext = {"jpeg": "jpg", "unknown": "img", "other": "img"}.get(ext, ext)
            files.append((key + f".{spec.name}.{ext}".encode(), bytes(ds.field_bytes(spec.name, i))))
        else:
            values[spec.name] = _field_value_json(ds, spec, i)
    if values:
        files.append((key + b".json", json.dumps(values, sort_keys=True, ensure_ascii=False).encode("utf-8")))
    return files


def _check_side_keys(ds: Any, rows: np.ndarray, class_folders: bool) -> None:
    """Refuse an export whose samples' side files would collide (``a.1.jpg`` and ``a.2.jpg``)."""
    if not ds.fields:
        return
    seen: dict[bytes, str] = {}
    classes = ds.classes
    for i in rows.tolist():
        meta = ds.metadata(i)
        path = sample_path(ds.key(i), int(ds.labels[i]), classes, bool(meta.get(ESCAPED_FIELD)),
                           class_folders=class_folders)
        if path is None:
            continue
        key = _side_key(path)
        if key in seen:
            raise OptionError(f"samples {seen[key]!r} and {ds.key(i)!r} share the side-file key "
                              f"{os.fsdecode(key)!r} (the path up to the first dot): their fields' side files "
                              f"would overwrite each other; export them separately (--keys)")
        seen[key] = ds.key(i)


def _tar_info(name: bytes, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(os.fsdecode(name))
    info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, 0o644, 0, 0
    info.uname = info.gname = ""
    return info


def _open_tar(path: Path) -> tarfile.TarFile:
    return tarfile.open(path, "w", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape")


def export(dataset: str | os.PathLike[str], out: str | os.PathLike[str], *, to: str = "folder",
           classes: list[str] | None = None, samples: str | None = None,
           keys: str | os.PathLike[str] | None = None, samples_per_shard: int = 10_000,
           overwrite: bool = False) -> ExportResult:
    """Write the selected samples of ``dataset`` to ``out`` (see the module docstring).

    Raises:
        OptionError: a bad target, filter, or a dataset whose payloads are not the source bytes.
        OutputExistsError: ``out`` exists (and is not an empty folder) without ``overwrite``.
        FormatError: the dataset is damaged.
    """
    if to not in EXPORT_TARGETS:
        raise OptionError(f"--to must be one of {', '.join(EXPORT_TARGETS)}, got {to!r}")
    if samples_per_shard < 1:
        raise OptionError(f"--samples-per-shard must be at least 1, got {samples_per_shard}")
    out_path = Path(out)
    if out_path.exists() and not overwrite and not (out_path.is_dir() and not any(out_path.iterdir())):
        raise OutputExistsError("the export target exists; pass --overwrite or choose a new path", path=out_path)
    with open_dataset(dataset) as ds:
        codec = ds.manifest.codec.get("name", "passthrough")
        if codec != "passthrough":
            raise OptionError(f"this dataset was built with codec {codec!r}: its payloads are not the source "
                              f"files, so there is nothing to export verbatim (export needs a passthrough build)")
        build_options = ds.manifest.build.get("options", {}) if isinstance(ds.manifest.build, dict) else {}
        if build_options.get("normalize_formats"):
            raise OptionError("this dataset was built with --normalize-formats: some payloads are PNGs converted "
                              "from the source files, so there is nothing to export verbatim")
        rows = select_samples(ds, classes=classes, samples=samples, keys=keys)
        _check_side_keys(ds, rows, class_folders=to != "webdataset")
        result = ExportResult(0, 0, 0, 0)
        if to == "folder":
            _to_folder(ds, rows, out_path, result)
        elif to == "tar":
            _to_tar(ds, rows, out_path, result)
        else:
            _to_webdataset(ds, rows, out_path, samples_per_shard, result)
    return result


def _to_folder(ds: object, rows: np.ndarray, out: Path, result: ExportResult) -> None:
    root = os.fsencode(out)
    os.makedirs(root, exist_ok=True)
    for i, (_, path, data, meta) in zip(rows.tolist(), _samples(ds, rows)):
        if path is None:
            result.skipped_unsafe += 1
            continue
        files = [(path, data)] + (_side_files(ds, i, _side_key(path), None) if ds.fields else [])
        for relative, body in files:
            full = os.path.join(root, relative)
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as handle:
                handle.write(body)
            result.files += 1
        result.samples += 1
        result.bytes += len(data)


def _to_tar(ds: object, rows: np.ndarray, out: Path, result: ExportResult) -> None:
    temp = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        with _open_tar(temp) as archive:
            for i, (_, path, data, _) in zip(rows.tolist(), _samples(ds, rows)):
                if path is None:
                    result.skipped_unsafe += 1
                    continue
                archive.addfile(_tar_info(path, len(data)), io.BytesIO(data))
                for relative, body in (_side_files(ds, i, _side_key(path), None) if ds.fields else []):
                    archive.addfile(_tar_info(relative, len(body)), io.BytesIO(body))
                result.samples += 1
                result.bytes += len(data)
        os.replace(temp, out)
        result.files = 1
    finally:
        temp.unlink(missing_ok=True)


def _to_webdataset(ds: object, rows: np.ndarray, out: Path, per_shard: int, result: ExportResult) -> None:
    out.mkdir(parents=True, exist_ok=True)
    archive = None
    temp = final = None
    try:
        for i, (label, path, data, meta) in zip(rows.tolist(), _samples(ds, rows, class_folders=False)):
            if path is None:
                result.skipped_unsafe += 1
                continue
            if archive is None or result.samples % per_shard == 0:
                if archive is not None:
                    archive.close()
                    os.replace(temp, final)  # type: ignore[arg-type]
                    result.files += 1
                final = out / f"shard-{result.files:06d}.tar"
                temp = out / f".{final.name}.partial"
                archive = _open_tar(temp)
            folder, _, base = path.rpartition(b"/")
            stem, dot, ext = base.rpartition(b".") if b"." in base else (base, b".", b"img")
            stem = (folder + b"/" if folder else b"") + stem
            archive.addfile(_tar_info(stem + b"." + ext, len(data)), io.BytesIO(data))
            extras = {b"cls": str(label).encode()}
            if "json" in meta:
                extras[b"json"] = json.dumps(meta["json"], sort_keys=True, ensure_ascii=False).encode()
            if ds.fields:  # declared fields as the members a WebDataset build reads them from
                for relative, body in _side_files(ds, i, stem, meta.get("json")):
                    extras[relative[len(stem) + 1:]] = body
            if isinstance(meta.get("txt"), str):
                extras[b"txt"] = meta["txt"].encode()
            for suffix, body in extras.items():
                archive.addfile(_tar_info(stem + b"." + suffix, len(body)), io.BytesIO(body))
            result.samples += 1
            result.bytes += len(data)
        if archive is not None:
            archive.close()
            os.replace(temp, final)  # type: ignore[arg-type]
            result.files += 1
            archive = None
    finally:
        if archive is not None:
            archive.close()
        if temp is not None:
            Path(temp).unlink(missing_ok=True)
