"""The DALI adapter: real CPU-only DALI pipelines (device_id=None) over packed datasets."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from packer.writer import build
from packer.dali import PackedBatchIterator, PackedBatchSource, PackedSampleSource
from packer.dataset import open_dataset
from packer.errors import DatasetChangedError, OptionError
from packer.order import ReadOrder
from packer.writer.plan import BuildOptions

BATCH = 4


@pytest.fixture(scope="module")
def jpeg_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    base = tmp_path_factory.mktemp("dali")
    make_sample.make_image_folder(base / "src", classes=3, per_class=6, seed=3, formats=("jpeg",))
    build(base / "src", base / "ds", BuildOptions(shard_size=48 << 10), workers=1, progress=False)
    return base / "ds"


@pytest.fixture(scope="module")
def raw_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    base = tmp_path_factory.mktemp("dali-raw")
    make_sample.make_image_folder(base / "src", classes=2, per_class=5, seed=4, formats=("png",))
    build(base / "src", base / "ds", BuildOptions(shard_size=16 << 10, codec="raw:size=12x10"), workers=1,
          progress=False)
    return base / "ds"


def _info(epoch: int, idx: int) -> SimpleNamespace:
    return SimpleNamespace(epoch_idx=epoch, idx_in_epoch=idx, idx_in_batch=idx % BATCH, iteration=idx // BATCH)


def _expected(num_samples: int, epoch: int, *, shard_id: int = 0, num_shards: int = 1, seed: int = 0,
              order: str = "random", drop_last: bool = False, consumed: int = 0) -> list[int]:
    """The shard's samples of an epoch as sample mode emits them: full batches, wrapped padding."""
    plan = ReadOrder(kind=order, seed=seed, batch_size=BATCH, drop_last=drop_last).plan(
        num_samples, epoch=epoch, consumed=consumed, rank=shard_id, world_size=num_shards)
    mine = plan.indices.tolist()
    return [mine[p % len(mine)] for p in range(plan.num_batches * BATCH)]


# --- the sources without DALI ---------------------------------------------------------------

def test_sample_source_is_a_pure_function_of_epoch_and_position(jpeg_dataset: Path) -> None:
    source = PackedSampleSource(jpeg_dataset, BATCH, seed=7, return_index=True)
    n = source.num_samples
    assert n == 18 and source.epoch_length() == 20  # 5 batches: the short last one completed
    with open_dataset(jpeg_dataset) as ds:
        for epoch in (0, 1):
            got = [int(source(_info(epoch, p))[2]) for p in range(source.epoch_length())]
            assert got == _expected(n, epoch, seed=7)
            assert sorted(set(got)) == list(range(n))
        data, label, index = source(_info(0, 3))
        assert data.dtype == np.uint8 and data.ndim == 1 and bytes(data) == ds.read(int(index))
        assert label.shape == () and label.dtype == np.int64 and int(label) == int(ds.labels[int(index)])
    assert _expected(n, 0, seed=7) != _expected(n, 1, seed=7)
    # DALI prefetches past the end: every later position keeps raising StopIteration.
    for position in (20, 21, 25, 1000):
        with pytest.raises(StopIteration):
            source(_info(0, position))


def test_sample_source_drop_last_and_resume(jpeg_dataset: Path) -> None:
    dropped = PackedSampleSource(jpeg_dataset, BATCH, drop_last=True, return_index=True)
    assert dropped.epoch_length() == 16
    got = [int(dropped(_info(0, p))[2]) for p in range(16)]
    assert got == _expected(18, 0, drop_last=True)
    resumed = PackedSampleSource(jpeg_dataset, BATCH, first_epoch=2, consumed=8, return_index=True)
    assert resumed.epoch_length(2) == 12 and resumed.epoch_length(3) == 20
    assert [int(resumed(_info(0, p))[2]) for p in range(12)] == _expected(18, 2, consumed=8)
    full = _expected(18, 2)
    assert [int(resumed(_info(0, p))[2]) for p in range(10)] == full[8:18]
    assert [int(resumed(_info(1, p))[2]) for p in range(20)] == _expected(18, 3)


