"""Durability you can see: the fsync/rename order of every commit path, recorded and checked.

A power cut after ``os.replace`` can leave the new name pointing at bytes that never reached the
disk (unless the file was fsynced first), or lose the rename itself (unless the folder was
fsynced). Neither shows in a test that does not crash the machine, so these tests record every
``os.fsync`` (of a file or a folder, by inode) and every ``os.replace`` of a build and of an
append, and check the rules a crash-consistent commit needs:

1. **data before name**: the inode that a rename publishes was fsynced (after it was written)
   before the rename;
2. **every name is made durable before the next step**: each rename into folder D is followed
   by an fsync of D before the next rename, so after a power cut the disk holds a prefix of the
   steps, whatever the file system reorders;
3. **the shard before its record**: a shard's rename into ``shards/`` is durable (folder fsynced)
   before the shard's record is renamed into place (``--resume`` trusts records);
4. **the plan before any record**: the saved plan is durable before a record stamps its fingerprint;
5. **everything the manifest names before the manifest**: every shard and index rename into the
   dataset is durable before ``manifest.json`` is renamed (the commit point);
6. **the report after the commit is durable**: ``build-report.jsonl`` is replaced only after the
   folder was fsynced following the manifest (a crash never pairs a new report with an old manifest).

Each rule is also tested against the real trace with one fsync removed or two steps swapped.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from PIL import Image

import packer._internal.atomic as atomic
from packer import format as fmt
from packer.writer import build
from packer.writer.append import append
from packer._internal.atomic import fsync_dir, temp_name, write_atomic
from packer.writer.staging import PLAN_NAME, RECORD_DIR, STAGING_DIR
from packer import BuildSettings, LayoutSettings, RunOptions


@dataclass(frozen=True)
class Event:
    """One recorded step: ``fsync`` of ``path`` (inode ``inode``), or ``replace`` of src -> path."""

    op: str
    path: str
    inode: int
    is_dir: bool = False
    src: str = ""


class Tracer:
    """Records os.fsync and os.replace/os.rename in order (the build runs in this process: workers=1)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[Event] = []
        real_fsync, real_replace, real_rename = os.fsync, os.replace, os.rename

        def fsync(fd: int) -> None:
            info = os.fstat(fd)
            path = os.readlink(f"/proc/self/fd/{fd}")
            real_fsync(fd)
            self.events.append(Event("fsync", path, info.st_ino, stat.S_ISDIR(info.st_mode)))

        def replace(src: os.PathLike[str] | str, dst: os.PathLike[str] | str, *args: object, **kw: object) -> None:
            inode = os.stat(src).st_ino
            real_replace(src, dst, *args, **kw)
            self.events.append(Event("replace", os.path.abspath(dst), inode, src=os.path.abspath(src)))

        def rename(src: os.PathLike[str] | str, dst: os.PathLike[str] | str, *args: object, **kw: object) -> None:
            inode = os.stat(src).st_ino
            real_rename(src, dst, *args, **kw)
            self.events.append(Event("replace", os.path.abspath(dst), inode, src=os.path.abspath(src)))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "replace", replace)
        monkeypatch.setattr(os, "rename", rename)


