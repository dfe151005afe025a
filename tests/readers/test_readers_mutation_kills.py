"""Mutation kill tests for packer/dataset.py and the torch sampler/reader state of packer/torch.py.

Written after the declared fields (SPEC §14) landed: each pins down behaviour that a surviving
mutant of `scripts/mutate.py` changed. `tests/project/test_mutation_kills.py` holds the ones from before.
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
from packer.writer import BuildOptions, build
from packer.dataset import as_sample_indices, open_dataset
from packer.errors import ChecksumMismatchError, DecodeError, IndexMismatchError, OptionError
from helpers import rewrite_index

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
                assert batch.data.nbytes >= offsets[1] + sizes[1] - offsets[0], (name, backend)
                assert batch.starts.tolist() == [offsets[1] - offsets[0], 0] and batch.sizes.tolist() == sizes[1::-1]
                assert [bytes(batch[j]) for j in range(2)] == [(src / "img" / f"{i}.png").read_bytes() for i in (1, 0)]
                gap = batch.data[sizes[0]:offsets[1] - offsets[0]]
                assert gap.size and not gap.any()  # the alignment padding between them is in the block, zeros


# --- torch -----------------------------------------------------------------------------------------
# The sampler/reader state of packer/torch.py (the "torch" scope of scripts/mutate.py): orders, rank
# and worker dealing, positions and state dicts, compared with references built from packer.order's
# functions. One small dataset: 14 PNGs in 3 shards (alignment 512), so byte blocks (index_blocks)
# differ from sample-count blocks. torch is imported inside the tests: the file imports without it.

from types import SimpleNamespace  # noqa: E402

from packer.order import (DEFAULT_BLOCK_BYTES, DEFAULT_WINDOW, deal, epoch_order, index_blocks,  # noqa: E402
                          uniform_blocks)

TORCH_COUNT = 14


@pytest.fixture(scope="module")
def torch_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    root = tmp_path_factory.mktemp("torch-state")
    make_sample.make_image_folder(root / "src", classes=2, per_class=TORCH_COUNT // 2, seed=21, min_size=10,
                                  max_size=14, formats=("png",))
    build(root / "src", root / "ds", BuildOptions(shard_size=4096, alignment=512), workers=1, progress=False)
    with open_dataset(root / "ds") as ds:  # what the tests below rely on
        ix = ds.index
        assert len(ds) == TORCH_COUNT and ix.shard.tolist() == [0] * 7 + [1] * 4 + [2] * 3
        assert len({ds.read(i) for i in range(TORCH_COUNT)}) == TORCH_COUNT
    return root / "ds"


def _torch_pt() -> Any:
    pytest.importorskip("torch")  # packer.torch raises MissingDependencyError without it, not ImportError
    import packer.torch

    return packer.torch


def _torch_ids(folder: Path) -> Callable[[Any], list[int]]:
    """Sample indices of raw payloads (``decode=False``), told apart by their bytes."""
    with open_dataset(folder) as ds:
        by_payload = {ds.read(i): i for i in range(len(ds))}
    return lambda payloads: [by_payload[bytes(t.numpy())] for t in payloads]


def _torch_blocks(folder: Path, block_bytes: int) -> np.ndarray:
    with open_dataset(folder) as ds:
        ix = ds.index
        return index_blocks(ix.offset, ix.size, ix.shard, block_bytes)


def _torch_batches(*, order: str = "random", seed: int = 0, epoch: int = 0, consumed: int = 0, rank: int = 0,
                   world_size: int = 1, batch_size: int = 1, drop_last: bool = False, blocks: Any = None,
                   window: int = DEFAULT_WINDOW, count: int = TORCH_COUNT) -> list[list[int]]:
    """The reference: ``deal(epoch_order(...))`` cut into the rank's batches."""
    if order == "block" and blocks is None:
        blocks = uniform_blocks(count)
    global_order = epoch_order(order, count, seed=seed, epoch=epoch, blocks=blocks, window=window)
    plan = deal(global_order, consumed=consumed, rank=rank, world_size=world_size, batch_size=batch_size,
                drop_last=drop_last, sort_steps=order == "block")
    return [plan.batch(k).tolist() for k in range(plan.num_batches)]


def _torch_in_worker(monkeypatch: pytest.MonkeyPatch, worker: int | None, num_workers: int = 0) -> None:
    import torch.utils.data as torch_data

    info = None if worker is None else SimpleNamespace(id=worker, num_workers=num_workers)
    monkeypatch.setattr(torch_data, "get_worker_info", lambda: info)


