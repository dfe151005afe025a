"""packer.pack: map a function over inputs in workers and pack the samples (issue 35).

The promises: the same bytes whatever ``workers``, ``engine`` and ``part``; an ``fn`` that raises
on an input is a rejection naming it, and the run goes on; a killed pack resumes to the same
bytes; Dataset objects (torch map-style, Hugging Face in memory) go in whole.
"""

from __future__ import annotations

import importlib.util
import io
import os
import signal
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packer
from packer.errors import BuildError, OptionError, PackerError
from packer.writer.staging import STAGING_DIR

SMALL = dict(shard_size=24 << 10)


def jpeg(seed: int, size: tuple[int, int] = (24, 20)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=85)
    return out.getvalue()


def load(i: int) -> object:
    """An fn as a user writes one: a sample per input, a few skipped, one raising, one giving two."""
    if i % 17 == 5:
        raise ValueError(f"no image for input {i}")
    if i % 13 == 7:
        return None
    if i == 21:
        return [{"image": jpeg(1000), "label": "even"}, (jpeg(1001), "odd")]
    return {"image": jpeg(i), "label": "even" if i % 2 == 0 else "odd"}


def tree(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and p.name != ".packer.lock"}


def opens(path: Path) -> bool:
    try:
        with packer.open_dataset(path):
            return True
    except PackerError:
        return False


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("ref") / "out"
    result = packer.pack(range(60), out, load, workers=1, chunk_size=8, **SMALL)
    assert result is not None and result.sample_count == 60 - 4 - 5 + 1
    return tree(out)


def test_the_report_names_each_input_whose_fn_raised_and_the_run_goes_on(reference: dict[str, bytes],
                                                                          tmp_path: Path) -> None:
    report = reference["build-report.jsonl"].decode()
    for i in (5, 22, 39, 56):
        assert f'"key": "{i:09d}"' in report
        assert f"fn raised ValueError: no image for input {i} (at test_pack.py:" in report
        assert f"in load) on input {i}: {i}" in report
    assert report.count('"reason": "fn-error"') == 4
    with pytest.raises(BuildError, match="fn-error: fn raised ValueError: no image for input 5"):
        packer.pack(range(10), tmp_path / "fail", load, workers=1, on_error="fail")
    assert not opens(tmp_path / "fail")


def test_keys_are_input_numbers_and_a_list_gives_several_samples(reference: dict[str, bytes], tmp_path: Path) -> None:
    packer.pack(range(30), tmp_path / "out", load, workers=1, **SMALL)
    with packer.open_dataset(tmp_path / "out") as ds:
        keys = {ds.key(i) for i in range(len(ds))}
        assert "000000021-0" in keys and "000000021-1" in keys and "000000007" not in keys
        assert "000000004" in keys and ds.classes == ("even", "odd")


@pytest.mark.parametrize("workers", [2, 3])
def test_the_bytes_do_not_depend_on_the_workers(reference: dict[str, bytes], tmp_path: Path, workers: int) -> None:
    packer.pack(range(60), tmp_path / "out", load, workers=workers, chunk_size=8, **SMALL)
    assert tree(tmp_path / "out") == reference


def test_parts_then_resume_give_the_same_bytes(reference: dict[str, bytes], tmp_path: Path) -> None:
    out = tmp_path / "out"
    for part in ((1, 3), "0/3", (2, 3)):
        assert packer.pack(range(60), out, load, workers=1, chunk_size=8, part=part, **SMALL) is None
    assert not opens(out)
    packer.pack(range(60), out, load, workers=2, chunk_size=8, resume=True, **SMALL)
    assert tree(out) == reference


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_ray_gives_the_same_bytes(reference: dict[str, bytes], tmp_path: Path) -> None:
    import sys

    import ray
    import ray.cloudpickle

    # This test module is not importable in Ray's workers: its functions travel by value, as a
    # function defined in a script's __main__ does.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        packer.pack(range(60), tmp_path / "out", load, engine="ray", chunk_size=8, **SMALL)
        packer.pack(range(60), tmp_path / "lambda", lambda i: load(i), engine="ray", chunk_size=8, **SMALL)
    finally:
        ray.shutdown()
    assert tree(tmp_path / "out") == reference
    assert tree(tmp_path / "lambda") == reference


