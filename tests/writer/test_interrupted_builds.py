"""Interrupted and failing builds: SIGKILL at many points, --resume, full disk, bad sources, locks.

Kill trials run the build in a forked child that SIGKILLs itself at a chosen call of a chosen
function (listing a folder, packing a file, every rename, fsync, cleanup): deterministic points,
robust to a slow machine. A few trials also kill the real CLI from outside after a random delay.
After every kill the output folder either does not open (a typed ``PackerError``) or opens as a
complete dataset that reads back correct bytes; ``--resume`` then ends byte-identical to an
uninterrupted build, with no stale file left.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

import packer.writer.commit as commit_module
import packer.writer.pack as pack_module
import packer.writer.records as records_module
import packer.writer.run as run_module
import packer.writer.staging as staging_module
from packer import format as fmt
from packer.dataset import open_dataset
from packer.errors import (BuildError, BuildLockedError, NotAPackerFileError, OptionError, OutputExistsError,
                           PackerError)
from packer.verify import verify
from packer.writer import build
from packer.writer.pack import pack_planned_shard
from packer.writer.plan import load_plan
from packer.writer.records import read_record, record_path
from packer.writer.staging import PLAN_NAME, STAGING_DIR, build_lock
from packer import BuildSettings, LayoutSettings, RunOptions

from helpers import make_png_classes

OPTIONS = BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=16 << 10))
REPO = Path(__file__).resolve().parents[2]
#: Trial counts, printed at the end of the module (run with -s to see them).
TRIALS: dict[str, int] = {}


def _count(name: str, n: int = 1) -> None:
    TRIALS[name] = TRIALS.get(name, 0) + n


@pytest.fixture(scope="module", autouse=True)
def _print_trial_counts():
    yield
    print("\nreliability/build trials:", json.dumps(TRIALS, sort_keys=True))


# --- sources and references ---------------------------------------------------------------------

def make_source(root: Path, *, classes: int = 3, per_class: int = 6, seed: int = 0) -> Path:
    """Small random PNGs (0.5-5 KB): with 16 KiB shards, about 7 shards for 18 files."""
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            h, w = (int(v) for v in rng.integers(8, 40, 2))
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"img{i:02d}.png")
    return root


def tree(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` (relative path -> bytes), but the lock file."""
    return {p.relative_to(out).as_posix(): p.read_bytes()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != staging_module.LOCK_NAME}


def dataset_samples(path: Path) -> dict[str, bytes]:
    """key -> bytes of every sample, read with checksum verification."""
    with open_dataset(path, verify_checksums=True) as ds:
        return {ds.key(i): ds.read(i) for i in range(len(ds))}


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Any]:
    """Two sources (A, B: same names, different pixels) and their uninterrupted builds."""
    base = tmp_path_factory.mktemp("sources")
    src_a = make_source(base / "a", seed=1)
    src_b = make_source(base / "b", seed=2)
    build(src_a, base / "ref_a", OPTIONS, RunOptions(workers=1))
    build(src_b, base / "ref_b", OPTIONS, RunOptions(workers=1))
    return {"a": src_a, "b": src_b, "tree_a": tree(base / "ref_a"), "tree_b": tree(base / "ref_b"),
            "samples_a": dataset_samples(base / "ref_a"), "samples_b": dataset_samples(base / "ref_b")}


# --- deterministic kill points ---------------------------------------------------------------------

def _kill_targets() -> dict[str, tuple[Any, str, str]]:
    import packer.sources.folder as sources_module
    return {
        "listing": (sources_module, "_sorted_entries", "before"),   # reading a folder while listing
        "pack-file": (pack_module, "_load_and_check", "before"),   # mid-shard: temp partly written
        "shard-hash": (pack_module, "_hash_file", "before"),       # temp complete, not renamed
        "shard-record": (pack_module, "write_record", "before"),  # shard renamed, no record yet
        "rename": (os, "replace", "before"),                        # every rename: plan, shards, records, index, report, manifest
        "renamed": (os, "replace", "after"),                        # just after each rename
        "fsync": (os, "fsync", "before"),
        "cleanup": (commit_module, "_remove_unreferenced", "before"),  # committed, old files still there
        "rmtree": (shutil, "rmtree", "before"),                     # stale staging removal, start and end
    }


