"""``packer bench``: the JSON document, every decode mode and reader, worker CPU from /proc, and
the advice given when the loader is slower than 1.5x the target rate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from packer.bench import (HEADROOM, BenchOptions, child_pids, process_cpu_seconds, run_bench, run_queue_seconds,
                          storage_read_bytes)
from packer.errors import OptionError
from packer.writer import build
from packer.cli import _register, cli
from packer.writer.plan import BuildOptions

_register()

FIELDS = {"advice", "batches", "codec", "cores", "dataset", "diagnosis", "formats", "image_size", "loader",
          "main_cpu", "main_wait", "mb_per_s", "meets_target", "notes", "num_samples", "options", "payload_bytes",
          "required_rate", "samples", "samples_per_s", "seconds", "size", "storage_bytes", "target_rate",
          "worker_cpu", "worker_wait", "workers", "threads", "batches_per_epoch", "idle_workers"}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import make_sample

    tmp = tmp_path_factory.mktemp("bench")
    make_sample.make_image_folder(tmp / "src", classes=2, per_class=12, seed=1,
                                  formats=("jpeg", "jpeg", "png"))
    build(tmp / "src", tmp / "ds", BuildOptions(shard_size=32 << 10), workers=1, progress=False)
    return tmp / "ds"


def run_cli(*args: str) -> tuple[int, dict, str]:
    result = CliRunner().invoke(cli, ["bench", *args, "--json"])
    assert result.exit_code == 0, result.output + str(result.exception)
    return result.exit_code, json.loads(result.stdout), result.stderr


def test_json_document_simple_loop(dataset: Path) -> None:
    _, doc, err = run_cli(str(dataset), "-b", "4", "-n", "3", "--warmup", "1", "--size", "32",
                          "--loader", "simple")
    assert doc["ok"] is True and "format_version" in doc
    bench = doc["bench"]
    assert set(bench) == FIELDS
    assert bench["loader"] == "simple" and bench["workers"] == 0 and bench["worker_cpu"] is None
    assert bench["samples"] == 12 and bench["batches"] == 3 and bench["num_samples"] == 24
    assert bench["samples_per_s"] > 0 and bench["mb_per_s"] > 0 and bench["payload_bytes"] > 0
    assert bench["target_rate"] is None and bench["meets_target"] is None and bench["advice"] == []
    assert bench["options"]["decode"] == "rrc" and bench["options"]["size"] == 32
    assert "samples/s" in err and "MB/s" in err


@pytest.mark.parametrize("decode", ["none", "full", "center"])
def test_decode_modes_in_process(dataset: Path, decode: str) -> None:
    result = run_bench(dataset, BenchOptions(batch_size=5, batches=2, warmup=1, size=24,
                                             decode=decode, loader="simple", order="block"))
    assert result.samples == 10 and result.samples_per_s > 0


def test_target_rate_above_achieved_gives_advice(dataset: Path) -> None:
    _, doc, err = run_cli(str(dataset), "-b", "4", "-n", "2", "--warmup", "1", "--size", "32",
                          "--loader", "simple", "--target-rate", "1e9")
    bench = doc["bench"]
    assert bench["meets_target"] is False
    assert bench["required_rate"] == pytest.approx(HEADROOM * 1e9)
    assert len(bench["advice"]) >= 2 and "1.5x" in bench["advice"][0]
    assert any("torch" in item for item in bench["advice"])  # the in-process loop was measured
    assert "TOO SLOW" in err


def test_target_rate_met_gives_no_advice(dataset: Path) -> None:
    _, doc, err = run_cli(str(dataset), "-b", "4", "-n", "2", "--warmup", "0", "--size", "32",
                          "--loader", "simple", "--target-rate", "0.001")
    assert doc["bench"]["meets_target"] is True and doc["bench"]["advice"] == []
    assert "OK" in err


def test_torch_dataloader_with_a_worker_process(dataset: Path) -> None:
    pytest.importorskip("torch")
    _, doc, err = run_cli(str(dataset), "-b", "4", "-n", "3", "--warmup", "1", "--size", "32",
                          "-j", "1", "--order", "block")
    bench = doc["bench"]
    assert bench["loader"] == "torch" and bench["workers"] == 1 and bench["samples"] == 12
    assert bench["worker_cpu"] is not None and len(bench["worker_cpu"]) == 1
    assert 0 <= bench["worker_cpu"][0] <= 1.5
    assert "workers" in err


@pytest.mark.parametrize("decode", ["rrc", "none", "full"])
def test_threaded_loader_is_measured(dataset: Path, decode: str) -> None:
    """--loader threaded: ThreadedLoader's batches on threads of this process (--workers its threads)."""
    pytest.importorskip("torch")
    _, doc, err = run_cli(str(dataset), "-b", "5", "-n", "6", "--warmup", "1", "--size", "24", "--decode", decode,
                          "--loader", "threaded", "-j", "2", "--target-rate", "1e9")
    bench = doc["bench"]
    assert bench["loader"] == "threaded" and bench["threads"] == 2 and bench["workers"] == 0
    assert bench["worker_cpu"] is None and bench["samples"] == 29 and bench["payload_bytes"] > 0  # 4 + 5 short
    assert bench["batches_per_epoch"] == 5 and bench["main_cpu"] > 0  # 24 samples in batches of 5
    assert "loader      threaded, 2 thread(s)" in err and "TOO SLOW" in err
    assert not any("install torch" in item or "use more workers" in item for item in bench["advice"])