def test_shards_get_equal_batches_and_cover_the_epoch(jpeg_dataset: Path) -> None:
    sources = [PackedSampleSource(jpeg_dataset, BATCH, shard_id=s, num_shards=4, return_index=True)
               for s in range(4)]
    lengths = {source.epoch_length() for source in sources}
    assert lengths == {8}  # 18 samples, 4 shards: ceil(18/4)=5 each -> 2 batches of 4, padded
    seen = [int(source(_info(0, p))[2]) for source in sources for p in range(8)]
    assert set(seen) == set(range(18))


def test_sources_pickle_small_and_open_files_lazily(jpeg_dataset: Path) -> None:
    source = PackedBatchSource(jpeg_dataset, BATCH, order="block")
    blob = pickle.dumps(source)
    assert len(blob) < 1024
    copy = pickle.loads(blob)
    assert copy._dataset is None
    data, labels = copy(SimpleNamespace(epoch_idx=0, iteration=0))
    assert len(data) == len(labels) == BATCH
    assert copy._dataset is not None and pickle.loads(pickle.dumps(copy))._dataset is None


def test_replaced_dataset_is_refused_in_the_worker(jpeg_dataset: Path, tmp_path: Path) -> None:
    import shutil

    target = tmp_path / "ds"
    shutil.copytree(jpeg_dataset, target)
    source = PackedSampleSource(target, BATCH)
    blob = pickle.dumps(source)
    source._index_checksum ^= 1  # as if the manifest had been replaced after the source was made
    with pytest.raises(DatasetChangedError, match="replaced"):
        source(_info(0, 0))
    pickle.loads(blob)(_info(0, 0))  # the unmodified pickle still works


def test_batch_source_epochs_by_iteration(jpeg_dataset: Path) -> None:
    source = PackedBatchIterator(jpeg_dataset, BATCH, seed=1, num_shards=2, shard_id=1, return_index=True)
    assert not callable(source)
    with open_dataset(jpeg_dataset) as ds:
        for epoch in (0, 1):
            plan = ReadOrder(kind="random", seed=1, batch_size=BATCH).plan(18, epoch=epoch, rank=1, world_size=2)
            batches = list(iter(source))
            assert [len(b[0]) for b in batches] == [4, 4, 1]  # 9 samples per shard, the short batch last
            indices = [int(i) for b in batches for i in b[2]]
            assert indices == plan.indices.tolist()
            for data, labels, index in batches:
                for d, label, i in zip(data, labels, index):
                    assert bytes(d) == ds.read(int(i)) and int(label) == int(ds.labels[int(i)])
        with pytest.raises(StopIteration):
            source.read(0, 3)
    callable_source = PackedBatchSource(jpeg_dataset, BATCH, seed=1, num_shards=2, shard_id=1)
    assert not hasattr(callable_source, "__iter__")
    with pytest.raises(StopIteration):
        callable_source(SimpleNamespace(epoch_idx=0, iteration=3))
    assert len(callable_source(2)[0]) == 1  # batch_info=False: DALI passes the iteration


def test_raw_payloads_come_as_pixels(raw_dataset: Path) -> None:
    source = PackedSampleSource(raw_dataset, BATCH, order="sequential")
    data, label = source(_info(0, 1))
    assert data.shape == (12, 10, 3) and data.dtype == np.uint8
    with open_dataset(raw_dataset) as ds:
        assert data.tobytes() == ds.read(1)
    batch = PackedBatchSource(raw_dataset, BATCH, order="sequential").read(0, 0)
    assert [d.shape for d in batch[0]] == [(12, 10, 3)] * BATCH