def _install_hook(point: str, kill_at: int, counts: dict[str, int] | None) -> None:
    """In the child: SIGKILL ourselves at call ``kill_at`` of ``point`` (or just count calls)."""
    targets = _kill_targets()
    names = [point] if counts is None else list(targets)
    for name in names:
        module, attribute, when = targets[name]
        original = getattr(module, attribute)
        calls = [0]

        def wrapper(*args: Any, _original: Callable[..., Any] = original, _calls: list[int] = calls,
                    _name: str = name, _when: str = when, **kwargs: Any) -> Any:
            _calls[0] += 1
            if counts is not None:
                counts[_name] = counts.get(_name, 0) + 1
            elif _when == "before" and _calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            result = _original(*args, **kwargs)
            if counts is None and _when == "after" and _calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return result

        setattr(module, attribute, wrapper)


def run_forked(body: Callable[[], Any], *, point: str | None = None, kill_at: int = 0,
               count_file: Path | None = None) -> int:
    """Run ``body`` in a forked child with a kill hook; returns the raw wait status."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        code = 0
        try:
            counts: dict[str, int] | None = {} if count_file is not None else None
            if point is not None or counts is not None:
                _install_hook(point or "", kill_at, counts)
            body()
            if count_file is not None:
                count_file.write_text(json.dumps(counts))
        except BaseException:  # noqa: BLE001 - report anything to the parent through the exit code
            traceback.print_exc()
            code = 70
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def killed(status: int) -> bool:
    return os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def check_after_kill(out: Path, allowed: list[dict[str, bytes]]) -> str:
    """The folder opens as one complete, verifying dataset of ``allowed`` (by samples), or not at all."""
    try:
        samples = dataset_samples(out)
    except NotAPackerFileError:
        assert not (out / fmt.MANIFEST_NAME).exists()
        return "no-dataset"
    except PackerError as exc:  # a typed error is acceptable, but only without a manifest
        pytest.fail(f"a folder with a manifest failed to open after a kill: {exc!r}")
    assert samples in allowed, "a killed build left a dataset that is not one of the complete ones"
    _verify_if_available(out)
    return f"dataset-{allowed.index(samples)}"


def _verify_if_available(out: Path) -> None:
    try:
        from packer.verify import verify
    except ImportError:
        return
    report = verify(out, workers=1, progress=False)
    assert report.ok, f"verify found damage in a committed dataset: {[str(p) for p in report.problems]}"


def _plan_kill_points(counts: dict[str, int], rng: random.Random) -> list[tuple[str, int]]:
    """A spread of (point, call number): every listing/cleanup call, a sample of the rest,
    always including the last few renames (index, report, manifest)."""
    points: list[tuple[str, int]] = []
    for name, total in sorted(counts.items()):
        if total == 0:
            continue
        calls = list(range(1, total + 1))
        if name in ("listing", "cleanup", "rmtree", "shard-record", "shard-hash"):
            chosen = calls if len(calls) <= 3 else sorted({1, total, *rng.sample(calls, 1)})
        elif name in ("rename", "renamed"):
            chosen = sorted({1, 2, 3, *calls[-4:], *rng.sample(calls, min(3, total))})
        else:
            chosen = sorted({1, total, *rng.sample(calls, min(2, total))})
        points += [(name, n) for n in chosen]
    return points


@pytest.mark.parametrize("scenario", ["fresh", "overwrite"])
def test_sigkill_at_every_stage_then_resume(sources, tmp_path, scenario):
    """SIGKILL at many points of a build (listing, packing, finishing, cleanup), fresh or replacing a
    dataset: the folder never opens as anything but a complete dataset, and --resume ends
    byte-identical to an uninterrupted build, reusing finished shards, with no stale file."""
    overwrite = scenario == "overwrite"
    src = sources["b"]

    def prepare(out: Path) -> None:
        if out.exists():
            shutil.rmtree(out)
        if overwrite:  # an existing, different dataset A is being replaced by B
            shutil.copytree(_ref_dir(sources, "a", tmp_path), out)

    # Count the calls of an uninterrupted build once, then kill at a spread of them.
    count_file = tmp_path / "counts.json"
    out = tmp_path / "out"
    prepare(out)
    status = run_forked(lambda: build(src, out, OPTIONS, RunOptions(workers=1, overwrite=overwrite)),
                        count_file=count_file)
    assert status == 0
    counts = json.loads(count_file.read_text())
    assert counts["pack-file"] == 18 and counts["rename"] > 10
    points = _plan_kill_points(counts, random.Random(f"kill-{scenario}"))
    allowed = [sources["samples_b"]] + ([sources["samples_a"]] if overwrite else [])
    outcomes: dict[str, int] = {}
    reused_total = 0
    for point, kill_at in points:
        prepare(out)
        status = run_forked(lambda: build(src, out, OPTIONS, RunOptions(workers=1, overwrite=overwrite)),
                            point=point, kill_at=kill_at)
        assert killed(status), f"{point}#{kill_at}: the child was not killed (status {status})"
        state = check_after_kill(out, allowed)
        outcomes[state] = outcomes.get(state, 0) + 1
        shards_before = _finished_shard_inodes(out)
        result = build(src, out, OPTIONS, RunOptions(workers=1, overwrite=overwrite, resume=True))
        assert result is not None and result.sample_count == 18
        after = tree(out)
        assert after == sources["tree_b"], (
            f"{scenario} {point}#{kill_at}: resume differs from an uninterrupted build: "
            f"extra {sorted(set(after) - set(sources['tree_b']))}, "
            f"missing {sorted(set(sources['tree_b']) - set(after))}")
        reused = {name for name, inode in shards_before.items()
                  if (out / name).exists() and (out / name).stat().st_ino == inode}
        assert reused == set(shards_before), f"{point}#{kill_at}: finished shards were packed again"
        reused_total += len(reused)
    _count(f"sigkill-{scenario}", len(points))
    _count(f"sigkill-{scenario}-resume-identical", len(points))
    _count(f"sigkill-{scenario}-shards-reused", reused_total)
    for state, n in outcomes.items():
        _count(f"sigkill-{scenario}-state-{state}", n)
    assert len(points) >= 20
    assert "no-dataset" in outcomes or overwrite
    assert reused_total > 0


def _ref_dir(sources: dict[str, Any], which: str, tmp_path: Path) -> Path:
    """Materialise reference tree ``which`` as a folder (for copying into an output)."""
    folder = tmp_path / f"ref_{which}"
    if not folder.exists():
        for name, data in sources[f"tree_{which}"].items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_bytes(data)
    return folder


def _finished_shard_inodes(out: Path) -> dict[str, int]:
    """Shards that a valid record of the saved plan vouches for (what --resume must reuse)."""
    plan_path = out / staging_module.STAGING_DIR / staging_module.PLAN_NAME
    if not plan_path.exists():
        return {}
    from packer.writer.plan import load_plan
    plan = load_plan(plan_path, out)
    found = {}
    for shard in range(plan.shard_count):
        record = records_module.read_record(records_module.record_path(out, shard), plan.fingerprint, out)
        if record is not None and record[0]["sample_count"]:
            found[record[0]["path"]] = (out / record[0]["path"]).stat().st_ino
    return found


def test_sigkill_during_resume_then_resume_again(sources, tmp_path):
    """A resume that is itself killed can be resumed again, still ending byte-identical."""
    src, out = sources["b"], tmp_path / "out"
    trials = 0
    for first, second in [(("pack-file", 5), ("pack-file", 3)), (("rename", 6), ("renamed", 4)),
                          (("shard-record", 3), ("cleanup", 1)), (("pack-file", 12), ("rename", 9))]:
        shutil.rmtree(out, ignore_errors=True)
        assert killed(run_forked(lambda: build(src, out, OPTIONS, RunOptions(workers=1)),
                                 point=first[0], kill_at=first[1]))
        status = run_forked(lambda: build(src, out, OPTIONS, RunOptions(workers=1, resume=True)),
                            point=second[0], kill_at=second[1])
        assert killed(status) or status == 0
        check_after_kill(out, [sources["samples_b"]])
        build(src, out, OPTIONS, RunOptions(workers=1, overwrite=True, resume=True))
        assert tree(out) == sources["tree_b"]
        trials += 1
    _count("sigkill-resume-twice", trials)


def test_plain_rebuild_after_kill_starts_over_cleanly(sources, tmp_path):
    """Without --resume, a build into a killed build's folder starts over and leaves no stale file."""
    src, out = sources["b"], tmp_path / "out"
    assert killed(run_forked(lambda: build(src, out, OPTIONS, RunOptions(workers=1)),
                             point="shard-record", kill_at=4))
    build(src, out, OPTIONS, RunOptions(workers=1))
    assert tree(out) == sources["tree_b"]