def test_idle_workers_are_counted_and_named(dataset: Path) -> None:
    """4 workers on 24 samples in batches of 12: 2 batches an epoch, so workers 2 and 3 get none.

    Each still wakes once an epoch (persistent workers are told of every new epoch), and on a
    loaded machine such a short run can put them over the idle threshold: the count is checked
    against the measurement, and the note against the count (the advice table checks the text
    for the issue's run)."""
    pytest.importorskip("torch")
    _, doc, err = run_cli(str(dataset), "-b", "12", "-n", "16", "--warmup", "2", "--decode", "full", "-j", "4")
    bench = doc["bench"]
    assert bench["batches_per_epoch"] == 2
    idle = sum(1 for c, w in zip(bench["worker_cpu"], bench["worker_wait"]) if c + w < 0.1)
    assert bench["idle_workers"] == idle
    noted = [note for note in bench["notes"] if "workers sat idle" in note]
    if idle:
        assert f"{idle} of 4 workers sat idle" in err
        assert noted and "an epoch of 24 samples holds 2 batches of 12" in noted[0], bench["notes"]
    else:
        assert not noted


@pytest.mark.parametrize("reader,decode", [("map", "full"), ("iterable", "rrc"),
                                           ("iterable", "none")])
def test_torch_readers_in_the_main_process(dataset: Path, reader: str, decode: str) -> None:
    pytest.importorskip("torch")
    # 24 samples in batches of 5: 5 batches an epoch, so 7 batches cross into a second epoch.
    result = run_bench(dataset, BenchOptions(batch_size=5, batches=5, warmup=2, size=24,
                                             workers=0, reader=reader, decode=decode,
                                             layout="CHW"))
    assert result.loader == "torch" and result.workers == 0 and result.samples == 24
    assert result.payload_bytes > 0


def test_missing_dataset_is_an_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["bench", str(tmp_path / "nope"), "--loader", "simple"])
    assert result.exit_code != 0 and "error" in result.output


def test_options_are_validated() -> None:
    with pytest.raises(OptionError, match="order"):
        BenchOptions(order="shuffled")
    with pytest.raises(OptionError, match="target_rate"):
        BenchOptions(target_rate=0)
    for options, message in (({"batch_size": 0}, "batch_size must be at least 1, got 0"),
                             ({"size": -3}, "size must be at least 1, got -3"),
                             ({"warmup": -1}, "warmup and workers must not be negative, got warmup=-1, workers=None"),
                             ({"workers": -2}, "warmup and workers must not be negative, got warmup=5, workers=-2"),
                             ({"layout": "NHWC"}, "layout must be one of ['HWC', 'CHW'], got 'NHWC'")):
        with pytest.raises(OptionError) as caught:
            BenchOptions(**options)
        assert isinstance(caught.value, ValueError) and caught.value.message == message