def test_bad_arguments() -> None:
    with pytest.raises(OptionError) as caught:  # the old names, refused as the order's rank and world size
        PackedSampleSource("unused", BATCH, shard_id=2, num_shards=2)
    assert caught.value.message == ("rank must be an integer in 0..1, got 2 (shard_id= sets rank, num_shards= sets "
                                    "world_size)")
    with pytest.raises(OptionError) as caught:
        PackedSampleSource("unused", BATCH, num_shards=0)
    assert caught.value.message == "world_size must be a positive integer, got 0 (num_shards= sets world_size)"
    with pytest.raises(OptionError, match=r"^rank must be an integer in 0\.\.1, got 2$"):
        PackedSampleSource("unused", BATCH, order=ReadOrder(rank=2, world_size=2))
    with pytest.raises(OptionError) as caught:
        PackedBatchSource("unused", BATCH, order=ReadOrder(batch_size=BATCH + 1))
    assert caught.value.message == (f"PackedBatchSource has batch_size={BATCH} but its order has batch_size="
                                    f"{BATCH + 1}; give the same, or leave the order's out (None: the reader's)")


@pytest.mark.parametrize("kind", [PackedSampleSource, PackedBatchSource, PackedBatchIterator])
def test_old_and_new_spellings_read_and_save_the_same(jpeg_dataset: Path, kind: type) -> None:
    """``order=ReadOrder(...)`` (rank and world size DALI's shard_id and num_shards) reads what the old
    keywords read; they still work for one release, with a warning naming the new spelling."""
    with pytest.warns(DeprecationWarning) as caught:
        old = kind(jpeg_dataset, BATCH, order="block", seed=5, shard_id=1, num_shards=2, drop_last=True,
                   block_bytes=4096, window=2)
    assert str(caught[0].message) == (
        f"{kind.__name__}(seed=, shard_id=, num_shards=, drop_last=, block_bytes=, window=) is deprecated and goes "
        f"in the next release: pass order=packer.ReadOrder('block', seed=5, block_bytes=4096, window=2, "
        f"drop_last=True, rank=1, world_size=2)")
    order = ReadOrder("block", seed=5, block_bytes=4096, window=2, drop_last=True, rank=1, world_size=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        new = kind(jpeg_dataset, BATCH, order=order)
    assert old.read_order == new.read_order == new.cursor.read_order
    assert (new.shard_id, new.num_shards) == (1, 2)
    for epoch in (0, 1):
        assert old.plan(epoch).indices.tolist() == new.plan(epoch).indices.tolist()
    assert old.state_dict(1, 1) == new.state_dict(1, 1)
    with pytest.warns(DeprecationWarning):  # only seed=: the share it read before, shard 0 of 1
        alone = kind(jpeg_dataset, BATCH, seed=5)
    assert (alone.shard_id, alone.num_shards) == (0, 1)


# --- real DALI pipelines (CPU only) --------------------------------------------------------

def _run_epochs(pipe: object, epochs: int) -> list[list[tuple[np.ndarray, ...]]]:
    """Run a built pipeline for whole epochs: a list per epoch of per-batch output tuples."""
    out = []
    for _ in range(epochs):
        batches = []
        try:
            while True:
                outputs = pipe.run()
                batches.append(tuple([np.array(o.at(j)) for j in range(len(o))] for o in outputs))
        except StopIteration:
            pipe.reset()
        out.append(batches)
    return out


def _sample_pipeline(source: object, *, parallel: bool, start_method: str = "fork", decode: bool = False,
                     resize: int = 0):
    dali = pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, types

    kwargs = {"py_num_workers": 2, "py_start_method": start_method} if parallel else {}

    @dali.pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, prefetch_queue_depth=2, seed=0, **kwargs)
    def pipeline():
        data, label, index = fn.external_source(source=source, num_outputs=3, batch=False, parallel=parallel,
                                                dtype=[types.UINT8, types.INT64, types.INT64])
        if decode:
            images = fn.decoders.image(data, device="cpu", output_type=types.RGB)
            if resize:  # the example pipeline's shape: decode, resize, normalise to CHW float
                images = fn.resize(images, resize_x=resize, resize_y=resize)
                images = fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW",
                                                  mean=[127.5] * 3, std=[127.5] * 3)
            return images, label, index
        return data, label, index

    pipe = pipeline()
    pipe.build()
    return pipe


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel-fork"])
def test_dali_sample_pipeline(jpeg_dataset: Path, parallel: bool) -> None:
    source = PackedSampleSource(jpeg_dataset, BATCH, seed=5, shard_id=1, num_shards=2, return_index=True)
    pipe = _sample_pipeline(source, parallel=parallel)
    epochs = _run_epochs(pipe, 3)
    with open_dataset(jpeg_dataset) as ds:
        for epoch, batches in enumerate(epochs):
            assert [len(b[0]) for b in batches] == [BATCH] * 3  # 9 samples -> 3 full batches on every shard
            indices = [int(i) for b in batches for i in b[2]]
            assert indices == _expected(18, epoch, shard_id=1, num_shards=2, seed=5)
            for data, labels, index in batches:
                for d, label, i in zip(data, labels, index):
                    assert d.tobytes() == ds.read(int(i))
                    assert int(label) == int(ds.labels[int(i)])
    orders = [[int(i) for b in batches for i in b[2]] for batches in epochs]
    assert orders[0] != orders[1]


