"""packer.dataset: what open refuses and says, lookups, sample info, metadata, checksums, pickling,
the shard cache, batches, iteration and declared fields read back."""

from __future__ import annotations
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.dataset import Dataset, as_sample_indices, open_dataset, open_index
from packer.errors import (
    ChecksumMismatchError,
    DatasetChangedError,
    DecodeError,
    IndexMismatchError,
    ManifestError,
    NotAPackerFileError,
    OptionError,
    PackerError,
    SampleIndexError,
    SampleIndexTypeError,
    SampleKeyError,
    TruncatedFileError,
)
from packer.writer import BuildOptions, build

from helpers import VECTORS, png_folder, rewrite_index


# --- dataset: open errors, lookups, pickling, the shard cache, reads ------------------------------


def _refusal(folder: Path) -> tuple[type, str, str | None]:
    with pytest.raises(PackerError) as caught:
        open_index(folder)
    return type(caught.value), caught.value.message, caught.value.path


def test_open_refuses_what_is_not_a_dataset_and_says_what_it_is(tmp_path: Path) -> None:
    no_manifest = "no manifest.json: not a packer dataset"
    staging = " (an unfinished build is here: finish it with `packer build --resume`)"
    report = (f" (a build that packed nothing left {fmt.REPORT_NAME} here: it lists every rejected file "
              f"and why)")
    assert _refusal(tmp_path / "nope") == (NotAPackerFileError, "dataset folder does not exist", str(tmp_path / "nope"))
    (tmp_path / "file").write_bytes(b"x")
    assert _refusal(tmp_path / "file") == (
        NotAPackerFileError, "not a dataset folder (expected a folder holding manifest.json)", str(tmp_path / "file"))
    cases = {"empty": ([], no_manifest), "staging": ([".packer-build/"], no_manifest + staging),
             "failed": ([fmt.REPORT_NAME], no_manifest + report),
             "both": ([".packer-build/", fmt.REPORT_NAME], no_manifest + staging),
             "report-folder": ([fmt.REPORT_NAME + "/"], no_manifest)}
    for name, (entries, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        for entry in entries:
            if entry.endswith("/"):
                (folder / entry).mkdir()
            else:
                (folder / entry).write_text("{}\n")
        assert _refusal(folder) == (NotAPackerFileError, message, str(folder)), name
    big = tmp_path / "big"
    big.mkdir()
    with open(big / fmt.MANIFEST_NAME, "wb") as handle:
        handle.truncate(fmt.MAX_MANIFEST_BYTES + 1)  # sparse: never read, refused by its size
    assert _refusal(big) == (ManifestError, f"manifest is over the {fmt.MAX_MANIFEST_BYTES} bytes limit",
                             str(big / fmt.MANIFEST_NAME))
    with open(big / fmt.MANIFEST_NAME, "r+b") as handle:
        handle.truncate(fmt.MAX_MANIFEST_BYTES)
    error, message, _ = _refusal(big)  # at the limit it is read (and is not a manifest)
    assert (error, message) == (NotAPackerFileError, f"not a packer manifest (starts with {bytes(16)!r})")


def _rewrite_index(folder: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """Rewrite the index's columns and make the manifest's index entry (name, size, checksum) match."""
    manifest = json.loads((folder / fmt.MANIFEST_NAME).read_text())
    rows, columns = fmt.parse_column_file((folder / manifest["index"]["path"]).read_bytes(), fmt.INDEX_MAGIC)
    columns = {key: np.array(value) for key, value in columns.items()}
    change(columns)
    data = b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns))
    (folder / manifest["index"]["path"]).unlink()
    digest = fmt.checksum(data)
    manifest["index"] = {"path": fmt.index_file_name(digest), "size": len(data), "checksum": fmt.checksum_hex(digest)}
    (folder / manifest["index"]["path"]).write_bytes(data)
    (folder / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.fixture
def base3(tmp_path: Path) -> Path:
    """A private copy of the base-align512 vector: cat/a.png, cat/b.jpg, dog/c.bmp in 2 shards."""
    return Path(shutil.copytree(VECTORS / "valid" / "base-align512", tmp_path / "base3"))


def _with_blob(column: str, pieces: list[bytes]) -> Callable[[dict[str, np.ndarray]], None]:
    """Replace a variable-length column (keys, meta) and its offsets by ``pieces``."""

    def change(columns: dict[str, np.ndarray]) -> None:
        columns[column] = np.frombuffer(b"".join(pieces), dtype=np.uint8).copy()
        columns[column[:-1] + "_offsets" if column == "keys" else "meta_offsets"] = np.cumsum(
            [0] + [len(p) for p in pieces]).astype(np.uint64)

    return change


def test_index_labels_outside_the_class_list_name_the_first_one(base3: Path) -> None:
    for labels, bad, label in [([0, 1, 2], 2, 2), ([0, -1, 1], 1, -1), ([1, 0, 5], 2, 5), ([0, 1, 1], None, None)]:
        _rewrite_index(base3, lambda c: c.__setitem__("label", np.array(labels, dtype=np.int64)))
        if bad is None:
            assert open_index(base3).labels.tolist() == labels
            continue
        error, message, path = _refusal(base3)
        assert (error, message) == (IndexMismatchError, f"has label {label} but the manifest lists 2 classes")
        with pytest.raises(IndexMismatchError) as caught:
            open_index(base3)
        assert caught.value.sample == bad and Path(path).name == json.loads(
            (base3 / fmt.MANIFEST_NAME).read_text())["index"]["path"]


def test_a_one_byte_index_file_is_too_short_for_its_header(base3: Path) -> None:
    manifest = json.loads((base3 / fmt.MANIFEST_NAME).read_text())
    (base3 / manifest["index"]["path"]).unlink()
    name = fmt.index_file_name(fmt.checksum(b"P"))
    (base3 / name).write_bytes(b"P")
    manifest["index"] = {"path": name, "size": 1, "checksum": fmt.checksum_hex(fmt.checksum(b"P"))}
    (base3 / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))
    error, message, path = _refusal(base3)
    assert (error, message, Path(path).name) == (
        TruncatedFileError, "index file is 1 bytes, shorter than its 64-byte header", name)


