"""After a resume, every reader reads the same passes: the loaded position is used once.

The rule (``packer.order``, "Passes after a resume"): a position loaded with ``load_state_dict``
is used by the one pass that follows the load, which reads exactly the rest of the saved epoch.
Every later pass is a whole epoch: of the epoch ``set_epoch`` selects, or, in a loop that never
calls ``set_epoch``, of the same epoch number again (as ``DistributedSampler`` does). So a resumed
run reads what the uninterrupted run would have read, pass for pass.

Each case runs a reader for two batches, saves, builds a fresh reader, loads, and runs three
passes, with and without ``set_epoch``, with 0 and 2 DataLoader workers (threads, double
buffering: each reader's own concurrency). Every pass is compared with an uninterrupted reader's
pass of the same epoch, sample for sample.
"""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from packer.errors import OptionError  # noqa: E402
from packer.torch import (  # noqa: E402
    PackedBatchSampler,
    PackedDataLoader,
    PackedDataset,
    PackedIterableDataset,
    PackedSampler,
    collate,
)
from packer.writer import build  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create.*:UserWarning")]

N, B, SEED, TAKEN = 20, 4, 7, 2  # samples, batch size, seed, batches taken before the save
PASSES = 3


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    root = tmp_path_factory.mktemp("passes") / "src"
    make_sample.make_image_folder(root, classes=2, per_class=N // 2, seed=3, min_size=6, max_size=6,
                                  formats=("png",))
    out = root.parent / "raw"
    build(root, out, BuildOptions(shard_size=4 << 10, alignment=512, codec="raw:size=4x4"), workers=1,
          progress=False)
    return out


def _indices(batch: Any) -> list[int]:
    return [int(i) for i in batch["index"].tolist()]


class Reader:
    """One wiring: how to make it, run a pass, save after ``TAKEN`` batches, and load."""

    name = ""

    def make(self, path: Path, workers: int) -> Any:
        raise NotImplementedError

    def batches(self, obj: Any) -> Iterator[Any]:
        return iter(obj)

    def save(self, obj: Any) -> dict:
        return obj.state_dict()

    def load(self, obj: Any, state: dict) -> None:
        obj.load_state_dict(state)

    def set_epoch(self, obj: Any, epoch: int) -> None:
        obj.set_epoch(epoch)

    def epoch(self, obj: Any) -> int:
        return obj.epoch

    def close(self, obj: Any) -> None:
        iterator = getattr(obj, "_iterator", None)  # a DataLoader's persistent workers: stop them now
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()


def _loader_kwargs(workers: int) -> dict:
    if not workers:
        return {}
    return dict(num_workers=workers, prefetch_factor=2, persistent_workers=True)


def _dataset(path: Path) -> PackedDataset:
    return PackedDataset(path, decode=False, fields=("index",))


class LoaderSampler(Reader):
    name = "PackedDataLoader+PackedSampler"

    def make(self, path, workers):
        ds = _dataset(path)
        return PackedDataLoader(ds, sampler=PackedSampler(ds, seed=SEED), batch_size=B, collate_fn=collate,
                                **_loader_kwargs(workers))


class LoaderBatchSampler(Reader):
    name = "PackedDataLoader+PackedBatchSampler"

    def make(self, path, workers):
        ds = _dataset(path)
        return PackedDataLoader(ds, batch_sampler=PackedBatchSampler(ds, batch_size=B, seed=SEED),
                                collate_fn=collate, **_loader_kwargs(workers))


class PlainBatchSampler(Reader):
    name = "DataLoader+PackedBatchSampler"

    def make(self, path, workers):
        ds = _dataset(path)
        return DataLoader(ds, batch_sampler=PackedBatchSampler(ds, batch_size=B, seed=SEED), collate_fn=collate,
                          **_loader_kwargs(workers))

    def save(self, obj):
        return obj.batch_sampler.state_dict(batches_consumed=TAKEN)

    def load(self, obj, state):
        obj.batch_sampler.load_state_dict(state)

    def set_epoch(self, obj, epoch):
        obj.batch_sampler.set_epoch(epoch)

    def epoch(self, obj):
        return obj.batch_sampler.epoch


class PlainSampler(Reader):
    name = "DataLoader+PackedSampler"

    def make(self, path, workers):
        ds = _dataset(path)
        return DataLoader(ds, sampler=PackedSampler(ds, seed=SEED, batch_size=B), batch_size=B,
                          collate_fn=collate, **_loader_kwargs(workers))

    def save(self, obj):
        return obj.sampler.state_dict(batches_consumed=TAKEN)

    def load(self, obj, state):
        obj.sampler.load_state_dict(state)

    def set_epoch(self, obj, epoch):
        obj.sampler.set_epoch(epoch)

    def epoch(self, obj):
        return obj.sampler.epoch


