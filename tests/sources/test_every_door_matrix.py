"""The differential matrix: every door against the folder path (issue 25).

For every source kind, the same images and labels are written the way that kind holds them, built
with each option, and compared with the image folder built with the same option: the same dataset
(classes, and per sample in dataset order: key, bytes, label, fields), or a typed refusal naming
why. One column re-runs a finished build with ``--resume`` through the CLI (a job script requeued
after it succeeded): it must be a no-op that exits 0 for every kind (the kind is recorded, never
guessed from the path). ``EXPECTED`` is the promise, cell by cell; the test checks every cell, and
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

from packer import BuildSettings, LabelSettings, LayoutSettings, RunOptions
from packer.dataset import open_dataset
from packer.errors import PackerError
from packer.writer import build, finish
from packer.writer.append import append

from helpers import with_source

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "reference" / "doors.md"
OPTIONS = BuildSettings(layout=LayoutSettings(shard_size=12 << 10, seed=5))
ONE = RunOptions(workers=1)
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
    build: dict[str, Any]          # the source settings it needs: root, kind (packer.SourceSettings)
    cli: list[str]                 # the same as CLI arguments
    fields: tuple[str, ...] = ()   # --field declarations the kind needs
    extra: dict[str, Any] = field(default_factory=dict)


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
    return Source(_tar(folder / "shards" / "train-000000.tar", files), {"kind": "webdataset"},
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


def write_hf(folder: Path, samples: list[tuple[str, str]], unlabeled: list[str]) -> Source:
    """A Hugging Face ``save_to_disk`` folder: the images as a ``{bytes, path}`` column (the path is
    the sample's key; named with --image-column, as it is not an ``Image`` feature), the labels a
    ``ClassLabel`` of the names this half holds (-1: no label)."""
    hf = pytest.importorskip("datasets")
    hf.disable_progress_bars()
    names = sorted({label for _, label in samples})
    keys = [key for key, _ in samples] + unlabeled
    features = hf.Features({"image": {"bytes": hf.Value("binary"), "path": hf.Value("string")},
                            "label": hf.ClassLabel(names=names)})
    columns = {"image": [{"bytes": image(key), "path": key} for key in keys],
               "label": [names.index(label) for _, label in samples] + [-1] * len(unlabeled)}
    hf.Dataset.from_dict(columns, features=features).save_to_disk(str(folder / "hf"))
    return Source(folder / "hf", {"image_column": "image"}, ["--image-column", "image"])


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
    "HF save_to_disk": write_hf,
}


#: The Python doors (issue 35): ``packer.Writer`` given each sample's bytes, or its decoded pixels
#: (stored as lossless PNG: the cell compares decoded pixels, not bytes), and ``packer.pack`` with
#: an ``fn`` giving each sample's bytes. No source path: ``append`` takes a path, not a writer.
PYTHON_DOORS = ("Writer (bytes)", "Writer (arrays)", "pack")


def make(kind: str, folder: Path, samples: list[tuple[str, str]], unlabeled: list[str] = ()) -> Source:  # type: ignore[assignment]
    folder.mkdir(parents=True, exist_ok=True)
    return KINDS[kind](folder, samples, list(unlabeled))


#: The finished build re-run with ``--resume`` (through the CLI): a no-op that exits 0.
RERUN = "done, then `--resume`"
#: A size bound: ``--max-file-size`` between the samples' sizes, so the larger half is rejected
#: (``file-too-large``) by the contract, whatever door listed them.
SIZE_BOUND = "`--max-file-size`"
OPTION_NAMES = ("plain", "--classes", "--classes-from", "unlabeled", "append", "--resume", "--part K/N", "workers=2",
                SIZE_BOUND, RERUN)


def size_bound() -> int:
    """A bound between the samples' sizes: the median, so about half of them are over it."""
    return sorted(len(image(key)) for key, _ in SAMPLES)[len(SAMPLES) // 2 - 1]


def over_size_bound() -> int:
    return sum(len(image(key)) > size_bound() for key, _ in SAMPLES)


# --- the promise ------------------------------------------------------------------------------------------

SAME = "same"
#: What a cell must give. ``same``: the dataset equals the folder path's (same option). ``same (N
#: REASON)``: equal, and the unlabeled samples are in the report with that reason. ``same images``:
#: keys and bytes equal, the kind has no main label (COCO's categories are a field). ``refused
#: (CLASS)``: a typed error before anything is written.
EXPECTED: dict[str, dict[str, str]] = {kind: dict.fromkeys(OPTION_NAMES, SAME) for kind in KINDS}
NO_OP = "no-op (exit 0)"
for _kind in KINDS:
    EXPECTED[_kind][RERUN] = NO_OP
for _kind in ("folder", "tar", "tar of tars", "tar.gz", "zip", "side files"):
    EXPECTED[_kind]["unlabeled"] = "same (2 not-in-class-folder)"
for _kind in ("CSV", "TSV", "JSONL"):
    EXPECTED[_kind]["unlabeled"] = "same (2 bad-manifest-row)"
for _kind in ("WebDataset", "Parquet", "HF save_to_disk"):
    EXPECTED[_kind]["unlabeled"] = "same (2 unlabeled)"
EXPECTED["COCO"] = {"plain": "same images", "--classes": "refused (OptionError)", "--classes-from": "refused (OptionError)",
                    "unlabeled": "n/a (no main labels)", "append": "refused (OptionError)", "--resume": "same images",
                    "--part K/N": "same images", "workers=2": "same images", RERUN: NO_OP}
EXPECTED["side files"]["append"] = "refused (OptionError)"  # append does not take declared fields yet
for _kind in KINDS:
    EXPECTED[_kind][SIZE_BOUND] = f"same ({over_size_bound()} file-too-large)"
EXPECTED["COCO"][SIZE_BOUND] = "same images"
for _kind in PYTHON_DOORS:
    EXPECTED[_kind] = dict.fromkeys(OPTION_NAMES, SAME)
    EXPECTED[_kind]["unlabeled"] = "same (2 unlabeled)"
    EXPECTED[_kind]["append"] = "n/a (no source path)"
    EXPECTED[_kind][RERUN] = NO_OP
    EXPECTED[_kind][SIZE_BOUND] = f"same ({over_size_bound()} file-too-large)"
# a Writer given arrays encodes them itself (lossless PNG): its files are not the folder's JPEGs
EXPECTED["Writer (arrays)"][SIZE_BOUND] = "n/a (encodes its own files)"
for _kind in PYTHON_DOORS[:2]:  # a Writer's samples live only in the process writing them
    for _option in ("--resume", "--part K/N", RERUN):
        EXPECTED[_kind][_option] = "refused (OptionError)"


# --- running a cell ---------------------------------------------------------------------------------------

def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def content(out: Path, *, ordered: bool = True, decoded: bool = False) -> dict[str, Any]:
    """What two builds must share: the class list, and per sample its key, bytes (``decoded``: its
    decoded pixels), label and fields."""
    with open_dataset(out, verify_checksums=True) as ds:
        rows = []
        for i in range(len(ds)):
            label = int(ds.labels[i])
            fields = tuple((spec.name, str(ds.value(spec.name, i))) for spec in ds.fields)
            data = pixels(ds.read(i)).tobytes() if decoded else ds.read(i)
            rows.append((ds.key(i), hashlib.sha256(data).hexdigest(),
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
        build(train.path, self.train, OPTIONS, ONE)

    def reference(self, option: str, *, decoded: bool = False) -> dict[str, Any]:
        name = f"{option} (decoded)" if decoded else option
        if name not in self.references:
            out = self.base / f"ref-{len(self.references)}"
            source = write_folder(self.base / f"ref-src-{len(self.references)}", SAMPLES, [])
            build(source.path, out, self.options(option), ONE)
            self.references[name] = content(out, decoded=decoded)
        return self.references[name]

    def options(self, option: str, fields: tuple[str, ...] = ()) -> BuildSettings:
        labels = LabelSettings(fields=fields)
        if option == "--classes":
            labels = replace(labels, classes=CLASSES)
        if option == "--classes-from":
            with open_dataset(self.train) as ds:
                labels = replace(labels, classes=ds.classes, classes_origin=f"--classes-from {self.train}")
        if option == SIZE_BOUND:
            return replace(OPTIONS, labels=labels, checks=replace(OPTIONS.checks, max_file_size=size_bound()))
        return replace(OPTIONS, labels=labels)

    def run(self, kind: str, option: str) -> str:
        folder = self.base / f"{kind}-{option}".replace(" ", "_").replace("/", "_")
        folder.mkdir(parents=True)
        out = folder / "out"
        if option == "unlabeled" and kind == "COCO":
            return "n/a (no main labels)"
        if kind in PYTHON_DOORS:
            return self._python(kind, option, out)
        source = make(kind, folder, SAMPLES, UNLABELED if option == "unlabeled" else [])
        options = with_source(self.options(option, source.fields), **source.build)
        if option == RERUN:
            return self._rerun(kind, source, out)
        try:
            result = self._build(kind, option, source, options, folder, out)
        except _Refused as exc:
            return f"refused ({exc.name})"
        except PackerError as exc:
            return f"refused ({type(exc).__name__})"
        found = content(out, ordered=option != "append")
        reference = self.reference("plain" if option in ("unlabeled", "append", "--resume", "--part K/N",
                                                         "workers=2", RERUN) else option)
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

    def _python(self, kind: str, option: str, out: Path) -> str:
        """A Python door's cell: the samples written (or mapped) in the folder's listing order, with
        the option's settings, compared with the folder path's dataset."""
        import packer

        if option == "append":
            return "n/a (no source path)"
        if option == SIZE_BOUND and kind == "Writer (arrays)":
            return "n/a (encodes its own files)"
        rows = SAMPLES + ([(key, None) for key in UNLABELED] if option == "unlabeled" else [])
        decoded = kind == "Writer (arrays)"
        image_of = (lambda key: pixels(image(key))) if decoded else image
        settings = self.options(option)
        run = RunOptions(workers=2 if option == "workers=2" else 1)
        try:
            if kind.startswith("Writer"):
                if option in ("--resume", "--part K/N", RERUN):
                    run = replace(run, resume=True) if option != "--part K/N" else replace(run, part=(0, 2))
                with packer.Writer(out, settings=settings, run=run) as writer:
                    for key, label in rows:
                        writer.write(image_of(key), label, key=key)
                result = writer.result
            else:
                fn = lambda row: {"image": image_of(row[0]), "label": row[1], "key": row[0]}  # noqa: E731
                if option == "--part K/N":
                    for part in (1, 0):
                        packer.pack(rows, out, fn, chunk_size=2, part=(part, 2), settings=settings, run=run)
                    result = packer.pack(rows, out, fn, chunk_size=2, resume=True, settings=settings, run=run)
                elif option == "--resume":  # mapped in part, then resumed
                    packer.pack(rows, out, fn, chunk_size=2, part=(0, 2), settings=settings, run=run)
                    result = packer.pack(rows, out, fn, chunk_size=2, resume=True, settings=settings, run=run)
                else:
                    result = packer.pack(rows, out, fn, chunk_size=2, settings=settings, run=run)
                if option == RERUN:
                    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()}
                    again = packer.pack(rows, out, fn, chunk_size=2, resume=True, settings=settings, run=run)
                    after = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()}
                    if not again.already_complete or after != before:
                        return "built again"
        except PackerError as exc:
            return f"refused ({type(exc).__name__})"
        found = content(out, decoded=decoded)
        reference = self.reference("plain" if option in ("unlabeled", "--resume", "--part K/N", "workers=2", RERUN)
                                   else option, decoded=decoded)
        if found != reference:
            return "DIFFERENT"
        if option == RERUN:
            return NO_OP
        extra = [r.reason for r in (result.rejected if result is not None else [])]
        return f"same ({len(extra)} {extra[0]})" if extra and len(set(extra)) == 1 else (
            SAME if not extra else f"same ({', '.join(sorted(extra))})")

    def _cli(self, source: Source, out: Path, *more: str) -> tuple[int, dict[str, Any], str]:
        """``packer build SRC OUT`` with the matrix's options, as a user types it: (exit code, the
        --json document, stderr)."""
        from click.testing import CliRunner

        from packer.cli import _register, cli

        _register()
        argv = ["build", str(source.path), str(out), "-q", "--json", "--workers", "1", "--shard-size",
                str(OPTIONS.layout.shard_size), "--seed", str(OPTIONS.layout.seed), *source.cli, *more]
        done = CliRunner().invoke(cli, argv)
        return done.exit_code, json.loads(done.stdout), done.stderr

    def _rerun(self, kind: str, source: Source, out: Path) -> str:
        """A finished build, then the same command with --resume: exit 0, nothing rewritten."""
        code, document, errors = self._cli(source, out)
        assert code == 0 and document["ok"], errors
        before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()}
        code, document, errors = self._cli(source, out, "--resume")
        if code != 0:
            return f"exit {code} ({document.get('error')}: {document.get('message')})"
        if not document.get("already_complete"):
            return "built again"
        if {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in out.rglob("*") if p.is_file()} != before:
            return "rewritten"
        found, reference = content(out), self.reference("plain")
        if kind == "COCO":
            return NO_OP if images_only(found) == images_only(reference) else "DIFFERENT images"
        if source.fields:
            found = {"classes": found["classes"], "rows": [row[:3] + ((),) for row in found["rows"]]}
        return NO_OP if found == reference else "DIFFERENT"

    def _build(self, kind: str, option: str, source: Source, options: BuildSettings, folder: Path,
               out: Path) -> Any:
        if option == "--classes-from":  # through the CLI, as a user gives it
            code, document, errors = self._cli(source, out, "--classes-from", str(self.train))
            if not document["ok"]:
                assert code in (1, 2, 3), errors
                assert "--classes-from" in document["message"], document  # named as the user typed it
                raise _Refused(document["error"])
            assert code == 0, errors
            return None
        if option == "append":
            first = [s for s in SAMPLES if s[1] in ("cat", "dog")][:3]
            rest = [s for s in SAMPLES if s not in first]
            half = make(kind, folder / "first", first)
            build(half.path, out, with_source(options, **half.build), ONE)
            more = make(kind, folder / "rest", rest)
            return append(out, more.path, root=more.build.get("root"), run=ONE)
        if option == "--resume":  # planned (and killed) before packing, then resumed
            build(source.path, out, options, RunOptions(workers=1, plan_only=True))
            return build(source.path, out, options, RunOptions(workers=1, resume=True))
        if option == "--part K/N":
            for part in (1, 0):
                build(source.path, out, options, RunOptions(workers=1, part=(part, 2)))
            return finish(out, source.path, source.build.get("root"))
        if option == "workers=2":
            return build(source.path, out, options, RunOptions(workers=2))
        return build(source.path, out, options, ONE)


class _Refused(Exception):
    """A CLI refusal, named by the class the CLI reported (not a PackerError subclass: the error
    class tree is what packer.errors exports, tests/project/test_process_boundaries.py)."""

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


@pytest.mark.parametrize("kind", [*KINDS, *PYTHON_DOORS])
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
