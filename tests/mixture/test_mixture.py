"""Mixtures (issue 36 item 1): per-epoch counts exactly as planned (weight, repeat, choose), coverage
carried over between epochs, exact resume at another world size, worker count and batch size, a
foreign state refused by name, union class lists, and every reader over one mixture."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from helpers import write_images

import packer
from packer import errors
from packer.order import IndexSpace, ReadOrder, deal

ORDERS = ["block", "random", "sequential"]


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mixture")
    write_images(root / "a", {"cat": 20, "dog": 20}, size=16)
    write_images(root / "b", {"dog": 6, "emu": 9}, seed=4, size=16)
    write_images(root / "c", {"fox": 8}, seed=8, size=16)
    for name in "abc":
        packer.build_dataset(root / name, root / name.upper(), packer.BuildSettings(
            layout=packer.LayoutSettings(shard_size=8 << 10, alignment=512)))
    (view,) = packer.view(root / "A", root / "cats.pkview", classes="cat")
    return {"A": root / "A", "B": root / "B", "C": root / "C", "cats": view}


def _streams_of(mixture, numbers) -> list[int]:
    return [mixture.stream_of(int(i)) for i in numbers]


@pytest.mark.parametrize("kind", ORDERS)
def test_each_epoch_takes_exactly_the_planned_count_of_each_stream(parts, kind):
    mixture = packer.Mixture([packer.Stream(parts["A"], weight=3), packer.Stream(parts["B"], weight=1)],
                             epoch_size=30, seed=5)
    assert mixture.counts == (23, 7)  # 22.5 / 7.5: the largest remainders, a tie to the first stream
    space = IndexSpace(mixture)
    assert space.num_samples == 30
    for epoch in range(4):
        order = space.epoch_order(ReadOrder(kind, seed=1), epoch)
        assert Counter(_streams_of(mixture, order)) == {0: 23, 1: 7}
        assert order.min() >= 0 and order.max() < len(mixture)


def test_repeat_and_choose_as_mds_defines_them(parts):
    mixture = packer.Mixture([packer.Stream(parts["A"], repeat=0.25), packer.Stream(parts["B"], repeat=2),
                              packer.Stream(parts["C"], choose=3)], seed=1)
    assert mixture.counts == (10, 30, 3)
    order = IndexSpace(mixture).epoch_order(ReadOrder("block"), 0)
    assert Counter(_streams_of(mixture, order)) == {0: 10, 1: 30, 2: 3}
    b = [i for i in order.tolist() if mixture.stream_of(i) == 1]
    assert Counter(Counter(b).values()) == {2: 15}  # twice over: each sample of B exactly twice
    plain = packer.Mixture([parts["A"], parts["B"]])
    assert plain.counts == (40, 15) and IndexSpace(plain).num_samples == 55


@pytest.mark.parametrize("kind", ORDERS)
def test_coverage_carries_over_between_epochs(parts, kind):
    mixture = packer.Mixture([packer.Stream(parts["A"], choose=10), packer.Stream(parts["C"], choose=2)], seed=2)
    space = IndexSpace(mixture)
    orders = [space.epoch_order(ReadOrder(kind, seed=7), e) for e in range(4)]
    a = np.concatenate([o[o < 40] for o in orders])
    assert sorted(a.tolist()) == list(range(40))  # 4 epochs of 10: every sample of A once, none twice
    c = np.concatenate([o[o >= 40] for o in orders]) - 40
    assert sorted(c.tolist()) == list(range(8))
    again = [IndexSpace(packer.Mixture([packer.Stream(parts["A"], choose=10), packer.Stream(parts["C"], choose=2)],
                                       seed=2)).epoch_order(ReadOrder(kind, seed=7), e) for e in range(4)]
    assert all(np.array_equal(x, y) for x, y in zip(orders, again))  # a function of (seed, epoch) only


def test_the_block_order_keeps_a_streams_reads_in_runs(parts):
    mixture = packer.Mixture([parts["A"], parts["B"]], seed=3)
    order = IndexSpace(mixture).epoch_order(ReadOrder("block", seed=1), 0)
    switches = int(np.count_nonzero(np.diff(np.array(_streams_of(mixture, order))) != 0))
    random = IndexSpace(mixture).epoch_order(ReadOrder("random", seed=1), 0)
    assert switches < int(np.count_nonzero(np.diff(np.array(_streams_of(mixture, random))) != 0))
    assert sorted(order.tolist()) == list(range(55))


def test_samples_carry_their_stream_and_union_labels(parts):
    mixture = packer.Mixture([parts["A"], parts["B"], parts["C"]], classes="union")
    assert mixture.classes == ("cat", "dog", "emu", "fox")
    with packer.open_dataset(parts["B"]) as b:
        for local in range(len(b)):
            g = 40 + local
            assert mixture.field_value("stream", g) == 1 and mixture.key(g) == b.key(local)
            assert mixture.classes[int(mixture.labels[g])] == b.classes[int(b.labels[local])]
            assert bytes(mixture.get(g)) == bytes(b.get(local))
    assert mixture.labels[-1] == 3 and mixture.field_value("stream", len(mixture) - 1) == 2
    per = packer.Mixture([parts["A"], parts["B"]])
    assert per.classes == () and per.stream_classes == (("cat", "dog"), ("dog", "emu"))
    with packer.open_dataset(parts["B"]) as b:
        assert per.labels[40:].tolist() == b.labels.tolist()  # B's own labels, in B's class list


def test_a_view_is_a_stream(parts):
    mixture = packer.Mixture([packer.Stream(parts["cats"], weight=1), packer.Stream(parts["B"], weight=1)],
                             epoch_size=12)
    with packer.open_dataset(parts["cats"]) as cats:
        assert len(mixture) == 20 + 15 and mixture.key(3) == cats.key(3)
        assert bytes(mixture.read_batch([3, 25])[0]) == bytes(cats.get(3))
    assert Counter(_streams_of(mixture, IndexSpace(mixture).epoch_order(ReadOrder("block"), 0))) == {0: 6, 1: 6}


@pytest.mark.parametrize("change, key", [
    (dict(weights=(1, 2)), "mixture_counts"),
    (dict(seed=9), "mixture_seed"),
    (dict(streams=("A", "C")), "mixture"),
    (dict(classes="union"), "mixture_classes"),
])
def test_a_state_of_another_mixture_is_refused_naming_what_differs(parts, change, key):
    from packer.torch import PackedBatchSampler, PackedDataset

    def build(streams=("A", "B"), weights=(2, 1), seed=0, classes="per-stream"):
        mixture = packer.Mixture([packer.Stream(parts[s], weight=w) for s, w in zip(streams, weights)],
                                 epoch_size=21, seed=seed, classes=classes)
        return PackedBatchSampler(PackedDataset(mixture, decode=False), batch_size=4, order="block")

    state = build().state_dict()
    with pytest.raises(errors.StateMismatchError, match=f"the saved state has {key}="):
        build(**change).load_state_dict(state)


@pytest.mark.parametrize("kind", ["block", "random"])
@pytest.mark.parametrize("world, batch, new_world, new_batch", [(1, 4, 2, 3), (2, 3, 3, 5), (3, 2, 1, 8)])
def test_resume_at_another_world_size_and_batch_size_reads_exactly_the_rest(parts, kind, world, batch, new_world,
                                                                            new_batch):
    from packer.torch import PackedBatchSampler, PackedDataset

    mixture = packer.Mixture([packer.Stream(parts["A"], weight=2), packer.Stream(parts["B"], weight=1)],
                             epoch_size=33, seed=4)
    data = PackedDataset(mixture, decode=False)
    epoch_order = IndexSpace(mixture).epoch_order(ReadOrder(kind, seed=6), 1)
    samplers = [PackedBatchSampler(data, batch_size=batch, order=ReadOrder(kind, seed=6, rank=r, world_size=world))
                for r in range(world)]
    for sampler in samplers:
        sampler.set_epoch(1)
    iterators = [iter(s) for s in samplers]
    read = [i for it in iterators for _ in range(2) for i in next(it)]
    state = samplers[0].state_dict(batches_consumed=2)
    rest = []
    for r in range(new_world):
        sampler = PackedBatchSampler(data, batch_size=new_batch, order=ReadOrder(kind, seed=6, rank=r,
                                                                                 world_size=new_world))
        sampler.load_state_dict(state)
        rest += [i for batch in sampler for i in batch]
    counted = Counter(read) + Counter(rest)
    want = Counter(epoch_order.tolist())
    # padding repeats a few samples when the rest does not divide evenly: never a sample missed
    assert set(counted) == set(want) and all(counted[i] >= want[i] for i in want)
    assert sum(counted.values()) - sum(want.values()) < new_world * new_batch + world * batch


def test_dataloader_workers_and_the_iterable_and_threaded_readers(parts):
    from torch.utils.data import DataLoader

    from packer.threaded import ThreadedLoader
    from packer.torch import PackedBatchSampler, PackedDataset, PackedIterableDataset

    def mixture():
        return packer.Mixture([packer.Stream(parts["cats"], weight=1), packer.Stream(parts["B"], weight=1),
                               packer.Stream(parts["C"], choose=4)], epoch_size=20, seed=3, classes="union")

    want = Counter(IndexSpace(mixture()).epoch_order(ReadOrder("block", seed=2), 0).tolist())
    assert sum(want.values()) == 20  # epoch_size: C's 4, and 8 each for the weighted streams
    data = PackedDataset(mixture(), decode=False, fields=("index", "stream", "label"))
    loader = DataLoader(data, batch_sampler=PackedBatchSampler(data, batch_size=4, order=ReadOrder("block", seed=2)),
                        num_workers=2, collate_fn=lambda samples: samples)
    got = [(int(s["index"]), int(s["stream"])) for batch in loader for s in batch]
    assert Counter(i for i, _ in got) == want
    assert Counter(s for _, s in got) == {0: 8, 1: 8, 2: 4}
    iterable = PackedIterableDataset(mixture(), batch_size=4, decode=False, fields=("index", "stream"),
                                     order=ReadOrder("block", seed=2))
    seen = Counter(int(i) for batch in DataLoader(iterable, batch_size=None, num_workers=2)
                   for i in batch["index"].tolist())
    assert seen == want
    threaded = ThreadedLoader(mixture(), batch_size=4, decode=False, fields=("index",), threads=2,
                              order=ReadOrder("block", seed=2))
    assert Counter(int(i) for batch in threaded for i in batch["index"].tolist()) == want


@pytest.mark.parametrize("streams, kwargs, message", [
    ([], {}, "non-empty list"),
    (["A"], {"classes": "merge"}, "classes must be one of"),
    (["A"], {"epoch_size": 10}, "epoch_size= goes with weight= streams"),
    (["A"], {"seed": -1}, "seed must be an integer"),
])
def test_bad_mixtures_are_refused(parts, streams, kwargs, message):
    with pytest.raises(errors.OptionError, match=message):
        packer.Mixture([parts[s] for s in streams], **kwargs)


def test_bad_streams_are_refused(parts):
    with pytest.raises(errors.OptionError, match="one of weight=, repeat= and choose=, got weight= and choose="):
        packer.Stream(parts["A"], weight=1, choose=3)
    with pytest.raises(errors.OptionError, match="weight= must be a number above 0"):
        packer.Stream(parts["A"], weight=0)
    with pytest.raises(errors.OptionError, match="choose= must be a non-negative integer"):
        packer.Stream(parts["A"], choose=1.5)
    with pytest.raises(errors.OptionError, match="epoch_size=3 is smaller than the 4 samples"):
        packer.Mixture([packer.Stream(parts["A"], weight=1), packer.Stream(parts["B"], choose=4)], epoch_size=3)


def test_an_empty_stream_asked_for_samples_and_a_bad_epoch_size_are_refused(parts, tmp_path):
    (empty,) = packer.view(parts["B"], tmp_path / "none.pkview", where="width > 100000")
    mixture = packer.Mixture([packer.Stream(parts["A"]), packer.Stream(empty, choose=3, name="nothing")])
    with pytest.raises(errors.OptionError, match="stream 1 \\(nothing\\) is empty but asked for 3 samples"):
        IndexSpace(mixture).epoch_order(ReadOrder("block"), 0)
    assert packer.Mixture([parts["A"], empty]).counts == (40, 0)
    with pytest.raises(errors.OptionError, match="epoch_size must be a positive integer, got 0"):
        packer.Mixture([packer.Stream(parts["A"], weight=1)], epoch_size=0)


def test_streams_with_other_codecs_are_refused(parts, tmp_path):
    write_images(tmp_path / "src", {"cat": 3}, size=16)
    packer.build_dataset(tmp_path / "src", tmp_path / "jpeg", packer.BuildSettings(codec="jpeg:quality=80"))
    with pytest.raises(errors.OptionError, match="the streams of a mixture must share a codec"):
        packer.Mixture([parts["A"], tmp_path / "jpeg"])


def test_a_mixture_pickles_small_and_reads_the_same(parts):
    import pickle

    mixture = packer.Mixture([packer.Stream(parts["cats"], weight=1), packer.Stream(parts["B"], weight=2)],
                             epoch_size=9, seed=4, classes="union")
    data = pickle.dumps(mixture)
    clone = pickle.loads(data)
    assert len(data) < 64 << 10 and clone.counts == mixture.counts and clone.classes == mixture.classes
    assert [bytes(clone.get(i)) for i in range(len(clone))] == [bytes(mixture.get(i)) for i in range(len(mixture))]
    assert np.array_equal(IndexSpace(clone).epoch_order(ReadOrder("block"), 3),
                          IndexSpace(mixture).epoch_order(ReadOrder("block"), 3))


def test_grain_reads_a_mixtures_epochs(parts):
    pytest.importorskip("grain")
    from packer.grain import EpochOrdered, PackedDataSource

    mixture = packer.Mixture([packer.Stream(parts["A"], choose=10), packer.Stream(parts["C"], choose=2)], seed=2)
    source = PackedDataSource(mixture, fields=("index", "stream"), decode=False)
    epochs = EpochOrdered(source, order=ReadOrder("block", seed=7))
    assert len(epochs) == 12
    want = IndexSpace(mixture).epoch_order(ReadOrder("block", seed=7), 0)
    assert Counter(int(epochs[k]["index"]) for k in range(12)) == Counter(want.tolist())
    assert Counter(int(epochs[k]["stream"]) for k in range(12)) == {0: 10, 1: 2}


def test_a_batch_across_streams_of_other_backends_reads_each_streams_part(parts):
    mixture = packer.Mixture([packer.open_dataset(parts["A"], backend="pread"), parts["B"]])
    assert mixture.backend_name == "mixed"
    with packer.open_dataset(parts["A"]) as a, packer.open_dataset(parts["B"]) as b:
        batch = mixture.read_batch([41, 3, -1, 40])
        assert [bytes(batch[j]) for j in range(4)] == [bytes(b.get(1)), bytes(a.get(3)), bytes(b.get(14)),
                                                       bytes(b.get(0))]
    with pytest.raises(errors.SampleIndexError, match="batch holds index 55, outside -55..54"):
        mixture.read_batch([0, 55])


def test_iterable_resume_with_other_workers_ranks_and_batch_size(parts):
    """Part of an epoch on 2 ranks x 2 workers, the rest on 3 ranks with 1 and 3 workers and another
    batch size: together exactly the epoch's samples."""
    from torch.utils.data import DataLoader

    from packer.torch import PackedIterableDataset

    def mixture():
        return packer.Mixture([packer.Stream(parts["A"], weight=2), packer.Stream(parts["cats"], weight=1)],
                              epoch_size=36, seed=8)

    want = Counter(IndexSpace(mixture()).epoch_order(ReadOrder("block", seed=11), 1).tolist())
    read, states = [], []
    for rank in range(2):
        data = PackedIterableDataset(mixture(), batch_size=3, decode=False, fields=("index",),
                                     order=ReadOrder("block", seed=11, rank=rank, world_size=2))
        data.set_epoch(1)
        steps = 0
        for batch in DataLoader(data, batch_size=None, num_workers=2):
            read += batch["index"].tolist()
            steps += 1
            if steps == 2:
                break
        states.append(data.state_dict(batches_consumed=steps))
    assert states[0] == states[1] and states[0]["consumed"] == 12
    rest = []
    for rank, workers in zip(range(3), (1, 3, 3)):
        data = PackedIterableDataset(mixture(), batch_size=2, decode=False, fields=("index",),
                                     order=ReadOrder("block", seed=11, rank=rank, world_size=3))
        data.load_state_dict(states[0])
        data.set_epoch(1)
        rest += [i for batch in DataLoader(data, batch_size=None, num_workers=workers) for i in batch["index"].tolist()]
    assert Counter(read) + Counter(rest) == want  # 24 left = 3 x 8: exactly the rest, none twice