class LoaderIterable(Reader):
    name = "PackedDataLoader+PackedIterableDataset"
    persistent = True

    def make(self, path, workers):
        ds = PackedIterableDataset(path, batch_size=B, order="random", seed=SEED, decode=False, fields=("index",))
        kwargs = _loader_kwargs(workers)
        if kwargs:
            kwargs["persistent_workers"] = self.persistent
        return PackedDataLoader(ds, batch_size=None, **kwargs)


class LoaderIterableFreshWorkers(LoaderIterable):
    name = "PackedDataLoader+PackedIterableDataset (new workers each pass)"
    persistent = False


class PlainIterable(LoaderIterable):
    name = "DataLoader+PackedIterableDataset"

    def make(self, path, workers):
        ds = PackedIterableDataset(path, batch_size=B, order="random", seed=SEED, decode=False, fields=("index",))
        return DataLoader(ds, batch_size=None, **_loader_kwargs(workers))

    def save(self, obj):
        return obj.dataset.state_dict(batches_consumed=TAKEN)

    def load(self, obj, state):
        obj.dataset.load_state_dict(state)

    def set_epoch(self, obj, epoch):
        obj.dataset.set_epoch(epoch)

    def epoch(self, obj):
        return obj.dataset.epoch


class Stateful(Reader):
    """torchdata's StatefulDataLoader: its own state protocol (it asks the sampler or each worker)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = f"StatefulDataLoader+{kind}"

    def make(self, path, workers):
        stateful = pytest.importorskip("torchdata.stateful_dataloader")
        kwargs = _loader_kwargs(workers)
        if self.kind == "iterable":
            ds = PackedIterableDataset(path, batch_size=B, order="random", seed=SEED, decode=False,
                                       fields=("index",))
            loader = stateful.StatefulDataLoader(ds, batch_size=None, **kwargs)
            loader.packer_reader = ds
            return loader
        ds = _dataset(path)
        if self.kind == "sampler":
            reader = PackedSampler(ds, seed=SEED, batch_size=B)
            loader = stateful.StatefulDataLoader(ds, sampler=reader, batch_size=B, collate_fn=collate, **kwargs)
        else:
            reader = PackedBatchSampler(ds, batch_size=B, seed=SEED)
            loader = stateful.StatefulDataLoader(ds, batch_sampler=reader, collate_fn=collate, **kwargs)
        loader.packer_reader = reader
        return loader

    def set_epoch(self, obj, epoch):
        obj.packer_reader.set_epoch(epoch)

    def epoch(self, obj):
        return obj.packer_reader.epoch


class Threaded(Reader):
    name = "ThreadedLoader"

    def make(self, path, workers):
        from packer.threaded import ThreadedLoader

        return ThreadedLoader(path, batch_size=B, decode=False, seed=SEED, threads=max(1, workers),
                              fields=("index",))

    def close(self, obj):
        obj.close()


class GpuRaw(Reader):
    name = "GpuRawBatches"

    def make(self, path, workers):
        from packer.gpu import GpuRawBatches

        return GpuRawBatches(path, B, order="random", seed=SEED, device="cpu", double_buffer=bool(workers),
                             fields=("index",))

    def close(self, obj):
        obj.close()


READERS = [LoaderSampler(), LoaderBatchSampler(), PlainBatchSampler(), PlainSampler(), LoaderIterable(),
           LoaderIterableFreshWorkers(), PlainIterable(), Stateful("sampler"), Stateful("batch_sampler"),
           Stateful("iterable"), Threaded(), GpuRaw()]


def _pass(reader: Reader, obj: Any, limit: int | None = None) -> list[int]:
    seen: list[int] = []
    for step, batch in enumerate(reader.batches(obj), 1):
        seen += _indices(batch)
        if step == limit:
            break
    return seen


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("set_epoch", [True, False], ids=["set_epoch", "no_set_epoch"])
@pytest.mark.parametrize("reader", READERS, ids=lambda r: r.name)
def test_a_loaded_position_is_used_by_one_pass(packed: Path, reader: Reader, set_epoch: bool, workers: int) -> None:
    saved_epoch = 1 if set_epoch else 0

    # The uninterrupted run's passes: epoch e, then e+1, e+2 (set_epoch) or e again (no set_epoch).
    reference = reader.make(packed, 0)
    expected = []
    for k in range(PASSES):
        if set_epoch:
            reader.set_epoch(reference, saved_epoch + k)
        expected.append(_pass(reader, reference))
    reader.close(reference)
    assert all(sorted(p) == list(range(N)) for p in expected)

    first = reader.make(packed, workers)
    if set_epoch:
        reader.set_epoch(first, saved_epoch)
    seen = _pass(reader, first, TAKEN)
    state = reader.save(first)
    reader.close(first)
    del first
    if not isinstance(reader, Stateful):  # torchdata's loaders save a state of their own
        assert (state["epoch"], state["consumed"]) == (saved_epoch, TAKEN * B)
    assert seen == expected[0][:TAKEN * B]

    resumed = reader.make(packed, workers)
    reader.load(resumed, state)
    passes = []
    for k in range(PASSES):
        if set_epoch:
            reader.set_epoch(resumed, reader.epoch(resumed) + (k > 0))
        passes.append(_pass(reader, resumed))
    assert reader.epoch(resumed) == saved_epoch + (PASSES - 1 if set_epoch else 0)
    reader.close(resumed)
    assert passes[0] == expected[0][TAKEN * B:], "the pass after the load reads the rest of the saved epoch"
    assert passes[1:] == expected[1:], "later passes are whole epochs"


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("reader", [LoaderBatchSampler(), LoaderSampler(), LoaderIterable(), Threaded()],
                         ids=lambda r: r.name)
def test_state_saved_in_a_later_pass_counts_from_its_start(packed: Path, reader: Reader, workers: int) -> None:
    """A position saved in a pass after the resumed one counts from that pass's start (0)."""
    source = reader.make(packed, 0)
    _pass(reader, source, 3)
    state = reader.save(source)
    reader.close(source)
    loader = reader.make(packed, workers)
    reader.load(loader, state)
    assert len(_pass(reader, loader)) == N - 3 * B
    _pass(reader, loader, 1)
    assert reader.save(loader)["consumed"] == B
    reader.close(loader)


