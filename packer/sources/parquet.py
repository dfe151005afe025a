"""The Parquet door (HuggingFace datasets on disk): one sample per row, the image column found by
type or named, integer labels named by the file's ``ClassLabel`` metadata; the image bytes are
copied once into a spool that workers read by offset."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import BuildError, MissingDependencyError, SourceError
from .archive_listing import ArchiveListing
from .labels import INT64, LABEL_REJECTION
from .listing import DoorOptions, RawListing, RawListingBuilder, spool_write_error
from .members import container_stat
from .sniff import sniff_container
from .strictjson import lone_surrogate
from .._internal.files import MAX_USER_JSON_DEPTH, json_depth_exceeds


def parquet_label(label: object, out: ArchiveListing, column: str) -> tuple[tuple[int, int] | None, str]:
    """A Parquet row's label as written: an integer (a boolean column gives 0/1), text (a class
    name, typed by the contract), or none for null; ``(None, why)`` for anything else (a float,
    bytes, a list), never a guessed class."""
    if label is None:
        return RawListingBuilder.NONE, ""
    if isinstance(label, int):  # bool included: a boolean label column is two classes, 0 and 1
        if label not in INT64:
            return None, f"the label column {column!r} holds {label}, which does not fit in a signed 64-bit integer"
        return RawListingBuilder.int_label(int(label)), ""
    if isinstance(label, str) and label:
        return out.text_label(label), ""
    return None, (f"the label column {column!r} holds {str(label)[:80]!r} ({type(label).__name__}): expected "
                  f"an integer or a class name")


# --- Parquet (HuggingFace datasets) ---------------------------------------------------------------

#: A folder is searched this deep for Parquet files (a HuggingFace layout is ``data/train/x.parquet``);
#: anything deeper is not a Parquet dataset, and is not walked.
MAX_PARQUET_DEPTH = 16


def parquet_files(path: Path) -> list[Path] | None:
    """The Parquet files if ``path`` is one, or a folder (searched iteratively, at most
    ``MAX_PARQUET_DEPTH`` levels) holding only Parquet data and dataset cards."""
    if path.is_file():
        return [path] if sniff_container(path) == "parquet" else None
    if not path.is_dir():
        return None
    # Stops at the first file that is neither Parquet nor a dataset card: an image folder costs
    # one look at its first image, not a walk of the tree.
    data: list[Path] = []
    stack: list[tuple[Path, int]] = [(path, 0)]
    while stack:
        folder, depth = stack.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted((e for e in it if not e.name.startswith(".")), key=lambda e: os.fsencode(e.name))
        except OSError:
            return None
        for entry in entries:
            full = Path(entry.path)
            try:
                is_dir = entry.is_dir()
            except OSError:
                return None
            if is_dir:
                if depth + 1 > MAX_PARQUET_DEPTH:
                    return None
                stack.append((full, depth + 1))
            elif sniff_container(full) == "parquet":
                data.append(full)
            elif full.suffix.lower() not in (".json", ".md", ".txt", ".lock"):
                return None
    return sorted(data, key=lambda p: os.fsencode(p.relative_to(path))) or None


def _pyarrow() -> Any:
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise MissingDependencyError("reading Parquet needs pyarrow: pip install 'packer-shards[parquet]'") from None
    return parquet


def _image_column(schema: Any, wanted: str | None, path: Path) -> str:
    import pyarrow as pa

    def is_image(field: Any) -> bool:
        kind = field.type
        return (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
                or (pa.types.is_struct(kind) and kind.get_field_index("bytes") >= 0))

    if wanted is not None:
        if wanted not in schema.names or not is_image(schema.field(wanted)):
            raise SourceError(f"--image-column {wanted!r}: no binary or {{bytes, path}} column of that name "
                              f"(columns: {', '.join(schema.names)})", path=path)
        return wanted
    candidates = [f.name for f in schema if is_image(f)]
    for name in ("image", "img", "jpg", "png"):
        if name in candidates:
            return name
    if not candidates:
        raise SourceError(f"no image column (binary, or a struct with 'bytes'); columns: {', '.join(schema.names)}",
                          path=path)
    return candidates[0]


def _class_label_names(schema: Any, column: str, path: Path) -> tuple[str, ...]:
    """HuggingFace's ``ClassLabel`` names for ``column``, from the schema's ``huggingface`` metadata
    (informational JSON: a document that is not what HuggingFace writes declares nothing)."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw or json_depth_exceeds(raw, MAX_USER_JSON_DEPTH):
        return ()
    try:
        features = json.loads(raw)["info"]["features"]
        feature = features.get(column, {})
        names = feature.get("names") if feature.get("_type") == "ClassLabel" else None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return ()
    if not isinstance(names, list):
        return ()
    if not all(isinstance(name, str) and name for name in names):
        raise SourceError(f"the ClassLabel names of column {column!r} must be non-empty strings, got "
                          f"{str(names)[:80]}", path=path)
    return tuple(names)