def test_lightning_takes_a_mixture_and_a_view(parts):
    pytest.importorskip("lightning")
    from packer.lightning import PackedDataModule

    mixture = packer.Mixture([packer.Stream(parts["A"], choose=6), packer.Stream(parts["cats"], choose=4)], seed=2)
    module = PackedDataModule(train=mixture, val=parts["cats"], batch_size=5, order=ReadOrder("random", seed=0))
    module.setup("fit")
    got = [int(i) for _, labels in module.train_dataloader() for i in labels]
    assert len(got) == 10
    assert sum(len(labels) for _, labels in module.val_dataloader()) == 20  # the view: the 20 cats
    with pytest.raises(errors.OptionError, match=r"^train= must be a dataset folder, a view file, an open dataset"):
        PackedDataModule(train=42, batch_size=5)


def test_an_epoch_larger_than_memory_is_refused_before_any_read(parts):
    with pytest.raises(errors.OptionError) as caught:
        packer.Mixture([packer.Stream(parts["A"], choose=10**12)])
    assert caught.value.message.startswith("the mixture's epoch of 1,000,000,000,000 samples needs its order in "
                                           "memory (7,450.6 GiB of sample numbers), more than this machine's ")
    assert caught.value.message.endswith("GiB: lower choose=, repeat= or epoch_size")


