"""Declared fields through the torch readers: PackedDataset(fields=, multi_hot=, geometry=),
collate and PaddedCollate, the iterable dataset, the threaded loader, DataLoader workers, resume
and rank partitioning; every value checked against ``packer.dataset``'s own reading of it."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

torch = pytest.importorskip("torch")

from packer.writer import BuildOptions, build  # noqa: E402
from packer.dataset import open_dataset  # noqa: E402
from packer.errors import IndexMismatchError, OptionError  # noqa: E402
from packer.threaded import ThreadedLoader  # noqa: E402
from packer.torch import MAX_MULTI_HOT, PackedBatchSampler, PackedDataLoader, PackedDataset, PackedIterableDataset, PackedSampler, PaddedCollate, collate
from packer.transforms import CenterCrop, RandomResizedCrop  # noqa: E402

pytestmark = [pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning"),
              pytest.mark.filterwarnings("ignore:This DataLoader will create.*:UserWarning")]

N = 20
FIELDS = ("boxes=float32[N,4]", "labels=int64[N]", "tags=classes", "caption=text", "depth=float32[2]",
          "score=float64", "flags=bool[3]", "count=uint16", "mask=image", "view=image")
DECLARED = ("boxes", "labels", "tags", "caption", "depth", "score", "flags", "count", "mask", "view")
EVERYTHING = ("image", "label", "index", "key", "metadata", *DECLARED)


def make_source(root: Path, count: int = N, *, fixed_height: int | None = None) -> Path:
    (root / "img").mkdir(parents=True)
    rows = []
    for i in range(count):
        height, width = fixed_height or 12 + i % 3, 16
        Image.fromarray(np.full((height, width, 3), 10 * i, np.uint8)).save(root / f"img/{i}.png")
        mask = Image.fromarray((np.arange(width)[None, :] % (i % 4 + 2)).astype(np.uint8).repeat(height, 0), mode="P")
        mask.putpalette([0, 0, 0, 255, 0, 0] * 128)
        mask.save(root / f"img/{i}.mask.png")
        Image.fromarray(np.full((height, width, 3), (i, 2 * i, 3 * i), np.uint8)).save(root / f"img/{i}.view.png")
        boxes = [[i, 1, i + 3, 5 + j] for j in range(i % 3)]
        rows.append({"path": f"img/{i}.png", "label": ["cat", "dog"][i % 2], "metadata": {"n": i},
                     "boxes": boxes, "labels": [7 + j for j in range(i % 3)],
                     "tags": ["red", "green", "blue"][: i % 4], "caption": f"sample {i} é",
                     "depth": [i / 4, -i], "score": i / 8, "flags": [i % 2 == 0, True, False], "count": 1000 * i,
                     "mask": f"img/{i}.mask.png", "view": f"img/{i}.view.png"})
    manifest = root / "rows.jsonl"
    manifest.write_text("".join(json.dumps(row) + "\n" for row in rows), "utf-8")
    return manifest


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch-fields")
    out = root / "ds"
    build(make_source(root / "src"), out, BuildOptions(fields=FIELDS, shard_size=4 << 10, alignment=512, seed=1),
          workers=1, progress=False)
    return out


@pytest.fixture(scope="module")
def truth(packed: Path):
    """Each sample's values as packer.dataset reads them (the reference of every test)."""
    ds = open_dataset(packed)
    assert len(ds.manifest.shards) > 1  # fields are read across shard boundaries
    return ds