def test_resume_after_commit_cleans_up(sources, tmp_path):
    """Killed after the manifest landed but before cleanup: the dataset is complete; --resume (with
    or without --overwrite) only finishes the cleanup."""
    src, out = sources["b"], tmp_path / "out"
    assert killed(run_forked(lambda: build(src, out, OPTIONS, RunOptions(workers=1)),
                             point="cleanup", kill_at=1))
    assert (out / staging_module.STAGING_DIR).exists()
    assert dataset_samples(out) == sources["samples_b"]
    build(src, out, OPTIONS, RunOptions(workers=1, resume=True))
    assert tree(out) == sources["tree_b"]


def test_resume_with_other_options_is_refused(sources, tmp_path):
    src, out = sources["b"], tmp_path / "out"
    assert killed(run_forked(lambda: build(src, out, OPTIONS, RunOptions(workers=1)),
                             point="pack-file", kill_at=6))
    with pytest.raises(OptionError, match="different options.*--shard-size: saved 16384, asked 32768"):
        build(src, out, BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=32 << 10)), RunOptions(workers=1, resume=True))
    assert not (out / fmt.MANIFEST_NAME).exists()


# --- external SIGKILL of the real CLI, with worker processes ----------------------------------------

def _cli(*args: str, **kwargs: Any) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "packer", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, **kwargs)