def test_find_matches_whole_keys_only(base3: Path) -> None:
    """Keys that hold other keys: "a/z.png" inside "a/a/z.png", "111" overlapping "z1"."""
    keys = ["a/a/z.png", "z1", "111"]
    _rewrite_index(base3, _with_blob("keys", [k.encode() for k in keys]))
    with open_index(base3) as index:
        assert list(index.keys()) == keys
        assert [index.find(k) for k in keys] == [0, 1, 2]
        _rewrite_index(base3, _with_blob("keys", [b"a/a/z.png", b"a/z.png", b"111"]))
    with open_index(base3) as index:
        assert index.find("a/z.png") == 1 and index.find("a/a/z.png") == 0
        for missing in ["z.png", "a/a", "pnga/z", "11", "1111", "a/z.pn", "", "\udc80", 7, None]:
            with pytest.raises(SampleKeyError) as caught:
                index.find(missing)  # type: ignore[arg-type]
            assert isinstance(caught.value, KeyError) and caught.value.key == missing
            assert str(caught.value).startswith(f"no sample has the key {missing!r}")
        for missing, why in (("", ": keys are non-empty strings"), (7, ": keys are non-empty strings"),
                             ("\udc80", ": it holds a lone surrogate, and keys are UTF-8"), ("z.png", "")):
            with pytest.raises(SampleKeyError) as caught:
                index.find(missing)  # type: ignore[arg-type]
            assert str(caught.value) == f"no sample has the key {missing!r}{why}"
    _rewrite_index(base3, _with_blob("keys", [b"x", b"a/z.png", b"b/a/z.png"]))  # the false match comes last
    with open_index(base3) as index:
        assert [index.find(k) for k in ("x", "a/z.png", "b/a/z.png")] == [0, 1, 2]
    with open_index(VECTORS / "valid" / "empty") as index:
        for key in ("X", "XX", "a"):
            with pytest.raises(SampleKeyError, match=f"^no sample has the key {key!r}$"):
                index.find(key)


def test_keys_that_are_not_utf8_are_shown_with_replacement_characters(base3: Path) -> None:
    _rewrite_index(base3, _with_blob("keys", [b"cat/\xff.png", b"cat/b.jpg", b"dog/c.bmp"]))
    with open_index(base3) as index:
        assert index.key(0) == "cat/\ufffd.png"


def test_sample_numbers_are_checked_like_a_sequence(base3: Path, tmp_path: Path) -> None:
    with open_index(base3) as index:
        assert [index.key(i) for i in (-3, -1, 0, 2)] == ["cat/a.png", "dog/c.bmp", "cat/a.png", "dog/c.bmp"]
        assert index.shard_of(-1) == 1 and index.shard_of(1) == 0
        for bad in (3, -4, 10):
            with pytest.raises(SampleIndexError) as caught:
                index.key(bad)
            assert str(caught.value) == f"sample {bad} out of range for a dataset of 3 samples"
    with open_index(VECTORS / "valid" / "empty") as index:
        with pytest.raises(SampleIndexError, match="^sample 0 out of range for a dataset of 0 samples$"):
            index.key(0)


