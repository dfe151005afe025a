"""``packer bench``'s diagnosis and advice as a table: synthetic measurements (injected, so no timing
can make a row flaky) of each situation a user meets, and the advice line each must get (and the
lines it must not: no nvJPEG for raw pixels, no ``--codec tiled`` for PNGs, no "wait on reads" for
workers that waited for a CPU)."""

from __future__ import annotations

from typing import Any

import pytest

from packer.bench import DIAGNOSES, BenchOptions, BenchResult, advise, diagnose, format_report

IDLE = dict(worker_cpu=[0.15] * 8, worker_wait=[0.0] * 8, storage_bytes=1_300_000_000)  # blocked on reads
BUSY = dict(worker_cpu=[0.95] * 8, worker_wait=[0.02] * 8)
JPEG = dict(codec="passthrough", formats={"jpeg": 1000}, image_size=[375, 500], size=[224, 224])
RAW32 = dict(codec="raw", formats={"raw": 1000}, image_size=[32, 32], size=[32, 32])


def measured(**changes: Any) -> BenchResult:
    """One run's measurement: 8 workers on 8 cores reading 1,000 ImageNet-like JPEGs at 1,000
    samples/s for a model that needs 1,000/s (so 1,500/s with headroom)."""
    base: dict[str, Any] = dict(dataset="ds", num_samples=1000, loader="torch", options={}, workers=8, cores=8,
                                samples=12800, batches=50, payload_bytes=1_400_000_000, seconds=12.8,
                                samples_per_s=1000.0, mb_per_s=110.0, main_cpu=0.1, main_wait=0.0,
                                target_rate=1000.0, **BUSY, **JPEG)
    base.update(changes)
    return BenchResult(**base)


IDLE_SIX = dict(num_samples=300, workers=8, cores=2, worker_cpu=[0.94, 0.19] + [0.01, 0.0] * 3,
                worker_wait=[0.02] * 2 + [0.0] * 6, batches_per_epoch=2, idle_workers=6,
                options={"batch_size": 256})  # the run of issue 39: worker 0 made the 256-sample batches
OVERSUBSCRIBED = dict(workers=8, cores=2, worker_cpu=[0.24] * 6 + [0.01, 0.0], worker_wait=[0.72] * 6 + [0.0, 0.0])