def test_sigkill_cli_from_outside(sources, tmp_path):
    """The real ``packer build`` with 2 worker processes, SIGKILLed from outside (the parent only, as
    the OOM killer would) while starting and at fractions of the packing time after its plan file
    appears: never a half dataset; the orphaned workers exit and release the lock; --resume ends
    byte-identical."""
    src = make_source(tmp_path / "src", classes=4, per_class=40, seed=3)
    reference = tmp_path / "ref"
    build(src, reference, OPTIONS, RunOptions(workers=1))
    want = tree(reference)
    want_samples = dataset_samples(reference)
    plan_file = Path(staging_module.STAGING_DIR) / staging_module.PLAN_NAME

    def wait_for(path: Path, process: subprocess.Popen) -> float:
        started = time.monotonic()
        while not path.exists() and process.poll() is None:
            time.sleep(0.002)
        return time.monotonic() - started

    # Measure how long packing and finishing take (from the plan file to the manifest) once.
    probe_out = tmp_path / "timing"
    probe = _cli("build", str(src), str(probe_out), "--shard-size", "16K", "--alignment", "4096", "--workers", "2", "-q")
    wait_for(probe_out / plan_file, probe)
    pack_time = wait_for(probe_out / fmt.MANIFEST_NAME, probe)
    assert probe.wait(timeout=120) == 0, probe.stderr.read().decode()
    outcomes: dict[str, int] = {}
    fractions = [None, 0.0, 0.15, 0.3, 0.5, 0.7, 0.9, 1.05]  # None: while starting or listing
    trials = len(fractions)
    for trial, fraction in enumerate(fractions):
        out = tmp_path / f"out{trial}"
        process = _cli("build", str(src), str(out), "--shard-size", "16K", "--alignment", "4096", "--workers", "2", "-q")
        if fraction is None:
            time.sleep(0.05)
        else:
            wait_for(out / plan_file, process)
            time.sleep(fraction * pack_time)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        state = check_after_kill(out, [want_samples]) if out.exists() else "no-folder"
        outcomes[state] = outcomes.get(state, 0) + 1
        deadline = time.monotonic() + 20
        while True:  # orphaned pool workers hold the inherited lock until they notice and exit
            try:
                build(src, out, OPTIONS, RunOptions(workers=2, overwrite=True, resume=True))
                break
            except BuildLockedError:
                assert time.monotonic() < deadline, "the lock of a killed build was never released"
                time.sleep(0.1)
        assert tree(out) == want
    _count("sigkill-cli-external", trials)
    for state, n in outcomes.items():
        _count(f"sigkill-cli-external-state-{state}", n)


# --- full disk, unwritable output, changing and unreadable sources ------------------------------------

class _FullDisk:
    """A file object that accepts ``budget`` more bytes in total, then fails with ENOSPC."""

    def __init__(self, handle: Any, budget: list[int]) -> None:
        self._handle = handle
        self._budget = budget

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        if size > self._budget[0]:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._budget[0] -= size
        return self._handle.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)

    def __enter__(self) -> "_FullDisk":
        return self

    def __exit__(self, *exc: object) -> None:
        self._handle.close()