def test_metadata_forms_and_refusals(base3: Path) -> None:
    depth = fmt.MAX_JSON_DEPTH
    deepest = ("[" * depth + "]" * depth).encode()
    _rewrite_index(base3, _with_blob("meta", [b'{"a": 1}', b"", b"[1, 2]"]))
    with open_index(base3) as index:
        assert [index.metadata(i) for i in range(3)] == [{"a": 1}, {}, {"value": [1, 2]}]
        assert index.metadata(-3) == {"a": 1}
    _rewrite_index(base3, _with_blob("meta", [b"", deepest, b"[" + deepest + b"]"]))
    with open_index(base3) as index:
        assert index.metadata(1) == {"value": json.loads(deepest)}
        with pytest.raises(IndexMismatchError) as caught:
            index.metadata(-1)
        assert (caught.value.message, caught.value.sample, caught.value.path) == (
            f"holds metadata nested {depth + 1} levels deep; readers decode at most {depth}", 2, str(base3))
    _rewrite_index(base3, _with_blob("meta", [b"", b"{not json", b""]))
    with open_index(base3) as index:
        with pytest.raises(IndexMismatchError) as caught:
            index.metadata(1)
        assert (caught.value.message, caught.value.sample, caught.value.path) == (
            "holds metadata that is not JSON", 1, str(base3))


def test_sample_info_is_exact() -> None:
    with open_index(VECTORS / "valid" / "base-align512") as index:
        info = index.sample_info(-1)
        ix = index.index
        assert info == {"index": 2, "key": "dog/c.bmp", "label": 1, "class": "dog", "shard": 1,
                        "shard_path": index.manifest.shards[1].path, "offset": int(ix.offset[2]),
                        "size": int(ix.size[2]), "checksum": fmt.checksum_hex(int(ix.checksum[2])),
                        "width": int(ix.width[2]), "height": int(ix.height[2]), "channels": int(ix.channels[2]),
                        "image_format": "bmp", "metadata": {}}
        assert index.sample_info(0)["class"] == "cat"
    with open_index(VECTORS / "valid" / "manifest-metadata") as index:  # no classes; labels 123456789, -1, 0, 7
        assert [index.sample_info(i)["class"] for i in range(4)] == [None] * 4
        assert index.sample_info(2)["metadata"] == {"caption": "ünicode ✓", "n": 3}
    with open_index(VECTORS / "valid" / "unknown-fields") as index:  # image_format 200 is reserved
        assert index.sample_info(0)["image_format"] == "unknown"


def test_dataset_defaults_and_options() -> None:
    folder = VECTORS / "valid" / "base-align512"
    with Dataset(folder) as dataset:
        assert (dataset.backend_name, dataset.verify_checksums, dataset.max_open_shards) == ("mmap", False, 64)
    with open_dataset(folder, backend="pread", verify_checksums=True, max_open_shards=1) as dataset:
        assert (dataset.backend_name, dataset.verify_checksums, dataset.max_open_shards) == ("pread", True, 1)
        assert dataset.read(2) == bytes(Dataset(folder)[2])
    with open_dataset(folder, max_open_shards=0) as dataset:
        assert dataset.max_open_shards == 1


def test_checksums_are_verified_only_when_asked() -> None:
    folder = VECTORS / "invalid" / "sample-checksum-mismatch"
    with open_dataset(folder) as dataset:
        for i in range(len(dataset)):
            dataset.read(i)  # the default trusts the index: no hashing on the hot path
        damaged = [i for i in range(len(dataset)) if fmt.checksum(dataset.read(i)) != int(dataset.index.checksum[i])]
        assert len(damaged) == 1
        bad = damaged[0]
        shard_path = dataset.manifest.shards[dataset.shard_of(bad)].path
        offset = int(dataset.index.offset[bad])
        assert list(dataset.iter_samples()) and len(dataset.read_batch([bad])) == 1
    with open_dataset(folder, verify_checksums=True) as dataset:
        calls = {"get": lambda: dataset.get(bad - len(dataset)), "batch": lambda: dataset.read_batch([bad - len(dataset)]),
                 "iter": lambda: list(dataset.iter_samples([bad]))}
        for name, call in calls.items():
            with pytest.raises(ChecksumMismatchError) as caught:
                call()
            assert (caught.value.sample, caught.value.path) == (bad, shard_path), name
            assert caught.value.offset == (offset if name == "get" else None), name


