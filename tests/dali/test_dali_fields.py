"""The DALI sources with declared fields: one output per requested field, checked against the dataset's
values, with the sources called directly and in real CPU-only DALI pipelines (device_id=None)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer.writer import BuildOptions, build
from packer.dali import PackedBatchIterator, PackedBatchSource, PackedSampleSource
from packer.dataset import Dataset, open_dataset
from packer.errors import DecodeError, OptionError
from helpers import FIELDS, make_field_source

BATCH = 4
EVERYTHING = ("image", "boxes", "tags", "caption", "depth", "mask", "index", "label", "key")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("dali-fields")
    build(make_field_source(root / "src"), root / "ds", BuildOptions(fields=FIELDS, shard_size=3 * 8192, seed=3),
          workers=1, progress=False)
    return root / "ds"


def _info(epoch: int, idx: int) -> SimpleNamespace:
    return SimpleNamespace(epoch_idx=epoch, idx_in_epoch=idx, idx_in_batch=idx % BATCH, iteration=idx // BATCH)


def _expected(ds: Dataset, name: str, i: int, field_images: str = "encoded") -> np.ndarray:
    """What output ``name`` of sample ``i`` must be, from the dataset's own readers."""
    if name == "image":
        return np.frombuffer(ds.read(i), np.uint8)
    if name in ("index", "label"):
        return np.array(i if name == "index" else int(ds.labels[i]), np.int64)
    if name == "key":
        return np.frombuffer(ds.key(i).encode(), np.uint8)
    spec = ds.field_spec(name)
    if spec.kind == "image":
        if field_images == "encoded":
            return np.frombuffer(ds.field_bytes(name, i), np.uint8)
        return ds.field_image(name, i)[:, :, None]
    value = ds.field_value(name, i)
    return np.frombuffer(value.encode(), np.uint8) if spec.kind == "text" else value


def _same(got: Any, want: np.ndarray) -> bool:
    got = np.asarray(got)
    return got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)


# --- the sources, called directly ---------------------------------------------------------------------

def test_sample_source_gives_one_output_per_field(dataset: Path) -> None:
    source = PackedSampleSource(dataset, BATCH, seed=4, fields=EVERYTHING)
    assert source.output_names == EVERYTHING
    with open_dataset(dataset) as ds:
        for position in range(source.epoch_length()):
            outputs = source(_info(0, position))
            assert len(outputs) == len(EVERYTHING)
            i = int(outputs[EVERYTHING.index("index")])
            for name, got in zip(EVERYTHING, outputs):
                assert _same(got, _expected(ds, name, i)), (name, i)
        shapes = {ds.field_value("boxes", i).shape for i in range(len(ds))}
    assert (0, 4) in shapes and len(shapes) > 1  # variable: empty and non-empty per sample


def test_batch_sources_give_lists_per_field(dataset: Path) -> None:
    names = ("boxes", "image", "mask", "caption", "index")
    source = PackedBatchSource(dataset, BATCH, seed=1, fields=names)
    iterator = PackedBatchIterator(dataset, BATCH, seed=1, fields=names)
    with open_dataset(dataset) as ds:
        batches = list(iter(iterator))
        assert len(batches) == source.num_batches() == 2
        for k, batch in enumerate(batches):
            again = source(SimpleNamespace(epoch_idx=0, iteration=k))
            assert len(batch) == len(names)
            for name, column, other in zip(names, batch, again):
                for j, i in enumerate(int(v) for v in batch[-1]):
                    assert _same(column[j], _expected(ds, name, i)) and _same(other[j], column[j]), (name, i)


def test_decoded_image_fields_keep_their_values(dataset: Path) -> None:
    source = PackedSampleSource(dataset, BATCH, order="sequential", fields=("mask", "index"), field_images="decoded")
    with open_dataset(dataset) as ds:
        mask, index = source(_info(0, 5))
        assert mask.ndim == 3 and mask.shape[2] == 1 and mask.dtype == np.uint8
        assert np.array_equal(mask[:, :, 0], ds.field_image("mask", int(index)))  # palette indices, not colours
        assert int(mask.max()) >= 2