def assert_sample(sample: dict, ds, i: int, *, layout: str = "CHW", multi_hot: tuple = ()) -> None:
    """A (decoded, uncropped) dict sample holds sample i's values, with the documented types."""
    for name, value in sample.items():
        if name == "image":
            assert value.dtype == torch.uint8 and value.shape[0 if layout == "CHW" else 2] == 3
        elif name == "label":
            assert value == int(ds.labels[i])
        elif name == "index":
            assert value == i
        elif name == "key":
            assert value == ds.key(i)
        elif name == "metadata":
            assert value == ds.metadata(i)
        elif name == "caption":
            assert isinstance(value, str) and value == ds.field_value(name, i)
        elif name in ("mask", "view"):
            expected = ds.field_image(name, i)
            if expected.ndim == 3 and layout == "CHW":
                expected = expected.transpose(2, 0, 1)
            assert isinstance(value, torch.Tensor) and value.is_contiguous()
            np.testing.assert_array_equal(value.numpy(), expected, err_msg=name)
        elif name in multi_hot:
            spec = ds.field_spec(name)
            expected = np.zeros(spec.num_classes, np.float32)
            expected[ds.field_value(name, i)] = 1
            assert value.dtype == torch.float32
            np.testing.assert_array_equal(value.numpy(), expected)
        else:
            expected = ds.field_value(name, i)
            assert isinstance(value, torch.Tensor), name
            assert value.numpy().dtype == expected.dtype and tuple(value.shape) == expected.shape, name
            np.testing.assert_array_equal(value.numpy(), expected, err_msg=name)


def test_every_field_kind_as_a_tensor_of_its_dtype_and_shape(packed: Path, truth) -> None:
    dataset = PackedDataset(packed, fields=EVERYTHING)
    assert dataset.fields == EVERYTHING
    for i in range(N):
        sample = dataset[i]
        assert list(sample) == list(EVERYTHING)  # in the order asked for
        assert_sample(sample, truth, i)
    sample = dataset[truth.find("img/3.png")]  # row 3: no box, all three tags
    assert sample["boxes"].dtype == torch.float32 and tuple(sample["boxes"].shape) == (0, 4)
    assert sample["tags"].dtype == torch.int64 and sample["tags"].tolist() == [0, 1, 2]
    assert sample["flags"].dtype == torch.bool and sample["count"].dtype == torch.uint16
    assert sample["score"].dtype == torch.float64 and sample["score"].shape == ()
    assert sample["mask"].dim() == 2 and tuple(sample["view"].shape[:1]) == (3,)
    assert dataset[-1]["index"] == N - 1


def test_hwc_layout_keeps_image_fields_channels_last(packed: Path, truth) -> None:
    dataset = PackedDataset(packed, layout="HWC", fields=("image", "view", "mask"))
    for sample, i in zip(dataset.__getitems__([4, 0, 4]), [4, 0, 4]):
        assert_sample(sample, truth, i, layout="HWC")
        assert sample["view"].shape[2] == 3


def test_multi_hot_vectors_for_the_named_classes_fields(packed: Path, truth) -> None:
    dataset = PackedDataset(packed, fields=("tags", "index"), multi_hot=("tags",))
    batch = collate(dataset.__getitems__(list(range(N))))
    assert batch["tags"].shape == (N, 3) and batch["tags"].dtype == torch.float32
    for j in range(N):
        assert_sample({"tags": batch["tags"][j]}, truth, j, multi_hot=("tags",))
    assert batch["tags"][truth.find("img/3.png")].tolist() == [1, 1, 1]
    assert batch["tags"][truth.find("img/4.png")].tolist() == [0, 0, 0]


def test_decode_false_gives_every_image_as_its_stored_bytes(packed: Path, truth) -> None:
    sample = PackedDataset(packed, decode=False, fields=("image", "mask"))[2]
    assert sample["image"].numpy().tobytes() == truth.read(2)
    assert sample["mask"].numpy().tobytes() == bytes(truth.field_bytes("mask", 2))


def test_fields_without_the_image_do_not_decode_it(packed: Path, truth) -> None:
    def refuse(data, image_format):
        raise AssertionError("decoded an image nobody asked for")

    dataset = PackedDataset(packed, decode=refuse, fields=("label", "caption", "depth"))
    for j, sample in enumerate(dataset.__getitems__(list(range(N)))):
        assert_sample(sample, truth, j)