def test_a_lambda_and_a_closure_work_with_the_local_pool(reference: dict[str, bytes], tmp_path: Path) -> None:
    offset = 0
    packer.pack(range(60), tmp_path / "out", lambda i: load(i + offset), workers=2, chunk_size=8, **SMALL)
    assert tree(tmp_path / "out") == reference


def _kill_at_chunk(out: Path, chunk_to_die: int) -> int:
    """Fork a pack that SIGKILLs itself when chunk ``chunk_to_die`` starts; returns the wait status."""
    import packer.writer.map_pack as map_pack

    pid = os.fork()
    if pid == 0:
        try:
            original = map_pack._map_chunk

            def dying(state, chunk, progress):  # noqa: ANN001, ANN202
                if chunk == chunk_to_die:
                    os.kill(os.getpid(), signal.SIGKILL)
                return original(state, chunk, progress)

            map_pack._map_chunk = dying
            packer.pack(range(60), out, load, workers=1, chunk_size=8, **SMALL)
        finally:
            os._exit(3)
    return os.waitpid(pid, 0)[1]


def test_sigkill_during_pack_leaves_nothing_that_opens_and_resume_finishes_with_the_same_bytes(
        reference: dict[str, bytes], tmp_path: Path) -> None:
    import packer.writer.map_pack as map_pack

    out = tmp_path / "out"
    status = _kill_at_chunk(out, 4)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert not opens(out)
    done = sorted(p.name for p in (out / STAGING_DIR / "spool").glob("*.rows.npz"))
    assert done == [f"chunk-{k:06d}.rows.npz" for k in range(4)]
    ran: list[int] = []
    original = map_pack._map_chunk

    def counting(state, chunk, progress):  # noqa: ANN001, ANN202
        ran.append(chunk)
        return original(state, chunk, progress)

    map_pack._map_chunk = counting
    try:
        packer.pack(range(60), out, load, workers=1, chunk_size=8, resume=True, **SMALL)
    finally:
        map_pack._map_chunk = original
    assert ran == [4, 5, 6, 7]  # finished chunks are not mapped again
    assert tree(out) == reference
    again = packer.pack(range(60), out, load, workers=1, chunk_size=8, resume=True, **SMALL)
    assert again.already_complete and tree(out) == reference
    with pytest.raises(BuildError, match="built otherwise"):
        packer.pack(range(60), out, load, workers=1, chunk_size=8, resume=True, seed=3, **SMALL)


def test_sigkill_while_packing_shards_then_resume(reference: dict[str, bytes], tmp_path: Path) -> None:
    import packer.writer.pack as pack_module

    out = tmp_path / "out"
    pid = os.fork()
    if pid == 0:
        try:
            original = pack_module._hash_file
            calls = [0]

            def dying(path):  # noqa: ANN001, ANN202
                calls[0] += 1
                if calls[0] == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                return original(path)

            pack_module._hash_file = dying
            packer.pack(range(60), out, load, workers=1, chunk_size=8, **SMALL)
        finally:
            os._exit(3)
    assert os.WIFSIGNALED(os.waitpid(pid, 0)[1]) and not opens(out)
    packer.pack(range(60), out, load, workers=1, chunk_size=8, resume=True, **SMALL)
    assert tree(out) == reference


def test_a_resumed_pack_must_be_the_same_job(tmp_path: Path) -> None:
    out = tmp_path / "out"
    status = _kill_at_chunk(out, 2)
    assert os.WIFSIGNALED(status)
    with pytest.raises(OptionError, match="inputs"):
        packer.pack(range(61), out, load, workers=1, chunk_size=8, resume=True, **SMALL)
    with pytest.raises(OptionError, match="--seed: saved 0, asked 4"):
        packer.pack(range(60), out, load, workers=1, chunk_size=8, resume=True, seed=4, **SMALL)
    with pytest.raises(BuildError, match=r"chunk 2 of 8 \(inputs 16 to 23\) is not mapped yet"):
        _finish_with_missing_chunks(out)