def test_a_pickled_dataset_reopens_the_same_version(tmp_path: Path) -> None:
    folder = Path(shutil.copytree(VECTORS / "valid" / "base-align512", tmp_path / "ds"))
    with open_dataset(folder, backend="pread", verify_checksums=True, max_open_shards=1) as dataset:
        data = pickle.dumps(dataset)
        expected = [dataset.read(i) for i in range(3)]
    manifest = (folder / fmt.MANIFEST_NAME).read_bytes()
    (folder / fmt.MANIFEST_NAME).unlink()  # the worker uses the manifest bytes it was sent
    clone = pickle.loads(data)
    assert (clone.path, clone.backend_name, clone.verify_checksums, clone.max_open_shards) == (folder, "pread", True, 1)
    assert [clone.read(i) for i in range(3)] == expected
    clone.close()
    (folder / fmt.MANIFEST_NAME).write_bytes(manifest)
    index_file = folder / json.loads(manifest)["index"]["path"]
    index_bytes = index_file.read_bytes()
    index_file.write_bytes(index_bytes[:-1] + bytes([index_bytes[-1] ^ 1]))
    with pytest.raises(DatasetChangedError) as caught:
        pickle.loads(data)
    assert caught.value.path == str(folder)
    assert caught.value.message.startswith("the dataset changed since it was opened in the parent process: ")
    assert "index checksum mismatch" in caught.value.message
    index_file.unlink()
    with pytest.raises(DatasetChangedError) as caught:
        pickle.loads(data)
    assert caught.value.message.endswith("is missing: the dataset was replaced or deleted while in use, or the copy "
                                         "is incomplete")


def _mapped_shards(folder: Path) -> set[str]:
    with open("/proc/self/maps") as maps:
        return {Path(line.split()[-1]).name for line in maps if str(folder) in line and line.rstrip().endswith(".pks")}


def test_open_shards_are_an_lru_of_the_asked_size(tmp_path: Path) -> None:
    folder = Path(shutil.copytree(VECTORS / "valid" / "align1", tmp_path / "ds"))  # 3 shards
    with open_dataset(folder, max_open_shards=2) as dataset:
        names = [Path(s.path).name for s in dataset.manifest.shards]
        first = [dataset.index.shard.tolist().index(s) for s in range(3)]
        for shard in (0, 1, 0, 2):  # shard 1 is the least recently used when shard 2 opens
            assert bytes(dataset.get(first[shard]))
        assert _mapped_shards(folder) == {names[0], names[2]}
        assert dataset.shard(0) is dataset.shard(0)
    assert _mapped_shards(folder) == set()


def test_a_shard_cut_after_it_was_opened_names_its_file(tmp_path: Path) -> None:
    folder = Path(shutil.copytree(VECTORS / "valid" / "base-align512", tmp_path / "ds"))
    with open_dataset(folder, backend="pread") as dataset:
        shard = folder / dataset.manifest.shards[0].path
        dataset.shard(0)
        os.truncate(shard, 600)
        with pytest.raises(TruncatedFileError) as caught:
            dataset.read(1)
        assert caught.value.path == str(shard.resolve())


def test_a_forked_child_opens_its_own_shards() -> None:
    with open_dataset(VECTORS / "valid" / "base-align512") as dataset:
        parents = dataset.shard(0)
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if it opened and then kept its own backend
            ok = False
            try:
                mine = dataset.shard(0)
                ok = mine is not parents and dataset.shard(0) is mine and bytes(dataset.get(0)) == dataset.read(0)
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert dataset.shard(0) is parents


def test_batches_and_iteration_check_their_indices() -> None:
    with open_dataset(VECTORS / "valid" / "base-align512") as dataset:
        every = [dataset.read(i) for i in range(3)]
        empty = dataset.read_batch([])
        assert len(empty) == 0 and empty.data.dtype == np.uint8 and empty.data.shape == (0,)
        assert empty.starts.dtype == np.int64 and empty.starts.shape == (0,) == empty.sizes.shape
        assert empty.sizes.dtype == np.int64
        batch = dataset.read_batch(np.array([[2, -3], [-1, 1]]))
        assert [bytes(batch[j]) for j in range(4)] == [every[2], every[0], every[2], every[1]]
        with open_dataset(VECTORS / "valid" / "base-align512", verify_checksums=True) as checked:
            batch = checked.read_batch(np.array([[2, -3], [-1, 1]]))
            assert [bytes(batch[j]) for j in range(4)] == [every[2], every[0], every[2], every[1]]
        assert [bytes(b) for b, _ in dataset.iter_samples([-3, -1, 2])] == [every[0], every[2], every[2]]
        for bad, first in (([3], 3), ([-4], -4), ([0, 3], 3), ([-4, 1], -4), ([-4, 3], -4)):
            outside = rf"{first}, outside -3\.\.2 \(a dataset of 3 samples\)$"
            with pytest.raises(SampleIndexError, match=f"^batch holds index {outside}"):
                dataset.read_batch(bad)
            with pytest.raises(SampleIndexError, match=f"^indices hold {outside}"):
                list(dataset.iter_samples(bad))
        assert [label for _, label in dataset.iter_samples()] == [0, 0, 1]