@pytest.mark.parametrize("kwargs, message", [
    (dict(fields=("image", "nope")), r"declared fields \['boxes', 'labels', 'tags'.*unknown: \['nope'\]"),
    (dict(fields=("image", "image")), "repeated"),
    (dict(fields=()), "none chosen"),
    (dict(fields=("tags",), multi_hot=("caption",)), "not a declared field that fields= asks for"),
    (dict(fields=("caption",), multi_hot=("caption",)), "multi_hot is for classes fields; caption: text"),
    (dict(multi_hot=("tags",)), "not a declared field that fields= asks for"),
    (dict(fields=("boxes",), geometry={"labels": "per-box"}), "which fields= does not ask for"),
    (dict(fields=("depth",), geometry={"depth": "xyxy"}), r"DTYPE\[N,4\]"),
    (dict(fields=("boxes",), geometry={"boxes": "corners"}), "give one of"),
    (dict(fields=("boxes", "labels"), geometry={"labels": "per-box"}), "no 'xyxy' boxes field"),
    (dict(fields=("boxes", "depth"), geometry={"boxes": "xyxy", "depth": "per-box"}), "one row per box"),
    (dict(fields=("caption",), geometry={"caption": "points"}), "not an array field"),
    (dict(fields=("labels",), geometry={"labels": "points"}), "last dimension"),
    (dict(fields=("image", "boxes"), geometry={"image": "xyxy"}), "built in"),
    (dict(fields=("boxes",), geometry=["boxes"]), "must map field names"),
    (dict(fields=("boxes",), geometry={"boxes": "xyxy"}, decode=lambda data, fmt: data), "decode callable"),
])
def test_bad_field_options_are_option_errors_that_say_why(packed: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(OptionError, match=message):
        PackedDataset(packed, **kwargs)
    with pytest.raises(OptionError, match=message):
        PackedIterableDataset(packed, batch_size=4, **kwargs)


def test_multi_hot_refuses_a_vector_too_large_to_build(tmp_path: Path) -> None:
    manifest = tmp_path / "rows.jsonl"
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "a.png")
    manifest.write_text(json.dumps({"path": "a.png", "tags": [1, 5]}) + "\n", "utf-8")
    build(manifest, tmp_path / "ds", BuildOptions(fields=(f"tags=classes({MAX_MULTI_HOT + 1})",)), progress=False)
    with pytest.raises(OptionError, match="over the"):
        PackedDataset(tmp_path / "ds", fields=("tags",), multi_hot=("tags",))
    assert PackedDataset(tmp_path / "ds", fields=("tags",))[0]["tags"].tolist() == [1, 5]


# --- collate and PaddedCollate --------------------------------------------------------------------

def test_collate_stacks_fixed_fields_lists_variable_ones_and_keeps_strings(packed: Path, truth) -> None:
    dataset = PackedDataset(packed, fields=EVERYTHING)
    indices = [5, 1, 12, 5]
    samples = dataset.__getitems__(indices)
    batch = collate(samples)
    assert list(batch) == list(EVERYTHING)
    for name, shape in (("depth", (4, 2)), ("score", (4,)), ("flags", (4, 3)), ("count", (4,))):
        assert isinstance(batch[name], torch.Tensor) and tuple(batch[name].shape) == shape, name
        np.testing.assert_array_equal(batch[name].numpy(), truth.field_array(name)[indices])
    # the gathered column is the batch tensor: no second copy in collate
    assert batch["depth"].data_ptr() == samples.columns["depth"].data_ptr()
    for name in ("boxes", "labels", "tags"):
        assert isinstance(batch[name], list) and len(batch[name]) == 4
    assert batch["caption"] == [truth.field_value("caption", i) for i in indices]
    assert batch["key"] == [truth.key(i) for i in indices] and batch["metadata"][0] == {"n": truth.metadata(5)["n"]}
    assert batch["label"].dtype == torch.int64 and batch["index"].tolist() == indices
    assert isinstance(batch["image"], list)  # images of different sizes
    # a repeated index: values equal, and changing one sample's tensor leaves the other alone
    samples[0]["boxes"].fill_(-1)
    assert samples[3]["boxes"].numel() == 0 or not torch.equal(samples[3]["boxes"], samples[0]["boxes"])


