"""The differential matrix: every door against the folder path (issue 25).

For every source kind, the same images and labels are written the way that kind holds them, built
with each option, and compared with the image folder built with the same option: the same dataset
(classes, and per sample in dataset order: key, bytes, label, fields), or a typed refusal naming
why. ``EXPECTED`` is the promise, cell by cell; the test checks every cell, and
``docs/reference/doors.md`` holds the table rendered from ``EXPECTED`` (a test checks that the page
matches, so the page says exactly what the matrix checks). Regenerate the page's table with

    python tests/sources/test_every_door_matrix.py --write-docs
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import sys
import tarfile
import time
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

from packer.dataset import open_dataset
from packer.errors import PackerError
from packer.writer import BuildOptions, build, finish
from packer.writer.append import append

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reference" / "doors.md"
OPTIONS = BuildOptions(shard_size=12 << 10, seed=5)
CLASSES = ("emu", "cat", "dog", "zebra")  # --classes: another order, and a class without samples

#: The samples every kind holds: key, label.
SAMPLES = [("cat/000.jpg", "cat"), ("cat/001.jpg", "cat"), ("dog/000.jpg", "dog"), ("dog/001.jpg", "dog"),
           ("emu/000.jpg", "emu"), ("emu/001.jpg", "emu")]
#: Samples without a label, for the ``unlabeled`` column (each kind writes "no label" its own way).
UNLABELED = ["u000.jpg", "u001.jpg"]


def image(key: str) -> bytes:
    seed = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)
    pixels = np.random.default_rng(seed).integers(0, 255, (10 + seed % 7, 14, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=80)
    return out.getvalue()


def caption(key: str) -> str:
    return f"a photo of {key}"


# --- writing the samples as each kind -------------------------------------------------------------------

@dataclass
class Source:
    path: Path
    build: dict[str, Any]          # build() keywords: root, source_kind
    cli: list[str]                 # the same as CLI arguments
    fields: tuple[str, ...] = ()   # --field declarations the kind needs


def _tar(path: Path, files: dict[str, bytes], mode: str = "w") -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def _tar_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _images_folder(folder: Path, samples: list[tuple[str, str]], unlabeled: list[str]) -> Path:
    for key, _ in samples:
        (folder / key).parent.mkdir(parents=True, exist_ok=True)
        (folder / key).write_bytes(image(key))
    for key in unlabeled:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / key).write_bytes(image(key))
    return folder


def write_folder(folder: Path, samples: list[tuple[str, str]], unlabeled: list[str]) -> Source:
    return Source(_images_folder(folder / "src", samples, unlabeled), {}, [])


def _manifest(folder: Path, samples: list[tuple[str, str]], unlabeled: list[str], suffix: str) -> Source:
    root = _images_folder(folder / "images", samples, unlabeled)
    rows = [(key, label) for key, label in samples] + [(key, "") for key in unlabeled]
    path = folder / f"list.{suffix}"
    if suffix == "jsonl":
        lines = [json.dumps({"path": key, "label": label} if label else {"path": key}) for key, label in rows]
    else:
        sep = "," if suffix == "csv" else "\t"
        lines = [f"path{sep}label"] + [f"{key}{sep}{label}" for key, label in rows]
    path.write_text("\n".join(lines) + "\n", "utf-8")
    return Source(path, {"root": root}, ["--root", str(root)])


def write_tar(folder: Path, samples: list[tuple[str, str]], unlabeled: list[str], mode: str = "w") -> Source:
    files = {key: image(key) for key, _ in samples} | {key: image(key) for key in unlabeled}
    suffix = "tar" if mode == "w" else "tar.gz"
    return Source(_tar(folder / f"data.{suffix}", files, mode), {}, [])


def write_tar_of_tars(folder: Path, samples: list[tuple[str, str]], unlabeled: list[str]) -> Source:
    outer: dict[str, bytes] = {}
    for label in dict.fromkeys(label for _, label in samples):
        outer[f"{label}.tar"] = _tar_bytes({key.split("/", 1)[1]: image(key) for key, lab in samples if lab == label})
    outer |= {key: image(key) for key in unlabeled}
    return Source(_tar(folder / "train.tar", outer), {}, [])


def write_zip(folder: Path, samples: list[tuple[str, str]], unlabeled: list[str]) -> Source:
    path = folder / "data.zip"
    with zipfile.ZipFile(path, "w") as archive:
        for number, key in enumerate([key for key, _ in samples] + unlabeled):
            archive.writestr(key, image(key), compress_type=zipfile.ZIP_DEFLATED if number % 2 else zipfile.ZIP_STORED)
    return Source(path, {}, [])


def write_webdataset(folder: Path, samples: list[tuple[str, str]], unlabeled: list[str]) -> Source:
    files: dict[str, bytes] = {}
    for key, label in samples:
        stem = key.rsplit(".", 1)[0]
        files[key] = image(key)
        files[f"{stem}.cls"] = label.encode()
    for key in unlabeled:
        files[key] = image(key)
    (folder / "shards").mkdir(parents=True, exist_ok=True)
    return Source(_tar(folder / "shards" / "train-000000.tar", files), {"source_kind": "webdataset"},
                  ["--source-kind", "webdataset"])


def write_parquet(folder: Path, samples: list[tuple[str, str]], unlabeled: list[str]) -> Source:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    keys = [key for key, _ in samples] + unlabeled
    table = pa.table({
        "image": pa.array([{"bytes": image(key), "path": key} for key in keys],
                          type=pa.struct([("bytes", pa.binary()), ("path", pa.string())])),
        "label": pa.array([label for _, label in samples] + [None] * len(unlabeled), type=pa.string())})
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "train.parquet")
    return Source(folder / "train.parquet", {}, [])


def write_coco(folder: Path, samples: list[tuple[str, str]], unlabeled: list[str]) -> Source:
    root = _images_folder(folder / "images", samples, [])
    names = sorted({label for _, label in samples})
    document = {"images": [{"id": n, "file_name": key} for n, (key, _) in enumerate(samples)],
                "annotations": [{"id": n, "image_id": n, "category_id": names.index(label) + 1, "bbox": [1, 2, 3, 4]}
                                for n, (_, label) in enumerate(samples)],
                "categories": [{"id": n + 1, "name": name} for n, name in enumerate(names)]}
    path = folder / "instances.json"
    path.write_text(json.dumps(document), "utf-8")
    return Source(path, {"root": root}, ["--root", str(root)])


def write_side_files(folder: Path, samples: list[tuple[str, str]], unlabeled: list[str]) -> Source:
    root = _images_folder(folder / "src", samples, unlabeled)
    for key, _ in samples:
        (root / key).with_suffix(".txt").write_text(caption(key), "utf-8")
    return Source(root, {}, ["--field", "caption=text@txt"], fields=("caption=text@txt",))


KINDS: dict[str, Callable[[Path, list[tuple[str, str]], list[str]], Source]] = {
    "folder": write_folder,
    "CSV": lambda f, s, u: _manifest(f, s, u, "csv"),
    "TSV": lambda f, s, u: _manifest(f, s, u, "tsv"),
    "JSONL": lambda f, s, u: _manifest(f, s, u, "jsonl"),
    "tar": write_tar,
    "tar of tars": write_tar_of_tars,
    "tar.gz": lambda f, s, u: write_tar(f, s, u, "w:gz"),
    "zip": write_zip,
    "WebDataset": write_webdataset,
    "Parquet": write_parquet,
    "COCO": write_coco,
    "side files": write_side_files,
}


def make(kind: str, folder: Path, samples: list[tuple[str, str]], unlabeled: list[str] = ()) -> Source:  # type: ignore[assignment]
    folder.mkdir(parents=True, exist_ok=True)
    return KINDS[kind](folder, samples, list(unlabeled))


OPTION_NAMES = ("plain", "--classes", "--classes-from", "unlabeled", "append", "--resume", "--part K/N", "workers=2")


# --- the promise ------------------------------------------------------------------------------------------

SAME = "same"
#: What a cell must give. ``same``: the dataset equals the folder path's (same option). ``same (N
#: REASON)``: equal, and the unlabeled samples are in the report with that reason. ``same images``:
#: keys and bytes equal, the kind has no main label (COCO's categories are a field). ``refused
#: (CLASS)``: a typed error before anything is written.
EXPECTED: dict[str, dict[str, str]] = {kind: dict.fromkeys(OPTION_NAMES, SAME) for kind in KINDS}
for _kind in ("folder", "tar", "tar of tars", "tar.gz", "zip", "side files"):
    EXPECTED[_kind]["unlabeled"] = "same (2 not-in-class-folder)"
for _kind in ("CSV", "TSV", "JSONL"):
    EXPECTED[_kind]["unlabeled"] = "same (2 bad-manifest-row)"
for _kind in ("WebDataset", "Parquet"):
    EXPECTED[_kind]["unlabeled"] = "same (2 unlabeled)"
EXPECTED["COCO"] = {"plain": "same images", "--classes": "refused (OptionError)", "--classes-from": "refused (OptionError)",
                    "unlabeled": "n/a (no main labels)", "append": "refused (OptionError)", "--resume": "same images",
                    "--part K/N": "same images", "workers=2": "same images"}
EXPECTED["side files"]["append"] = "refused (OptionError)"  # append does not take declared fields yet


# --- running a cell ---------------------------------------------------------------------------------------

def content(out: Path, *, ordered: bool = True) -> dict[str, Any]:
    """What two builds must share: the class list, and per sample its key, bytes, label and fields."""
    with open_dataset(out, verify_checksums=True) as ds:
        rows = []
        for i in range(len(ds)):
            label = int(ds.labels[i])
            fields = tuple((spec.name, str(ds.value(spec.name, i))) for spec in ds.fields)
            rows.append((ds.key(i), hashlib.sha256(ds.read(i)).hexdigest(),
                         ds.classes[label] if ds.classes else label, fields))
        return {"classes": ds.classes, "rows": rows if ordered else sorted(rows)}


def images_only(found: dict[str, Any]) -> list[tuple[str, str]]:
    return [(key, digest) for key, digest, _, _ in found["rows"]]


class Matrix:
    """Builds each kind's sources once, and the folder references per option, under one folder."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.references: dict[str, dict[str, Any]] = {}
        self.cells: dict[str, dict[str, str]] = {}
        self.train = base / "train-ds"  # --classes-from: a training set with one more class
        train = write_folder(base / "train", SAMPLES + [("owl/000.jpg", "owl")], [])
        build(train.path, self.train, OPTIONS, workers=1, progress=False)

    def reference(self, option: str) -> dict[str, Any]:
        if option not in self.references:
            out = self.base / f"ref-{len(self.references)}"
            source = write_folder(self.base / f"ref-src-{len(self.references)}", SAMPLES, [])
            build(source.path, out, self.options(option), workers=1, progress=False)
            self.references[option] = content(out)
        return self.references[option]

    def options(self, option: str, fields: tuple[str, ...] = ()) -> BuildOptions:
        options = replace(OPTIONS, fields=fields)
        if option == "--classes":
            return replace(options, classes=CLASSES)
        if option == "--classes-from":
            with open_dataset(self.train) as ds:
                return replace(options, classes=ds.classes)
        return options

    def run(self, kind: str, option: str) -> str:
        folder = self.base / f"{kind}-{option}".replace(" ", "_").replace("/", "_")
        folder.mkdir(parents=True)
        out = folder / "out"
        if option == "unlabeled" and kind == "COCO":
            return "n/a (no main labels)"
        source = make(kind, folder, SAMPLES, UNLABELED if option == "unlabeled" else [])
        options = self.options(option, source.fields)
        try:
            result = self._build(kind, option, source, options, folder, out)
        except PackerError as exc:
            return f"refused ({exc.name if isinstance(exc, _Refused) else type(exc).__name__})"
        found = content(out, ordered=option != "append")
        reference = self.reference("plain" if option in ("unlabeled", "append", "--resume", "--part K/N",
                                                         "workers=2") else option)
        if option == "append":
            reference = {"classes": reference["classes"], "rows": sorted(reference["rows"])}
        if kind == "COCO":
            return "same images" if images_only(found) == images_only(reference) else "DIFFERENT images"
        if source.fields:  # the fields are the captions the side files hold; the rest is the folder's
            captions = {row[0]: row[3] for row in found["rows"]}
            if any(fields != (("caption", caption(key)),) for key, fields in captions.items()):
                return "DIFFERENT fields"
            found = {"classes": found["classes"], "rows": [row[:3] + ((),) for row in found["rows"]]}
        if found != reference:
            return "DIFFERENT"
        extra = [r.reason for r in (result.rejected if result is not None else [])]
        return f"same ({len(extra)} {extra[0]})" if extra and len(set(extra)) == 1 else (
            SAME if not extra else f"same ({', '.join(sorted(extra))})")

    def _build(self, kind: str, option: str, source: Source, options: BuildOptions, folder: Path,
               out: Path) -> Any:
        one = {"workers": 1, "progress": False, **source.build}
        if option == "--classes-from":  # through the CLI, as a user gives it
            from click.testing import CliRunner

            from packer.cli import _register, cli

            _register()
            argv = ["build", str(source.path), str(out), "-q", "--json", "--workers", "1", "--shard-size",
                    str(OPTIONS.shard_size), "--seed", str(OPTIONS.seed), "--classes-from", str(self.train), *source.cli]
            done = CliRunner().invoke(cli, argv)
            document = json.loads(done.stdout)
            if not document["ok"]:
                assert done.exit_code in (1, 2, 3), done.output
                raise _Refused(document["error"])
            assert done.exit_code == 0, done.output
            return None
        if option == "append":
            first = [s for s in SAMPLES if s[1] in ("cat", "dog")][:3]
            rest = [s for s in SAMPLES if s not in first]
            half = make(kind, folder / "first", first)
            build(half.path, out, options, **{"workers": 1, "progress": False, **half.build})
            more = make(kind, folder / "rest", rest)
            return append(out, more.path, root=more.build.get("root"), workers=1)
        if option == "--resume":  # planned (and killed) before packing, then resumed
            build(source.path, out, options, plan_only=True, **one)
            return build(source.path, out, options, resume=True, **one)
        if option == "--part K/N":
            for part in (1, 0):
                build(source.path, out, options, part=(part, 2), **one)
            return finish(out, source.path, source.build.get("root"))
        if option == "workers=2":
            return build(source.path, out, options, **{**one, "workers": 2})
        return build(source.path, out, options, **one)


