"""The export half of the differential matrix (issue 25, item 2): every round trip the export guide
claims, checked as claimed, with hostile names.

``docs/guides/export.md`` holds the table of claims (after ``<!-- round-trip-claims -->``): per
(dataset built from, ``--to``), which parts of the dataset a build of the export gives back. This
test reads that table and, for each row, builds a dataset of that kind whose names are hostile
(spaces, Unicode, ``%``, Latin-1 bytes, new lines, tabs, dots, long components, folders, a
backslash, an image without an image extension, two keys sharing a stem), exports it with
``skip_unsafe``, checks that exactly the names this target cannot hold were skipped (and
counted), rebuilds the export and compares every claimed part for every exported sample. A
claim in the guide that does not hold fails here; so does a row naming an unknown kind or part.
"""

from __future__ import annotations

import io
import json
import os
import re
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer.dataset import open_dataset
from packer.export import export
from packer.writer import BuildOptions, build

REPO = Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "export.md"
PARTS = ("keys", "bytes", "labels", "class list", "fields")
VALUES = {"same", "numbers", "<class>/<key>", "—"}
KINDS = ("folder", "folder with fields", "tar", "manifest", "manifest with fields", "webdataset",
         "webdataset with fields")
CLASSES = ("cat", "dög", "with space")
#: value fields and a second image; the folder and WebDataset side files spell captions as .txt
FOLDER_FIELDS = ("boxes=float32[N,4]", "tags=classes", "caption=text@txt", "mask=image")
MANIFEST_FIELDS = ("boxes=float32[N,4]", "tags=classes", "caption=text", "mask=image")
OPTIONS = dict(shard_size=64 << 10, seed=5)


def claims() -> list[dict[str, str]]:
    """The rows of the guide's claims table."""
    lines = GUIDE.read_text("utf-8").splitlines()
    start = lines.index("<!-- round-trip-claims -->") + 1
    header = [cell.strip().strip("`") for cell in lines[start].strip("|").split("|")]
    assert header == ["dataset built from", "--to", *PARTS], header
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        row = dict(zip(header, cells))
        assert row["dataset built from"] in KINDS and row["--to"] in ("folder", "tar", "webdataset"), row
        assert all(row[part] in VALUES for part in PARTS), row
        rows.append(row)
    return rows


# --- hostile names -------------------------------------------------------------------------------------

def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (4 + seed % 3, 5, 3), dtype=np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


#: File names inside a class (or ``images/``) folder, as bytes. Latin-1 and the backslash are only
#: where the source kind can hold them; a name with a dot in its stem only where keys are not grouped.
STEMMED = [b"plain.png", b"sp ace.png", "\u00fcn\u00ef\u00a9\u00f8d\u00e9.png".encode(), b"100%.png",
           b"pc%41.png", b"new\nline.png", b"tab\t.png", b"-dash.png", b"l" * 240 + b".png", b"deep/er/x.png"]
DOTTED = [b"a.b.c.png", b"s.1.png", b"s.2.png"]
ODD = [b"back\\slash.png", b"noext", b"img.json"]
LATIN1 = b"caf\xe9.png"


def names_for(kind: str) -> list[bytes]:
    names = list(STEMMED)
    if kind in ("folder", "tar", "manifest", "webdataset"):
        names += [DOTTED[0]]
    if kind in ("folder", "tar", "manifest", "manifest with fields"):
        names += DOTTED[1:]  # two images sharing the stem s: separate samples in these sources
    if kind in ("folder", "manifest"):
        names += ODD[0:1]
    if kind in ("folder", "tar", "manifest"):
        names += ODD[1:]
    if kind in ("folder", "tar", "webdataset", "webdataset with fields"):
        names.append(LATIN1)  # a folder build with --field groups files by UTF-8 names only
    return names