def test_iteration_over_a_one_sample_dataset(tmp_path: Path) -> None:
    out = tmp_path / "one"
    build(png_folder(tmp_path / "src", 1), out, BuildOptions(), workers=1, progress=False)
    with open_dataset(out) as dataset:
        assert [bytes(b) for b, _ in dataset.iter_samples([-1, 0])] == [dataset.read(0)] * 2


# --- dataset --------------------------------------------------------------------------------------


# Two small datasets built once: "fields" (6 samples in 2 shards, alignment 64, a text, an array and
# two image fields: a palette PNG mask and a PPM, a format detect_format cannot sniff) and "plain"
# (the same 6 images, no fields, alignment 4096 so reads can be whole pages).
READER_FIELDS = ("caption=text", "boxes=float32[N,4]", "mask=image", "edge=image")


READER_COUNT = 6


def _reader_source(root: Path) -> Path:
    (root / "img").mkdir(parents=True)
    rows = []
    for i in range(READER_COUNT):
        Image.fromarray(np.full((8 + i, 10, 3), 20 * i, np.uint8)).save(root / "img" / f"{i}.png")
        mask = Image.fromarray((np.arange(10)[None, :] % (i + 2)).astype(np.uint8).repeat(8 + i, 0), mode="P")
        mask.putpalette([0, 0, 0, 255, 0, 0] * 128)
        mask.save(root / "img" / f"{i}.mask.png")
        Image.fromarray(np.full((4, 5, 3), 30 * i + 1, np.uint8)).save(root / "img" / f"{i}.edge.ppm")
        rows.append({"path": f"img/{i}.png", "label": i % 2, "caption": f"cap {i} \u2713",
                     "boxes": [[i, 0, 1, 2]] * (i % 3), "mask": f"img/{i}.mask.png", "edge": f"img/{i}.edge.ppm"})
    manifest = root / "rows.jsonl"
    manifest.write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    return manifest


@pytest.fixture(scope="module")
def reader_datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("readers")
    manifest = _reader_source(root / "src")
    build(manifest, root / "fields", BuildOptions(fields=READER_FIELDS, shard_size=600, shuffle=False, alignment=64),
          workers=1, progress=False)
    build(manifest, root / "plain", BuildOptions(shard_size=3 * 4096, shuffle=False, alignment=4096),
          workers=1, progress=False)
    folders = {"src": root / "src", "fields": root / "fields", "plain": root / "plain"}
    with open_dataset(folders["fields"]) as ds:  # what the tests below rely on
        assert ds.index.shard.tolist() == [0, 0, 0, 0, 1, 1] and [ds.key(i) for i in range(6)] == [
            f"img/{i}.png" for i in range(6)]
    with open_dataset(folders["plain"]) as ds:
        assert ds.index.shard.tolist() == [0, 0, 1, 1, 2, 2] and not ds.fields
    return folders


def _reader_copy(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def _reader_edit_manifest(folder: Path, change: Callable[[dict[str, Any]], None]) -> None:
    document = json.loads((folder / fmt.MANIFEST_NAME).read_text("utf-8"))
    change(document)
    (folder / fmt.MANIFEST_NAME).write_text(json.dumps(document), "utf-8")


def _reader_pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path))


def test_sample_indices_errors_show_the_first_value() -> None:
    with pytest.raises(SampleIndexTypeError) as caught:
        as_sample_indices([1.7, 2.0])
    assert str(caught.value) == f"sample indices must be integers, got float64 values (e.g. {np.float64(1.7)!r})"
    with pytest.raises(SampleIndexTypeError) as caught:  # a 2-D array: the first value, not the first row
        as_sample_indices([[2.5, 1.0], [3.0, 4.0]])
    assert str(caught.value) == f"sample indices must be integers, got float64 values (e.g. {np.float64(2.5)!r})"
    with pytest.raises(SampleIndexTypeError) as caught:
        as_sample_indices(np.array([True, False]))
    assert str(caught.value) == f"sample indices must be integers, got bool values (e.g. {np.True_!r})"
    largest = np.iinfo(np.int64).max  # the largest unsigned value that fits is accepted
    got = as_sample_indices(np.array([largest, 3], dtype=np.uint64))
    assert got.dtype == np.int64 and got.tolist() == [largest, 3]
    with pytest.raises(SampleIndexTypeError) as caught:
        as_sample_indices(np.array([3, largest + 1], dtype=np.uint64))
    assert str(caught.value) == f"sample index {largest + 1} is past int64"
    empty = as_sample_indices(np.zeros(0, dtype=np.float64))  # no values: nothing to refuse
    assert empty.dtype == np.int64 and empty.shape == (0,)