def violations(events: list[Event], out: Path) -> list[str]:
    """Every broken rule (numbers as in the module docstring) in a recorded trace."""
    out_s = str(out.resolve())
    shards_s = str((out / fmt.SHARD_DIR).resolve())
    staging_s = str((out / STAGING_DIR).resolve())
    records_s = str((out / STAGING_DIR / RECORD_DIR).resolve())
    manifest_s = str((out / fmt.MANIFEST_NAME).resolve())
    report_s = str((out / fmt.REPORT_NAME).resolve())
    plan_s = str((out / STAGING_DIR / PLAN_NAME).resolve())
    problems: list[str] = []

    def folder_synced_between(folder: str, start: int, end: int) -> bool:
        return any(e.op == "fsync" and e.is_dir and e.path == folder for e in events[start + 1:end])

    for i, e in enumerate(events):
        if e.op != "replace":
            continue
        if not any(f.op == "fsync" and not f.is_dir and f.inode == e.inode for f in events[:i]):
            problems.append(f"rule 1: {e.path} renamed without an fsync of its data first")
        following = next((k for k in range(i + 1, len(events)) if events[k].op == "replace"), len(events))
        if not folder_synced_between(os.path.dirname(e.path), i, following):
            problems.append(f"rule 2: the rename to {e.path} is not durable (no fsync of its folder) "
                            f"before the next step")
    replaces = [(i, e) for i, e in enumerate(events) if e.op == "replace"]
    record_steps = [i for i, e in replaces if os.path.dirname(e.path) == records_s]
    plan_steps = [i for i, e in replaces if e.path == plan_s]
    manifest_steps = [i for i, e in replaces if e.path == manifest_s]
    shard_steps = [(i, e) for i, e in replaces if os.path.dirname(e.path) == shards_s]
    for i, shard in shard_steps:  # rule 3: the next record renamed after a shard is that shard's
        later = [r for r in record_steps if r > i]
        if not later or not folder_synced_between(shards_s, i, later[0]):
            problems.append(f"rule 3: the record after {os.path.basename(shard.path)} can land before it is durable")
    if record_steps and (not plan_steps or not folder_synced_between(staging_s, plan_steps[-1], record_steps[0])):
        problems.append("rule 4: a shard record can land before the plan it names is durable")
    if len(manifest_steps) != 1:
        problems.append(f"rule 5: {len(manifest_steps)} manifest renames (expected exactly one commit point)")
        return problems
    commit = manifest_steps[0]
    for i, e in replaces:
        folder = os.path.dirname(e.path)
        if i < commit and folder in (out_s, shards_s) and not folder_synced_between(folder, i, commit):
            problems.append(f"rule 5: {os.path.basename(e.path)} can be lost while the manifest naming it lands")
    for i, e in replaces:
        if e.path == report_s:
            if i < commit or not folder_synced_between(out_s, commit, i):
                problems.append("rule 6: the build report is replaced before the new manifest is durable")
    return problems


def make_images(root: Path, count: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    for i in range(count):
        folder = root / ("cat" if i % 2 else "dog")
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (16 + i, 20, 3), dtype=np.uint8)).save(folder / f"{seed}-{i}.png")
    return root


OPTIONS = BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=12 << 10))


def traced_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **kwargs: object) -> tuple[list[Event], Path]:
    src, out = make_images(tmp_path / "src", 6), tmp_path / "ds"
    tracer = Tracer(monkeypatch)
    build(src, out, OPTIONS, RunOptions(workers=1, **kwargs))  # type: ignore[arg-type]
    return tracer.events, out


def test_build_commits_in_a_crash_consistent_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events, out = traced_build(tmp_path, monkeypatch)
    assert violations(events, out) == []
    names = [os.path.basename(e.path) for e in events if e.op == "replace"]
    shard_names = [n for n in names if n.startswith("shard-") and n.endswith(".pks")]
    assert len(shard_names) >= 3  # several shards, so the per-shard rules were exercised
    assert names[0] == PLAN_NAME
    assert names[-2:] == [fmt.MANIFEST_NAME, fmt.REPORT_NAME]
    dir_syncs = {e.path for e in events if e.op == "fsync" and e.is_dir}
    assert {str((out / p).resolve()) for p in ("", fmt.SHARD_DIR, STAGING_DIR, f"{STAGING_DIR}/{RECORD_DIR}")} <= dir_syncs


def test_resumed_and_split_builds_commit_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, out = make_images(tmp_path / "src", 6), tmp_path / "ds"
    tracer = Tracer(monkeypatch)
    build(src, out, OPTIONS, RunOptions(workers=1, plan_only=True))
    build(src, out, OPTIONS, RunOptions(workers=1, part=(0, 2)))
    build(src, out, OPTIONS, RunOptions(workers=1, part=(1, 2)))
    from packer.writer import finish

    finish(out, src)
    assert violations(tracer.events, out) == []


def test_overwrite_commits_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, out = make_images(tmp_path / "src", 6), tmp_path / "ds"
    build(src, out, OPTIONS, RunOptions(workers=1))
    tracer = Tracer(monkeypatch)
    build(src, out, BuildSettings(layout=LayoutSettings(alignment=4096, shard_size=12 << 10, seed=1)), RunOptions(workers=1, overwrite=True))
    assert violations(tracer.events, out) == []


def test_append_commits_in_a_crash_consistent_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "ds"
    build(make_images(tmp_path / "src", 4), out, OPTIONS, RunOptions(workers=1))
    tracer = Tracer(monkeypatch)
    append(out, make_images(tmp_path / "more", 4, seed=1), run=RunOptions(workers=1))
    assert violations(tracer.events, out) == []
    names = [os.path.basename(e.path) for e in tracer.events if e.op == "replace"]
    assert names[-2:] == [fmt.MANIFEST_NAME, fmt.REPORT_NAME]