def test_dali_parallel_spawn_decodes_on_cpu(jpeg_dataset: Path) -> None:
    from packer.decode import decode_image

    source = PackedSampleSource(jpeg_dataset, BATCH, order="block", return_index=True)
    pipe = _sample_pipeline(source, parallel=True, start_method="spawn", decode=True)
    (batches,) = _run_epochs(pipe, 1)
    assert len(batches) == 5
    indices = [int(i) for b in batches for i in b[2]]
    assert indices == [int(source(_info(0, p))[2]) for p in range(20)]
    with open_dataset(jpeg_dataset) as ds:
        images, _, index = batches[0]
        for image, i in zip(images, index):
            reference = decode_image(ds.read(int(i)))
            assert image.shape == reference.shape
            assert np.abs(image.astype(int) - reference.astype(int)).mean() < 2.0


def test_dali_decodes_tiled_payloads_like_the_originals(jpeg_dataset: Path, tmp_path: Path) -> None:
    """A --codec tiled dataset through DALI's decoder: tiled JPEGs are ordinary JPEGs to it."""
    from packer.codecs.tiles import read_layout, transcoder_available

    if not transcoder_available():
        pytest.skip("packer.codecs._jpegtiles was not built")
    src = jpeg_dataset.parent / "src"
    tiled = tmp_path / "tiled"
    build(src, tiled, BuildOptions(shard_size=48 << 10, codec="tiled"), workers=1, progress=False)
    decoded = {}
    for path in (jpeg_dataset, tiled):
        source = PackedSampleSource(path, BATCH, order="sequential", return_index=True)
        (batches,) = _run_epochs(_sample_pipeline(source, parallel=False, decode=True), 1)
        with open_dataset(path) as ds:
            decoded[path] = {ds.key(int(i)): image for b in batches for image, i in zip(b[0], b[2])}
            if path == tiled:
                assert all(read_layout(ds.read(i)) is not None for i in range(len(ds)))
    assert decoded[jpeg_dataset].keys() == decoded[tiled].keys() and len(decoded[tiled]) == 18
    for key, image in decoded[tiled].items():
        assert np.array_equal(image, decoded[jpeg_dataset][key]), key