def test_field_spec_errors_list_the_fields(reader_datasets: dict[str, Path]) -> None:
    besides = "(besides image, label, key, index and metadata)"
    with open_dataset(reader_datasets["plain"]) as ds:
        with pytest.raises(OptionError) as caught:
            ds.field_value("caption", 0)
        assert str(caught.value) == f"dataset has no field 'caption'; its fields are none {besides}"
    with open_dataset(reader_datasets["fields"]) as ds:
        with pytest.raises(OptionError) as caught:
            ds.value("depth", 0)
        assert str(caught.value) == ("dataset has no field 'depth'; its fields are ['caption', 'boxes', 'mask', "
                                     f"'edge'] {besides}")


def test_value_reads_every_kind_as_its_reader_does(reader_datasets: dict[str, Path]) -> None:
    src = reader_datasets["src"]
    with open_dataset(reader_datasets["fields"]) as ds:
        for i in range(READER_COUNT):
            assert ds.value("caption", i) == f"cap {i} \u2713"
            boxes = ds.value("boxes", i)
            np.testing.assert_array_equal(boxes, np.array([[i, 0, 1, 2]] * (i % 3), np.float32).reshape(-1, 4))
            assert boxes.dtype == np.float32
            mask = ds.value("mask", i)
            np.testing.assert_array_equal(mask, _reader_pixels(src / "img" / f"{i}.mask.png"))  # palette indices
            assert mask.shape == (8 + i, 10) and mask.dtype == np.uint8
            np.testing.assert_array_equal(ds.value("edge", i), np.full((4, 5, 3), 30 * i + 1, np.uint8))
        assert ds.value("caption", -1) == f"cap {READER_COUNT - 1} \u2713"


def test_field_image_decodes_with_the_stored_format(reader_datasets: dict[str, Path]) -> None:
    """A PPM has no magic that sniffing knows: only the index's format (8, ppm) decodes it."""
    with open_dataset(reader_datasets["fields"]) as ds:
        spec = ds.field_spec("edge")
        assert ds.index.field_columns[spec.image_column("format")].tolist() == [8] * READER_COUNT
        for i in (0, READER_COUNT - 1):
            np.testing.assert_array_equal(ds.field_image("edge", i), np.full((4, 5, 3), 30 * i + 1, np.uint8))


def test_image_fields_read_their_own_shards(reader_datasets: dict[str, Path]) -> None:
    """Two image fields and the main shards share shard numbers: each read gets its own file."""
    src = reader_datasets["src"]
    for max_open in (64, 1):
        with open_dataset(reader_datasets["fields"], max_open_shards=max_open) as ds:
            for i in (0, 4, 1, 5, 3):
                assert ds.field_bytes("mask", i).tobytes() == (src / "img" / f"{i}.mask.png").read_bytes()
                assert ds.field_bytes("edge", i).tobytes() == (src / "img" / f"{i}.edge.ppm").read_bytes()
                assert ds.read(i) == (src / "img" / f"{i}.png").read_bytes()


def test_sample_info_fields_are_exact_and_json_ready(reader_datasets: dict[str, Path]) -> None:
    src = reader_datasets["src"]
    with open_dataset(reader_datasets["fields"]) as ds:
        for i in (0, 2, 5):
            fields = ds.sample_info(i)["fields"]
            assert json.loads(json.dumps(fields)) == fields
            assert fields["caption"] == f"cap {i} \u2713"
            assert type(fields["boxes"]) is list and fields["boxes"] == [[float(i), 0.0, 1.0, 2.0]] * (i % 3)
            shard = 0 if i < 4 else 1
            for name, suffix, fmt_name, size in (("mask", "mask.png", "png", (10, 8 + i, 1)),
                                                 ("edge", "edge.ppm", "ppm", (5, 4, 3))):
                data = (src / "img" / f"{i}.{suffix}").read_bytes()
                shard_path = ds.field_spec(name).shards[shard].path
                entry = fields[name]
                assert entry == {"shard_path": shard_path, "offset": entry["offset"], "size": len(data),
                                 "checksum": fmt.checksum(data), "format": fmt_name, "width": size[0],
                                 "height": size[1], "channels": size[2]}
                stored = (reader_datasets["fields"] / shard_path).read_bytes()
                assert stored[entry["offset"]:entry["offset"] + len(data)] == data