def _inject_full_disk(monkeypatch: pytest.MonkeyPatch, budget: int) -> None:
    import builtins

    import packer._internal.atomic as atomic_module
    import packer.writer.plan as plan_module
    left = [budget]
    real_open = builtins.open

    def fake_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        handle = real_open(file, mode, *args, **kwargs)
        return _FullDisk(handle, left) if any(c in mode for c in "wax+") else handle

    monkeypatch.setattr(pack_module, "open", fake_open, raising=False)
    monkeypatch.setattr(plan_module, "open", fake_open, raising=False)
    monkeypatch.setattr(atomic_module, "open", fake_open, raising=False)


def _stray_temps(out: Path) -> list[str]:
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*")
                  if p.is_file() and (p.name.endswith((".tmp", ".partial"))))


@pytest.mark.parametrize("scenario", ["fresh", "overwrite"])
def test_disk_full_injected_at_every_stage(sources, tmp_path, monkeypatch, scenario):
    """ENOSPC injected after N bytes (plan, shards, records, index, report, manifest): a BuildError
    saying the disk is full, no half dataset (the old one stays intact), no temp file; after space
    is freed --resume ends byte-identical."""
    src = sources["b"]
    total = sum(len(v) for k, v in sources["tree_b"].items())
    budgets = sorted({0, 100, 2000, 5000, 20000, 40000, 60000, 80000, total - 6000, total - 3000,
                      total - 500, total - 100})
    outcomes: dict[str, int] = {}
    for budget in budgets:
        out = tmp_path / f"out{budget}"
        if scenario == "overwrite":
            shutil.copytree(_ref_dir(sources, "a", tmp_path), out)
        with monkeypatch.context() as patch:
            _inject_full_disk(patch, budget)
            try:
                build(src, out, OPTIONS, RunOptions(workers=1, overwrite=scenario == "overwrite"))
                outcome = "completed"
            except BuildError as exc:
                assert "disk is full" in str(exc), exc
                outcome = "disk-full"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        if outcome == "disk-full":
            assert _stray_temps(out) == []
            state = check_after_kill(out, [sources["samples_b"], sources["samples_a"]])
            assert state == ("dataset-1" if scenario == "overwrite" else "no-dataset")
        build(src, out, OPTIONS, RunOptions(workers=1, overwrite=True, resume=True))
        assert tree(out) == sources["tree_b"]
    _count(f"enospc-injected-{scenario}", len(budgets))
    assert outcomes.get("disk-full", 0) >= len(budgets) - 2


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 192 KiB tmpfs (root only; skipped where mounting is not allowed)."""
    if not _can_mount():
        pytest.skip("needs root to mount a tmpfs")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=192k", "tmpfs", str(mount)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_real_tmpfs(sources, tmp_path, small_tmpfs):
    """A real ENOSPC on a small tmpfs, from the CLI: exit code 3, a clear message, no dataset, no
    temp file; then --resume on a bigger disk (same folder, copied) completes identically."""
    src = make_source(tmp_path / "big", classes=4, per_class=30, seed=4)  # ~120 files x 4-8 KiB on disk
    out = small_tmpfs / "out"
    done = subprocess.run([sys.executable, "-m", "packer", "build", str(src), str(out), "--shard-size", "16K", "--alignment", "4096",
                           "--workers", "1", "-q"], cwd=REPO, capture_output=True, timeout=120)
    stderr = done.stderr.decode()
    assert done.returncode == 3, stderr
    assert "disk is full" in stderr and "Traceback" not in stderr
    assert not (out / fmt.MANIFEST_NAME).exists() and _stray_temps(out) == []
    with pytest.raises(NotAPackerFileError):
        open_dataset(out)
    moved = tmp_path / "moved"
    shutil.copytree(out, moved)
    build(src, moved, OPTIONS, RunOptions(workers=1, resume=True))
    reference = tmp_path / "ref"
    build(src, reference, OPTIONS, RunOptions(workers=1))
    assert tree(moved) == tree(reference)
    _count("enospc-tmpfs", 1)


def test_unwritable_output_folder(sources, tmp_path):
    """An output on a read-only file system (or a folder without write permission): a clear
    BuildError before any work, exit code 3 from the CLI, nothing written."""
    src = sources["b"]
    if os.geteuid() == 0:
        if not _can_mount():
            pytest.skip("needs root to mount a read-only bind")
        target = tmp_path / "ro"
        target.mkdir()
        done = subprocess.run(["mount", "--bind", str(target), str(target)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot bind-mount here: {done.stderr.decode().strip()}")
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True, capture_output=True)
            _check_unwritable(src, target / "out", target)
        finally:
            subprocess.run(["umount", "-l", str(target)], check=False)
    else:
        target = tmp_path / "ro"
        target.mkdir()
        target.chmod(0o555)
        try:
            _check_unwritable(src, target / "out", target)
        finally:
            target.chmod(0o755)


def _check_unwritable(src: Path, out: Path, parent: Path) -> None:
    with pytest.raises(BuildError, match="permission denied|not writable|read-only"):
        build(src, out, OPTIONS, RunOptions(workers=1))
    done = subprocess.run([sys.executable, "-m", "packer", "build", str(src), str(out), "-q"], cwd=REPO,
                          capture_output=True, timeout=120)
    assert done.returncode == 3 and "Traceback" not in done.stderr.decode(), done.stderr.decode()
    assert list(parent.iterdir()) == []
    _count("unwritable-output", 2)


def test_existing_output_folder_read_only(sources, tmp_path):
    """The output folder exists (with a dataset) but is not writable: refused, dataset intact."""
    out = _ref_dir(sources, "a", tmp_path)
    before = tree(out)
    if os.geteuid() == 0:
        if not _can_mount():
            pytest.skip("needs root to mount a read-only bind")
        done = subprocess.run(["mount", "--bind", str(out), str(out)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot bind-mount here: {done.stderr.decode().strip()}")
        try:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(out)], check=True, capture_output=True)
            with pytest.raises(BuildError):
                build(sources["b"], out, OPTIONS, RunOptions(workers=1, overwrite=True))
        finally:
            subprocess.run(["umount", "-l", str(out)], check=False)
    else:
        out.chmod(0o555)
        try:
            with pytest.raises(BuildError):
                build(sources["b"], out, OPTIONS, RunOptions(workers=1, overwrite=True))
        finally:
            out.chmod(0o755)
    assert tree(out) == before


def _report(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / fmt.REPORT_NAME).read_text().splitlines()]


def test_source_vanishes_or_changes_during_build(tmp_path, monkeypatch):
    """Files deleted or resized between listing and packing are rejected with a reason (missing,
    changed-during-build); the build completes and its report accounts for every file."""
    src = make_source(tmp_path / "src", seed=7)
    real_run_shards = run_module.run_shards

    def mutate_then_pack(*args: Any, **kwargs: Any) -> None:
        (src / "class0" / "img01.png").unlink()
        with open(src / "class1" / "img02.png", "ab") as handle:
            handle.write(b"\0" * 10)
        (src / "class2" / "img03.png").write_bytes(b"")  # truncated to nothing
        real_run_shards(*args, **kwargs)

    monkeypatch.setattr(run_module, "run_shards", mutate_then_pack)
    result = build(src, tmp_path / "out", OPTIONS, RunOptions(workers=1))
    reasons = {r.key: r.reason for r in result.rejected}
    assert reasons == {"class0/img01.png": "missing", "class1/img02.png": "changed-during-build",
                       "class2/img03.png": "changed-during-build"}
    assert result.sample_count == 15
    report = _report(tmp_path / "out")
    assert report[0]["source_files"] == 18 and report[0]["packed"] == 15 and report[0]["rejected"] == 3
    assert {r["key"]: r["reason"] for r in report[1:]} == reasons
    samples = dataset_samples(tmp_path / "out")
    for key, data in samples.items():
        assert (src / key).read_bytes() == data
    _count("source-vanished-or-changed", 3)


def test_source_changes_while_workers_pack(tmp_path):
    """Same, with worker processes and the files changed by another process mid-build."""
    src = make_source(tmp_path / "src", classes=4, per_class=30, seed=8)
    victims = sorted(src.rglob("*.png"))[::7]
    out = tmp_path / "out"
    process = _cli("build", str(src), str(out), "--shard-size", "16K", "--alignment", "4096", "--workers", "2", "-q", "--json")
    for path in victims:  # while it runs: some before listing, some during packing, some after
        path.unlink()
        time.sleep(0.005)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 0, stderr.decode()
    summary = json.loads(stdout)
    report = _report(out)
    rejected = {r["key"]: r["reason"] for r in report[1:]}
    assert set(rejected.values()) <= {"missing", "changed-during-build"}
    victim_keys = {p.relative_to(src).as_posix() for p in victims}
    packed = set(dataset_samples(out))
    assert not packed & set(rejected)
    assert set(rejected) <= victim_keys
    survivors = {p.relative_to(src).as_posix() for p in src.rglob("*.png")}
    assert survivors <= packed  # every file that stayed is packed
    assert packed | set(rejected) <= survivors | victim_keys
    assert summary["samples"] + summary["rejected"] == report[0]["source_files"]
    _count("source-vanished-during-cli-build", len(victims))


def test_unreadable_source_file_injected(tmp_path, monkeypatch):
    """Permission denied on a source file (injected: root reads anything): rejected as unreadable."""
    src = make_source(tmp_path / "src", seed=9)
    import packer._internal.files as files_module

    real_open = files_module.open_nonblocking  # the one place packing opens a source file (FolderReader)
    victim = str(src / "class1" / "img04.png")

    def fake_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        # by its path, or by its name beside a folder handle (FolderReader's way)
        if str(file) == victim or (kwargs.get("dir_fd") is not None and str(file) == "img04.png"):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(files_module, "open_nonblocking", fake_open)
    result = build(src, tmp_path / "out", OPTIONS, RunOptions(workers=1))
    assert [(r.key, r.reason) for r in result.rejected] == [("class1/img04.png", "unreadable")]
    assert result.sample_count == 17
    _count("source-unreadable-injected", 1)


def test_unreadable_source_file_real(tmp_path):
    """A real chmod 000 source file, the build run as an unprivileged user (root reads anything)."""
    import tempfile
    work = Path(tempfile.mkdtemp(prefix="packer-perm-"))
    try:
        work.chmod(0o777)
        src = make_source(work / "src", seed=10)
        secret = src / "class2" / "img00.png"
        secret.chmod(0o000)
        locked_dir = src / "class1" / "sub"
        locked_dir.mkdir()
        Image.new("RGB", (4, 4)).save(locked_dir / "x.png")
        locked_dir.chmod(0o000)
        for path in [work, *work.rglob("*")]:
            if path not in (secret, locked_dir) and not path.is_relative_to(locked_dir):
                path.chmod(0o777 if path.is_dir() else 0o644)
        command = [sys.executable, "-m", "packer", "build", str(src), str(work / "out"), "-q", "--json",
                   "--workers", "1"]
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("needs setpriv to drop root")
            command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
        done = subprocess.run(command, cwd=REPO, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr.decode()
        report = _report(work / "out")
        rejected = {r["key"]: r["reason"] for r in report[1:]}
        assert rejected == {"class2/img00.png": "unreadable", "class1/sub/": "unreadable"}
        assert json.loads(done.stdout)["samples"] == 17
        _count("source-unreadable-real", 2)
    finally:
        for path in [work, *work.rglob("*")] if work.exists() else []:
            try:
                path.chmod(0o777)
            except OSError:
                pass
        shutil.rmtree(work, ignore_errors=True)


# --- two builds into one output -------------------------------------------------------------------

def test_second_build_is_locked_out(sources, tmp_path):
    """While a build holds the folder, another is refused at once (library and CLI)."""
    out = tmp_path / "out"
    out.mkdir()
    with build_lock(out):
        with pytest.raises(BuildLockedError, match="another packer build"):
            build(sources["b"], out, OPTIONS, RunOptions(workers=1))
        done = subprocess.run([sys.executable, "-m", "packer", "build", str(sources["b"]), str(out), "-q"],
                              cwd=REPO, capture_output=True, timeout=120)
        assert done.returncode == 3 and "another packer build" in done.stderr.decode()
    assert not (out / fmt.MANIFEST_NAME).exists()
    build(sources["b"], out, OPTIONS, RunOptions(workers=1))
    assert tree(out) == sources["tree_b"]


def test_build_finishing_between_check_and_lock_is_not_replaced(sources, tmp_path, monkeypatch):
    """A build that commits after our 'output exists?' check but before we get the lock must not be
    silently replaced without --overwrite."""
    out = tmp_path / "out"
    real_lock = run_module.build_lock
    raced = []

    def racing_lock(path: Path, **kwargs: Any) -> Any:
        if not raced:
            raced.append(True)
            assert run_forked(lambda: build(sources["a"], out, OPTIONS, RunOptions(workers=1))) == 0
        return real_lock(path, **kwargs)

    monkeypatch.setattr(run_module, "build_lock", racing_lock)
    with pytest.raises(OutputExistsError):
        build(sources["b"], out, OPTIONS, RunOptions(workers=1))
    assert tree(out) == sources["tree_a"]


def test_concurrent_cli_builds_never_mix(sources, tmp_path):
    """Two ``packer build --overwrite`` of different sources into one folder at the same moment,
    several times: each run either succeeds or fails with the lock error, and the folder always
    holds exactly one of the two datasets, complete."""
    trials = 4
    results: dict[str, int] = {}
    for trial in range(trials):
        out = tmp_path / f"out{trial}"
        processes = [_cli("build", str(sources[which]), str(out), "--shard-size", "16K", "--alignment", "4096", "--workers", "1",
                          "--overwrite", "-q") for which in ("a", "b")]
        for process in processes:
            _, stderr = process.communicate(timeout=120)
            if process.returncode == 0:
                results["ok"] = results.get("ok", 0) + 1
            else:
                assert process.returncode == 3 and b"another packer build" in stderr, stderr.decode()
                results["locked"] = results.get("locked", 0) + 1
        assert tree(out) in (sources["tree_a"], sources["tree_b"])
    _count("concurrent-builds", trials)
    for outcome, n in results.items():
        _count(f"concurrent-builds-{outcome}", n)


# --- build resume: a finished shard whose file was truncated is packed again ----------------------


def test_resume_repacks_a_finished_shard_whose_file_was_truncated(tmp_path: Path) -> None:
    """Mutant: ``read_record`` no longer compares the shard file's size with its record."""
    src, out = make_png_classes(tmp_path / "src"), tmp_path / "ds"
    options = BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=16 << 10))
    build(src, out, options, RunOptions(workers=1, part=(0, 1)))  # every shard packed, no manifest
    plan = load_plan(out / STAGING_DIR / PLAN_NAME, src)
    assert plan.shard_count >= 2
    header, _ = read_record(record_path(out, 1), plan.fingerprint, out)
    shard = out / header["path"]
    full_size = shard.stat().st_size
    assert full_size == header["size"]
    with open(shard, "r+b") as handle:  # a crash or a full disk cut it short after its record landed
        handle.truncate(full_size - 4096)
    assert read_record(record_path(out, 1), plan.fingerprint, out) is None

    result = build(src, out, options, RunOptions(workers=1, resume=True))
    assert result.sample_count == 10
    report = verify(out, progress=False, workers=1)
    assert report.ok, report.problems
    assert shard.stat().st_size == full_size  # packed again: same plan, same bytes, same name