def list_parquet(files: list[Path], door: DoorOptions = DoorOptions()) -> RawListing:
    """List Parquet files (HuggingFace datasets on disk): one sample per row.

    The image column (``door.source.image_column``, else found by type) is a struct with ``bytes`` (and
    ``path``) or a binary column; the label column (``door.source.label_field``) an integer (named by
    the file's ``ClassLabel`` metadata when it holds them: the source then numbers its classes)
    or a string. Parquet pages are compressed and cannot be read by offset, so the image bytes
    are copied once, in row order, into a spool in the staging folder that the workers then read
    by offset (like a compressed tar). A row's key is its image ``path`` when set, else
    ``<file stem>/<row>``. A null image is ``not-an-image``; a null label is no label.

    Raises:
        SourceError: no image column, unreadable Parquet, files declaring different ClassLabel names.
        MissingDependencyError: no pyarrow. BuildError: the disk filled while spooling.
    """
    parquet = _pyarrow()
    if door.spool_dir is None:
        raise SourceError("a Parquet source needs a spool folder (build it through packer build)", path=files[0])
    door.spool_dir.mkdir(parents=True, exist_ok=True)
    out = ArchiveListing(door.progress)
    spool = door.spool_dir / "spool-parquet.bin"
    spool.write_bytes(b"")
    container = out.add_container(str(spool.resolve()))  # its size is recorded once complete
    position = 0
    declared: tuple[str, ...] | None = None
    try:
        sink = open(spool, "wb", buffering=8 << 20)
    except OSError as exc:
        raise _spool_error(exc, spool) from None
    with sink:
        for path in files:
            try:
                handle = parquet.ParquetFile(path)
            except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
                raise SourceError(f"not a readable Parquet file: {exc}", path=path) from None
            schema = handle.schema_arrow
            image = _image_column(schema, door.source.image_column, path)
            columns = [image] + ([door.source.label_field] if door.source.label_field in schema.names else [])
            names = _class_label_names(schema, door.source.label_field, path)
            if names:
                if declared is not None and declared != names:
                    raise SourceError("the Parquet files declare different ClassLabel names", path=path)
                declared = out.declared_classes = names
                out.declared_numbering = True
            row = 0
            try:
                batches = handle.iter_batches(batch_size=64, columns=columns)
                for batch in batches:
                    images = batch.column(0).to_pylist()
                    labels = batch.column(1).to_pylist() if len(columns) > 1 else [None] * len(images)
                    for value, label in zip(images, labels):
                        data, name = (value.get("bytes"), value.get("path")) if isinstance(value, dict) else (value, None)
                        key = name.replace("\\", "/").lstrip("/") if isinstance(name, str) and name else \
                            f"{path.stem}/{row:09d}"
                        row += 1
                        if ".." in key.split("/") or lone_surrogate(key) is not None or "\x00" in key:
                            key = f"{path.stem}/{row - 1:09d}"
                        if not data or not isinstance(data, bytes):
                            out.reject(key, "not-an-image", "the row's image has no bytes")
                            continue
                        value_label, why = parquet_label(label, out, door.source.label_field)
                        if value_label is None:
                            out.reject(key, LABEL_REJECTION, why)
                            continue
                        try:
                            sink.write(data)
                        except OSError as exc:
                            raise _spool_error(exc, spool) from None
                        out.add(key, len(data), value_label, container, position, len(data))
                        position += len(data)
            except (SourceError, BuildError):
                raise
            except Exception as exc:  # noqa: BLE001
                raise SourceError(f"the Parquet file is damaged: {exc}", path=path) from None
        try:
            sink.flush()
            os.fsync(sink.fileno())
        except OSError as exc:
            raise _spool_error(exc, spool) from None
    out.stats[container] = container_stat(str(spool.resolve()))
    return out.finish(files[0] if len(files) == 1 else files[0].parent, "parquet")


def _spool_error(exc: OSError, spool: Path) -> BuildError:
    return spool_write_error(exc, spool, "copying the Parquet images")