def test_padded_collate_pads_variable_fields_and_adds_lengths(packed: Path, truth) -> None:
    dataset = PackedDataset(packed, fields=("index", "boxes", "labels", "tags", "caption", "depth"))
    indices = [0, 1, 2, 3, 4]
    batch = PaddedCollate(pad_value={"labels": -1, "tags": -1})(dataset.__getitems__(indices))
    assert set(batch) == {"index", "boxes", "boxes_lengths", "labels", "labels_lengths", "tags", "tags_lengths",
                          "caption", "depth"}
    lengths = [len(truth.field_value("boxes", i)) for i in indices]
    assert batch["boxes_lengths"].tolist() == lengths and batch["boxes_lengths"].dtype == torch.int64
    assert tuple(batch["boxes"].shape) == (5, max(lengths), 4) and batch["boxes"].dtype == torch.float32
    for j, i in enumerate(indices):
        n = lengths[j]
        np.testing.assert_array_equal(batch["boxes"][j, :n].numpy(), truth.field_value("boxes", i))
        assert torch.all(batch["boxes"][j, n:] == 0)
        assert batch["labels"][j, n:].tolist() == [-1] * (max(lengths) - n)
        tags = truth.field_value("tags", i)
        assert batch["tags"][j, :len(tags)].tolist() == tags.tolist() and batch["tags_lengths"][j] == len(tags)
    assert batch["depth"].shape == (5, 2) and isinstance(batch["caption"], list)
    assert pickle.loads(pickle.dumps(PaddedCollate(-1))).pad_value == -1


def test_padded_collate_refuses_a_pad_value_the_dtype_cannot_hold(packed: Path) -> None:
    samples = [{"ids": torch.tensor([1, 2], dtype=torch.uint8)}, {"ids": torch.tensor([3], dtype=torch.uint8)}]
    with pytest.raises(OptionError, match="pad value 1000 does not fit field 'ids'"):
        PaddedCollate(1000)(samples)
    with pytest.raises(OptionError, match="must be a number"):
        PaddedCollate("zero")
    taken = [{"a": torch.zeros(1), "a_lengths": 1}, {"a": torch.zeros(2), "a_lengths": 2}]
    with pytest.raises(OptionError, match="'a_lengths'"):
        PaddedCollate()(taken)


def test_plain_dict_samples_collate_by_their_values() -> None:
    same = [{"x": torch.zeros(2), "s": "a"}, {"x": torch.ones(2), "s": "b"}]
    batch = collate(same)
    assert batch["x"].shape == (2, 2) and batch["s"] == ["a", "b"]
    ragged = [{"x": torch.zeros(2)}, {"x": torch.ones(3)}]
    assert isinstance(collate(ragged)["x"], list)
    padded = PaddedCollate(9)(ragged)
    assert padded["x"].tolist() == [[0, 0, 9], [1, 1, 1]] and padded["x_lengths"].tolist() == [2, 3]


# --- boxes and per-box fields through the dataset (the geometry itself: test_transforms_geometry) -

def test_geometry_with_an_uncropped_decode_leaves_values_as_stored(packed: Path, truth) -> None:
    dataset = PackedDataset(packed, fields=("boxes", "labels", "mask"), geometry={"boxes": "xyxy",
                                                                                  "labels": "per-box"})
    for j, sample in enumerate(dataset.__getitems__(list(range(N)))):
        assert_sample(sample, truth, j)


def test_a_crop_moves_boxes_and_drops_per_box_rows_in_step(packed: Path, truth) -> None:
    transform = RandomResizedCrop(8, scale=(0.2, 0.5), seed=3)
    dataset = PackedDataset(packed, decode=transform, layout="HWC", fields=("index", "boxes", "labels", "mask"),
                            geometry={"boxes": "xyxy", "labels": "per-box"})
    dropped = 0
    for sample in dataset.__getitems__(list(range(N))):
        i = sample["index"]
        geometry = transform.geometry(int(truth.index.width[i]), int(truth.index.height[i]), i)
        mapped, keep = geometry.map_boxes(truth.field_value("boxes", i))
        np.testing.assert_allclose(sample["boxes"].numpy(), mapped[keep], atol=1e-5)
        assert sample["labels"].tolist() == truth.field_value("labels", i)[keep].tolist()
        assert tuple(sample["mask"].shape) == (8, 8)
        dropped += int((~keep).sum())
    assert dropped  # the small crops dropped some boxes


