"""Mutation kill tests for packer/dataset.py and the torch sampler/reader state of packer/torch.py.

Written after the declared fields (SPEC §14) landed: each pins down behaviour that a surviving
mutant of `scripts/mutate.py` changed. `tests/test_mutation_kills.py` holds the ones from before.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.build import BuildOptions, build
from packer.dataset import as_sample_indices, open_dataset
from packer.errors import ChecksumMismatchError, DecodeError, IndexMismatchError, OptionError

# --- dataset ---------------------------------------------------------------------------------------
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


def _reader_rewrite_index(folder: Path, change: Callable[[dict[str, np.ndarray]], None]) -> None:
    """``change`` edits writable copies of the index columns; name, size and checksum are made to match."""
    document = json.loads((folder / fmt.MANIFEST_NAME).read_text("utf-8"))
    old = folder / document["index"]["path"]
    rows, columns = fmt.parse_column_file(old.read_bytes(), fmt.INDEX_MAGIC)
    columns = {name: np.array(column) for name, column in columns.items()}
    change(columns)
    data = b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns))
    old.unlink()
    digest = fmt.checksum(data)
    (folder / fmt.index_file_name(digest)).write_bytes(data)
    document["index"] = {"path": fmt.index_file_name(digest), "size": len(data), "checksum": fmt.checksum_hex(digest)}
    (folder / fmt.MANIFEST_NAME).write_text(json.dumps(document), "utf-8")


def _reader_pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path))


def test_sample_indices_errors_show_the_first_value() -> None:
    with pytest.raises(TypeError) as caught:
        as_sample_indices([1.7, 2.0])
    assert str(caught.value) == f"sample indices must be integers, got float64 values (e.g. {np.float64(1.7)!r})"
    with pytest.raises(TypeError) as caught:  # a 2-D array: the first value, not the first row
        as_sample_indices([[2.5, 1.0], [3.0, 4.0]])
    assert str(caught.value) == f"sample indices must be integers, got float64 values (e.g. {np.float64(2.5)!r})"
    with pytest.raises(TypeError) as caught:
        as_sample_indices(np.array([True, False]))
    assert str(caught.value) == f"sample indices must be integers, got bool values (e.g. {np.True_!r})"
    largest = np.iinfo(np.int64).max  # the largest unsigned value that fits is accepted
    got = as_sample_indices(np.array([largest, 3], dtype=np.uint64))
    assert got.dtype == np.int64 and got.tolist() == [largest, 3]
    with pytest.raises(TypeError) as caught:
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
    _reader_rewrite_index(copy, lambda columns: columns["f_mask__format"].__setitem__(1, 200))
    with open_dataset(copy) as ds:
        assert ds.sample_info(1)["fields"]["mask"]["format"] == "unknown"
        assert ds.sample_info(0)["fields"]["mask"]["format"] == "png"


def test_text_that_is_not_utf8_is_a_typed_error(reader_datasets: dict[str, Path], tmp_path: Path) -> None:
    copy = _reader_copy(reader_datasets["fields"], tmp_path)
    last = READER_COUNT - 1

    def damage(columns: dict[str, np.ndarray]) -> None:
        columns["f_caption"][int(columns["f_caption__offsets"][last])] = 0xFF

    _reader_rewrite_index(copy, damage)
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
        assert ds.sample_info(last)["fields"]["caption"] == {"error": message}  # shown, not raised
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
                assert batch.data.nbytes >= offsets[1] + sizes[1] - offsets[0], (name, backend)
                assert batch.starts.tolist() == [offsets[1] - offsets[0], 0] and batch.sizes.tolist() == sizes[1::-1]
                assert [bytes(batch[j]) for j in range(2)] == [(src / "img" / f"{i}.png").read_bytes() for i in (1, 0)]
                gap = batch.data[sizes[0]:offsets[1] - offsets[0]]
                assert gap.size and not gap.any()  # the alignment padding between them is in the block, zeros
