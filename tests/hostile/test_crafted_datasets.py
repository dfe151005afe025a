"""A crafted dataset is refused at open with a typed ``PackerError`` naming what is wrong, before any
allocation proportional to a stored count (checked with ``tracemalloc``), and never hangs:
manifests, index headers, column tables and values, nested metadata, shard lists, links and
special files in place of dataset files, and keys that would lead ``inspect --extract`` outside.

Every crafted dataset keeps the manifest's index checksum consistent with the crafted index, so
the structural checks themselves are exercised (not just the index checksum)."""

from __future__ import annotations
import json
import os
import shutil
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

from packer import errors as E
from packer import format as fmt
from packer.dataset import open_dataset, open_index
from packer.errors import IndexMismatchError, PackerError
from packer.writer import build
from packer import BuildSettings, LayoutSettings, RunOptions

from helpers import REPO, copy_dataset, count_trial, run_main


# --- from test_crafted_inputs ---------------------------------------------------------------------


#: Allocation budget for refusing a crafted dataset: far below what any stored count would ask for.
ALLOCATION_LIMIT = 32 << 20


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """A small valid dataset: 8 samples in 2+ shards, alignment 4096."""
    work = tmp_path_factory.mktemp("hostile")
    rng = np.random.default_rng(0)
    for c in range(2):
        folder = work / "src" / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 256, (20 + i, 24, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    build(work / "src", work / "ds", BuildSettings(layout=LayoutSettings(shard_size=12 << 10)), RunOptions(workers=1))
    assert len(json.loads((work / "ds" / "manifest.json").read_text())["shards"]) >= 2
    return work / "ds"


@pytest.fixture
def ds(pristine, tmp_path) -> Path:
    target = tmp_path / "ds"
    shutil.copytree(pristine, target)
    return target


def load_manifest(path: Path) -> dict[str, Any]:
    return json.loads((path / fmt.MANIFEST_NAME).read_text())


def save_manifest(path: Path, manifest: Any) -> None:
    (path / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))


def install_index(path: Path, data: bytes) -> None:
    """Replace the index with ``data`` and make the manifest's entry (name, size, checksum) match."""
    manifest = load_manifest(path)
    (path / manifest["index"]["path"]).unlink()
    digest = fmt.checksum(data)
    name = fmt.index_file_name(digest)
    (path / name).write_bytes(data)
    manifest["index"] = {"path": name, "size": len(data), "checksum": fmt.checksum_hex(digest)}
    save_manifest(path, manifest)


def index_bytes(path: Path) -> bytes:
    return (path / load_manifest(path)["index"]["path"]).read_bytes()


def index_columns(path: Path) -> tuple[int, dict[str, np.ndarray]]:
    rows, columns = fmt.parse_column_file(index_bytes(path), fmt.INDEX_MAGIC)
    return rows, {name: np.array(column) for name, column in columns.items()}


def rewrite_index(path: Path, rows: int, columns: dict[str, np.ndarray]) -> None:
    install_index(path, b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns)))


def open_and_read_all(path: Path) -> None:
    with open_dataset(path, verify_checksums=True) as dataset:
        for i in range(len(dataset)):
            dataset.read(i)
        dataset.read_batch(np.arange(len(dataset)))


