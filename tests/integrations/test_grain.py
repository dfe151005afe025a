"""packer.grain with the real Grain: a MapDataset pipeline (shuffle, map, batch) over a packed
dataset reads every sample once per epoch with packer's pixels; its checkpointed iterator resumes
exactly; EpochOrdered deals packer's orders to processes like the PyTorch readers."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import numpy as np
import pytest

grain = pytest.importorskip("grain", reason="the Grain tests need grain: pip install 'packer-shards[grain]'")

import packer  # noqa: E402
from helpers import write_images  # noqa: E402
from packer import OptionError  # noqa: E402
from packer.decode import decode_image  # noqa: E402
from packer.grain import EpochOrdered, PackedDataSource  # noqa: E402
from packer.order import ReadOrder, index_blocks  # noqa: E402
from packer.transforms import CenterCrop  # noqa: E402
from packer.writer import build  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402

SAMPLES = 30


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("grain")
    write_images(root / "src", {"ant": 12, "bee": 10, "cow": 8}, size=12)
    build(root / "src", root / "packed", BuildOptions(shard_size=8 << 10), workers=1)
    return root / "packed"


def _take(iterator, count: int) -> list[dict]:
    return [next(iterator) for _ in range(count)]


def test_the_source_is_grains_random_access_protocol_with_batched_reads(packed):
    source = PackedDataSource(packed, fields=("image", "label", "index", "key"))
    assert isinstance(source, grain.sources.RandomAccessDataSource)
    from grain._src.python.dataset.base import SupportsBatchedReadRandomAccessDataSource

    assert isinstance(source, SupportsBatchedReadRandomAccessDataSource)
    dataset = packer.open_dataset(packed)
    assert len(source) == SAMPLES
    record = source[7]
    assert record["image"].dtype == np.uint8 and record["image"].shape[2] == 3  # HWC
    assert np.array_equal(record["image"], decode_image(dataset.get(7)))
    assert record["label"] == dataset.labels[7] and record["index"] == 7 and record["key"] == dataset.key(7)
    batch = source._getitems([3, 1, 3])
    assert [r["index"] for r in batch] == [3, 1, 3] and np.array_equal(batch[0]["image"], batch[2]["image"])
    again = pickle.loads(pickle.dumps(source))  # what Grain's worker processes receive
    assert repr(again) == repr(source) and np.array_equal(again[7]["image"], record["image"])
    assert repr(source).startswith(f"PackedDataSource(path={str(dataset.path)!r}, samples={SAMPLES}")


def test_a_shuffled_batched_map_dataset_reads_every_sample_once_per_epoch(packed):
    source = PackedDataSource(packed, fields=("image", "label", "index"), decode=CenterCrop(8))
    dataset = packer.open_dataset(packed)
    pipeline = (grain.MapDataset.source(source).shuffle(seed=3).repeat(2)
                .map(lambda r: {**r, "mean": r["image"].mean(dtype=np.float32)}).batch(6))
    batches = list(pipeline)
    assert len(batches) == 10 and batches[0]["image"].shape == (6, 8, 8, 3)
    for epoch in (0, 1):
        seen = np.concatenate([b["index"] for b in batches[5 * epoch:5 * epoch + 5]])
        assert sorted(seen.tolist()) == list(range(SAMPLES))
        assert seen.tolist() != list(range(SAMPLES))  # shuffled
    first = batches[0]
    for k, i in enumerate(first["index"].tolist()):
        assert first["label"][k] == dataset.labels[i]
        assert np.array_equal(first["image"][k], CenterCrop(8)(np.frombuffer(dataset.get(i), np.uint8),
                                                               int(dataset.index.image_format[i])))
        assert first["mean"][k] == pytest.approx(first["image"][k].mean())


def test_a_checkpointed_iterator_resumes_exactly(packed):
    def pipeline() -> grain.IterDataset:
        source = PackedDataSource(packed, fields=("image", "index"), decode=CenterCrop(8))
        return grain.MapDataset.source(source).shuffle(seed=5).repeat().batch(4).to_iter_dataset()

    iterator = iter(pipeline())
    head = _take(iterator, 9)  # past the first epoch's end (30 samples = 7.5 batches)
    state = iterator.get_state()
    expected = _take(iterator, 6)
    resumed = iter(pipeline())
    resumed.set_state(state)
    got = _take(resumed, 6)
    for a, b in zip(expected, got, strict=True):
        assert np.array_equal(a["index"], b["index"]) and np.array_equal(a["image"], b["image"])
    fresh = _take(iter(pipeline()), 15)
    assert [b["index"].tolist() for b in fresh] == [b["index"].tolist() for b in head + expected]


@pytest.mark.parametrize("order", ["block", "random"])
def test_epoch_ordered_deals_packers_orders_to_processes(packed, order):
    source = PackedDataSource(packed, fields=("index",), decode=False)
    index = packer.open_dataset(packed).index
    blocks = index_blocks(index.offset, index.size, index.shard, 4096) if order == "block" else None
    read_order = ReadOrder(kind=order, seed=9, block_bytes=4096, batch_size=4)
    per_process = []
    for rank in (0, 1):
        data = EpochOrdered(source, order=order, seed=9, batch_size=4, process_index=rank, process_count=2,
                            block_bytes=4096)
        assert len(data) == 15  # 30 samples, 15 a process per epoch: batches of 4, 4, 4, 3
        batches = [b["index"].tolist() for b in data.batch(4).repeat(2)]
        assert [len(b) for b in batches] == [4, 4, 4, 3] * 2
        for epoch in (0, 1):
            plan = read_order.plan(SAMPLES, epoch=epoch, rank=rank, world_size=2, blocks=blocks)
            assert batches[4 * epoch:4 * epoch + 4] == [plan.batch(k).tolist() for k in range(plan.num_batches)]
        per_process.append(batches)
    for epoch in (0, 1):
        seen = [i for rank in (0, 1) for b in per_process[rank][4 * epoch:4 * epoch + 4] for i in b]
        assert sorted(seen) == list(range(SAMPLES))
    assert per_process[0][:4] != per_process[0][4:]  # epochs differ


def test_options_are_checked(packed):
    with pytest.raises(OptionError, match="unknown field 'boxes'"):
        PackedDataSource(packed, fields=("image", "boxes"))
    for fields in ((), "image"):  # a bare string would be read letter by letter
        with pytest.raises(OptionError) as caught:
            PackedDataSource(packed, fields=fields)
        assert caught.value.message == f"fields must be a non-empty sequence of names, got {fields!r}"
    with pytest.raises(OptionError, match="decode must be"):
        PackedDataSource(packed, decode="yes")
    source = PackedDataSource(packed, fields=("label",))
    with pytest.raises(OptionError, match="outside 0..29"):
        source[30]
    for key in (None, "a", "3", 2.7):  # never a plain ValueError, never '3' or 2.7 taken for sample 3 or 2
        with pytest.raises(OptionError) as caught:
            source[key]
        assert caught.value.message == f"record keys are integers, got {type(key).__name__}"
    assert source[np.int64(3)] == source[3]  # what Grain's samplers hand over
    # the old keywords (deprecated) are checked as the order's rank and world size, named as typed
    for name, value, message in (("process_count", -1, "world_size must be a positive integer, got -1"),
                                 ("process_index", True, "rank must be an integer in 0..0, got True"),
                                 ("process_count", "2", "world_size must be a positive integer, got '2'")):
        with pytest.raises(OptionError) as caught:  # refused before the warning
            EpochOrdered(source, **{name: value})
        field = "rank" if name == "process_index" else "world_size"
        assert caught.value.message == f"{message} ({name}= sets {field})"
    with pytest.raises(OptionError, match=r"^rank must be an integer in 0..1, got 2$"):
        EpochOrdered(source, order=ReadOrder(rank=2, world_size=2))
    with pytest.raises(OptionError, match="unknown order"):
        EpochOrdered(source, order="zigzag")
    with pytest.raises(OptionError, match="reads a PackedDataSource"):
        EpochOrdered(list(range(3)))
    assert PackedDataSource(packed, fields=("image",), decode=False)[0]["image"].ndim == 1  # the stored bytes


def test_a_damaged_payload_is_a_decode_error_naming_the_sample(packed, tmp_path):
    """Same size, garbage bytes (only decoding can notice): the error names the sample and its key."""
    import shutil

    from packer.errors import DecodeError

    copy = Path(shutil.copytree(packed, tmp_path / "ds"))
    dataset = packer.open_dataset(copy)
    victim = 4
    with open(copy / dataset.manifest.shards[int(dataset.index.shard[victim])].path, "r+b") as handle:
        handle.seek(int(dataset.index.offset[victim]))
        handle.write(b"\x00" * int(dataset.index.size[victim]))
    source = PackedDataSource(copy, fields=("image", "index"))
    with pytest.raises(DecodeError) as caught:
        source[victim]
    assert (caught.value.path, caught.value.sample) == (str(dataset.path), victim)
    assert caught.value.message.startswith("cannot decode")
    assert caught.value.message.endswith(f" (key {dataset.key(victim)!r})")
    assert source[victim - 1]["index"] == victim - 1  # the other samples read on
    assert source._getitems([victim + 1])[0]["image"].ndim == 3


def test_a_raw_payload_that_does_not_hold_its_pixels_is_a_decode_error(tmp_path):
    """A --codec raw sample whose index size disagrees with its height x width x channels (a
    hand-made index that still passes the layout checks) is refused by name, not reshaped."""
    from helpers import rewrite_index
    from packer.errors import DecodeError

    write_images(tmp_path / "src", {"ant": 3, "bee": 3}, size=12)
    build(tmp_path / "src", tmp_path / "raw", BuildOptions(codec="raw:size=6x5", alignment=64, shuffle=False),
          workers=1)
    rewrite_index(tmp_path / "raw", lambda columns: columns["size"].__setitem__(3, 70))  # 90 bytes, aligned to 128
    source = PackedDataSource(tmp_path / "raw", fields=("image",))
    assert source[2]["image"].shape == (6, 5, 3)
    with pytest.raises(DecodeError) as caught:
        source[3]
    assert caught.value.sample == 3 and caught.value.path == str(source.dataset.path)
    assert caught.value.message == "raw payload of 70 bytes does not hold the index's 6x5x3 pixels"


def test_epoch_ordered_takes_one_order_value_and_the_old_keywords_for_a_release(packed):
    """``order=ReadOrder(...)`` reads what the old keywords read (Grain's process_index and
    process_count are the order's rank and world size); they warn with the new spelling."""
    source = PackedDataSource(packed, fields=("index",), decode=False)
    order = ReadOrder("block", seed=9, block_bytes=4096, batch_size=4, drop_last=True, rank=1, world_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        new = EpochOrdered(source, order=order)
    with pytest.warns(DeprecationWarning) as caught:
        old = EpochOrdered(source, order="block", seed=9, batch_size=4, process_index=1, process_count=2,
                           block_bytes=4096, drop_last=True)
    assert str(caught[0].message) == (
        "EpochOrdered(seed=, batch_size=, process_index=, process_count=, block_bytes=, drop_last=) is deprecated "
        "and goes in the next release: pass order=packer.ReadOrder('block', seed=9, block_bytes=4096, batch_size=4, "
        "drop_last=True, rank=1, world_size=2)")
    assert new.read_order == old.read_order == order and len(new) == len(old) == 12
    for epoch in (0, 1, 2):
        assert new.indices(epoch).tolist() == old.indices(epoch).tolist()
        assert new.indices(epoch).tolist() == order.plan(SAMPLES, epoch=epoch, blocks=index_blocks(
            *(getattr(source.dataset.index, c) for c in ("offset", "size", "shard")), 4096)).indices.tolist()
    assert EpochOrdered(source).read_order == ReadOrder("block", rank=0, world_size=1)  # the default
    with pytest.warns(DeprecationWarning):  # old keywords without a share: process 0 of 1, as before
        assert EpochOrdered(source, seed=1).read_order.world_size == 1


def test_records_hold_every_readers_built_in_fields(packed):
    """One vocabulary (``packer.fields.READ_FIELDS``): Grain's records take ``metadata`` too."""
    from packer.fields import READ_FIELDS
    from packer.grain import BUILTIN_FIELDS

    assert BUILTIN_FIELDS == READ_FIELDS
    record = PackedDataSource(packed, fields=READ_FIELDS, decode=False)[4]
    dataset = packer.open_dataset(packed)
    assert record["metadata"] == dataset.metadata(4) and record["key"] == dataset.key(4)