def _torch_equal(a: Any, b: Any) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_torch_samplers_deal_the_reference_order(torch_folder: Path) -> None:
    pt = _torch_pt()
    byte_blocks = _torch_blocks(torch_folder, 1024)
    cases = [  # (sampler options, reference options besides the batch size)
        (dict(order="random", seed=3, rank=1, world_size=3), dict(order="random", seed=3, rank=1, world_size=3)),
        (dict(order="sequential", rank=2, world_size=4, drop_last=True),
         dict(order="sequential", rank=2, world_size=4, drop_last=True)),
        (dict(order="block", seed=2, block_bytes=1024, window=2, rank=0, world_size=2),
         dict(order="block", seed=2, blocks=byte_blocks, window=2, rank=0, world_size=2)),
        (dict(order="block", seed=2, block_samples=3, window=1, rank=1, world_size=2),
         dict(order="block", seed=2, blocks=uniform_blocks(TORCH_COUNT, 3), window=1, rank=1, world_size=2)),
        (dict(order="block", seed=5),
         dict(order="block", seed=5, blocks=_torch_blocks(torch_folder, DEFAULT_BLOCK_BYTES))),
    ]
    dataset = pt.PackedDataset(torch_folder, decode=False)
    for options, reference in cases:
        for epoch in (0, 2):
            for batch_size in (None, 3):
                sampler = pt.PackedSampler(dataset, batch_size=batch_size, **options)
                sampler.set_epoch(epoch)
                expected = _torch_batches(epoch=epoch, batch_size=batch_size or 1, **reference)
                flat = [i for batch in expected for i in batch]
                assert list(sampler) == flat, (options, epoch, batch_size)
                assert len(sampler) == len(flat)
            batches = pt.PackedBatchSampler(dataset, batch_size=3, **options)
            batches.set_epoch(epoch)
            expected = _torch_batches(epoch=epoch, batch_size=3, **reference)
            assert list(batches) == expected and len(batches) == len(expected), (options, epoch)
            assert list(batches.sampler) == [i for batch in expected for i in batch]