def test_the_gpu_raw_loader_reads_a_mixture_of_raw_datasets(tmp_path):
    """GpuRawBatches (on CPU tensors here: no GPU) over a mixture of two raw datasets: the mixture's
    order, its counts per stream, each sample's stored pixels; its private reader is a copy of the
    mixture that reopened every stream's dataset."""
    pytest.importorskip("torch")
    from packer.gpu import GpuRawBatches

    raw = packer.BuildSettings(codec="raw:size=12x10")
    write_images(tmp_path / "a", {"cat": 7, "dog": 5}, size=16)
    write_images(tmp_path / "b", {"emu": 6}, seed=3, size=16)
    for name in "ab":
        packer.build_dataset(tmp_path / name, tmp_path / name.upper(), raw, packer.RunOptions(workers=1))
    mixture = packer.Mixture([packer.Stream(tmp_path / "A", choose=6), packer.Stream(tmp_path / "B", repeat=0.5)],
                             seed=4)
    order = ReadOrder("random", seed=0)
    with GpuRawBatches(mixture, 4, device="cpu", order=order, fields=("image", "label", "index")) as loader:
        assert loader._reader is not mixture and loader._reader.datasets[0] is not mixture.datasets[0]
        batches = list(loader)
    got = [int(i) for b in batches for i in b["index"]]
    assert got == IndexSpace(mixture).epoch_order(order, 0).tolist()
    assert Counter(_streams_of(mixture, got)) == {0: 6, 1: 3}
    for batch in batches:
        for image, label, i in zip(batch["image"], batch["label"], batch["index"]):
            assert image.contiguous().numpy().tobytes() == mixture.read(int(i))
            assert int(label) == int(mixture.labels[int(i)])