def test_per_box_rows_that_do_not_match_the_boxes_are_a_typed_error(tmp_path: Path) -> None:
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    (tmp_path / "rows.jsonl").write_text(json.dumps({"path": "a.png", "boxes": [[0, 0, 4, 4], [1, 1, 2, 2]],
                                                     "labels": [1]}) + "\n", "utf-8")
    build(tmp_path / "rows.jsonl", tmp_path / "ds", BuildOptions(fields=("boxes=float32[N,4]", "labels=int64[N]")),
          progress=False)
    dataset = PackedDataset(tmp_path / "ds", decode=CenterCrop(4, resize=4), fields=("boxes", "labels"),
                            geometry={"boxes": "xyxy", "labels": "per-box"})
    with pytest.raises(IndexMismatchError, match=r"'labels' has 1 rows but 'boxes' has 2 boxes.*key 'a.png'") as info:
        dataset[0]
    assert info.value.sample == 0


# --- DataLoader workers, resume, ranks ------------------------------------------------------------

def _check_batch(batch: dict, truth) -> list[int]:
    """Every sample of a collated (unpadded) batch holds its values; returns the batch's indices."""
    indices = batch["index"].tolist()
    for j, i in enumerate(indices):
        sample = {name: value[j] for name, value in batch.items()}
        sample["index"] = int(sample["index"])
        assert_sample(sample, truth, i)
    return indices


def test_dataloader_workers_build_fixed_fields_in_shared_memory(packed: Path, truth) -> None:
    dataset = PackedDataset(packed, fields=("index", "key", "depth", "flags", "boxes", "tags", "caption", "mask"))
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=PackedBatchSampler(dataset, batch_size=6, seed=0),
                                         num_workers=2, collate_fn=collate)
    seen = []
    for batch in loader:
        assert batch["depth"].is_shared() and batch["flags"].is_shared()  # built by the worker in shared memory
        seen += _check_batch(batch, truth)
    assert sorted(seen) == list(range(N))


def _take(loader, batches: int, truth) -> list[int]:
    seen = []
    for step, batch in enumerate(loader, 1):
        seen += _check_batch(batch, truth)
        if step == batches:
            break
    return seen