def expect_refused(path: Path, error: type[PackerError], fragment: str = "", *,
                   limit: int = ALLOCATION_LIMIT) -> PackerError:
    """Opening and reading ``path`` raises ``error`` (exactly that class or a subclass), within the
    allocation budget."""
    tracemalloc.start()
    try:
        with pytest.raises(PackerError) as caught:
            open_and_read_all(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(caught.value, error), f"expected {error.__name__}, got {caught.value!r}"
    assert fragment in str(caught.value), f"{fragment!r} not in {str(caught.value)!r}"
    assert peak < limit, f"refusing it allocated {peak >> 20} MiB"
    return caught.value


# --- crafted manifests ----------------------------------------------------------------------------


def _set(*keys: Any, value: Any) -> Callable[[dict[str, Any]], None]:
    def mutate(manifest: dict[str, Any]) -> None:
        target = manifest
        for key in keys[:-1]:
            target = target[key]
        target[keys[-1]] = value
    return mutate


MANIFEST_CASES = {
    "shard-dotdot": (_set("shards", 0, "path", value="../escape.pks"), E.UnsafePathError),
    "shard-dotdot-inside": (_set("shards", 0, "path", value="shards/../../escape.pks"), E.UnsafePathError),
    "shard-absolute": (_set("shards", 0, "path", value="/etc/passwd"), E.UnsafePathError),
    "shard-subfolder": (_set("shards", 0, "path", value="shards/a/shard-00000-0000000000000000.pks"),
                        E.UnsafePathError),
    "shard-nul": (_set("shards", 0, "path", value="shards/shard-00000\x00.pks"), E.UnsafePathError),
    "shard-backslash": (_set("shards", 0, "path", value="shards\\..\\..\\x.pks"), E.UnsafePathError),
    "shard-not-string": (_set("shards", 0, "path", value=["shards/x.pks"]), E.ManifestError),
    "index-dotdot": (_set("index", "path", value="../index-0000000000000000.pki"), E.UnsafePathError),
    "index-absolute": (_set("index", "path", value="/tmp/index-0000000000000000.pki"), E.UnsafePathError),
    "sample-count-2^63": (_set("sample_count", value=2**63), E.ManifestError),
    "sample-count-2^64": (_set("sample_count", value=2**64), E.ManifestError),
    "sample-count-negative": (_set("sample_count", value=-1), E.ManifestError),
    "sample-count-float": (_set("sample_count", value=8.0), E.ManifestError),
    "sample-count-string": (_set("sample_count", value="8"), E.ManifestError),
    "sample-count-bool": (_set("sample_count", value=True), E.ManifestError),
    "sample-count-null": (_set("sample_count", value=None), E.ManifestError),
    "shard-size-negative": (_set("shards", 0, "size", value=-4096), E.ManifestError),
    "shard-size-2^64": (_set("shards", 0, "size", value=2**64), E.ManifestError),
    "shard-size-zero": (_set("shards", 0, "size", value=0), E.ManifestError),
    "shard-size-past-end": (_set("shards", 0, "size", value=4096 * 1000), E.FormatError),
    "shard-count-2^63": (_set("shards", 0, "sample_count", value=2**63), E.ManifestError),
    "shard-count-negative": (_set("shards", 0, "sample_count", value=-3), E.ManifestError),
    "alignment-3": (_set("alignment", value=3), E.ManifestError),
    "alignment-0": (_set("alignment", value=0), E.ManifestError),
    "alignment-2^40": (_set("alignment", value=2**40), E.ManifestError),
    "alignment-string": (_set("alignment", value="4096"), E.ManifestError),
    "alignment-other": (_set("alignment", value=512), E.FormatError),
    "shards-object": (_set("shards", value={"0": {}}), E.ManifestError),
    "shards-of-ints": (_set("shards", value=[1, 2]), E.ManifestError),
    "shards-empty": (_set("shards", value=[]), E.ManifestError),
    "classes-ints": (_set("classes", value=[1, 2]), E.ManifestError),
    "classes-string": (_set("classes", value="ab"), E.ManifestError),
    "checksum-upper": (_set("index", "checksum", value="ABCDEF0123456789"), E.ManifestError),
    "checksum-int": (_set("shards", 0, "checksum", value=12345), E.ManifestError),
    "checksum-wrong": (_set("index", "checksum", value="0123456789abcdef"), E.ChecksumMismatchError),
    "format-version-2": (_set("format_version", value=2), E.UnsupportedVersionError),
    "format-version-string": (_set("format_version", value="1"), E.ManifestError),
    "format-other": (_set("format", value="webdataset"), E.NotAPackerFileError),
    "checksum-algorithm": (_set("checksum_algorithm", value="md5"), E.ManifestError),
    "codec-not-object": (_set("codec", value="passthrough"), E.ManifestError),
    "build-not-object": (_set("build", value=[1]), E.ManifestError),
    "history-not-list": (_set("history", value={"a": 1}), E.ManifestError),
    "index-size-huge": (_set("index", "size", value=2**62), E.FormatError),
}


@pytest.mark.parametrize("case", sorted(MANIFEST_CASES))
def test_crafted_manifest_refused(ds, case):
    mutate, error = MANIFEST_CASES[case]
    manifest = load_manifest(ds)
    mutate(manifest)
    save_manifest(ds, manifest)
    expect_refused(ds, error)


def test_manifest_structural_edits_refused(ds):
    """Consistent-looking edits across entries: swapped, duplicated, recounted shards."""
    original = load_manifest(ds)
    edits = {
        "swapped": lambda m: m["shards"].reverse(),
        "duplicated": lambda m: m["shards"].__setitem__(1, dict(m["shards"][0])),
        "recounted": lambda m: (m["shards"][0].__setitem__("sample_count", m["shards"][0]["sample_count"] + 1),
                                m.__setitem__("sample_count", m["sample_count"] + 1)),
        "moved-count": lambda m: (m["shards"][0].__setitem__("sample_count", m["shards"][0]["sample_count"] + 1),
                                  m["shards"][1].__setitem__("sample_count", m["shards"][1]["sample_count"] - 1)),
        "other-shard-file": lambda m: m["shards"][0].__setitem__("path", m["shards"][1]["path"]),
    }
    for name, edit in edits.items():
        manifest = json.loads(json.dumps(original))
        edit(manifest)
        save_manifest(ds, manifest)
        expect_refused(ds, E.FormatError)


@pytest.mark.parametrize("text,error", [
    (b"", E.NotAPackerFileError),
    (b"[]", E.NotAPackerFileError),
    (b"{", E.ManifestError),
    (b"\xff\xfe{}", E.NotAPackerFileError),
    (b'{"format": "packer-dataset", "format_version": NaN}', E.ManifestError),
    (b'{"format": "packer-dataset", "build": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", E.ManifestError),
    (b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 12\n", E.NotAPackerFileError),
])
def test_garbage_manifest_refused(ds, text, error):
    (ds / fmt.MANIFEST_NAME).write_bytes(text)
    expect_refused(ds, error)


def test_huge_manifest_refused_without_reading_it_all(ds):
    """A manifest over the 64 MiB cap is refused after reading at most cap + 1 bytes."""
    with open(ds / fmt.MANIFEST_NAME, "r+b") as handle:
        handle.truncate(fmt.MAX_MANIFEST_BYTES + (1 << 20))  # 1 MiB over: sparse, costs no disk
    expect_refused(ds, E.ManifestError, "limit", limit=fmt.MAX_MANIFEST_BYTES + (16 << 20))


# --- crafted indexes ------------------------------------------------------------------------------


_HEADER = {"version": (8, "<I"), "header_size": (12, "<I"), "file_size": (16, "<Q"), "row_count": (24, "<Q"),
           "column_count": (32, "<I")}


def _patch(data: bytes, offset: int, code: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(code, out, offset, value)
    return bytes(out)


def _column_entry(data: bytes, name: str) -> int:
    count = struct.unpack_from("<I", data, 32)[0]
    for i in range(count):
        start = fmt.COLUMN_FILE_HEADER_SIZE + i * fmt.COLUMN_ENTRY_SIZE
        if data[start:start + 24].rstrip(b"\0") == name.encode():
            return start
    raise AssertionError(name)


INDEX_HEADER_CASES = {
    "row-count-2^63": ("row_count", 2**63, E.CorruptHeaderError),
    "row-count-2^40": ("row_count", 2**40, E.IndexMismatchError),
    "row-count-zero": ("row_count", 0, E.IndexMismatchError),
    "column-count-2^31": ("column_count", 2**31, E.CorruptHeaderError),
    "column-count-zero": ("column_count", 0, E.CorruptHeaderError),
    "header-size-huge": ("header_size", 2**32 - 64, E.CorruptHeaderError),
    "file-size-huge": ("file_size", 2**63, E.TruncatedFileError),
    "version-99": ("version", 99, E.UnsupportedVersionError),
}


@pytest.mark.parametrize("case", sorted(INDEX_HEADER_CASES))
def test_crafted_index_header_refused(ds, case):
    field, value, error = INDEX_HEADER_CASES[case]
    offset, code = _HEADER[field]
    install_index(ds, _patch(index_bytes(ds), offset, code, value))
    expect_refused(ds, error)


INDEX_ENTRY_CASES = {
    "length-2^61": ("offset", 40, "<Q", 2**61, E.OffsetOutOfBoundsError),
    "length-2^64-1": ("size", 40, "<Q", 2**64 - 1, E.OffsetOutOfBoundsError),
    "offset-2^63": ("label", 32, "<Q", 2**63, E.FormatError),
    "offset-unaligned": ("label", 32, "<Q", 8, E.OverlappingRecordsError),
    "dtype-object": ("keys", 24, "8s", b"|O", E.CorruptHeaderError),
    "dtype-float": ("offset", 24, "8s", b"<f8", E.CorruptHeaderError),
    "dtype-big-endian": ("offset", 24, "8s", b">u8", E.CorruptHeaderError),
    "name-non-ascii": ("offset", 0, "24s", "öffset".encode(), E.CorruptHeaderError),
    "name-duplicate": ("size", 0, "24s", b"offset", E.CorruptHeaderError),
}


@pytest.mark.parametrize("case", sorted(INDEX_ENTRY_CASES))
def test_crafted_index_column_table_refused(ds, case):
    column, field_offset, code, value, error = INDEX_ENTRY_CASES[case]
    data = index_bytes(ds)
    install_index(ds, _patch(data, _column_entry(data, column) + field_offset, code, value))
    expect_refused(ds, error)


def _edit_column(name: str, edit: Callable[[np.ndarray], None]) -> Callable[[dict[str, np.ndarray]], None]:
    def apply(columns: dict[str, np.ndarray]) -> None:
        edit(columns[name])
    return apply


def _swap(column: np.ndarray) -> None:
    column[[0, 1]] = column[[1, 0]]


INDEX_VALUE_CASES = {
    "offset-past-end": (_edit_column("offset", lambda c: c.__setitem__(-1, c[-1] + 4096 * 100)),
                        E.FormatError),
    "offsets-overlap": (_edit_column("offset", lambda c: c.__setitem__(1, c[0])), E.OverlappingRecordsError),
    "offsets-unsorted": (lambda cols: (_swap(cols["offset"]), _swap(cols["size"])), E.OverlappingRecordsError),
    "offset-unaligned": (_edit_column("offset", lambda c: c.__setitem__(1, c[1] + 1)), E.MisalignedRecordError),
    "offset-2^63": (_edit_column("offset", lambda c: c.__setitem__(2, 2**63)), E.FormatError),
    "size-2^63": (_edit_column("size", lambda c: c.__setitem__(0, 2**63)), E.OffsetOutOfBoundsError),
    "size-zero": (_edit_column("size", lambda c: c.__setitem__(0, 0)), E.CorruptHeaderError),
    "size-grown": (_edit_column("size", lambda c: c.__setitem__(0, c[0] + 5000)), E.FormatError),
    "shard-2^31": (_edit_column("shard", lambda c: c.__setitem__(0, 2**31)), E.OffsetOutOfBoundsError),
    "shard-regrouped": (_edit_column("shard", lambda c: c.__setitem__(0, 1)), E.OverlappingRecordsError),
    "label-negative": (_edit_column("label", lambda c: c.__setitem__(0, -5)), E.IndexMismatchError),
    "label-huge": (_edit_column("label", lambda c: c.__setitem__(0, 2**62)), E.IndexMismatchError),
    "key-offsets-decreasing": (_edit_column("key_offsets", lambda c: c.__setitem__(1, c[3])),
                               E.OverlappingRecordsError),
    "key-offsets-past-blob": (_edit_column("key_offsets", lambda c: c.__setitem__(-1, c[-1] + 1000)),
                              E.OverlappingRecordsError),
    "meta-offsets-nonzero-start": (_edit_column("meta_offsets", lambda c: c.__setitem__(0, 7)),
                                   E.OverlappingRecordsError),
}


@pytest.mark.parametrize("case", sorted(INDEX_VALUE_CASES))
def test_crafted_index_values_refused(ds, case):
    edit, error = INDEX_VALUE_CASES[case]
    rows, columns = index_columns(ds)
    edit(columns)
    rewrite_index(ds, rows, columns)
    expect_refused(ds, error)


def test_index_missing_column_and_wrong_dtype(ds):
    rows, columns = index_columns(ds)
    without = {k: v for k, v in columns.items() if k != "checksum"}
    rewrite_index(ds, rows, without)
    expect_refused(ds, E.CorruptHeaderError, "checksum")
    retyped = dict(columns, label=columns["label"].astype("<u8"))
    rewrite_index(ds, rows, retyped)
    expect_refused(ds, E.CorruptHeaderError, "label")


def test_bad_metadata_and_keys_are_typed_on_use(ds):
    """keys/meta are not validated at open (spec 8.2); using them never raises a raw error."""
    rows, columns = index_columns(ds)
    columns["keys"][:] = 0xFF  # invalid UTF-8
    columns["meta"] = np.frombuffer(b"{not json" * rows, dtype=np.uint8).copy()
    columns["meta_offsets"] = np.arange(rows + 1, dtype=np.uint64) * 9
    rewrite_index(ds, rows, columns)
    with open_index(ds) as index:
        assert "\ufffd" in index.key(0)
        with pytest.raises(E.IndexMismatchError):
            index.metadata(0)


# --- files that are not what the manifest says ----------------------------------------------------


def _outside_copy(ds: Path, relative: str) -> Path:
    outside = ds.parent / "outside" / Path(relative).name
    outside.parent.mkdir(exist_ok=True)
    shutil.copy(ds / relative, outside)
    return outside


def test_shard_symlink_leading_outside_is_refused(ds):
    relative = load_manifest(ds)["shards"][0]["path"]
    outside = _outside_copy(ds, relative)
    (ds / relative).unlink()
    (ds / relative).symlink_to(outside)
    expect_refused(ds, E.UnsafePathError, "outside")


def test_index_symlink_leading_outside_is_refused(ds):
    relative = load_manifest(ds)["index"]["path"]
    outside = _outside_copy(ds, relative)
    (ds / relative).unlink()
    (ds / relative).symlink_to(outside)
    expect_refused(ds, E.UnsafePathError, "outside")


def test_shards_folder_symlink_leading_outside_is_refused(ds):
    outside = ds.parent / "outside-shards"
    shutil.move(ds / "shards", outside)
    (ds / "shards").symlink_to(outside)
    expect_refused(ds, E.UnsafePathError, "outside")


def test_symlinks_inside_the_dataset_and_to_it_are_fine(ds, tmp_path):
    """A symlink that stays inside the folder is followed; so is a symlink to the folder itself."""
    relative = load_manifest(ds)["shards"][0]["path"]
    stash = ds / "stash"
    stash.mkdir()
    shutil.move(ds / relative, stash / "real.pks")
    (ds / relative).symlink_to(Path("..") / "stash" / "real.pks")
    open_and_read_all(ds)
    link = tmp_path / "link-to-ds"
    link.symlink_to(ds)
    open_and_read_all(link)


@pytest.mark.parametrize("which", ["index", "shard", "manifest"])
@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_special_files_in_place_of_dataset_files(ds, which, kind):
    """A FIFO or a folder where a file should be: a typed error, never a hang (run in a child with
    a timeout, so a regression cannot hang the suite)."""
    manifest = load_manifest(ds)
    relative = {"index": manifest["index"]["path"], "shard": manifest["shards"][0]["path"],
                "manifest": fmt.MANIFEST_NAME}[which]
    (ds / relative).unlink()
    if kind == "fifo":
        os.mkfifo(ds / relative)
    else:
        (ds / relative).mkdir()
        if which != "manifest":  # make the size check pass, so the type check is what refuses it
            entry = manifest["index"] if which == "index" else manifest["shards"][0]
            entry["size"] = os.stat(ds / relative).st_size
            save_manifest(ds, manifest)
    code = ("import sys\nfrom packer.dataset import open_dataset\nfrom packer.errors import PackerError\n"
            "try:\n    d = open_dataset(sys.argv[1])\n    [d.read(i) for i in range(len(d))]\n"
            "except PackerError as exc:\n    print(type(exc).__name__)\n    sys.exit(0)\nsys.exit(5)\n")
    done = subprocess.run([sys.executable, "-c", code, str(ds)], capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.strip()  # the typed error's name


# --- inspect --extract ----------------------------------------------------------------------------


def test_inspect_extract_writes_only_the_path_given(ds, tmp_path):
    """Keys crafted to escape (../, absolute) never choose where --extract writes; a symlink at the
    target is refused, with or without --force."""
    if not (REPO / "packer" / "cli" / "inspect_cmd.py").exists():
        pytest.skip("packer inspect is not there yet")
    rows, columns = index_columns(ds)
    keys = [b"../../../escape-%d.bin" % i if i % 2 else b"/tmp/packer-escape-%d.bin" % i for i in range(rows)]
    columns["keys"] = np.frombuffer(b"".join(keys), dtype=np.uint8).copy()
    columns["key_offsets"] = np.concatenate([[0], np.cumsum([len(k) for k in keys])]).astype(np.uint64)
    rewrite_index(ds, rows, columns)
    work = tmp_path / "a" / "b" / "c"
    work.mkdir(parents=True)
    before = {p for p in tmp_path.rglob("*")}
    target = work / "out.bin"
    for sample in ("0", "1", keys[1].decode()):
        target.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-m", "packer", "inspect", str(ds), "--sample", sample,
                               "--extract", str(target)], cwd=work, capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
        assert target.exists()
    assert {p for p in tmp_path.rglob("*")} - before == {target}
    assert not any(Path(f"/tmp/packer-escape-{i}.bin").exists() for i in range(rows))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    link = work / "link.bin"
    link.symlink_to(victim)
    for force in ([], ["--force"]):
        done = subprocess.run([sys.executable, "-m", "packer", "inspect", str(ds), "--sample", "0",
                               "--extract", str(link), *force], cwd=work, capture_output=True, timeout=60)
        assert done.returncode != 0 and "Traceback" not in done.stderr.decode()
    assert victim.read_text() == "keep me"


# --- class 3: recursion on attacker-controlled depth ----------------------------------------------


def _set_metadata(ds: Path, meta: bytes) -> None:
    manifest = json.loads((ds / fmt.MANIFEST_NAME).read_text())
    data = (ds / manifest["index"]["path"]).read_bytes()
    rows, columns = fmt.parse_column_file(data, fmt.INDEX_MAGIC)
    columns = {name: np.array(column) for name, column in columns.items()}
    columns["meta"] = np.frombuffer(meta * rows, dtype=np.uint8).copy()
    columns["meta_offsets"] = np.arange(rows + 1, dtype=np.uint64) * len(meta)
    encoded = b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns))
    (ds / manifest["index"]["path"]).unlink()
    digest = fmt.checksum(encoded)
    name = fmt.index_file_name(digest)
    (ds / name).write_bytes(encoded)
    manifest["index"] = {"path": name, "size": len(encoded), "checksum": fmt.checksum_hex(digest)}
    (ds / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.mark.parametrize("depth", [65, 5_000, 100_000])
def test_deeply_nested_metadata_is_a_typed_error(small_dataset, tmp_path, depth):
    ds = copy_dataset(small_dataset, tmp_path / "ds")
    _set_metadata(ds, b"[" * depth + b"]" * depth)
    with open_index(ds) as index:
        with pytest.raises(IndexMismatchError, match="nested"):
            index.metadata(0)
    code, out, err = run_main(["inspect", str(ds), "--sample", "0"])
    assert code == 1 and "nested" in err and "Traceback" not in err + out
    count_trial("class3-deep-metadata")


def test_metadata_within_the_depth_cap_and_brackets_in_strings(small_dataset, tmp_path):
    ds = copy_dataset(small_dataset, tmp_path / "ds")
    _set_metadata(ds, b'{"a": "' + b"[" * 500 + b'", "b": ' + b"[" * 10 + b"]" * 10 + b"}")
    with open_index(ds) as index:
        assert index.metadata(0)["a"] == "[" * 500
    count_trial("class3-metadata-within-cap")


# --- class 10: refusals that cost too much --------------------------------------------------------


def _many_shards_manifest(shards: int, sample_count: int, bad_entry: int | None = None) -> bytes:
    entries = [{"path": f"shards/shard-{i:05d}-{i:016x}.pks", "size": 4096, "sample_count": 1,
                "checksum": f"{i:016x}"} for i in range(shards)]
    if bad_entry is not None:
        entries[bad_entry]["path"] = "../../etc/passwd"
    manifest = {"format": "packer-dataset", "format_version": 1, "checksum_algorithm": "xxh3_64",
                "alignment": 4096, "sample_count": sample_count, "codec": {"name": "passthrough"},
                "classes": [], "index": {"path": "index-0000000000000000.pki", "size": 10, "checksum": "0" * 16},
                "shards": entries}
    return json.dumps(manifest).encode()


def test_huge_shard_lists_are_refused_before_any_entry_is_checked():
    from packer.errors import ManifestError

    # The count check runs before the entries: a bad path at entry 7 is never reached.
    with pytest.raises(ManifestError, match="differs from the sum"):
        fmt.parse_manifest(_many_shards_manifest(50_000, 10**9, bad_entry=7))
    with pytest.raises(ManifestError, match="every shard holds at least one sample"):
        fmt.parse_manifest(_many_shards_manifest(50_000, 10, bad_entry=7))
    with pytest.raises(PackerError, match="not a valid dataset path"):  # the counts agree: R19 names it
        fmt.parse_manifest(_many_shards_manifest(50_000, 50_000, bad_entry=7))
    manifest = fmt.parse_manifest(_many_shards_manifest(50_000, 50_000))
    assert len(manifest.shards) == 50_000 and manifest.shards[-1].number == 49_999
    assert manifest.shards[3] == fmt.ShardEntry(path="shards/shard-00003-0000000000000003.pks", size=4096,
                                                checksum=3, sample_count=1)
    count_trial("class10-cheap-refusals", 4)


# --- class 11: the C extension --------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_json_depth_scan_is_linear_on_unterminated_strings():
    """The nesting pre-check runs on hostile bytes: it must not be quadratic (a regex rescanning)."""
    assert fmt.json_nesting_depth(b'{"a": "[[[", "b": [[1]]}') == 3
    assert fmt.json_nesting_depth(b'"\\"[[[" [') == 1
    hostile = b'"' + b'\\"' * 500_000 + b"[" * 10
    assert fmt.json_nesting_depth(hostile) == 0  # one unterminated string to the end
    hostile = b'"x' * 1_000_000
    assert fmt.json_nesting_depth(hostile) == 0
    count_trial("class3-depth-scan-linear", 2)