def expected_skips(kind: str, target: str, keys_in_order: list[str], exported: dict[str, str]) -> dict[str, str]:
    """key -> reason of the samples the export must skip (every other must be exported);
    ``exported``: key -> the path it is exported under."""
    grouped = target == "webdataset" or "fields" in kind
    skips = {}
    for key in keys_in_order:
        base = key.rsplit("/", 1)[-1]
        if "\\" in key and target != "folder":
            skips[key] = "unsafe-name"
        elif base in ("noext", "img.json") and (target == "webdataset" or (target == "tar" and base == "img.json")):
            skips[key] = "unrepresentable"
    sharing = [key for key in keys_in_order if key.rsplit("/", 1)[-1] in ("s.1.png", "s.2.png")]
    if grouped:  # the two share a key per class; the later (dataset order) of each pair is skipped
        seen: set[str] = set()
        for key in sharing:
            folder = exported[key].rsplit("/", 1)[0]
            if folder in seen:
                skips[key] = "name-collision"
            seen.add(folder)
    return skips


def _side(value: int, stem: bytes) -> dict[bytes, bytes]:
    boxes = [[value, value, value + 2.5, value + 3]] * (value % 3)
    tags = ["red", "green", "blue"][: value % 4]
    return {stem + b".mask.png": _png(1000 + value),
            stem + b".json": json.dumps({"boxes": boxes, "tags": tags}).encode(),
            stem + b".txt": f"caption {value} ✓\twith a tab".encode()}


def make_source(root: Path, kind: str) -> tuple[Path, dict[str, Any]]:
    """A source of ``kind`` holding every hostile name; returns it and the build's keyword arguments."""
    files: dict[bytes, bytes] = {}
    rows: list[dict[str, Any]] = []
    wds_members: list[tuple[bytes, bytes]] = []
    for index, name in enumerate(names_for(kind)):
        label = index % len(CLASSES)
        folder = CLASSES[label].encode()
        folder_part, _, base = name.rpartition(b"/")
        stem = (folder_part + b"/" if folder_part else b"") + base.split(b".", 1)[0]  # the side-file key
        if kind.startswith(("folder", "tar")):
            files[folder + b"/" + name] = _png(index)
            if "fields" in kind:
                files.update({folder + b"/" + k: v for k, v in _side(index, stem).items()})
        elif kind.startswith("manifest"):
            files[b"images/" + name] = _png(index)
            row: dict[str, Any] = {"path": "images/" + name.decode(), "label": CLASSES[label]}
            if "fields" in kind:
                mask = b"images/" + name + b".mask.png"
                files[mask] = _png(1000 + index)
                row.update(boxes=[[index, index, index + 2.5, index + 3]] * (index % 3),
                           tags=["red", "green", "blue"][: index % 4], caption=f"caption {index} ✓",
                           mask=mask.decode())
            rows.append(row)
        else:
            key = stem  # WebDataset members of a sample: its key and a suffix
            members = [(name, _png(index)), (key + b".cls", str(label).encode())]
            if "fields" in kind:
                side = _side(index, key)
                members += [(key + b".mask.png", side[key + b".mask.png"]), (key + b".json", side[key + b".json"]),
                            (key + b".txt", side[key + b".txt"])]
            else:
                members.append((key + b".json", json.dumps({"n": index}).encode()))
            wds_members += members
    source = root / "source"
    if kind.startswith(("folder", "manifest")):
        for name, data in files.items():
            path = source / os.fsdecode(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        if kind.startswith("manifest"):
            (source / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
            source = source / "rows.jsonl"
    else:
        members = sorted(files.items()) if kind == "tar" else wds_members
        source = root / "source.tar"
        with tarfile.open(source, "w", format=tarfile.PAX_FORMAT, encoding="utf-8", errors="surrogateescape") as archive:
            for name, data in members:
                info = tarfile.TarInfo(name.decode("utf-8", "surrogateescape"))
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    fields = (MANIFEST_FIELDS if kind.startswith("manifest") else FOLDER_FIELDS) if "fields" in kind else ()
    return source, {"fields": fields, "source_kind": "webdataset" if kind.startswith("webdataset") else "auto"}


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, tuple[str, ...]]]:
    """One dataset per kind the guide names, built once."""
    built = {}
    for kind in sorted({row["dataset built from"] for row in claims()}):
        root = tmp_path_factory.mktemp(re.sub(r"\W", "_", kind))
        source, options = make_source(root, kind)
        result = build(source, root / "ds", BuildOptions(fields=options["fields"], **OPTIONS), workers=1,
                       progress=False, source_kind=options["source_kind"])
        assert not result.rejected, (kind, result.rejected[:3])
        assert result.sample_count == len(names_for(kind)), kind
        built[kind] = (root / "ds", options["fields"])
    return built