def test_resume_mid_epoch_elsewhere_sees_the_rest_with_its_values(packed: Path, truth) -> None:
    dataset = PackedDataset(packed, fields=("index", "boxes", "depth", "caption", "tags"))
    sampler = PackedBatchSampler(dataset, batch_size=4, seed=4, order="random")
    loader = PackedDataLoader(dataset, batch_sampler=sampler, collate_fn=collate, num_workers=2, prefetch_factor=4)
    loader.set_epoch(2)
    seen = _take(loader, 2, truth)
    state = loader.state_dict()
    del loader
    assert state["consumed"] == 8
    other = PackedDataset(packed, fields=("index", "boxes", "depth", "caption", "tags"))
    resumed = PackedDataLoader(other, batch_sampler=PackedBatchSampler(other, batch_size=3, seed=4, order="random"),
                               collate_fn=PaddedCollate(), num_workers=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(2)
    rest = []
    for batch in resumed:
        for j, i in enumerate(batch["index"].tolist()):
            n = int(batch["boxes_lengths"][j])
            np.testing.assert_array_equal(batch["boxes"][j, :n].numpy(), truth.field_value("boxes", i))
            np.testing.assert_array_equal(batch["depth"][j].numpy(), truth.field_value("depth", i))
            assert batch["caption"][j] == truth.field_value("caption", i)
            rest.append(i)
    assert sorted(seen + rest) == list(range(N))
    assert seen == sampler.read_order.epoch_order(N, 2)[:8].tolist()


@pytest.mark.parametrize("batched", [True, False])
def test_iterable_dataset_with_fields_workers_and_resume(packed: Path, truth, batched: bool) -> None:
    def make() -> PackedIterableDataset:
        return PackedIterableDataset(packed, batch_size=4, order="block", block_bytes=2048, seed=8, batched=batched,
                                     fields=("index", "image", "boxes", "depth", "mask", "tags"),
                                     multi_hot=("tags",))

    kwargs = dict(batch_size=None) if batched else dict(batch_size=4, collate_fn=collate)
    dataset = make()
    loader = PackedDataLoader(dataset, **kwargs, num_workers=2, prefetch_factor=4)
    seen = []
    for step, batch in enumerate(loader, 1):
        assert batch["tags"].shape == (4, 3) and isinstance(batch["boxes"], list)
        for j, i in enumerate(batch["index"].tolist()):
            assert_sample({"tags": batch["tags"][j], "depth": batch["depth"][j], "boxes": batch["boxes"][j],
                           "mask": batch["mask"][j]}, truth, i, multi_hot=("tags",))
            seen.append(i)
        if step == 2:
            break
    state = loader.state_dict()
    del loader
    fresh = make()
    fresh.load_state_dict(state)
    rest = [i for batch in PackedDataLoader(fresh, **kwargs, num_workers=1) for i in batch["index"].tolist()]
    assert sorted(seen + rest) == list(range(N))
    plan = dataset.read_order.plan(N, epoch=0, blocks=dataset.cursor.blocks)
    assert seen + rest == [i for k in range(plan.num_batches) for i in plan.batch(k).tolist()]  # the rank's order


def test_iterable_collate_fn_pads(packed: Path, truth) -> None:
    dataset = PackedIterableDataset(packed, batch_size=5, order="sequential", fields=("index", "boxes"),
                                    collate_fn=PaddedCollate(-1))
    for batch in dataset:
        for j, i in enumerate(batch["index"].tolist()):
            n = int(batch["boxes_lengths"][j])
            np.testing.assert_array_equal(batch["boxes"][j, :n].numpy(), truth.field_value("boxes", i))
            assert torch.all(batch["boxes"][j, n:] == -1)


def test_ranks_partition_the_epoch_with_the_right_values(packed: Path, truth) -> None:
    dataset = PackedDataset(packed, fields=("index", "labels", "depth"))
    per_rank = []
    for rank in range(3):
        sampler = PackedBatchSampler(dataset, batch_size=3, seed=1, rank=rank, world_size=3)
        loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=2, collate_fn=collate)
        per_rank.append([i for batch in loader for i in _check_batch(batch, truth)])
        iterable = PackedIterableDataset(packed, batch_size=3, order="random", seed=1, rank=rank, world_size=3,
                                         fields=("index", "labels", "depth"))
        assert [i for batch in iterable for i in _check_batch(batch, truth)] == per_rank[-1]
    assert len({len(share) for share in per_rank}) == 1  # every rank the same number of samples
    counts = Counter(i for share in per_rank for i in share)
    assert set(counts) == set(range(N)) and 0 <= sum(counts.values()) - N < 3  # padded to a multiple of 3 ranks


def test_threaded_loader_with_fields_and_resume(packed: Path, truth) -> None:
    def make() -> ThreadedLoader:
        return ThreadedLoader(packed, batch_size=4, order="random", seed=2, threads=2,
                              fields=("index", "boxes", "tags", "depth"), collate_fn=PaddedCollate(-1))

    loader = make()
    seen = []
    for step, batch in enumerate(loader, 1):
        for j, i in enumerate(batch["index"].tolist()):
            n = int(batch["tags_lengths"][j])
            np.testing.assert_array_equal(batch["tags"][j, :n].numpy(), truth.field_value("tags", i))
            np.testing.assert_array_equal(batch["depth"][j].numpy(), truth.field_value("depth", i))
            seen.append(i)
        if step == 2:
            break
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [i for batch in resumed for i in batch["index"].tolist()]
    assert sorted(seen + rest) == list(range(N))
    default = ThreadedLoader(packed, batch_size=4, order="sequential", decode=False)
    images, labels = next(iter(default))  # the (images, labels) batches are unchanged
    assert isinstance(images, list) and labels.tolist() == truth.labels[:4].tolist()