def test_fields_without_the_image_never_read_the_main_shards(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the main payload was read")

    monkeypatch.setattr(Dataset, "get", refuse)
    monkeypatch.setattr(Dataset, "read_batch", refuse)
    boxes, = PackedSampleSource(dataset, BATCH, fields=("boxes",))(_info(0, 0))
    assert boxes.dtype == np.float32 and boxes.shape[1:] == (4,)
    captions, labels = PackedBatchSource(dataset, BATCH, fields=("caption", "label")).read(0, 0)
    assert len(captions) == len(labels) == BATCH and captions[0].dtype == np.uint8


def test_sources_with_fields_pickle_and_reopen(dataset: Path) -> None:
    source = PackedSampleSource(dataset, BATCH, fields=("boxes", "mask"))
    first = source(_info(0, 3))
    again = pickle.loads(pickle.dumps(source))
    assert again.output_names == ("boxes", "mask")
    assert all(np.array_equal(a, b) for a, b in zip(again(_info(0, 3)), first))


@pytest.mark.parametrize("kwargs, message", [
    ({"fields": ("image", "nope")}, r"fields \['nope'\] are not outputs.*declared fields \['boxes', 'caption'"),
    ({"fields": ("boxes", "boxes")}, "distinct names"),
    ({"fields": ()}, "distinct names"),
    ({"fields": ("metadata",)}, "no type for"),
    ({"fields": ("boxes",), "return_index": True}, "name 'index' among them"),
    ({"fields": ("mask",), "field_images": "pixels"}, "field_images must be one of encoded, decoded"),
])
def test_bad_field_requests_are_refused_at_construction(dataset: Path, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        PackedSampleSource(dataset, BATCH, **kwargs)


def test_an_image_field_dali_cannot_decode_is_refused_unless_decoded(tmp_path: Path) -> None:
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(tmp_path / "a.png")
    mask = Image.fromarray(np.eye(8, dtype=np.uint8), mode="P")
    mask.putpalette([0, 0, 0, 255, 0, 0] * 128)
    mask.save(tmp_path / "a.gif")  # GIF: not one of DALI's decoder's formats
    (tmp_path / "rows.jsonl").write_text(json.dumps({"path": "a.png", "mask": "a.gif"}) + "\n", "utf-8")
    build(tmp_path / "rows.jsonl", tmp_path / "ds", BuildOptions(fields=("mask=image",)), workers=1, progress=False)
    with pytest.raises(DecodeError, match="field 'mask': DALI's fn.decoders.image cannot decode 1 gif.*"
                                          "field_images='decoded'"):
        PackedSampleSource(tmp_path / "ds", 1, fields=("image", "mask"))
    PackedSampleSource(tmp_path / "ds", 1, fields=("image",))  # the main images are fine
    decoded, = PackedSampleSource(tmp_path / "ds", 1, fields=("mask",), field_images="decoded")(_info(0, 0))
    assert np.array_equal(decoded[:, :, 0], np.eye(8, dtype=np.uint8))


def test_raw_images_come_as_pixels_beside_fields(tmp_path: Path) -> None:
    rows = []
    for i in range(3):
        Image.fromarray(np.full((10, 12, 3), 40 * i, np.uint8)).save(tmp_path / f"{i}.png")
        rows.append({"path": f"{i}.png", "score": i / 2})
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    build(tmp_path / "rows.jsonl", tmp_path / "ds", BuildOptions(fields=("score=float32",), codec="raw:size=12x10",
                                                                 shuffle=False), workers=1, progress=False)
    image, score = PackedSampleSource(tmp_path / "ds", 1, order="sequential", fields=("image", "score"))(_info(0, 2))
    assert image.shape == (12, 10, 3) and np.all(image == 80)  # the codec's (H, W, C): pixels, not bytes
    with open_dataset(tmp_path / "ds") as ds:
        assert image.tobytes() == ds.read(2)
    assert score.shape == () and score.dtype == np.float32 and float(score) == 1.0


# --- real DALI pipelines (CPU only) ---------------------------------------------------------------------

def _run(pipe: Any) -> list[tuple[list[np.ndarray], ...]]:
    batches = []
    try:
        while True:
            outputs = pipe.run()
            batches.append(tuple([np.array(o.at(j)) for j in range(len(o))] for o in outputs))
    except StopIteration:
        pipe.reset()
    return batches


def test_external_source_options(dataset: Path) -> None:
    types = pytest.importorskip("nvidia.dali.types")
    options = PackedSampleSource(dataset, BATCH, fields=EVERYTHING).external_source_options()
    assert options["num_outputs"] == len(EVERYTHING)
    assert options["dtype"] == [types.UINT8, types.FLOAT, types.INT64, types.UINT8, types.FLOAT, types.UINT8,
                                types.INT64, types.INT64, types.UINT8]
    assert options["ndim"] == [1, 2, 1, 1, 1, 1, 0, 0, 1]
    decoded = PackedSampleSource(dataset, BATCH, fields=("mask",), field_images="decoded").external_source_options()
    assert decoded == {"num_outputs": 1, "dtype": [types.UINT8], "ndim": [3]}


@pytest.mark.parametrize("parallel", [False, True], ids=["serial", "parallel-fork"])
def test_dali_sample_pipeline_with_fields(dataset: Path, parallel: bool) -> None:
    dali = pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn

    source = PackedSampleSource(dataset, BATCH, seed=6, fields=EVERYTHING)
    kwargs = {"py_num_workers": 2, "py_start_method": "fork"} if parallel else {}

    @dali.pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, prefetch_queue_depth=2, seed=0, **kwargs)
    def pipeline():
        return tuple(fn.external_source(source=source, batch=False, parallel=parallel,
                                        **source.external_source_options()))

    pipe = pipeline()
    pipe.build()
    batches = _run(pipe)
    assert len(batches) == source.num_batches() == 2
    seen = []
    with open_dataset(dataset) as ds:
        for batch in batches:
            for j, i in enumerate(int(v) for v in batch[EVERYTHING.index("index")]):
                seen.append(i)
                for name, column in zip(EVERYTHING, batch):
                    assert _same(column[j], _expected(ds, name, i)), (name, i)
    assert sorted(set(seen)) == list(range(8))


def test_dali_batch_pipeline_decodes_images_and_masks(dataset: Path) -> None:
    dali = pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn, types

    from packer.decode import decode_image

    names = ("image", "mask", "boxes", "index")
    encoded = PackedBatchSource(dataset, BATCH, seed=2, fields=names)
    decoded = PackedBatchSource(dataset, BATCH, seed=2, fields=("mask",), field_images="decoded")

    @dali.pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, py_num_workers=1, py_start_method="fork")
    def pipeline():
        image, mask, boxes, index = fn.external_source(source=encoded, batch=True, parallel=True, batch_info=True,
                                                       **encoded.external_source_options())
        ids, = fn.external_source(source=decoded, batch=True, parallel=True, batch_info=True,
                                  **decoded.external_source_options())
        return (fn.decoders.image(image, device="cpu", output_type=types.RGB),
                fn.decoders.image(mask, device="cpu", output_type=types.ANY_DATA), ids, boxes, index)

    pipe = pipeline()
    pipe.build()
    batches = _run(pipe)
    assert len(batches) == 2
    with open_dataset(dataset) as ds:
        for images, masks, ids, boxes, index in batches:
            for j, i in enumerate(int(v) for v in index):
                reference = decode_image(ds.read(i))
                assert images[j].shape == reference.shape
                assert np.abs(images[j].astype(int) - reference.astype(int)).mean() < 2.0
                stored = ds.field_image("mask", i)
                # DALI decodes the encoded mask to the image's size; the decoded output keeps the ids
                assert masks[j].shape[:2] == stored.shape and np.array_equal(ids[j][:, :, 0], stored)
                assert _same(boxes[j], ds.field_value("boxes", i))