def test_sample_info_names_an_unknown_field_image_format(reader_datasets: dict[str, Path], tmp_path: Path) -> None:
    """A reserved image_format value (39-254) is not refused: ``sample_info`` calls it unknown."""
    copy = _reader_copy(reader_datasets["fields"], tmp_path)
    rewrite_index(copy, lambda columns: columns["f_mask__format"].__setitem__(1, 200))
    with open_dataset(copy) as ds:
        assert ds.sample_info(1)["fields"]["mask"]["format"] == "unknown"
        assert ds.sample_info(0)["fields"]["mask"]["format"] == "png"


def test_text_that_is_not_utf8_is_a_typed_error(reader_datasets: dict[str, Path], tmp_path: Path) -> None:
    copy = _reader_copy(reader_datasets["fields"], tmp_path)
    last = READER_COUNT - 1

    def damage(columns: dict[str, np.ndarray]) -> None:
        columns["f_caption"][int(columns["f_caption__offsets"][last])] = 0xFF

    rewrite_index(copy, damage)
    message = "field 'caption' holds bytes that are not UTF-8 (invalid start byte)"
    with open_dataset(copy) as ds:
        with pytest.raises(IndexMismatchError) as caught:
            ds.field_value("caption", last)
        error = caught.value
        assert (error.message, error.path, error.sample, error.offset) == (message, str(copy), last, None)
        assert str(error) == f"{copy}, sample {last}: {message}"
        with pytest.raises(IndexMismatchError) as caught:  # a negative index names the sample it means
            ds.field_value("caption", -1)
        assert caught.value.sample == last
        shown = ds.sample_info(last)["fields"]["caption"]  # shown, not raised: what is wrong, the bytes escaped
        assert shown == {"error": message, "escaped": f"\\xffap {last} \u2713"}
        assert ds.sample_info(last - 1)["fields"]["caption"] == f"cap {last - 1} \u2713"


def test_damaged_field_bytes_name_the_shard_sample_and_offset(reader_datasets: dict[str, Path], tmp_path: Path) -> None:
    copy = _reader_copy(reader_datasets["fields"], tmp_path)
    src = reader_datasets["src"]
    sample = 4  # the first sample of shard 1
    with open_dataset(copy) as ds:
        spec = ds.field_spec("mask")
        shard_path = spec.shards[1].path
        offset = int(ds.index.field_columns[spec.image_column("offset")][sample])
    original = (src / "img" / f"{sample}.mask.png").read_bytes()
    damaged = b"\0" * 8 + original[8:]  # no PNG signature any more
    with open(copy / shard_path, "r+b") as handle:
        handle.seek(offset)
        handle.write(damaged[:8])
    expected = (f"field 'mask' checksum mismatch: expected {fmt.checksum_hex(fmt.checksum(original))}, got "
                f"{fmt.checksum_hex(fmt.checksum(damaged))} (the stored bytes are damaged)")
    with open_dataset(copy, verify_checksums=True) as ds:
        with pytest.raises(ChecksumMismatchError) as caught:
            ds.field_bytes("mask", sample)
        error = caught.value
        assert (error.message, error.path, error.sample, error.offset) == (expected, shard_path, sample, offset)
        assert str(error) == f"{shard_path}, sample {sample}, offset {offset}: {expected}"
        assert ds.field_bytes("mask", sample + 1).tobytes() == (src / "img" / f"{sample + 1}.mask.png").read_bytes()
    with open_dataset(copy) as ds:  # without checksums the decoder finds the damage, naming key and field
        assert ds.field_bytes("mask", sample).tobytes() == damaged
        with pytest.raises(DecodeError) as caught:
            ds.field_image("mask", sample)
        assert caught.value.path == f"img/{sample}.png (field 'mask')"
        assert str(caught.value).startswith(f"img/{sample}.png (field 'mask'): cannot decode the bytes as PNG")


def test_field_image_applies_the_dataset_pixel_limit(reader_datasets: dict[str, Path], tmp_path: Path) -> None:
    """The limit recorded in the manifest (limits.max_pixels) applies unless the caller passes one."""
    copy = _reader_copy(reader_datasets["fields"], tmp_path)
    _reader_edit_manifest(copy, lambda document: document.update(limits={"max_pixels": 50}))
    with open_dataset(copy) as ds:
        assert ds.manifest.max_pixels == 50
        np.testing.assert_array_equal(ds.field_image("edge", 0), np.full((4, 5, 3), 1, np.uint8))  # 20 pixels
        with pytest.raises(DecodeError) as caught:
            ds.field_image("mask", 0)  # 80 pixels
        assert caught.value.path == "img/0.png (field 'mask')"
        assert caught.value.message == ("the header declares 8x10 (HxW) = 80 pixels, over the limit of 50 (a "
                                        "decompression bomb, or raise max_pixels)")
        with pytest.raises(DecodeError):
            ds.value("mask", 0)
        np.testing.assert_array_equal(ds.field_image("mask", 0, max_pixels=80),
                                      _reader_pixels(reader_datasets["src"] / "img" / "0.mask.png"))