def _finish_with_missing_chunks(out: Path) -> None:
    """A last step that maps nothing (as if a part had not run): the chunks left are missing."""
    import packer.writer.map_pack as map_pack

    original = map_pack._map
    map_pack._map = lambda *args, **kwargs: None  # the final step maps nothing: chunks left are missing
    try:
        packer.pack(range(60), out, load, workers=1, chunk_size=8, resume=True, **SMALL)
    finally:
        map_pack._map = original


def test_a_value_that_is_not_a_sample_is_a_rejection_or_with_fail_an_error(tmp_path: Path) -> None:
    result = packer.pack([jpeg(0), 3.5, {"label": 1}, (jpeg(1), 2, 3)], tmp_path / "skip", workers=1)
    assert [(r.key, r.reason) for r in result.rejected] == [
        ("000000001", "bad-sample"), ("000000002", "bad-sample"), ("000000003", "bad-sample")]
    assert "(input 1)" in result.rejected[0].message and "needs an 'image'" in result.rejected[1].message
    with pytest.raises(BuildError, match=r"bad-sample: an image is encoded bytes.*\(input 1; on_error='fail'\)"):
        packer.pack([jpeg(0), 3.5], tmp_path / "fail", workers=1, on_error="fail")


def test_pack_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match="sized sequence"):
        packer.pack(iter(range(3)), tmp_path / "a", load)
    with pytest.raises(OptionError, match="fn must be a function"):
        packer.pack(range(3), tmp_path / "a", 3)
    with pytest.raises(OptionError, match="chunk_size must be a positive"):
        packer.pack(range(3), tmp_path / "a", load, chunk_size=0)
    with pytest.raises(OptionError, match="plan_only is not for pack"):
        packer.pack(range(3), tmp_path / "a", load, run=packer.RunOptions(plan_only=True))
    with pytest.raises(OptionError, match="--part"):
        packer.pack(range(3), tmp_path / "a", load, part="4/2")


def test_inputs_that_are_samples_and_a_dataset_that_fails_to_read_one(tmp_path: Path) -> None:
    class Flaky:
        classes = ["a", "b"]

        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> tuple[bytes, int]:
            if i == 4:
                raise OSError("damaged file")
            return jpeg(i), i % 2

    result = packer.pack(Flaky(), tmp_path / "out", workers=1)
    assert [(r.key, r.reason) for r in result.rejected] == [("000000004", "fn-error")]
    assert "reading the input raised OSError: damaged file" in result.rejected[0].message
    with packer.open_dataset(tmp_path / "out") as ds:
        assert ds.classes == ("a", "b") and len(ds) == 5
        assert {ds.key(i): int(ds.labels[i]) for i in range(5)} == {f"{i:09d}": i % 2 for i in (0, 1, 2, 3, 5)}
    packer.pack([(jpeg(0), 1), (jpeg(1), 2)], tmp_path / "list", workers=1)
    with packer.open_dataset(tmp_path / "list") as ds:
        assert sorted(ds.labels.tolist()) == [1, 2] and ds.classes == ()


# --- Dataset objects ----------------------------------------------------------------------------------------

