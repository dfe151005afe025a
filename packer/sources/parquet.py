"""The Parquet door (HuggingFace datasets on disk): one sample per row, the image column found by
type or named, integer labels named by the file's ``ClassLabel`` metadata; the image bytes are
copied once into a spool that workers read by offset."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..errors import MissingDependencyError, SourceError
from .archive_listing import DEFAULT_MAX_MEMBER_SIZE, _Listing
from .listing import SourceListing
from .members import container_stat
from .sniff import sniff_container
from .webdataset import _INT64, LABEL_REJECTION


def _parquet_label(label: object, out: _Listing, column: str) -> tuple[int | None, str]:
    """A Parquet row's label: an integer (a boolean column gives 0/1), a class name, or -1 for
    null; ``(None, why)`` for anything else (a float, bytes, a list), never a guessed class."""
    if label is None:
        return -1, ""
    if isinstance(label, int):  # bool included: a boolean label column is two classes, 0 and 1
        if label not in _INT64:
            return None, f"the label column {column!r} holds {label}, which does not fit in a signed 64-bit integer"
        out.label_kinds.setdefault("int", str(int(label)))
        return int(label), ""
    if isinstance(label, str) and label:
        return out.class_id(label), ""
    return None, (f"the label column {column!r} holds {str(label)[:80]!r} ({type(label).__name__}): expected "
                  f"an integer or a class name")


# --- Parquet (HuggingFace datasets) ---------------------------------------------------------------

def _parquet_files(path: Path) -> list[Path] | None:
    """The Parquet files if ``path`` is one, or a folder (searched recursively) holding only Parquet data."""
    if path.is_file():
        return [path] if sniff_container(path) == "parquet" else None
    if not path.is_dir():
        return None
    # Stops at the first file that is neither Parquet nor a dataset card: an image folder costs
    # one look at its first image, not a walk of the tree.
    data: list[Path] = []
    for folder, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            full = Path(folder) / name
            if name.startswith("."):
                continue
            if sniff_container(full) == "parquet":
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


def _class_label_names(schema: Any, column: str) -> tuple[str, ...]:
    """HuggingFace's ``ClassLabel`` names for ``column``, from the schema's ``huggingface`` metadata."""
    raw = (schema.metadata or {}).get(b"huggingface")
    if not raw:
        return ()
    try:
        features = json.loads(raw)["info"]["features"]
        feature = features.get(column, {})
        names = feature.get("names") if feature.get("_type") == "ClassLabel" else None
    except (ValueError, KeyError, TypeError, AttributeError):
        return ()
    return tuple(str(n) for n in names) if isinstance(names, list) else ()


def list_parquet(files: list[Path], *, progress: Callable[[int], None] | None = None, spool_dir: Path | None = None,
                 label_column: str = "label", image_column: str | None = None,
                 max_member_size: int = DEFAULT_MAX_MEMBER_SIZE) -> SourceListing:
    """List Parquet files (HuggingFace datasets on disk): one sample per row.

    The image column is a struct with ``bytes`` (and ``path``) or a binary column; the label
    column an integer (labelled by the ``ClassLabel`` names when the file's metadata holds them)
    or a string (class names, sorted). Parquet pages are compressed and cannot be read by offset,
    so the image bytes are copied once, in row order, into a spool in the staging folder that the
    workers then read by offset (like a compressed tar). A row's key is its image ``path`` when
    set, else ``<file stem>/<row>``. A null image is ``not-an-image``; a null label is -1.

    Raises:
        SourceError: no image column, unreadable Parquet. MissingDependencyError: no pyarrow.
    """
    parquet = _pyarrow()
    if spool_dir is None:
        raise SourceError("a Parquet source needs a spool folder (build it through packer build)", path=files[0])
    spool_dir.mkdir(parents=True, exist_ok=True)
    out = _Listing(progress)
    spool = spool_dir / "spool-parquet.bin"
    spool.write_bytes(b"")
    container = out.add_container(str(spool.resolve()))  # its size is recorded once complete
    position = 0
    declared: tuple[str, ...] | None = None
    with open(spool, "wb", buffering=8 << 20) as sink:
        for path in files:
            try:
                handle = parquet.ParquetFile(path)
            except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid, OSError, ...
                raise SourceError(f"not a readable Parquet file: {exc}", path=path) from None
            schema = handle.schema_arrow
            image = _image_column(schema, image_column, path)
            columns = [image] + ([label_column] if label_column in schema.names else [])
            names = _class_label_names(schema, label_column)
            if names:
                if declared is not None and declared != names:
                    raise SourceError("the Parquet files declare different ClassLabel names", path=path)
                declared = out.fixed_classes = names
            row = 0
            try:
                batches = handle.iter_batches(batch_size=256, columns=columns)
                for batch in batches:
                    images = batch.column(0).to_pylist()
                    labels = batch.column(1).to_pylist() if len(columns) > 1 else [None] * len(images)
                    for value, label in zip(images, labels):
                        data, name = (value.get("bytes"), value.get("path")) if isinstance(value, dict) else (value, None)
                        key = name.replace("\\", "/").lstrip("/") if isinstance(name, str) and name else \
                            f"{path.stem}/{row:09d}"
                        row += 1
                        if ".." in key.split("/"):
                            key = f"{path.stem}/{row - 1:09d}"
                        if not data:
                            out.reject(key, "not-an-image", "the row's image has no bytes")
                            continue
                        if len(data) > max_member_size:
                            out.reject(key, "oversize-member", f"{len(data)} bytes, over the limit of {max_member_size}")
                            continue
                        value_label, why = _parquet_label(label, out, label_column)
                        if value_label is None:
                            out.reject(key, LABEL_REJECTION, why)
                            continue
                        sink.write(data)
                        out.add(key, len(data), value_label, container, position, len(data))
                        position += len(data)
            except SourceError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise SourceError(f"the Parquet file is damaged: {exc}", path=path) from None
        sink.flush()
        os.fsync(sink.fileno())
    out.stats[container] = container_stat(str(spool.resolve()))
    if declared and "int" in out.label_kinds:
        labels = np.frombuffer(out.out.labels, dtype=np.int64)
        if len(labels) and labels.max() >= len(declared):
            raise SourceError(f"a label is {int(labels.max())}, but ClassLabel names only {len(declared)} classes",
                              path=files[0])
    return out.finish(files[0] if len(files) == 1 else files[0].parent, "parquet")