# (situation, measurement, options, expected diagnosis, an advice line that must be there, words that must not)
TABLE = [
    ("CPU-bound JPEG decode (random crops of pass-through JPEGs)", measured(), BenchOptions(decode="rrc"),
     "cpu-bound", "rebuild with --codec tiled", ("wait on reads", "use at most", "use more workers")),
    ("CPU-bound JPEG decode: nvJPEG", measured(), BenchOptions(decode="rrc"),
     "cpu-bound", "decode the JPEGs on the GPU with NVIDIA DALI (nvJPEG", ("most images are not JPEGs",)),
    ("CPU-bound with two idle workers: they do not pull the mean down",
     measured(worker_cpu=[0.95] * 6 + [0.0, 0.02], worker_wait=[0.02] * 6 + [0.0, 0.0]), BenchOptions(),
     "cpu-bound", "rebuild with --codec tiled", ("wait on reads",)),
    ("CPU-bound with idle cores", measured(workers=2, cores=8, worker_cpu=[0.98, 0.97], worker_wait=[0.0, 0.0]),
     BenchOptions(), "cpu-bound", "use more workers: the 2 process(es) are CPU-bound and only 2 of 8 cores are "
     "used; try --workers 3", ("use at most",)),
    ("tiny raw images in the page cache, nobody busy: the hand-off between processes",
     measured(**RAW32, worker_cpu=[0.47, 0.52], worker_wait=[0.2, 0.2], workers=2, cores=2, main_cpu=0.3,
              main_wait=0.3, storage_bytes=0), BenchOptions(), "handoff-bound",
     "read in the training process with packer.threaded.ThreadedLoader", ("wait on reads", "nvJPEG", "DALI")),
    ("I/O-bound cold reads, random order", measured(**IDLE), BenchOptions(order="random"),
     "read-bound", "the workers wait on reads: at 1,500 samples/s the loader needs about 164 MB/s and got "
     "110 MB/s", ("DALI", "--codec tiled", "use at most")),
    ("I/O-bound cold reads: the block shuffle", measured(**IDLE), BenchOptions(order="random"),
     "read-bound", "use the block shuffle (--order block)", ()),
    ("I/O-bound cold reads with O_DIRECT: the other backends", measured(**IDLE), BenchOptions(backend="direct"),
     "read-bound", "try another --backend (mmap, pread), or copy", ("warm the page cache",)),
    ("oversubscribed workers: 8 workers on 2 cores, two of them idle", measured(**OVERSUBSCRIBED), BenchOptions(),
     "oversubscribed", "use at most 2 workers: 8 workers on 2 core(s) waited for a CPU 75% of the time they "
     "were runnable", ("wait on reads", "use more workers", "--codec tiled")),
    ("oversubscribed with a busy main process", measured(**{**OVERSUBSCRIBED, "main_cpu": 0.8}), BenchOptions(),
     "oversubscribed", "use at most 1 worker:", ("wait on reads",)),
    ("cold reads on a shared machine: blocked most of the time, some waiting for a CPU",
     measured(workers=2, cores=2, worker_cpu=[0.28, 0.26], worker_wait=[0.15, 0.09], main_cpu=0.27, main_wait=0.45,
              storage_bytes=1_400_000_000),
     BenchOptions(decode="none"), "read-bound", "the workers wait on reads", ("other processes", "use at most")),
    ("contended: the run fits the cores, other processes take them",
     measured(workers=2, cores=4, worker_cpu=[0.5, 0.5], worker_wait=[0.45, 0.45]), BenchOptions(),
     "contended", "other processes use these cores", ("use at most", "wait on reads")),
    ("tiny raw images", measured(**RAW32), BenchOptions(decode="rrc"),
     "cpu-bound", "raw pixels are not decoded: the time goes to cropping and resizing each batch",
     ("nvJPEG", "DALI", "--codec tiled", "re-encode", "--codec raw")),
    ("tiny raw images upsampled by --size 224", measured(**{**RAW32, "size": [224, 224]}), BenchOptions(size=224),
     "cpu-bound", "crop at the stored size (leave --size out): 224x224 upsamples the 32x32 images",
     ("nvJPEG", "--codec tiled")),
    ("tiny raw images, bytes only", measured(**RAW32), BenchOptions(decode="none"),
     "cpu-bound", "raw pixels are not decoded: the time goes to moving batches", ("nvJPEG", "DALI")),
    ("small encoded PNGs", measured(codec="passthrough", formats={"png": 1000}, image_size=[32, 32], size=[32, 32]),
     BenchOptions(), "cpu-bound", "rebuild with --codec raw (small images", ("--codec tiled", "nvJPEG")),
    ("large PNGs", measured(codec="passthrough", formats={"png": 990, "jpeg": 10}, image_size=[375, 500]),
     BenchOptions(), "cpu-bound", "most images are not JPEGs (990 png, 10 jpeg): nvJPEG and --codec tiled are "
     "for JPEGs", ("rebuild with --codec tiled", "decode the JPEGs on the GPU")),
    ("tiled JPEGs already", measured(codec="tiled"), BenchOptions(), "cpu-bound", "nvJPEG", ("--codec tiled",)),
    ("full-size decode", measured(), BenchOptions(decode="full"), "cpu-bound", "decode with a fused transform",
     ("--codec tiled",)),
    ("small dataset: fewer samples than a batch", measured(num_samples=80, samples=4000), BenchOptions(batch_size=256),
     "cpu-bound", "the dataset holds 80 samples, fewer than one batch of 256: every timed \"batch\" was the whole "
     "dataset (80 samples)", ()),
    ("main process collating", measured(worker_cpu=[0.3] * 8, worker_wait=[0.0] * 8, main_cpu=0.95), BenchOptions(),
     "main-bound", "the main process is busy (collating batches)", ("wait on reads",)),
    ("in-process loop without torch", measured(loader="simple", workers=0, worker_cpu=None, worker_wait=None,
                                               main_cpu=0.99), BenchOptions(),
     "cpu-bound", "install torch (pip install 'packer-shards[torch]')", ("use more workers",)),
    ("8 workers on 300 samples in batches of 256: 2 batches an epoch, 6 workers never get one",
     measured(**IDLE_SIX), BenchOptions(batch_size=256),
     "cpu-bound", "6 of 8 workers sat idle: an epoch of 300 samples holds 2 batches of 256",
     ("use more workers", "wait on reads", "use at most")),
    ("idle workers while an epoch has batches for all: something else set the pace",
     measured(worker_cpu=[0.3, 0.3, 0.0, 0.0], worker_wait=[0.0] * 4, workers=4, main_cpu=0.95,
              batches_per_epoch=40, idle_workers=2), BenchOptions(),
     "main-bound", "2 of 4 workers sat idle (they ran less than 10% of the time): the other workers kept up", ()),
    ("ThreadedLoader on one of four cores", measured(loader="threaded", workers=0, threads=1, cores=4, worker_cpu=None,
                                                     worker_wait=None, main_cpu=0.98), BenchOptions(loader="threaded"),
     "cpu-bound", "use more threads: 1 thread(s) on 4 cores; try --workers 4", ("use more workers", "install torch")),
    ("tiny raw images in ThreadedLoader: no advice to measure what was measured",
     measured(**RAW32, loader="threaded", workers=0, threads=2, cores=2, worker_cpu=None, worker_wait=None,
              main_cpu=1.7), BenchOptions(loader="threaded"),
     "cpu-bound", "crop on the GPU with packer.gpu.GpuRawBatches", ("--loader threaded measures it",)),
]