def test_torch_iterable_deals_batches_to_ranks_and_workers(torch_folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pt = _torch_pt()
    ids = _torch_ids(torch_folder)
    byte_blocks = _torch_blocks(torch_folder, 1024)
    cases = [
        (dict(order="block", seed=4, block_bytes=1024, window=2, rank=1, world_size=2),
         dict(order="block", seed=4, blocks=byte_blocks, window=2, rank=1, world_size=2)),
        (dict(order="random", seed=7, rank=0, world_size=3, drop_last=True),
         dict(order="random", seed=7, rank=0, world_size=3, drop_last=True)),
        (dict(order="sequential", rank=2, world_size=3), dict(order="sequential", rank=2, world_size=3)),
    ]
    for options, reference in cases:
        for worker, num_workers in [(None, 0), (0, 2), (1, 2), (2, 3)]:
            _torch_in_worker(monkeypatch, worker, num_workers)
            batches = pt.PackedIterableDataset(torch_folder, batch_size=2, decode=False, **options)
            samples = pt.PackedIterableDataset(torch_folder, batch_size=2, decode=False, batched=False, **options)
            for epoch in (0, 3):
                batches.set_epoch(epoch)
                samples.set_epoch(epoch)
                expected = _torch_batches(epoch=epoch, batch_size=2, **reference)
                mine = expected if worker is None else expected[worker::num_workers]
                assert [ids(images) for images, _ in batches] == mine, (options, worker, epoch)
                assert [ids([image])[0] for image, _ in samples] == [i for batch in mine for i in batch]
                assert len(batches) == len(expected) and len(samples) == sum(map(len, expected))


def test_torch_resume_positions_across_readers(torch_folder: Path) -> None:
    """Saved after some batches of one configuration, loaded into another: the rest of that epoch."""
    pt = _torch_pt()
    ids = _torch_ids(torch_folder)
    dataset = pt.PackedDataset(torch_folder, decode=False)
    byte_blocks = _torch_blocks(torch_folder, 1024)
    for order, blocks, drop_last in [("random", None, False), ("block", byte_blocks, True), ("sequential", None, True)]:
        settings = dict(order=order, seed=6, drop_last=drop_last, block_bytes=1024, window=2)
        reference = dict(order=order, seed=6, drop_last=drop_last, blocks=blocks, window=2, epoch=1)
        first = pt.PackedBatchSampler(dataset, batch_size=2, rank=1, world_size=2, **settings)
        first.set_epoch(1)
        it = iter(first)
        taken = [next(it) for _ in range(2)]
        assert taken == _torch_batches(batch_size=2, rank=1, world_size=2, **reference)[:2]
        state = first.state_dict()
        assert (state["epoch"], state["consumed"], state["order"], state["seed"]) == (1, 8, order, 6)
        assert state == first.state_dict(batches_consumed=2) == first.sampler.state_dict(samples_consumed=4)
        resumed = pt.PackedBatchSampler(dataset, batch_size=3, **settings)  # another batch size and world size
        resumed.load_state_dict(state)
        assert (resumed.epoch, resumed.start) == (1, 8)
        rest = _torch_batches(batch_size=3, consumed=8, **reference)
        assert list(resumed) == rest and len(resumed) == len(rest), order
        resumed.set_epoch(1)  # the loaded position was used by the pass after the load: a whole epoch now
        assert list(resumed) == _torch_batches(batch_size=3, **reference)
        again = pt.PackedBatchSampler(dataset, batch_size=3, **settings)
        again.load_state_dict(state)
        again.set_epoch(1)  # the loaded epoch keeps the position for the pass that follows the load
        assert list(again) == rest
        samples = pt.PackedSampler(dataset, rank=1, world_size=3, **settings)
        samples.load_state_dict(state)
        flat = [i for batch in _torch_batches(consumed=8, rank=1, world_size=3, **reference) for i in batch]
        assert list(samples) == flat and len(samples) == len(flat)
        iterable = pt.PackedIterableDataset(torch_folder, batch_size=4, decode=False, **settings)
        iterable.load_state_dict(state)
        assert [ids(images) for images, _ in iterable] == _torch_batches(batch_size=4, consumed=8, **reference)
        assert len(iterable) == len(_torch_batches(batch_size=4, consumed=8, **reference))
        iterable.set_epoch(2)  # another epoch starts at its beginning
        assert iterable.start == 0
        assert [ids(images) for images, _ in iterable] == _torch_batches(batch_size=4, **{**reference, "epoch": 2})
        resumed.set_epoch(3)
        assert list(resumed) == _torch_batches(batch_size=3, **{**reference, "epoch": 3})


def test_torch_loader_refusals_are_exact(torch_folder: Path) -> None:
    pt = _torch_pt()
    dataset = pt.PackedDataset(torch_folder, decode=False)
    with pytest.raises(OptionError) as caught:
        pt.PackedDataLoader(dataset, sampler=pt.PackedSampler(dataset, batch_size=3), batch_size=2)
    assert caught.value.message == ("the PackedSampler was given batch_size=3 but the DataLoader's batch_size is 2: "
                                    "give both the same, or leave the sampler's out")
    for sampler in (pt.PackedSampler(dataset, batch_size=2), pt.PackedSampler(dataset)):  # agreeing, or unsized
        assert pt.PackedDataLoader(dataset, sampler=sampler, batch_size=2).state_dict()["consumed"] == 0


def test_torch_iterable_with_fields_counts_what_it_handed_out(torch_folder: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Dict samples (``fields=``) take another path through ``__iter__``: it counts the same way."""
    pt = _torch_pt()
    expected = _torch_batches(seed=1, batch_size=3)
    for batched in (True, False):
        dataset = pt.PackedIterableDataset(torch_folder, batch_size=3, decode=False, order="random", seed=1,
                                           batched=batched, fields=("index", "label"))
        it = iter(dataset)
        taken = [next(it) for _ in range(4)]
        if batched:
            assert [batch["index"].tolist() for batch in taken] == expected[:4]
            assert dataset.state_dict() == dataset.state_dict(batches_consumed=4)
            assert dataset.state_dict()["consumed"] == 12
        else:
            assert [sample["index"] for sample in taken] == [i for batch in expected for i in batch][:4]
            assert dataset.state_dict() == dataset.state_dict(samples_consumed=4)
            assert dataset.state_dict()["consumed"] == 3  # one whole batch
        list(it)
        assert dataset.state_dict()["consumed"] == TORCH_COUNT
    _torch_in_worker(monkeypatch, 1, 2)  # a worker's own state counts its own items
    for batched, items in ((True, 2), (False, 5)):
        dataset = pt.PackedIterableDataset(torch_folder, batch_size=3, decode=False, seed=1, batched=batched,
                                           fields=("index",))
        it = iter(dataset)
        for _ in range(items):
            next(it)
        assert dataset.state_dict()["worker_items"] == items


def test_torch_set_epoch_moves_the_seeded_crops(torch_folder: Path) -> None:
    """A loop that moves only the sampler (the DistributedSampler habit) moves the dataset's crops too."""
    pt = _torch_pt()
    from packer.transforms import RandomResizedCrop

    crop = RandomResizedCrop(8, seed=3)
    dataset = pt.PackedDataset(torch_folder, decode=crop)
    for epoch, reader in enumerate([pt.PackedSampler(dataset), pt.PackedBatchSampler(dataset, batch_size=2),
                                    pt.PackedDataLoader(dataset, sampler=pt.PackedSampler(dataset), batch_size=2)], 1):
        reader.set_epoch(epoch)
        assert crop.epoch == epoch and reader.epoch == epoch
    moved = RandomResizedCrop(8, seed=3)
    iterable = pt.PackedIterableDataset(torch_folder, batch_size=4, order="sequential", decode=moved)
    iterable.set_epoch(5)
    assert moved.epoch == 5
    at_five = RandomResizedCrop(8, seed=3)
    at_five.set_epoch(5)
    reference = pt.PackedDataset(torch_folder, decode=at_five)
    images, _ = next(iter(iterable))
    assert _torch_equal(images, pt.collate(reference.__getitems__([0, 1, 2, 3]))[0])
    at_zero = pt.PackedDataset(torch_folder, decode=RandomResizedCrop(8, seed=3))
    assert not _torch_equal(images, pt.collate(at_zero.__getitems__([0, 1, 2, 3]))[0])  # the epoch matters
    fields = RandomResizedCrop(8, seed=3)
    pt.PackedIterableDataset(torch_folder, batch_size=4, decode=fields, fields=("image", "index")).set_epoch(2)
    assert fields.epoch == 2


def test_torch_iterable_fields_pass_the_reader_options(torch_folder: Path) -> None:
    """With ``fields=`` the samples come from a PackedDataset given every decoding option."""
    pt = _torch_pt()
    options = dict(layout="HWC", transform=lambda t: t[:2, :3] + 1, target_transform=lambda y: y + 10)
    fields = ("image", "label", "index")
    reference = pt.PackedDataset(torch_folder, fields=fields, **options)
    for batched in (True, False):
        dataset = pt.PackedIterableDataset(torch_folder, batch_size=3, order="random", seed=2, fields=fields,
                                           batched=batched, **options)
        got = list(dataset)
        samples = got if not batched else [dict(image=batch["image"][j], label=int(batch["label"][j]),
                                                index=int(batch["index"][j]))
                                           for batch in got for j in range(len(batch["index"]))]
        order = [i for batch in _torch_batches(seed=2, batch_size=3) for i in batch]
        assert [int(sample["index"]) for sample in samples] == order
        for sample in samples:
            expected = reference[int(sample["index"])]
            assert sample["label"] == expected["label"] and sample["label"] >= 10
            assert sample["image"].shape == (2, 3, 3) and _torch_equal(sample["image"], expected["image"])


def test_torch_iterable_collate_fn_is_for_dict_samples_only(torch_folder: Path) -> None:
    pt = _torch_pt()
    ids = _torch_ids(torch_folder)
    custom = lambda samples: {"custom": len(samples)}  # noqa: E731
    plain = pt.PackedIterableDataset(torch_folder, batch_size=3, order="random", seed=2, decode=False,
                                     collate_fn=custom)
    assert [ids(images) for images, _ in plain] == _torch_batches(seed=2, batch_size=3)  # unused for (image, label)
    for fields in (["image", "label"], ("image", "label")):
        assert isinstance(next(iter(pt.PackedIterableDataset(torch_folder, batch_size=3, fields=fields,
                                                             collate_fn=custom))), tuple)
    dicts = pt.PackedIterableDataset(torch_folder, batch_size=3, order="random", seed=2, fields=("index",),
                                     collate_fn=custom)
    assert list(dicts) == [{"custom": len(batch)} for batch in _torch_batches(seed=2, batch_size=3)]


def test_torch_readers_report_their_order_settings(torch_folder: Path) -> None:
    """``read_order`` is every setting the reader was given (a reader built from it reads the same blocks)."""
    pt = _torch_pt()
    from packer.order import ReadOrder

    settings = dict(order="block", seed=2, block_bytes=1024, window=3, drop_last=True)
    expected = dict(kind="block", seed=2, block_bytes=1024, window=3, drop_last=True)
    dataset = pt.PackedDataset(torch_folder, decode=False)
    assert pt.PackedSampler(dataset, **settings).read_order == ReadOrder(batch_size=1, **expected)
    assert pt.PackedSampler(dataset, batch_size=4, **settings).read_order == ReadOrder(batch_size=4, **expected)
    batches = pt.PackedBatchSampler(dataset, batch_size=3, **settings)
    assert batches.read_order == batches.sampler.read_order == ReadOrder(batch_size=3, **expected)
    iterable = pt.PackedIterableDataset(torch_folder, batch_size=3, decode=False, **settings)
    assert iterable.read_order == ReadOrder(batch_size=3, **expected)
    rebuilt = pt.PackedSampler(dataset, batch_size=3, order="block", seed=2, window=3, drop_last=True,
                               block_bytes=batches.read_order.block_bytes)
    assert list(rebuilt) == list(batches.sampler)