# --- DALI's sources: DALI tells them the epoch (epoch_idx), so every pass after the resumed one is
# --- the next epoch; without epoch information a resumed position cannot be placed, and is refused.

SampleInfo = namedtuple("SampleInfo", "idx_in_epoch idx_in_batch iteration epoch_idx")
BatchInfo = namedtuple("BatchInfo", "iteration epoch_idx")


def _dali_reference(path: Path, make: Callable[..., Any], epoch: int) -> list[int]:
    source = make(path, B, seed=SEED, first_epoch=epoch, return_index=True, check_formats=False)
    return _dali_pass(source, 0)


def _dali_pass(source: Any, epoch_idx: int) -> list[int]:
    from packer.dali import PackedBatchIterator, PackedBatchSource

    seen: list[int] = []
    if isinstance(source, PackedBatchIterator):
        for _, _, index in source:
            seen += [int(i) for i in index]
        return seen
    if isinstance(source, PackedBatchSource):
        iteration = 0
        while True:
            try:
                _, _, index = source(BatchInfo(iteration, epoch_idx))
            except StopIteration:
                return seen
            seen += [int(i) for i in index]
            iteration += 1
    for i in range(source.epoch_length(source.first_epoch + epoch_idx)):
        seen.append(int(source(SampleInfo(i, i % B, i // B, epoch_idx))[2]))
    return seen[:source.shard_size(source.first_epoch + epoch_idx)]


@pytest.mark.parametrize("kind", ["PackedSampleSource", "PackedBatchSource", "PackedBatchIterator"])
def test_dali_sources_use_a_loaded_position_once(packed: Path, kind: str) -> None:
    import packer.dali

    make = getattr(packer.dali, kind)
    expected = [_dali_reference(packed, make, epoch) for epoch in (1, 2, 3)]
    source = make(packed, B, seed=SEED, first_epoch=1, return_index=True, check_formats=False)
    state = source.state_dict(0, TAKEN)
    resumed = make(packed, B, seed=SEED, return_index=True, check_formats=False)
    resumed.load_state_dict(state)
    passes = [_dali_pass(resumed, k) for k in range(PASSES)]
    assert passes[0] == expected[0][TAKEN * B:]
    assert passes[1:] == expected[1:]


def test_dali_batch_source_without_epochs_refuses_a_resumed_position(packed: Path) -> None:
    from packer.dali import PackedBatchSource

    source = PackedBatchSource(packed, B, seed=SEED, consumed=TAKEN * B, return_index=True, check_formats=False)
    with pytest.raises(OptionError, match="batch_info=True"):
        source(0)
    whole = PackedBatchSource(packed, B, seed=SEED, return_index=True, check_formats=False)
    assert len(whole(0)[0]) == B  # a source that starts at an epoch's beginning needs no epoch information