class _Refused(PackerError):
    """A CLI refusal, named by the class the CLI reported."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


# --- the table ----------------------------------------------------------------------------------------

_BEGIN = "<!-- door-matrix: begin (generated by tests/sources/test_every_door_matrix.py --write-docs) -->"
_END = "<!-- door-matrix: end -->"


def render_table(expected: dict[str, dict[str, str]] = EXPECTED) -> str:
    lines = [_BEGIN, "", "| kind | " + " | ".join(f"`{o}`" if o.startswith("-") else o for o in OPTION_NAMES) + " |",
             "|---" * (len(OPTION_NAMES) + 1) + "|"]
    for kind, cells in expected.items():
        lines.append(f"| {kind} | " + " | ".join(cells[o] for o in OPTION_NAMES) + " |")
    return "\n".join(lines + ["", _END])


def page_table(text: str) -> str:
    start, end = text.index(_BEGIN), text.index(_END) + len(_END)
    return text[start:end]


# --- the tests --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Any:
    started = time.monotonic()
    built = Matrix(tmp_path_factory.mktemp("matrix"))
    yield built
    outcomes: dict[str, int] = {}
    for cells in built.cells.values():
        for text in cells.values():
            word = text.split(" ")[0]
            outcomes[word] = outcomes.get(word, 0) + 1
    print(f"door matrix: {json.dumps({'kinds': len(built.cells), 'cells': sum(outcomes.values()), 'outcomes': outcomes, 'seconds': round(time.monotonic() - started, 1)}, sort_keys=True)}")


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_door_keeps_the_folder_paths_promises(matrix: Matrix, kind: str) -> None:
    """One kind across every option: each cell as ``EXPECTED`` says."""
    observed = {option: matrix.run(kind, option) for option in OPTION_NAMES}
    matrix.cells[kind] = observed
    assert observed == EXPECTED[kind]


def test_the_docs_table_is_the_matrix() -> None:
    """docs/reference/doors.md promises exactly what this matrix checks (regenerate: --write-docs)."""
    assert page_table(DOC.read_text("utf-8")) == render_table()


def test_the_references_differ_by_option(matrix: Matrix) -> None:
    """The matrix can fail: the folder references differ where the options say they must."""
    plain, fixed = matrix.reference("plain"), matrix.reference("--classes")
    assert plain["classes"] == ("cat", "dog", "emu") and fixed["classes"] == CLASSES
    assert [row[2] for row in plain["rows"]] == [row[2] for row in fixed["rows"]]  # names equal ...
    with open_dataset(matrix.base / "ref-0") as a, open_dataset(matrix.base / "ref-1") as b:
        assert a.labels.tolist() != b.labels.tolist()  # ... numbers differ


if __name__ == "__main__":
    if sys.argv[1:] == ["--write-docs"]:
        text = DOC.read_text("utf-8")
        DOC.write_text(text.replace(page_table(text), render_table()), "utf-8")
        print(f"wrote the table into {DOC}")
    else:
        print(render_table())