def test_iter_samples_chunks_labels_and_evicted_shards(reader_datasets: dict[str, Path]) -> None:
    src = reader_datasets["src"]
    order, meant = [5, 0, 4, 1, 3, 2, -1], [5, 0, 4, 1, 3, 2, 5]
    for backend in ("mmap", "pread"):
        with open_dataset(reader_datasets["fields"], backend=backend) as ds:
            for chunk in (1, 4, 65536):  # chunk boundaries inside and outside one shard
                got = [(bytes(view), label) for view, label in ds.iter_samples(order, chunk=chunk)]
                assert got == [((src / "img" / f"{i}.png").read_bytes(), i % 2) for i in meant], (backend, chunk)
    with open_dataset(reader_datasets["fields"], max_open_shards=1) as ds:  # shards evicted mid-chunk
        got = [bytes(view) for view, _ in ds.iter_samples([0, 4, 1, 5, 2], chunk=3)]
        assert got == [(src / "img" / f"{i}.png").read_bytes() for i in (0, 4, 1, 5, 2)]


def test_iter_samples_with_mmap_yields_views_of_the_map(reader_datasets: dict[str, Path]) -> None:
    """The documented fast path: each sample is a read-only slice of its shard's mapping, no copy."""
    with open_dataset(reader_datasets["fields"]) as ds:
        views = [view for view, _ in ds.iter_samples([5, 0, 4], chunk=2)]
        for view, i in zip(views, (5, 0, 4)):
            assert view.readonly
            assert np.shares_memory(np.frombuffer(view, np.uint8), np.frombuffer(ds.get(i), np.uint8))


def test_read_batch_runs_and_padding_per_backend(reader_datasets: dict[str, Path]) -> None:
    src = reader_datasets["src"]
    for name in ("plain", "fields"):
        for backend in ("mmap", "pread"):
            with open_dataset(reader_datasets[name], backend=backend) as ds:
                offsets, sizes = ds.index.offset.tolist(), ds.index.size.tolist()
                batch = ds.read_batch(np.array([[1], [0]]))  # one run: samples 0 and 1 of shard 0
                # pread reads the run's page block (SPEC §3.4): it starts at the page holding sample 0
                base = offsets[0] - offsets[0] % 4096 if backend == "pread" else offsets[0]
                assert batch.data.nbytes >= offsets[1] + sizes[1] - base, (name, backend)
                assert batch.starts.tolist() == [offsets[1] - base, offsets[0] - base]
                assert batch.sizes.tolist() == sizes[1::-1]
                assert [bytes(batch[j]) for j in range(2)] == [(src / "img" / f"{i}.png").read_bytes() for i in (1, 0)]
                gap = batch.data[offsets[0] - base + sizes[0]:offsets[1] - base]
                assert gap.size and not gap.any()  # the alignment padding between them is in the block, zeros


# --- refusals at the reader doors: backend names, bytes that are not an image, pixel limits ------------

def test_an_unknown_backend_is_refused_before_anything_is_opened() -> None:
    with pytest.raises(OptionError) as caught:
        open_dataset(VECTORS / "valid" / "base-align512", backend="mmapp")
    assert caught.value.message == "unknown backend 'mmapp'; choose one of mmap, pread, direct, kvikio"


def test_decoding_as_stored_refuses_no_bytes_and_raw_pixels() -> None:
    from packer.decode import decode_as_stored
    from packer.format import ImageFormat

    with pytest.raises(DecodeError) as caught:
        decode_as_stored(b"", name="mask of 3")
    assert caught.value.message == "no bytes to decode: expected an encoded image, found 0 bytes"
    assert caught.value.path == "mask of 3"
    with pytest.raises(DecodeError) as caught:
        decode_as_stored(bytes(12), ImageFormat.RAW)
    assert caught.value.message == f"cannot decode image_format {int(ImageFormat.RAW)} as a stored image"


@pytest.mark.parametrize("limit", [0, -5, True, 2.5])
def test_a_pixel_limit_that_is_not_a_positive_integer_is_refused(limit: object) -> None:
    from packer.codecs import dataset_max_pixels

    with open_index(VECTORS / "valid" / "base-align512") as index:
        with pytest.raises(OptionError) as caught:
            dataset_max_pixels(index.manifest, limit)  # type: ignore[arg-type]
    assert caught.value.message == f"max_pixels must be a positive number of pixels, got {limit!r}"