@pytest.mark.parametrize("parallel", [False, True], ids=["iterable", "parallel-batch-info"])
def test_dali_batch_pipeline(jpeg_dataset: Path, parallel: bool) -> None:
    dali = pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, types

    source = (PackedBatchSource if parallel else PackedBatchIterator)(jpeg_dataset, BATCH, seed=2, return_index=True)
    kwargs = {"py_num_workers": 1, "py_start_method": "fork"} if parallel else {}
    mode = {"parallel": True, "batch_info": True} if parallel else {"cycle": "raise"}

    @dali.pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, **kwargs)
    def pipeline():
        return tuple(fn.external_source(source=source, num_outputs=3, batch=True,
                                        dtype=[types.UINT8, types.INT64, types.INT64], **mode))

    pipe = pipeline()
    pipe.build()
    epochs = _run_epochs(pipe, 2)
    with open_dataset(jpeg_dataset) as ds:
        for epoch, batches in enumerate(epochs):
            assert [len(b[0]) for b in batches] == [4, 4, 4, 4, 2]
            plan = ReadOrder(kind="random", seed=2, batch_size=BATCH).plan(18, epoch=epoch)
            assert [int(i) for b in batches for i in b[2]] == plan.indices.tolist()
            for data, labels, index in batches:
                for d, label, i in zip(data, labels, index):
                    assert d.tobytes() == ds.read(int(i)) and int(label) == int(ds.labels[int(i)])


def test_dali_generic_iterator_for_pytorch(jpeg_dataset: Path) -> None:
    pytest.importorskip("nvidia.dali")
    pytest.importorskip("torch")
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    source = PackedSampleSource(jpeg_dataset, BATCH, seed=9, return_index=True)
    pipe = _sample_pipeline(source, parallel=False, decode=True, resize=16)
    loader = DALIGenericIterator(pipe, ["images", "labels", "index"], auto_reset=True)
    for epoch in range(2):
        indices = []
        for batch in loader:
            assert batch[0]["images"].shape == (BATCH, 3, 16, 16) and batch[0]["labels"].shape == (BATCH,)
            indices += batch[0]["index"].tolist()
        assert indices == _expected(18, epoch, seed=9)


def test_iterator_options_size_the_shard(jpeg_dataset: Path) -> None:
    """DALI's ``size`` is the shard's samples before the batch completion: equal on every shard."""
    # 18 samples, 4 shards of batch 4: the order pads to 20 (5 per shard), the source to 8.
    shards = [PackedSampleSource(jpeg_dataset, BATCH, shard_id=s, num_shards=4) for s in range(4)]
    assert [s.shard_size() for s in shards] == [5] * 4 and [s.epoch_length() for s in shards] == [8] * 4
    assert shards[0].iterator_options() == {"size": 5, "last_batch_padded": True}
    dropped = PackedSampleSource(jpeg_dataset, BATCH, num_shards=4, drop_last=True)
    assert dropped.shard_size() == dropped.epoch_length() == 4
    resumed = PackedSampleSource(jpeg_dataset, BATCH, first_epoch=3, consumed=8)
    assert resumed.shard_size() == 10 and resumed.shard_size(4) == 18
    with pytest.raises(OptionError, match="no sample"):
        PackedSampleSource(jpeg_dataset, BATCH, num_shards=4, drop_last=True, consumed=4).iterator_options()


