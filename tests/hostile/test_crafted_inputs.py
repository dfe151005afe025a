"""Hostile input: crafted manifests, indexes and file trees, decompression bombs, odd images,
``inspect --extract`` paths, and a scan for pickle/eval/shell in the package.

Every crafted dataset keeps the manifest's index checksum consistent with the crafted index, so
the structural checks themselves are exercised (not just the index checksum). Each one must be
refused with a typed ``PackerError`` subclass, before any allocation proportional to a stored
count (checked with ``tracemalloc``), and never hang.
"""

from __future__ import annotations

import ast
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
from packer.writer import build
from packer.dataset import open_dataset, open_index
from packer.errors import PackerError
from packer.writer.plan import BuildOptions

from helpers import BOMBS

REPO = Path(__file__).resolve().parents[2]
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
    build(work / "src", work / "ds", BuildOptions(shard_size=12 << 10), workers=1, progress=False)
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


# --- crafted manifests -------------------------------------------------------------------------------

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
    "alignment-other": (_set("alignment", value=64), E.FormatError),
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


# --- files that are not what the manifest says -------------------------------------------------------

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














def test_decompression_bombs_rejected_at_build(tmp_path):
    """Small files whose headers claim gigapixels are rejected as too-many-pixels at build, by the
    documented limit (--max-pixels, default 150 MP), without decoding them."""
    from packer.imageinfo import DEFAULT_MAX_PIXELS
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for name, make in BOMBS.items():
        (src / f"bomb.{name}").write_bytes(make())
    Image.new("RGB", (64, 64), "red").save(src / "ok.png")
    Image.new("RGB", (300, 300), "blue").save(src / "big.png")  # 90 kpx: over a 50 kpx limit
    for max_pixels, validate in ((DEFAULT_MAX_PIXELS, "header"), (DEFAULT_MAX_PIXELS, "full"), (50_000, "full")):
        out = tmp_path / f"out-{max_pixels}-{validate}"
        tracemalloc.start()
        result = build(tmp_path / "src", out, BuildOptions(max_pixels=max_pixels, validate=validate),
                       workers=1, progress=False)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 64 << 20
        reasons = {r.key: (r.reason, r.message) for r in result.rejected}
        for name in BOMBS:
            reason, message = reasons.pop(f"c/bomb.{name}")
            assert reason == "too-many-pixels" and "pixel" in message, (name, reason, message)
        if max_pixels == 50_000:
            assert reasons.pop("c/big.png")[0] == "too-many-pixels"
        assert reasons == {}
    done = subprocess.run([sys.executable, "-m", "packer", "build", str(tmp_path / "src"), str(tmp_path / "cli"),
                           "--max-pixels", "5000", "-q", "--json"], cwd=REPO, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads(done.stdout)
    assert summary["samples"] == 1 and summary["rejected_by_reason"] == {"too-many-pixels": 5}


_DECODE_BOMB = """
import resource, sys, time
resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))  # a regression must not take the machine
sys.path.insert(0, sys.argv[1])  # tests/, for helpers.py
from helpers import BOMBS
from packer.decode import decode_image
from packer.errors import DecodeError
for name, make in BOMBS.items():
    started = time.monotonic()
    try:
        decode_image(make(), name=name)
    except DecodeError as exc:
        assert "pixel" in str(exc).lower() and "MemoryError" not in str(exc), (name, str(exc))
        assert time.monotonic() - started < 2, (name, time.monotonic() - started)
        continue
    raise SystemExit(f"{name}: decoded a bomb")
"""


def test_decompression_bombs_rejected_at_decode():
    """Decoding stored bytes (a hostile dataset's payload) applies a pixel limit too, before
    allocating the pixels."""
    import inspect

    from packer.decode import decode_image
    if "max_pixels" not in inspect.signature(decode_image).parameters:
        pytest.xfail("packer.decode.decode_image has no pixel limit yet: a bomb is only stopped by "
                     "MemoryError after allocating gigabytes (see the reliability report)")
    done = subprocess.run([sys.executable, "-c", _DECODE_BOMB, str(Path(__file__).resolve().parents[1])], cwd=REPO,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]


def _animated_gif(path: Path) -> list[np.ndarray]:
    frames = [Image.new("RGB", (20, 10), color) for color in ("red", "green", "blue")]
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=50, loop=0)
    return [np.asarray(f) for f in frames]