@pytest.mark.parametrize("situation, result, options, diagnosis, line, absent", TABLE, ids=[row[0] for row in TABLE])
def test_advice_table(situation: str, result: BenchResult, options: BenchOptions, diagnosis: str, line: str,
                      absent: tuple[str, ...]) -> None:
    assert diagnose(result) == diagnosis
    advice = advise(result, options)
    assert advice[0].startswith("the loader delivers 1,000 samples/s")
    assert any(line in item for item in advice[1:]), advice
    for word in absent:
        assert not any(word in item for item in advice[1:]), (word, advice)


def test_the_limit_line_names_the_idle_workers() -> None:
    slow = measured(**{**IDLE_SIX, "options": {**BenchOptions().__dict__, "batch_size": 256}}, required_rate=1500.0,
                    meets_target=False)
    slow.diagnosis = diagnose(slow)
    slow.advice = advise(slow, BenchOptions())
    report = format_report(slow)
    assert "limit       cpu-bound: the workers computed all the time; 6 of 8 workers sat idle (see the note)" in report
    assert "- 6 of 8 workers sat idle" in report and "use --workers 2, or a smaller --batch-size" in report


def test_every_diagnosis_is_in_the_table() -> None:
    assert {row[3] for row in TABLE} == set(DIAGNOSES)


def test_no_advice_when_the_target_is_met_and_the_report_names_the_limit() -> None:
    fast = measured(samples_per_s=1600.0)
    assert advise(fast, BenchOptions()) == []
    slow = measured(**OVERSUBSCRIBED, options=BenchOptions().__dict__, meets_target=False, required_rate=1500.0)
    slow.diagnosis = diagnose(slow)
    slow.advice = advise(slow, BenchOptions())
    report = format_report(slow)
    assert "limit       oversubscribed: more runnable processes than cores" in report
    assert "- use at most 2 workers" in report and "TOO SLOW" in report