# --- comparing ----------------------------------------------------------------------------------------

def _class_name(ds: Any, i: int) -> str | None:
    label = int(ds.labels[i])
    return ds.classes[label] if ds.classes and 0 <= label < len(ds.classes) else None


def _field(ds: Any, spec: Any, i: int) -> Any:
    if spec.kind == "image":
        return ds.field_bytes(spec.name, i).tobytes()
    value = ds.field_value(spec.name, i)
    if spec.kind == "text":
        return value
    if spec.kind == "classes":
        return [spec.classes[k] for k in value.tolist()] if spec.classes else value.tolist()
    return (value.shape, value.tobytes())


def _rebuilt_key(claim: str, key: str, class_name: str | None, label: int) -> str:
    if claim != "<class>/<key>":
        return key
    folder = class_name if class_name is not None else str(label)
    return key if key.split("/", 1)[0] == folder and "/" in key else f"{folder}/{key}"


ROWS = claims()


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['dataset built from']}->{r['--to']}" for r in ROWS])
def test_a_claimed_round_trip_gives_back_what_the_guide_says(datasets: dict[str, tuple[Path, tuple[str, ...]]],
                                                              tmp_path: Path, row: dict[str, str]) -> None:
    dataset, fields = datasets[row["dataset built from"]]
    target = row["--to"]
    out = tmp_path / ("export.tar" if target == "tar" else "export")
    with open_dataset(dataset) as original:
        keys = [original.key(i) for i in range(len(original))]
        exported = {key: _rebuilt_key("<class>/<key>" if target != "webdataset" else "same", key,
                                      _class_name(original, i), int(original.labels[i])) for i, key in enumerate(keys)}
    skips = expected_skips(row["dataset built from"], target, keys, exported)
    result = export(dataset, out, to=target, skip_unsafe=True, samples_per_shard=7)
    got_skips = {key: reason for key, reason, _ in result.skipped_examples}
    assert got_skips == skips, (got_skips, skips)
    assert result.samples + result.skipped_unsafe == len(keys) and result.skipped_unsafe == len(skips)
    again = tmp_path / "again"
    build(out, again, BuildOptions(fields=fields, **OPTIONS), workers=1, progress=False,
          source_kind="webdataset" if target == "webdataset" else "auto")
    with open_dataset(dataset) as original, open_dataset(again) as rebuilt:
        assert len(rebuilt) == result.samples
        index = {rebuilt.key(i): i for i in range(len(rebuilt))}
        checked = 0
        for i, key in enumerate(keys):
            if key in skips:
                continue
            j = index.get(_rebuilt_key(row["keys"], key, _class_name(original, i), int(original.labels[i])))
            assert j is not None, f"{key!r} did not come back under the claimed key"
            if row["bytes"] == "same":
                assert rebuilt.read(j) == original.read(i), key
            if row["labels"] == "same":
                assert _class_name(rebuilt, j) == _class_name(original, i), key
            if row["labels"] in ("same", "numbers"):
                assert int(rebuilt.labels[j]) == int(original.labels[i]), key
            if row["fields"] == "same":
                assert [spec.name for spec in rebuilt.fields] == [spec.name for spec in original.fields]
                for spec in original.fields:
                    assert _field(rebuilt, rebuilt.field_spec(spec.name), j) == _field(original, spec, i), (key, spec.name)
            checked += 1
        assert checked == result.samples
        if row["class list"] == "same":
            assert rebuilt.classes == original.classes


def test_the_claims_table_covers_every_target_and_says_something() -> None:
    assert {row["--to"] for row in ROWS} == {"folder", "tar", "webdataset"}
    assert all(row["bytes"] == "same" for row in ROWS)