def test_a_fields_dataset_pickles_small(packed: Path) -> None:
    dataset = PackedDataset(packed, fields=EVERYTHING, multi_hot=("tags",))
    plain = PackedDataset(packed)
    assert len(pickle.dumps(dataset)) < len(pickle.dumps(plain)) + 2048
    clone = pickle.loads(pickle.dumps(dataset))
    assert torch.equal(clone[3]["tags"], dataset[3]["tags"]) and clone[3]["caption"] == dataset[3]["caption"]


def test_default_samples_are_still_tuples(packed: Path, truth) -> None:
    dataset = PackedDataset(packed)
    image, label = dataset[1]
    assert image.shape[0] == 3 and label == int(truth.labels[1])
    images, labels = collate(dataset.__getitems__([0, 1]))
    assert labels.tolist() == truth.labels[:2].tolist()
    sampler = PackedSampler(dataset, seed=0)
    assert sorted(sampler) == list(range(N))


@pytest.fixture(scope="module")
def packed_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch-fields-raw")
    out = root / "ds"
    # sources of exactly the raw size: the stored pixel grid is the sources', so boxes still fit
    build(make_source(root / "src", fixed_height=12), out, BuildOptions(fields=FIELDS, codec="raw:size=12x16", seed=1),
          workers=1, progress=False)
    return out


def test_geometry_is_refused_where_the_codec_resampled_the_images(tmp_path: Path) -> None:
    """Boxes are in source pixels: a raw build that resampled (12-14 rows -> 12) must not move them silently."""
    out = tmp_path / "ds"
    build(make_source(tmp_path / "src"), out, BuildOptions(fields=FIELDS, codec="raw:size=12x16", seed=1), workers=1,
          progress=False)
    with pytest.raises(OptionError, match="resized the stored images"):
        PackedDataset(out, fields=("image", "boxes", "labels"), decode=RandomResizedCrop(8, seed=2),
                      geometry={"boxes": "xyxy", "labels": "per-box"})
    with pytest.raises(OptionError, match="cannot follow a crop of a raw-codec dataset"):
        PackedDataset(out, fields=("image", "mask"), decode=RandomResizedCrop(8, seed=2))
    PackedDataset(out, fields=("image", "boxes", "mask"))  # read as stored: nothing to refuse


def _assert_same_batch(one: dict, other: dict) -> None:
    assert list(one) == list(other)
    for name in one:
        a, b = one[name], other[name]
        if isinstance(a, torch.Tensor):
            assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), name
        elif a and isinstance(a[0], torch.Tensor):
            assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b)), name
        else:
            assert a == b, name


@pytest.mark.parametrize("which", ["png", "raw"])
@pytest.mark.parametrize("crop", [False, True])
def test_load_batch_is_collate_of_getitems(packed: Path, packed_raw: Path, which: str, crop: bool) -> None:
    # load_batch (the threaded loader's path) collates straight from the columns: same batch as the
    # DataLoader's collate(__getitems__()), whichever image path (raw gather, batched raw crop) ran.
    options = dict(decode=RandomResizedCrop(8, seed=2), layout="HWC",
                   geometry={"boxes": "xyxy", "labels": "per-box"}) if crop else {}
    dataset = PackedDataset(packed if which == "png" else packed_raw, multi_hot=("tags",),
                            fields=("image", "label", "index", "boxes", "labels", "depth", "tags", "mask"), **options)
    indices = [7, 0, 19, 7, 3]
    _assert_same_batch(dataset.load_batch(indices), collate(dataset.__getitems__(indices)))
    _assert_same_batch(dataset.load_batch(indices, collate_fn=PaddedCollate(-1)),
                       PaddedCollate(-1)(dataset.__getitems__(indices)))
    assert dataset.load_batch(indices, collate_fn=lambda samples: len(samples)) == 5
