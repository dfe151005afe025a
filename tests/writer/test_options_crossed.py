"""The build's options crossed (issue 31, item 2): an all-pairs table over source door x how labels
are written x --label-type x a given class list x codec x --normalize-formats x declared fields x
fresh / append / resume, each row built from a tiny source and compared with a reference model: a
few lines of obvious Python, written from the docs, that say which keys, labels, class list and
bytes the dataset must hold, or which refusal the build must give.

The rules the model encodes (the source contract: ``docs/reference/doors.md`` and
``packer/sources/contract.py``'s docstring; SPEC §14), one class list for every door:

* a door gives each label as written: a class-folder *name* (folder, tar and zip of class
  folders), *text* (a CSV cell, a JSONL or WebDataset ``.cls`` string, a Parquet string column),
  an *integer* (a JSON number, a ``.cls`` of digits, a Parquet integer column), a Hugging Face
  ``ClassLabel`` integer (the source's own numbered names), or none (COCO: its categories are a
  field, the samples have no main label);
* ``--label-type``: ``str`` makes every label a class name (``3`` is ``"3"``); ``int`` rejects names
  and text that is not an integer (a ClassLabel integer is its name all the same); ``auto`` reads
  text of plain digits as an integer and other text as a name, and with a class list given reads
  text as names (an integer the source types as one then indexes the list);
* without a class list, names are numbered in sorted order (a ClassLabel list keeps its own
  order) and integers have no class list; with one, label i is ``classes[i]``, a name not in it (or
  an integer outside it) is rejected as ``unknown-class``, and a listed class without samples stays
  a class; COCO takes no class list (refused);
* ``passthrough`` stores the source bytes; ``--normalize-formats`` stores a TIFF as a PNG of the
  same pixels; ``raw:size=8x8`` stores 8x8 RGB pixels;
* a declared value field comes from a manifest column or a side ``.json``; the tar and zip of class
  folders, Parquet, COCO and Hugging Face doors take no declared fields (refused); ``append`` of a
  dataset with declared fields is refused;
* ``append`` adds the second half of the samples to a build of the first half; ``resume``
  finishes a build whose plan was saved (``plan_only``): both give what one build of all gives.
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

import packer
from packer import BuildSettings, CheckSettings, LabelSettings, LayoutSettings, RunOptions, SourceSettings
from packer.dataset import open_dataset
from packer.errors import EmptySourceError, OptionError, PackerError

# --- the all-pairs generator -------------------------------------------------------------------------


def all_pairs(factors: dict[str, list[Any]], builds: Callable[[dict[str, Any]], bool] | None = None
              ) -> list[dict[str, Any]]:
    """Rows that hold every pair of values of every two factors at least once (greedy, deterministic).

    Each new row is the combination of values that covers the most pairs not yet covered (ties: the
    first in product order). With ``builds`` (does this row build, or is it refused?), rows that
    build are chosen first, until every pair that some building row holds is covered; then refused
    rows cover the pairs only a refusal holds. So a pair is never checked only in a row that a
    refusal of *another* pair ends early (a tar with declared fields would hide the tar's codec).
    """
    names = list(factors)
    sizes = [len(factors[name]) for name in names]
    candidates = np.array(list(itertools.product(*(range(n) for n in sizes))), dtype=np.int64)
    columns, offset = [], 0
    for x, y in itertools.combinations(range(len(names)), 2):
        columns.append(offset + candidates[:, x] * sizes[y] + candidates[:, y])
        offset += sizes[x] * sizes[y]
    pair_ids = np.stack(columns, axis=1)  # (candidates, pairs of factors): one id per pair of values

    def row_of(index: int) -> dict[str, Any]:
        return {name: factors[name][k] for name, k in zip(names, candidates[index].tolist())}

    good = np.array([builds(row_of(i)) for i in range(len(candidates))]) if builds else np.ones(len(candidates), bool)
    covered = np.zeros(offset, dtype=bool)
    chosen: list[int] = []
    for pool in (np.flatnonzero(good), np.flatnonzero(~good)):
        wanted = np.zeros(offset, dtype=bool)
        wanted[pair_ids[pool].ravel()] = True
        wanted &= ~covered
        while wanted.any():
            gains = wanted[pair_ids[pool]].sum(axis=1)
            best = int(pool[int(np.argmax(gains))])
            chosen.append(best)
            covered[pair_ids[best]] = True
            wanted[pair_ids[best]] = False
    return [row_of(i) for i in chosen]


def test_all_pairs_covers_every_pair_with_few_rows() -> None:
    factors = {"a": [0, 1, 2], "b": ["x", "y"], "c": [True, False], "d": list(range(4))}
    rows = all_pairs(factors)
    for (p, q) in itertools.combinations(factors, 2):
        assert {(r[p], r[q]) for r in rows} == set(itertools.product(factors[p], factors[q]))
    assert len(rows) <= 3 * 4 + 2 and rows == all_pairs(factors)


def test_all_pairs_covers_what_can_build_in_rows_that_build() -> None:
    factors = {"a": [0, 1, 2], "b": ["x", "y"], "c": [True, False], "d": list(range(4))}
    builds = lambda row: not (row["a"] == 2 and row["c"]) and row["d"] != 3  # noqa: E731
    rows = all_pairs(factors, builds)
    for (p, q) in itertools.combinations(factors, 2):
        assert {(r[p], r[q]) for r in rows} == set(itertools.product(factors[p], factors[q]))
        possible = {(r[p], r[q]) for r in (dict(zip(factors, v)) for v in itertools.product(*factors.values()))
                    if builds(r)}
        assert {(r[p], r[q]) for r in rows if builds(r)} == possible
    first_refused = next(i for i, r in enumerate(rows) if not builds(r))
    assert all(not builds(r) for r in rows[first_refused:])


# --- the tiny source, written in every door's form ------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    folder: str        # the class folder / the name label
    number: int        # the integer label
    file: str          # file name inside the class folder
    data: bytes
    score: float


def _image(kind: str, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (6 + seed, 7, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, kind)
    return out.getvalue()


def samples(labels: str) -> list[Sample]:
    """Four samples, two per class, one of them a TIFF (what --normalize-formats converts)."""
    names = ("cat", "dog") if labels == "names" else ("0", "1")
    kinds = ("PNG", "PNG", "PNG", "TIFF")
    return [Sample(names[i % 2], i % 2, f"{i:03d}.{'tif' if kinds[i] == 'TIFF' else 'png'}", _image(kinds[i], i),
                   0.5 + i) for i in range(4)]


def _tar(path: Path, files: list[tuple[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as archive:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def write_source(root: Path, door: str, rows: list[Sample], labels: str, fields: bool) -> Path:
    """The samples as each door holds them: a folder, a CSV or JSONL manifest (with ``images/``), a
    tar or zip of class folders, WebDataset shards, a Parquet file, a COCO file (with ``images/``)
    or a Hugging Face ``save_to_disk`` folder. With ``fields``, each sample's score where the door
    can carry it (a side ``.json``, a column, the WebDataset ``.json``)."""
    label = (lambda s: s.folder) if labels == "names" else (lambda s: s.number)
    if door in ("folder", "csv", "jsonl", "coco"):
        images = root / "images"
        for s in rows:
            (images / s.folder).mkdir(parents=True, exist_ok=True)
            (images / s.folder / s.file).write_bytes(s.data)
            if fields and door == "folder":
                (images / s.folder / f"{s.file.split('.')[0]}.json").write_text(json.dumps({"score": s.score}))
        if door == "folder":
            return images
        if door == "csv":
            path = root / "rows.csv"
            with open(path, "w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(["path", "label"] + (["score"] if fields else []))
                for s in rows:
                    writer.writerow([f"{s.folder}/{s.file}", label(s)] + ([s.score] if fields else []))
            return path
        if door == "coco":
            document = {"images": [{"id": n, "file_name": f"{s.folder}/{s.file}"} for n, s in enumerate(rows)],
                        "annotations": [{"id": n, "image_id": n, "category_id": 1 + s.number, "bbox": [1, 1, 2, 2]}
                                        for n, s in enumerate(rows)],
                        "categories": [{"id": 1, "name": "cat"}, {"id": 2, "name": "dog"}]}
            path = root / "instances.json"
            path.write_text(json.dumps(document))
            return path
        path = root / "rows.jsonl"
        path.write_text("".join(json.dumps({"path": f"{s.folder}/{s.file}", "label": label(s),
                                            **({"score": s.score} if fields else {})}) + "\n" for s in rows))
        return path
    root.mkdir(parents=True, exist_ok=True)
    if door == "tar":
        return _tar(root / "classes.tar", [(f"{s.folder}/{s.file}", s.data) for s in rows])
    if door == "zip":
        with zipfile.ZipFile(root / "classes.zip", "w") as archive:
            for s in rows:
                archive.writestr(f"{s.folder}/{s.file}", s.data)
        return root / "classes.zip"
    if door == "webdataset":
        members = []
        for s in rows:
            stem = f"{s.folder}-{s.file.split('.')[0]}"
            members.append((f"{stem}.{s.file.split('.')[1]}", s.data))
            members.append((f"{stem}.cls", str(label(s)).encode()))
            if fields:
                members.append((f"{stem}.json", json.dumps({"score": s.score}).encode()))
        return _tar(root / "shard-000000.tar", members)
    columns: dict[str, list[Any]] = {"image": [{"bytes": s.data, "path": f"{s.folder}/{s.file}"} for s in rows]}
    if door == "parquet":
        pa = pytest.importorskip("pyarrow")
        pq = pytest.importorskip("pyarrow.parquet")
        columns["label"] = [label(s) for s in rows]
        if fields:
            columns["score"] = [s.score for s in rows]
        pq.write_table(pa.table(columns), root / "rows.parquet")
        return root / "rows.parquet"
    hf = pytest.importorskip("datasets")  # door == "hf"
    hf.disable_progress_bars()
    features = {"image": hf.Image(), "label": hf.ClassLabel(names=list(HF_CLASS_LABEL)) if labels == "names"
                else hf.Value("int64")}
    columns["label"] = [HF_CLASS_LABEL.index(s.folder) if labels == "names" else s.number for s in rows]
    if fields:
        features["score"] = hf.Value("float32")
        columns["score"] = [s.score for s in rows]
    hf.Dataset.from_dict(columns, features=hf.Features(features)).save_to_disk(str(root / "hf"))
    return root / "hf"


#: The Hugging Face door's ClassLabel names, not sorted: the source's own numbering is kept.
HF_CLASS_LABEL = ("dog", "cat")


def key_of(door: str, s: Sample) -> str:
    if door == "webdataset":
        return f"{s.folder}-{s.file}"
    return s.file if door == "hf" else f"{s.folder}/{s.file}"  # Hugging Face: the image path's file name


# --- the reference model --------------------------------------------------------------------------------

CLASS_LISTS = ("none", "sorted", "reordered", "extra", "partial")
#: How each door writes the samples' labels: class-folder names, text, typed (JSON numbers, ``.cls``
#: digits, Parquet integer columns), a ClassLabel, or no main label.
WRITES = {"folder": "name", "tar": "name", "zip": "name", "csv": "text", "jsonl": "typed", "webdataset": "typed",
          "parquet": "typed", "hf": "classlabel", "coco": "none"}
#: The doors that take declared fields (a manifest column, a side .json, a WebDataset .json).
TAKES_FIELDS = ("folder", "csv", "jsonl", "webdataset")
MANIFESTS = ("csv", "jsonl", "coco")


def given_classes(choice: str, labels: str) -> tuple[str, ...] | None:
    names = ("cat", "dog") if labels == "names" else ("0", "1")
    return {"none": None, "sorted": names, "reordered": names[::-1], "extra": names + ("zz",),
            "partial": names[:1]}[choice]  # partial: the second class's samples are unknown-class


def read_label(door: str, labels: str, label_type: str, given: bool, s: Sample) -> tuple[str, Any]:
    """("name", class name), ("int", integer), ("bad", None) or ("none", None): one label as the
    contract reads it."""
    writes = WRITES[door]
    if writes == "none":
        return ("none", None)
    if writes == "classlabel" and labels == "names":
        return ("name", s.folder)  # a ClassLabel integer is its name, whatever --label-type says
    if writes == "name":
        return ("bad", None) if label_type == "int" else ("name", s.folder)
    # a JSON string or .cls of a name is text; a JSON number, .cls of digits or integer column is typed
    typed = labels == "ints" and writes in ("typed", "classlabel")
    if typed:
        return ("name", str(s.number)) if label_type == "str" else ("int", s.number)
    text = s.folder  # "cat" or "0"
    if label_type == "str" or (label_type == "auto" and given):
        return ("name", text)
    if text.isdigit():
        return ("int", int(text))
    return ("bad", None) if label_type == "int" else ("name", text)


def expected(row: dict[str, Any], rows: list[Sample]) -> dict[str, Any]:
    """{"error": class} or {"classes": tuple, "labels": {key: label}, "bytes": {key: how stored}}."""
    door, labels, given = row["door"], row["labels"], given_classes(row["classes"], row["labels"])
    if row["fields"] and door not in TAKES_FIELDS:
        return {"error": OptionError}
    if door == "coco" and given is not None:
        return {"error": OptionError}  # no main label to number
    if row["fields"] and row["mode"] == "append":
        return {"error": OptionError}
    if door == "coco" and row["mode"] == "append":
        return {"error": OptionError}  # a COCO dataset has declared fields (its boxes and categories)
    read = {key_of(door, s): read_label(door, labels, row["label_type"], given is not None, s) for s in rows}
    kept = {key: value for key, value in read.items() if value[0] != "bad"}
    if door == "coco":
        classes: tuple[str, ...] = ()
        numbered = {key: -1 for key in kept}
    elif given is not None:
        classes = given
        numbered = {key: (value if kind == "int" else given.index(value)) for key, (kind, value) in kept.items()
                    if (0 <= value < len(given) if kind == "int" else value in given)}
    elif any(kind == "name" for kind, _ in kept.values()):
        names = {value for _, value in kept.values()}
        own_list = WRITES[door] == "classlabel" and labels == "names"  # (integers are a plain int64 column)
        classes = HF_CLASS_LABEL if own_list else tuple(sorted(names, key=str.encode))
        numbered = {key: classes.index(value) for key, (_, value) in kept.items()}
    else:
        classes = ()
        numbered = {key: value for key, (_, value) in kept.items()}
    if not numbered:
        return {"error": EmptySourceError}
    stored = {}
    for s in rows:
        key = key_of(door, s)
        if key in numbered:
            tiff = s.file.endswith(".tif")
            stored[key] = ("raw" if row["codec"] != "passthrough" else
                           "png-of" if tiff and row["normalize"] else "verbatim")
    return {"classes": classes, "labels": numbered, "bytes": stored,
            "scores": {key_of(door, s): s.score for s in rows} if row["fields"] else None}


FACTORS = {
    "door": ["folder", "csv", "jsonl", "tar", "zip", "webdataset", "parquet", "coco", "hf"],
    "labels": ["names", "ints"],
    "label_type": ["auto", "int", "str"],
    "classes": list(CLASS_LISTS),
    "codec": ["passthrough", "raw:size=8x8"],
    "normalize": [False, True],
    "fields": [False, True],
    "mode": ["fresh", "append", "resume"],
}
#: Each source written once per way of labelling (the model reads them; the builds write their own).
_SAMPLES = {labels: samples(labels) for labels in FACTORS["labels"]}
PAIRS = all_pairs(FACTORS, lambda row: "error" not in expected(row, _SAMPLES[row["labels"]]))
#: Besides the pairs: every door's plain build of each way of labelling (no class list, the other
#: options at their defaults), where a door's own numbering shows (a ClassLabel keeps its order).
PLAIN = [{"door": door, "labels": labels, "label_type": "auto", "classes": "none", "codec": "passthrough",
          "normalize": False, "fields": False, "mode": "fresh"} for door in FACTORS["door"] for labels in FACTORS["labels"]]
ROWS = PAIRS + [row for row in PLAIN if row not in PAIRS]


def _row_id(row: dict[str, Any]) -> str:
    return "-".join(str(v).replace(":", "").replace("=", "") for v in row.values())


def _build(row: dict[str, Any], tmp_path: Path) -> Path:
    rows = samples(row["labels"])
    kind = {"csv": "manifest", "jsonl": "manifest"}.get(row["door"], row["door"])

    def settings(folder: Path) -> BuildSettings:
        return BuildSettings(
            source=SourceSettings(kind=kind, root=folder / "images" if row["door"] in MANIFESTS else None),
            layout=LayoutSettings(shard_size=16 << 10, seed=3), codec=row["codec"],
            checks=CheckSettings(normalize_formats=row["normalize"]),
            labels=LabelSettings(classes=given_classes(row["classes"], row["labels"]), label_type=row["label_type"],
                                 fields=("score=float32",) if row["fields"] else ()))

    out = tmp_path / "ds"
    one = RunOptions(workers=1)
    if row["mode"] == "append":
        first = write_source(tmp_path / "first", row["door"], rows[:2], row["labels"], row["fields"])
        second = write_source(tmp_path / "second", row["door"], rows[2:], row["labels"], row["fields"])
        packer.build_dataset(first, out, settings(tmp_path / "first"), one)
        packer.append_dataset(out, second, run=one, root=settings(tmp_path / "second").source.root)
        return out
    source = write_source(tmp_path / "src", row["door"], rows, row["labels"], row["fields"])
    if row["mode"] == "resume":
        packer.build_dataset(source, out, settings(tmp_path / "src"), RunOptions(workers=1, plan_only=True))
        assert not (out / "manifest.json").exists()
        packer.build_dataset(source, out, settings(tmp_path / "src"), RunOptions(workers=1, resume=True))
    else:
        packer.build_dataset(source, out, settings(tmp_path / "src"), one)
    return out


def test_the_table_crosses_every_door_with_every_other_option() -> None:
    for factor in FACTORS:
        if factor != "door":
            for door, value in itertools.product(FACTORS["door"], FACTORS[factor]):
                assert any(r["door"] == door and r[factor] == value for r in ROWS), (door, factor, value)
    outcomes = {("error" if "error" in expected(r, _SAMPLES[r["labels"]]) else "built") for r in ROWS}
    assert outcomes == {"error", "built"} and len(ROWS) <= 80


@pytest.mark.parametrize("row", [pytest.param(r, id=_row_id(r)) for r in ROWS])
def test_a_build_holds_what_the_reference_model_says(row: dict[str, Any], tmp_path: Path) -> None:
    rows = samples(row["labels"])
    want = expected(row, rows)
    if "error" in want:
        with pytest.raises(PackerError) as caught:
            _build(row, tmp_path)
        assert isinstance(caught.value, want["error"]), f"{type(caught.value).__name__}: {caught.value}"
        return
    out = _build(row, tmp_path)
    by_key = {key_of(row["door"], s): s for s in rows}
    with open_dataset(out) as ds:
        assert tuple(ds.classes) == want["classes"]
        got = {ds.key(i): int(ds.labels[i]) for i in range(len(ds))}
        assert got == want["labels"]
        for i in range(len(ds)):
            key, data = ds.key(i), ds.read(i)
            source = by_key[key]
            how = want["bytes"][key]
            if how == "verbatim":
                assert data == source.data, key
            elif how == "png-of":
                assert data[:8] == b"\x89PNG\r\n\x1a\n" and np.array_equal(
                    np.asarray(Image.open(io.BytesIO(data))), np.asarray(Image.open(io.BytesIO(source.data)))), key
            else:
                assert len(data) == 8 * 8 * 3, key
            if want["scores"] is not None:
                assert float(ds.field_value("score", i)) == pytest.approx(want["scores"][key]), key
