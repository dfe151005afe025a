"""GpuRawBatches with declared fields: fixed-width array fields ride along with each batch (one gather
from the index column), on CPU tensors here (``device="cpu"``) and on CUDA under the ``gpu`` marker;
fields without a fixed width are refused."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer import gpu
from packer.writer import BuildOptions, build
from packer.dataset import open_dataset
from packer.errors import OptionError

torch = pytest.importorskip("torch")

COUNT = 20
FIELDS = ("score=float32", "xy=float64[2]", "grid=uint16[2,3]", "flag=bool", "boxes=float32[N,4]",
          "tags=classes", "caption=text", "mask=image")


@pytest.fixture(scope="module")
def raw_fields(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 raw 12x10 samples in several shards, with fixed fields of four dtypes and the other kinds."""
    root = tmp_path_factory.mktemp("gpu-fields")
    rng = np.random.default_rng(7)
    rows = []
    for i in range(COUNT):
        Image.fromarray(rng.integers(0, 256, (10, 12, 3), dtype=np.uint8)).save(root / f"{i}.png")
        Image.fromarray(np.full((10, 12), i % 3, np.uint8)).save(root / f"{i}.mask.png")
        rows.append({"path": f"{i}.png", "label": i % 4, "score": i / 8, "xy": [i, -i / 3],
                     "grid": [[i, i + 1, i + 2], [1000 * i, 7, 65535]], "flag": i % 3 == 0,
                     "boxes": [[0, 0, i, i]] * (i % 2), "tags": ["a", "b"][: i % 3], "caption": f"#{i}",
                     "mask": f"{i}.mask.png"})
    (root / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
    build(root / "rows.jsonl", root / "ds", BuildOptions(fields=FIELDS, codec="raw:size=12x10", shard_size=20 << 10, alignment=4096),
          workers=1, progress=False)
    return root / "ds"


def _check_batches(loader: Any, ds: Any, names: tuple[str, ...]) -> list[int]:
    """Every batch's tensors against the dataset's own values; returns the indices seen."""
    seen: list[int] = []
    for batch in loader:
        assert list(batch) == list(names)
        indices = batch["index"].cpu().tolist()
        seen += indices
        for name in names:
            tensor = batch[name]
            assert tensor.shape[0] == len(indices) and tensor.device == loader.device
        for j, i in enumerate(indices):
            assert batch["image"][j].cpu().numpy().tobytes() == ds.read(i)
            if "label" in batch:
                assert int(batch["label"][j]) == int(ds.labels[i])
            for name in ("score", "xy", "grid", "flag"):
                if name in batch:
                    want = ds.field_value(name, i)
                    got = batch[name][j].cpu().numpy()
                    assert got.dtype == want.dtype.newbyteorder("=") and got.shape == want.shape
                    assert np.array_equal(got, want), (name, i)
    return seen


@pytest.mark.parametrize("double_buffer", [False, True])
def test_fixed_fields_come_with_each_batch(raw_fields: Path, double_buffer: bool) -> None:
    names = ("image", "label", "index", "score", "xy", "grid", "flag")
    with gpu.GpuRawBatches(raw_fields, 6, fields=names, device="cpu", seed=2, double_buffer=double_buffer) as loader, \
            open_dataset(raw_fields) as ds:
        assert len(ds.manifest.shards) > 1
        seen = _check_batches(loader, ds, names)
    assert sorted(seen) == list(range(COUNT))


def test_field_dtypes_and_shapes(raw_fields: Path) -> None:
    with gpu.GpuRawBatches(raw_fields, 4, fields=("index", "score", "xy", "grid", "flag", "image"), device="cpu",
                           order="sequential") as loader:
        batch = next(iter(loader))
    assert batch["score"].dtype == torch.float32 and batch["score"].shape == (4,)
    assert batch["xy"].dtype == torch.float64 and batch["xy"].shape == (4, 2)
    assert batch["grid"].dtype == torch.uint16 and batch["grid"].shape == (4, 2, 3)
    assert batch["flag"].dtype == torch.bool and batch["index"].dtype == torch.int64
    assert batch["image"].shape == (4, 12, 10, 3)


def test_without_fields_batches_are_unchanged(raw_fields: Path) -> None:
    with gpu.GpuRawBatches(raw_fields, 5, device="cpu", order="sequential") as plain:
        images, labels = next(iter(plain))
    with gpu.GpuRawBatches(raw_fields, 5, device="cpu", order="sequential", fields=("image", "label")) as named:
        batch = next(iter(named))
    assert torch.equal(batch["image"], images) and torch.equal(batch["label"], labels)


def test_resume_keeps_fields_in_step(raw_fields: Path) -> None:
    names = ("index", "score")
    with gpu.GpuRawBatches(raw_fields, 4, fields=names, device="cpu", seed=9, order="random") as loader:
        iterator = iter(loader)
        next(iterator)
        state = loader.state_dict()
        rest = [b["index"].tolist() for b in iterator]
    with gpu.GpuRawBatches(raw_fields, 4, fields=names, device="cpu", seed=9, order="random") as resumed, \
            open_dataset(raw_fields) as ds:
        resumed.load_state_dict(state)
        batches = list(resumed)
        assert [b["index"].tolist() for b in batches] == rest
        scores = ds.field_array("score")
        for b in batches:
            assert b["score"].tolist() == scores[b["index"].numpy()].tolist()


@pytest.mark.parametrize("fields, message", [
    (("image", "boxes"), r"boxes: float32\[N,4\] has a per-sample length"),
    (("tags",), r"tags: classes\(2\) has a per-sample length"),
    (("caption",), "caption: text has a per-sample length"),
    (("mask",), "'mask' is an image field"),
    (("key",), "'key' is a string per sample"),
    (("metadata",), "'metadata' is a string per sample"),
    (("nope",), "no field 'nope'"),
    (("score", "score"), "distinct names"),
    ((), "distinct names"),
])
def test_fields_that_do_not_apply_are_refused(raw_fields: Path, fields: tuple[str, ...], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        gpu.GpuRawBatches(raw_fields, 4, fields=fields, device="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU with CUDA")
@pytest.mark.parametrize("io", ["host", "auto"])
def test_fixed_fields_land_on_the_gpu(raw_fields: Path, io: str) -> None:
    names = ("image", "label", "index", "score", "xy", "grid", "flag")
    with gpu.GpuRawBatches(raw_fields, 6, fields=names, device="cuda", io=io, seed=4) as loader, \
            open_dataset(raw_fields) as ds:
        assert loader.device.type == "cuda"
        seen = _check_batches(loader, ds, names)
    assert sorted(seen) == list(range(COUNT))