def test_a_torch_dataset_of_pil_images_tensors_and_detection_targets(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Pictures(torch.utils.data.Dataset):
        classes = ["cat", "dog", "emu"]

        def __len__(self) -> int:
            return 9

        def __getitem__(self, i: int):  # noqa: ANN204
            pixels = np.full((6, 8, 3), i * 20, dtype=np.uint8)
            image = Image.fromarray(pixels) if i % 2 else torch.from_numpy(pixels).permute(2, 0, 1)
            return image, i % 3

    packer.pack(Pictures(), tmp_path / "cls", workers=2)
    with packer.open_dataset(tmp_path / "cls") as ds:
        assert ds.classes == ("cat", "dog", "emu")
        for i in range(len(ds)):
            n = int(ds.key(i))
            assert ds.classes[int(ds.labels[i])] == ("cat", "dog", "emu")[n % 3]
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(ds.read(i)))), np.full((6, 8, 3), n * 20, np.uint8))

    class Detection(torch.utils.data.Dataset):  # what CocoDetection wrapped for transforms v2 returns
        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int):  # noqa: ANN204
            boxes = torch.tensor([[1.0, 2.0, 5.0, 6.0]] * i, dtype=torch.float32).reshape(i, 4)
            return Image.fromarray(np.zeros((8, 8, 3), np.uint8)), {
                "boxes": boxes, "labels": torch.arange(i, dtype=torch.int64), "image_id": i}

    packer.pack(Detection(), tmp_path / "det", workers=1)
    with packer.open_dataset(tmp_path / "det") as ds:
        assert {spec.name: (spec.dtype, spec.shape) for spec in ds.fields} == {
            "boxes": ("float32", (-1, 4)), "labels": ("int64", (-1,)), "image_id": ("int64", ())}
        for i in range(4):
            n = int(ds.key(i))
            assert ds.value("boxes", i).shape == (n, 4) and ds.value("labels", i).tolist() == list(range(n))
            assert int(ds.value("image_id", i)) == n and int(ds.labels[i]) == -1


def test_a_hugging_face_dataset_in_memory_keeps_its_bytes_and_class_names(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    names = ["zebra", "ant", "cat"]
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=names),
                                  "score": datasets.Value("float32"), "caption": datasets.Value("string")})
    data = {"image": [{"bytes": jpeg(i), "path": None} for i in range(7)], "label": [i % 3 for i in range(6)] + [-1],
            "score": [i / 2 for i in range(7)], "caption": [f"photo {i}" for i in range(7)]}
    hf = datasets.Dataset.from_dict(data, features=features)
    result = packer.pack(hf, tmp_path / "out", workers=2)
    assert [(r.key, r.reason) for r in result.rejected] == [("000000006", "unlabeled")]
    with packer.open_dataset(tmp_path / "out") as ds:
        assert ds.classes == tuple(names)  # ClassLabel's own order
        for i in range(len(ds)):
            n = int(ds.key(i))
            assert ds.read(i) == jpeg(n)  # the encoded bytes, as they were
            assert ds.classes[int(ds.labels[i])] == names[n % 3]
            assert ds.value("caption", i) == f"photo {n}" and float(ds.value("score", i)) == n / 2


@pytest.mark.torchvision
def test_real_torchvision_datasets(tmp_path: Path) -> None:
    """FakeData, ImageFolder (file bytes kept), CIFAR-like arrays, CocoDetection wrapped for v2 (.venv-tv)."""
    torchvision = pytest.importorskip("torchvision")
    fake = torchvision.datasets.FakeData(size=6, image_size=(3, 12, 10), num_classes=3)
    packer.pack(fake, tmp_path / "fake", workers=1)
    with packer.open_dataset(tmp_path / "fake") as ds:
        assert len(ds) == 6
        for i in range(6):
            image, label = fake[int(ds.key(i))]
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(ds.read(i))).convert("RGB")), np.asarray(image))
            assert int(ds.labels[i]) == int(label)
    for c in ("b", "a"):
        (tmp_path / "folder" / c).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "folder" / c / f"{i}.jpg").write_bytes(jpeg(i + ord(c)))
    folder = torchvision.datasets.ImageFolder(str(tmp_path / "folder"))
    packer.pack(folder, tmp_path / "if", workers=1)
    with packer.open_dataset(tmp_path / "if") as ds:
        assert ds.classes == ("a", "b")
        for i in range(len(ds)):
            path, label = folder.samples[int(ds.key(i))]
            assert ds.read(i) == Path(path).read_bytes() and int(ds.labels[i]) == label