def test_raw_streams_of_other_alignments_mix_in_every_raw_reader(tmp_path):
    """A stream written with --alignment 4096 beside one the default packed at 64 (SPEC §3.4): each
    shard keeps its own stream's distance between samples, in the batched crops, the threaded
    loader, the raw gather and GpuRawBatches; every reader returns each sample's stored pixels."""
    pytest.importorskip("torch")
    from packer.gpu import GpuRawBatches
    from packer.rawcrop import read_raw_batch
    from packer.threaded import ThreadedLoader
    from packer.torch import PackedDataset

    write_images(tmp_path / "a", {"cat": 7, "dog": 5}, size=16)
    write_images(tmp_path / "b", {"emu": 6}, seed=3, size=16)
    for name, alignment in (("a", 4096), ("b", "auto")):
        packer.build_dataset(tmp_path / name, tmp_path / name.upper(), packer.BuildSettings(
            codec="raw:size=12x10", layout=packer.LayoutSettings(alignment=alignment)), packer.RunOptions(workers=1))
    def mix():  # one per reader: closing a reader closes the mixture it was given
        return packer.Mixture([packer.Stream(tmp_path / "A"), packer.Stream(tmp_path / "B")], seed=1)

    mixture = mix()
    assert [ds.alignment for ds in mixture.datasets] == [4096, 8]  # 360-byte samples: auto packs them at 8
    stored = np.stack([np.frombuffer(mixture.read(i), np.uint8).reshape(12, 10, 3) for i in range(len(mixture))])
    everything = np.arange(len(mixture))
    assert np.array_equal(read_raw_batch(mixture, everything[::-1], (12, 10, 3)), stored[::-1])
    strided = np.zeros((len(mixture), 12, 10, 4), dtype=np.uint8)[..., :3]  # not contiguous: the strided-view path
    assert np.array_equal(read_raw_batch(mixture, everything, (12, 10, 3), out=strided), stored)
    mapped = PackedDataset(mixture, layout="HWC", fields=("image", "index"))
    batch = mapped.__getitems__(everything.tolist())
    assert np.array_equal(np.stack([np.asarray(s["image"]) for s in batch]), stored)
    with ThreadedLoader(mix(), batch_size=5, decode=False, fields=("image", "index"), threads=2) as loader:
        for got in loader:
            assert np.array_equal(np.asarray(got["image"]).reshape(-1, 12, 10, 3), stored[np.asarray(got["index"])])
    with GpuRawBatches(mix(), 5, device="cpu", order=ReadOrder("random", seed=2), fields=("image", "index")) as gpu:
        for got in gpu:
            assert np.array_equal(got["image"].numpy(), stored[got["index"].numpy()])