def test_write_atomic_fsyncs_data_then_renames_then_fsyncs_the_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tracer = Tracer(monkeypatch)
    target = tmp_path / "file.bin"
    atomic.write_atomic(target, [b"abc", b"def"])
    assert target.read_bytes() == b"abcdef"
    ops = [(e.op, e.is_dir) for e in tracer.events]
    assert ops == [("fsync", False), ("replace", False), ("fsync", True)]
    data_sync, rename, folder_sync = tracer.events
    assert data_sync.inode == rename.inode == target.stat().st_ino
    assert rename.path == str(target) and folder_sync.path == str(tmp_path)


# --- the checker itself: every fsync of a real trace is needed, and order matters -------------------

@pytest.fixture
def recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Event], Path]:
    return traced_build(tmp_path, monkeypatch)


def test_dropping_any_one_fsync_breaks_a_rule(recorded: tuple[list[Event], Path]) -> None:
    events, out = recorded
    fsyncs = [i for i, e in enumerate(events) if e.op == "fsync"]
    assert len(fsyncs) >= 10
    for i in fsyncs:
        assert violations(events[:i] + events[i + 1:], out), f"fsync #{i} ({events[i].path}) is not checked"


@pytest.mark.parametrize("what", ["manifest-before-index-durable", "record-before-shard-durable",
                                  "rename-before-data-sync", "report-before-manifest"])
def test_reordering_a_step_breaks_a_rule(recorded: tuple[list[Event], Path], what: str) -> None:
    events, out = recorded
    moved = list(events)
    name: Callable[[Event], str] = lambda e: os.path.basename(e.path)
    if what == "manifest-before-index-durable":
        i = next(i for i, e in enumerate(moved) if e.op == "replace" and name(e).startswith("index-"))
        j = next(j for j, e in enumerate(moved) if e.op == "replace" and name(e) == fmt.MANIFEST_NAME)
        moved.insert(i + 1, moved.pop(j))  # the manifest right after the index rename
    elif what == "record-before-shard-durable":
        i = next(i for i, e in enumerate(moved) if e.op == "replace" and name(e).endswith(".pks"))
        j = next(j for j, e in enumerate(moved) if j > i and e.op == "replace" and name(e).endswith(".pkr"))
        moved.insert(i + 1, moved.pop(j))
    elif what == "rename-before-data-sync":
        i = next(i for i, e in enumerate(moved) if e.op == "replace" and name(e).endswith(".pks"))
        sync = max(k for k in range(i) if moved[k].op == "fsync" and moved[k].inode == moved[i].inode)
        moved[sync], moved[i] = moved[i], moved[sync]
    else:
        i = next(i for i, e in enumerate(moved) if e.op == "replace" and name(e) == fmt.MANIFEST_NAME)
        j = next(j for j, e in enumerate(moved) if e.op == "replace" and name(e) == fmt.REPORT_NAME)
        moved.insert(i, moved.pop(j))
    assert violations(moved, out)


# --- build: atomic, records, commit, plan ---------------------------------------------------------


def test_write_atomic_returns_the_digest_and_leaves_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "f.bin"
    written = write_atomic(target, [b"hello ", memoryview(b"world")])
    assert written.digest == fmt.checksum(b"hello world") and target.read_bytes() == b"hello world"
    assert written.size == 11
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"]

    def failing() -> Any:
        yield b"new bytes"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError):
        write_atomic(target, failing())
    assert target.read_bytes() == b"hello world", "a failed write leaves the old file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.bin"], "and removes its temp file"


def test_write_atomic_temp_name_is_the_one_cleanup_looks_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        seen.append(os.path.basename(src))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    write_atomic(tmp_path / "manifest.json", [b"{}"])
    assert seen == [temp_name(tmp_path / "manifest.json").name]
    assert seen[0].startswith(f".manifest.json.{os.getpid()}-") and seen[0].endswith(".tmp")


def test_fsync_dir_needs_a_folder(tmp_path: Path) -> None:
    fsync_dir(tmp_path)
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(NotADirectoryError):
        fsync_dir(tmp_path / "file")


# --- format: the index table and the column-file writer -------------------------------------------


def test_write_atomic_reports_the_real_error_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing folder fsync (after the temp file is renamed away) raises that error, not a
    FileNotFoundError from cleaning up a temp file that no longer exists."""
    import errno

    import packer._internal.atomic as atomic_module

    def broken_fsync_dir(path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(atomic_module, "fsync_dir", broken_fsync_dir)
    with pytest.raises(OSError) as caught:
        write_atomic(tmp_path / "f.bin", [b"x"])
    assert caught.value.errno == errno.EIO