# The advice itself is tested as a table of injected measurements in test_bench_advice.py.


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")
def test_proc_accounting_of_a_child_process() -> None:
    child = subprocess.Popen([sys.executable, "-c",
                              "import time\nt=time.time()\nwhile time.time()-t<0.3: pass\n"
                              "time.sleep(30)"])
    try:
        time.sleep(0.6)
        assert child.pid in child_pids()
        used = process_cpu_seconds(child.pid)
        assert used is not None and 0.05 <= used <= 5
        assert run_queue_seconds(child.pid) is not None
        assert storage_read_bytes(child.pid) is not None and storage_read_bytes(os.getpid()) is not None
    finally:
        child.kill()
        child.wait()
    assert process_cpu_seconds(child.pid) is None


def test_without_torch_falls_back_to_the_in_process_loop(dataset: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    result = run_bench(dataset, BenchOptions(batch_size=4, batches=2, warmup=0, size=24,
                                             workers=2))
    assert result.loader == "simple" and result.workers == 0 and result.samples == 8
    assert any("torch is not installed" in note for note in result.notes)
    assert any("--workers 2 ignored" in note for note in result.notes)
    from packer.errors import MissingDependencyError
    with pytest.raises(MissingDependencyError, match="packer-shards\\[torch\\]"):
        run_bench(dataset, BenchOptions(batch_size=4, batches=1, warmup=0, loader="torch"))


def test_small_encoded_images_get_the_raw_codec_note_with_its_disk_cost(tmp_path: Path) -> None:
    import make_sample

    from packer.bench import raw_codec_note
    from packer.dataset import open_dataset

    make_sample.make_image_folder(tmp_path / "src", classes=2, per_class=10, seed=2, min_size=32,
                                  max_size=32, formats=("png",))
    build(tmp_path / "src", tmp_path / "small", BuildOptions(alignment=4096), workers=1, progress=False)
    with open_dataset(tmp_path / "small") as small:
        current = sum(shard.size for shard in small.manifest.shards)
        note = raw_codec_note(small)
    assert note is not None and "--codec raw --size 32x32" in note
    # 32*32*3 = 3072 bytes, which --alignment auto packs at 64 (whatever this dataset's alignment)
    assert "stores 3,072 bytes per image (--alignment auto packs them at 64 bytes)" in note
    assert f"{20 * 3072 / 1e6:,.1f} MB for 20 images" in note
    assert f"{20 * 3072 / current:.1f}x" in note
    _, document, stderr = run_cli(str(tmp_path / "small"), "--batches", "2", "--warmup", "0",
                                  "--batch-size", "4", "--loader", "simple", "--target-rate", "1e9")
    bench = document["bench"]
    assert any("--codec raw is the fast path" in item for item in bench["notes"])
    assert bench["size"] == [32, 32] and bench["image_size"] == [32, 32]  # cropped at the stored size
    assert bench["formats"] == {"png": 20} and bench["diagnosis"] is not None
    assert "--codec raw is the fast path" in stderr
    build(tmp_path / "src", tmp_path / "raw", BuildOptions(codec="raw:size=32x32"), workers=1, progress=False)
    with open_dataset(tmp_path / "raw") as raw:
        assert raw_codec_note(raw) is None
    with open_dataset(dataset_path_large(tmp_path)) as large:
        assert raw_codec_note(large) is None


def dataset_path_large(tmp_path: Path) -> Path:
    import make_sample

    make_sample.make_image_folder(tmp_path / "large-src", classes=1, per_class=3, seed=2, min_size=200,
                                  max_size=200, formats=("jpeg",))
    build(tmp_path / "large-src", tmp_path / "large", BuildOptions(), workers=1, progress=False)
    return tmp_path / "large"


def test_raw_datasets_are_cropped_at_their_stored_size_and_upsampling_is_flagged(tmp_path: Path) -> None:
    import make_sample

    make_sample.make_image_folder(tmp_path / "src", classes=2, per_class=10, seed=2, min_size=40, max_size=40,
                                  formats=("png",))
    build(tmp_path / "src", tmp_path / "raw", BuildOptions(codec="raw:size=24x32"), workers=1, progress=False)
    quiet = run_bench(tmp_path / "raw", BenchOptions(batch_size=4, batches=2, warmup=0, loader="simple"))
    assert quiet.size == [24, 32] and quiet.codec == "raw" and quiet.formats == {"raw": 20}
    assert not any("upsampling" in note for note in quiet.notes)
    _, document, stderr = run_cli(str(tmp_path / "raw"), "-b", "4", "-n", "2", "--warmup", "0", "--loader", "simple",
                                  "--size", "224")
    assert document["bench"]["size"] == [224, 224]
    assert any("--size 224 is larger than the stored images (median 24x32" in note
               for note in document["bench"]["notes"])
    assert "decode      rrc 224x224" in stderr


def test_the_in_process_loop_decodes_raw_pixels_and_refuses_an_unknown_codec(tmp_path: Path) -> None:
    """The loop asks the codec, as the readers do: raw payloads are pixels (--decode full read
    none of them before), and a codec this packer does not know is refused when the loop opens."""
    import shutil

    from helpers import edit_manifest, png_folder
    from packer.errors import DecodeError

    build(png_folder(tmp_path / "src", 6), tmp_path / "raw", BuildOptions(codec="raw:size=6x5"), workers=1,
          progress=False)
    for decode in ("full", "rrc", "none"):
        result = run_bench(tmp_path / "raw", BenchOptions(batch_size=3, batches=2, warmup=0, decode=decode,
                                                          loader="simple"))
        assert result.samples == 6 and result.codec == "raw"
    unknown = Path(shutil.copytree(tmp_path / "raw", tmp_path / "unknown"))
    edit_manifest(unknown, lambda document: document.update(codec={"name": "zstd-future"}))
    for decode in ("full", "rrc"):
        with pytest.raises(DecodeError) as caught:
            run_bench(unknown, BenchOptions(batch_size=3, batches=1, warmup=0, decode=decode, loader="simple"))
        assert caught.value.message.startswith("the dataset's codec 'zstd-future' is not one this packer can decode "
                                               "(it knows jpeg, passthrough, raw, tiled)")
    assert run_bench(unknown, BenchOptions(batch_size=3, batches=1, warmup=0, decode="none", loader="simple")).samples == 3


def test_the_default_size_never_upsamples(tmp_path: Path) -> None:
    import make_sample

    from packer.bench import default_size
    from packer.dataset import open_dataset

    for side, expected in ((240, (224, 224)), (200, (200, 200))):
        make_sample.make_image_folder(tmp_path / f"src{side}", classes=1, per_class=3, seed=2, min_size=side,
                                      max_size=side, formats=("jpeg",))
        build(tmp_path / f"src{side}", tmp_path / f"ds{side}", BuildOptions(), workers=1, progress=False)
        with open_dataset(tmp_path / f"ds{side}") as ds:
            assert default_size(ds) == expected


def test_a_dataset_smaller_than_a_batch_is_flagged(dataset: Path) -> None:
    _, document, stderr = run_cli(str(dataset), "-b", "256", "-n", "2", "--warmup", "0", "--loader", "simple",
                                  "--size", "16")
    bench = document["bench"]
    assert bench["samples"] == 48  # two "batches" of the whole 24-sample dataset
    assert any(note.startswith("the dataset holds 24 samples, fewer than one batch of 256") for note in bench["notes"])
    assert "fewer than one batch of 256" in stderr


def test_children_from_before_the_run_are_not_counted_as_workers(dataset: Path) -> None:
    pytest.importorskip("torch")
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        result = run_bench(dataset, BenchOptions(batch_size=4, batches=2, warmup=1, workers=1))
    finally:
        bystander.kill()
        bystander.wait()
    assert result.worker_cpu is not None and len(result.worker_cpu) == 1