def test_animated_multiframe_and_exotic_modes_follow_the_rule(tmp_path):
    """The documented rule: animated and multi-frame images are packed whole (the stored bytes are
    the file) and described and decoded by their first frame; every Pillow mode decodes to HxWx3
    uint8 RGB."""
    from packer.decode import decode_image
    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    _animated_gif(src / "anim.gif")
    first, second = Image.new("RGB", (30, 12), "yellow"), Image.new("RGB", (8, 8), "black")
    first.save(src / "pages.tiff", save_all=True, append_images=[second])
    first.save(src / "anim.webp", save_all=True, append_images=[Image.new("RGB", (30, 12), "black")],
               duration=40, lossless=True)
    first.save(src / "anim.png", save_all=True, append_images=[Image.new("RGB", (30, 12), "black")])  # APNG
    rng = np.random.default_rng(0)
    modes = {
        "cmyk.jpg": Image.fromarray(rng.integers(0, 256, (9, 11, 4), dtype=np.uint8), "CMYK"),
        "gray16.png": Image.fromarray(rng.integers(0, 65535, (9, 11), dtype=np.uint16)),
        "la.png": Image.fromarray(rng.integers(0, 256, (9, 11, 2), dtype=np.uint8), "LA"),
        "rgba.png": Image.fromarray(rng.integers(0, 256, (9, 11, 4), dtype=np.uint8), "RGBA"),
        "bilevel.png": Image.new("1", (11, 9), 1),
        "float.tiff": Image.fromarray(rng.random((9, 11), dtype=np.float32) * 300, "F"),
        "palette.png": Image.new("P", (11, 9), 3),
        "progressive.jpg": Image.fromarray(rng.integers(0, 256, (9, 11, 3), dtype=np.uint8)),
    }
    for name, image in modes.items():
        image.save(src / name, **({"progressive": True} if name == "progressive.jpg" else {}))
    result = build(tmp_path / "src", tmp_path / "out", BuildOptions(validate="full"), workers=1, progress=False)
    assert result.rejected == [], result.rejected
    with open_dataset(tmp_path / "out", verify_checksums=True) as dataset:
        for i in range(len(dataset)):
            key = dataset.key(i)
            stored = dataset.read(i)
            assert stored == (src.parent / key).read_bytes()  # packed whole, every frame kept
            pixels = decode_image(stored, int(dataset.index.image_format[i]), name=key)
            with Image.open(src.parent / key) as reference:  # frame 0
                assert pixels.shape == (reference.height, reference.width, 3) and pixels.dtype == np.uint8, key
                assert (int(dataset.index.width[i]), int(dataset.index.height[i])) == reference.size, key
                if reference.mode in ("RGB", "L", "P", "RGBA", "CMYK"):
                    expected = np.asarray(reference.convert("RGBA" if reference.mode == "P" and
                                                            "transparency" in reference.info else "RGB"))[..., :3]
                    assert np.abs(pixels.astype(int) - expected.astype(int)).max() <= 2, key


# --- inspect --extract ---------------------------------------------------------------------------------

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


# --- no pickle, eval or shell ----------------------------------------------------------------------------

FORBIDDEN_CALLS = {"eval", "exec", "compile"}
FORBIDDEN_ATTRIBUTES = {("os", "system"), ("os", "popen"), ("pickle", "load"), ("pickle", "loads"),
                        ("marshal", "loads"), ("yaml", "load"), ("shelve", "open")}
FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "yaml"}


def test_no_pickle_eval_or_shell_in_the_package():
    """The package never unpickles, evals or runs a shell: data never becomes code."""
    findings = []
    for path in sorted((REPO / "packer").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(REPO)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                findings += [f"{where}:{node.lineno} import {a.name}" for a in node.names
                             if a.name.split(".")[0] in FORBIDDEN_MODULES]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
                findings.append(f"{where}:{node.lineno} from {node.module} import")
            elif isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
                    findings.append(f"{where}:{node.lineno} {func.id}()")
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and (
                        (func.value.id, func.attr) in FORBIDDEN_ATTRIBUTES):
                    findings.append(f"{where}:{node.lineno} {func.value.id}.{func.attr}()")
                for keyword in node.keywords:
                    if keyword.arg == "shell" and not (isinstance(keyword.value, ast.Constant)
                                                       and keyword.value.value is False):
                        findings.append(f"{where}:{node.lineno} shell=")
                    if keyword.arg == "allow_pickle" and not (isinstance(keyword.value, ast.Constant)
                                                              and keyword.value.value is False):
                        findings.append(f"{where}:{node.lineno} allow_pickle=")
    assert findings == []