def test_a_record_of_a_truncated_shard_is_redone_by_pack(tmp_path: Path) -> None:
    src, out = make_png_classes(tmp_path / "src"), tmp_path / "ds"
    build(src, out, BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=16 << 10)), RunOptions(workers=1, part=(0, 1)))
    plan = load_plan(out / STAGING_DIR / PLAN_NAME, src)
    header, _ = read_record(record_path(out, 0), plan.fingerprint, out)
    shard = out / header["path"]
    shard.write_bytes(shard.read_bytes()[:-1])  # one byte short is as bad as half
    again = pack_planned_shard(plan, out, 0)
    assert again["size"] == header["size"] == shard.stat().st_size
    # and a shard file one byte too long is not trusted either
    with open(shard, "ab") as handle:
        handle.write(b"\0")
    assert read_record(record_path(out, 0), plan.fingerprint, out) is None


def test_ctrl_c_during_a_pool_build_leaves_the_pool_threads_quiet(tmp_path, monkeypatch):
    # Ctrl-C while shards are queued: the local engine terminates its workers and lets the broken
    # pool fail the pending futures. Cancelling them first made Python 3.11's pool manager thread
    # die with InvalidStateError, a traceback printed above "interrupted" (about 1 run in 4).
    import threading

    import packer.writer.engines.local as local_module
    from helpers import noisy_png_classes

    src = noisy_png_classes(tmp_path / "src", classes=4, per_class=40)
    thread_errors: list[str] = []
    monkeypatch.setattr(threading, "excepthook",
                        lambda args: thread_errors.append(f"{args.thread.name}: {args.exc_type.__name__}"))

    delay = [0.0]

    def interrupted_wait(*args: Any, **kwargs: Any) -> Any:
        time.sleep(delay[0])  # the workers have taken some tasks, others wait in the queue
        raise KeyboardInterrupt

    monkeypatch.setattr(local_module, "wait", interrupted_wait)
    for trial in range(20):
        delay[0] = 0.004 * (trial % 5)
        with pytest.raises(KeyboardInterrupt):
            build(src, tmp_path / f"out{trial}", BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=16 * 1024)), RunOptions(workers=2))
    assert thread_errors == []