@pytest.mark.parametrize("drop_last", [False, True], ids=["source-pads", "source-drops"])
@pytest.mark.parametrize("policy", ["DROP", "FILL", "PARTIAL"])
def test_dali_generic_iterator_honours_the_last_batch_policy(jpeg_dataset: Path, policy: str,
                                                              drop_last: bool) -> None:
    """A real DALI iterator given ``iterator_options()``: exactly the batches each policy promises."""
    pytest.importorskip("nvidia.dali")
    pytest.importorskip("torch")
    import warnings

    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    # Shard 1 of 2: 9 samples a epoch (18 / 2), batch 4; with drop_last the order keeps 16 (8 a shard).
    source = PackedSampleSource(jpeg_dataset, BATCH, seed=9, shard_id=1, num_shards=2, drop_last=drop_last,
                                return_index=True)
    size = source.shard_size()
    assert size == (8 if drop_last else 9)
    pipe = _sample_pipeline(source, parallel=False, decode=True, resize=8)  # dense outputs, as the iterator needs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DALI warns that size is set by hand: expected without a reader
        loader = DALIGenericIterator(pipe, ["data", "labels", "index"], auto_reset=True,
                                     last_batch_policy=getattr(LastBatchPolicy, policy),
                                     **source.iterator_options())
    for epoch in range(3):
        emitted = _expected(18, epoch, shard_id=1, num_shards=2, seed=9, drop_last=drop_last)  # what the source emits
        real = emitted[:size]
        if policy == "DROP":
            want = [real[k * BATCH:(k + 1) * BATCH] for k in range(size // BATCH)]
        elif policy == "FILL":
            want = [emitted[k * BATCH:(k + 1) * BATCH] for k in range(-(-size // BATCH))]
        else:
            want = [real[k * BATCH:(k + 1) * BATCH] for k in range(-(-size // BATCH))]
        got = [batch[0]["index"].tolist() for batch in loader]
        assert got == want, (policy, epoch)
        assert len(loader) == len(want)
    if not drop_last and policy == "FILL":
        # The padding is the shard's first samples of the epoch: the last batch repeats them.
        assert want[-1][1:] == real[:3]


def test_dali_iterator_without_a_size_ignores_drop(jpeg_dataset: Path) -> None:
    """What the iterator does without ``iterator_options()``: DROP is forced to FILL (DALI's rule)."""
    pytest.importorskip("nvidia.dali")
    pytest.importorskip("torch")
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    source = PackedSampleSource(jpeg_dataset, BATCH, seed=9, shard_id=1, num_shards=2, return_index=True)
    loader = DALIGenericIterator(_sample_pipeline(source, parallel=False, decode=True, resize=8),
                                 ["data", "labels", "index"],
                                 auto_reset=True, last_batch_policy=LastBatchPolicy.DROP)
    got = [batch[0]["index"].tolist() for batch in loader]
    assert len(got) == 3 and sum(got, []) == _expected(18, 0, shard_id=1, num_shards=2, seed=9)  # padded, not dropped


@pytest.mark.parametrize("parallel, start", [(False, "fork"), (True, "fork"), (True, "spawn")],
                         ids=["serial", "parallel-fork", "parallel-spawn"])
def test_a_mixture_feeds_dali_its_planned_counts_per_stream(jpeg_dataset: Path, tmp_path: Path, parallel: bool,
                                                              start: str) -> None:
    """A packer.Mixture through the DALI sample source: each epoch is the mixture's order (the same
    samples the torch readers read), the planned count from each stream, the bytes of each
    stream's sample; the source travels to spawned workers as its streams' locations."""
    import packer
    from packer.order import IndexSpace

    (view,) = packer.view(jpeg_dataset, tmp_path / "some.pkview", where="label < 2")
    mixture = packer.Mixture([packer.Stream(jpeg_dataset, choose=5), packer.Stream(view, weight=1)],
                             epoch_size=12, seed=3)
    assert mixture.counts == (5, 7)
    source = PackedSampleSource(mixture, BATCH, order=ReadOrder("random", seed=4), return_index=True)
    assert source.num_samples == 12
    pipe = _sample_pipeline(source, parallel=parallel, start_method=start)
    space = IndexSpace(mixture)
    for epoch, batches in enumerate(_run_epochs(pipe, 2)):
        indices = [int(i) for b in batches for i in b[2]]
        assert indices == space.epoch_order(source.read_order, epoch).tolist()
        assert sorted(mixture.stream_of(i) for i in indices) == [0] * 5 + [1] * 7
        for data, labels, index in batches:
            for d, label, i in zip(data, labels, index):
                assert d.tobytes() == mixture.read(int(i)) and int(label) == int(mixture.labels[int(i)])
