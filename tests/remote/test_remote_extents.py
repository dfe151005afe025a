"""The range planner and the node cache's files (``packer.remote.extents``, ``packer.remote.cache``),
on hand-made index columns and cache folders: where extents are cut (exact starts, ends, samples),
which extent holds a byte, an order as first needs, next needs and ranks, which extents one range
GET coalesces, which cached extents ``scan_extents`` sees and which ``evict`` removes (in the
priority's order, down to the target, never past an extent whose priority is infinite), and the
per-extent record locks as another process sees them."""

from __future__ import annotations

import fcntl
import os
import signal
import stat
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from packer.remote.cache import LockFile, evict, scan_extents, write_cached
from packer.remote.extents import ExtentTable, FetchPlan, coalesce, plan_extents


def _columns(rows):
    shard, offset, size = (np.asarray(column, dtype=np.int64) for column in zip(*rows))
    return shard, offset, size


#: Three shards, alignment 16, extents of 100 bytes: shard 0's samples at 64, 96 (one bucket),
#: 176, 192 (the next: 176 - 64 passes 100); shard 1's two in one; shard 2 holds none.
ROWS = [(0, 64, 30), (0, 96, 60), (0, 176, 10), (0, 192, 100), (1, 64, 8), (1, 80, 8)]
SHARD_SIZES = [300, 96, 64]


@pytest.fixture
def table() -> ExtentTable:
    return plan_extents(*_columns(ROWS), np.asarray(SHARD_SIZES), 16, 100)


def test_extents_are_cut_at_sample_boundaries_per_bucket_and_shard(table):
    assert len(table) == 3
    assert table.shard.tolist() == [0, 0, 1]
    assert table.start.tolist() == [64, 176, 64]
    # aligned end of the last sample (156 -> 160), clipped to the shard file (304 -> 300), aligned (88 -> 96)
    assert table.end.tolist() == [160, 300, 96]
    assert table.first.tolist() == [0, 2, 4]
    assert table.stop.tolist() == [2, 4, 6]
    assert table.ordinal.tolist() == [0, 1, 0]
    assert table.of_sample.tolist() == [0, 0, 1, 1, 2, 2]
    assert table.shard_extents.tolist() == [0, 2, 3, 3]
    assert [table.nbytes(e) for e in range(3)] == [96, 124, 32]
    for column in (table.shard, table.start, table.end, table.first, table.stop, table.ordinal, table.of_sample,
                   table.shard_extents):
        assert column.dtype == np.int64


def test_a_sample_exactly_one_extent_past_the_first_starts_a_new_extent():
    rows = [(0, 64, 16), (0, 163, 1), (0, 164, 16), (0, 263, 1), (0, 264, 1)]
    table = plan_extents(*_columns(rows), np.asarray([1000]), 1, 100)
    assert table.first.tolist() == [0, 2, 4]
    assert table.start.tolist() == [64, 164, 264]
    assert table.end.tolist() == [164, 264, 265]


def test_each_shard_counts_its_buckets_from_its_own_first_sample():
    rows = [(0, 64, 10), (1, 100, 10), (1, 190, 10), (1, 200, 10)]
    table = plan_extents(*_columns(rows), np.asarray([74, 210]), 1, 100)
    assert table.first.tolist() == [0, 1, 3]
    assert table.ordinal.tolist() == [0, 0, 1]
    assert table.shard_extents.tolist() == [0, 1, 3]


def test_adjacent_samples_share_an_extent_and_an_overlapping_one_gets_its_own():
    rows = [(0, 10, 10), (0, 20, 10), (0, 30, 10), (0, 35, 2), (0, 37, 3)]
    table = plan_extents(*_columns(rows), np.asarray([40]), 1, 1000)
    assert table.first.tolist() == [0, 3]
    assert table.stop.tolist() == [3, 5]
    assert table.end.tolist() == [40, 40]


def test_an_extent_ends_at_its_samples_end_even_past_a_short_shard_file():
    rows = [(0, 64, 30), (0, 96, 60)]
    table = plan_extents(*_columns(rows), np.asarray([150]), 16, 1 << 20)
    assert table.end.tolist() == [156]
    table = plan_extents(*_columns(rows), np.asarray([158]), 16, 1 << 20)
    assert table.end.tolist() == [158]


def test_no_samples_give_no_extents():
    empty = np.zeros(0, dtype=np.int64)
    table = plan_extents(empty, empty, empty, np.asarray([64, 64]), 16, 100)
    assert len(table) == 0
    assert table.shard_extents.tolist() == [0, 0, 0]
    assert table.of_sample.tolist() == [] and table.first.tolist() == [] and table.end.tolist() == []
    assert table.find(1, 10) == -1


def test_find_names_the_extent_holding_a_byte(table):
    expected = {(0, 0): -1, (0, 63): -1, (0, 64): 0, (0, 159): 0, (0, 160): -1, (0, 175): -1, (0, 176): 1,
                (0, 299): 1, (0, 300): -1, (0, 10_000): -1, (1, 0): -1, (1, 63): -1, (1, 64): 2, (1, 95): 2,
                (1, 96): -1, (2, 0): -1, (2, 64): -1}
    assert {key: table.find(*key) for key in expected} == expected


# --- an order as extents ---------------------------------------------------------------------------


def test_a_fetch_plan_lists_extents_in_first_need_order(table):
    plan = FetchPlan(table, [4, 0, 5, 1, 2, 4])  # extents 2, 0, 2, 0, 1, 2
    assert len(plan) == 3
    assert plan.sequence.tolist() == [2, 0, 1]
    assert plan.first_need.tolist() == [1, 2, 0]
    assert plan.sequence_sample.tolist() == [0, 1, 4]
    assert plan.last_need.tolist() == [3, 4, 5]
    assert [plan.next_need(2, p) for p in range(7)] == [0, 2, 2, 5, 5, 5, -1]
    assert [plan.next_need(0, p) for p in range(5)] == [1, 1, 3, 3, -1]
    assert [plan.next_need(1, p) for p in range(6)] == [4, 4, 4, 4, 4, -1]
    assert [plan.rank_of_sample(p) for p in (0, 1, 2, 3, 4, 5, 100)] == [1, 2, 2, 2, 3, 3, 3]


def test_an_extent_the_order_never_reads_has_no_need(table):
    plan = FetchPlan(table, np.asarray([5, 4], dtype=np.int32))
    assert plan.sequence.tolist() == [2]
    assert plan.first_need.tolist() == [-1, -1, 0]
    assert plan.last_need.tolist() == [-1, -1, 1]
    assert plan.next_need(0, 0) == -1 and plan.next_need(1, 0) == -1 and plan.next_need(2, 1) == 1
    empty = FetchPlan(table, [])
    assert len(empty) == 0
    assert empty.last_need.tolist() == [-1, -1, -1] and empty.first_need.tolist() == [-1, -1, -1]
    assert empty.rank_of_sample(0) == 0 and empty.next_need(0, 0) == -1


# --- coalescing -----------------------------------------------------------------------------------


@pytest.fixture
def small_extents() -> ExtentTable:
    """One extent per 16-byte sample: shard 0 at 64, 80, 96, 112 (extents 0-3); shard 1 at 64, 80 (4, 5)."""
    rows = [(0, 64, 16), (0, 80, 16), (0, 96, 16), (0, 112, 16), (1, 64, 16), (1, 80, 16)]
    return plan_extents(*_columns(rows), np.asarray([128, 96]), 16, 16)


def test_adjacent_extents_of_a_shard_coalesce_up_to_the_request_size(small_extents):
    assert small_extents.start.tolist() == [64, 80, 96, 112, 64, 80]
    assert coalesce(small_extents, [2, 0, 1, 3, 4, 5], 48) == [[0, 1, 2], [3], [4, 5]]
    assert coalesce(small_extents, [0, 1, 2, 3], 64) == [[0, 1, 2, 3]]
    assert coalesce(small_extents, [0, 1, 2, 3], 47) == [[0, 1], [2, 3]]
    assert coalesce(small_extents, [0, 1], 16) == [[0], [1]]
    assert coalesce(small_extents, [3, 4], 1 << 20) == [[3], [4]]  # adjacent numbers, two shards
    assert coalesce(small_extents, [0, 2], 1 << 20) == [[0], [2]]  # a gap
    assert coalesce(small_extents, [], 48) == []


def test_groups_come_back_in_the_order_of_need(small_extents):
    assert coalesce(small_extents, [4, 2, 0, 1], 1 << 20) == [[4], [0, 1, 2]]
    assert coalesce(small_extents, [1, 5, 0, 4], 1 << 20) == [[0, 1], [4, 5]]
    assert coalesce(small_extents, [5, 1, 0, 4], 1 << 20) == [[4, 5], [0, 1]]
    assert coalesce(small_extents, [0, 5, 4, 1], 1 << 20) == [[0, 1], [4, 5]]


def test_overlapping_extents_never_share_a_request():
    rows = [(0, 64, 40), (0, 80, 8)]
    table = plan_extents(*_columns(rows), np.asarray([128]), 16, 1 << 20)
    assert table.start.tolist() == [64, 80] and table.end.tolist() == [112, 96]
    assert coalesce(table, [0, 1], 1 << 20) == [[0], [1]]


# --- cache files ----------------------------------------------------------------------------------


def test_write_cached_makes_the_folders_and_returns_the_size(tmp_path):
    target = tmp_path / "a" / "b" / "file"
    assert write_cached(target, [b"abc", memoryview(b"de")]) == 5
    assert target.read_bytes() == b"abcde"
    assert [p.name for p in (tmp_path / "a" / "b").iterdir()] == ["file"]  # no temp left


def _extent_file(root: Path, name: str, size: int, age: float = 0.0) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    if age:
        stamp = time.time() - age
        os.utime(path, (stamp, stamp))
    return path


def test_scan_lists_extents_only_and_removes_stale_temps(tmp_path):
    extent = _extent_file(tmp_path, "v1/k/g/extents/main/0/64-160", 96, age=10)
    direct = _extent_file(tmp_path, "v1/k/g/extents/loose", 7)
    _extent_file(tmp_path, "v1/k/g/manifest.json", 50)
    _extent_file(tmp_path, "v1/k/g/headers/main-0", 64)
    _extent_file(tmp_path, "v1/k/g/myextents/x", 5)
    _extent_file(tmp_path, "v1/k/g/extentsx/y", 5)
    fresh_temp = _extent_file(tmp_path, "v1/k/g/extents/main/0/.tmp-fresh", 9, age=3000)
    stale_temp = _extent_file(tmp_path, "v1/k/g/extents/main/0/.tmp-stale", 9, age=3700)
    os.symlink(tmp_path / "nowhere", tmp_path / "v1/k/g/extents/main/0/dangling")
    found = sorted(scan_extents(tmp_path))
    assert [(path, size) for path, size, _ in found] == sorted([(extent, 96), (direct, 7)])
    mtimes = {path: mtime for path, _, mtime in found}
    assert mtimes[extent] == pytest.approx(time.time() - 10, abs=5)
    assert fresh_temp.exists() and not stale_temp.exists()


def _priority_by_name(order: list[str], infinite: tuple[str, ...] = ()):
    def priority(path: Path, mtime: float) -> tuple[float, ...]:
        if path.name in infinite:
            return (float("inf"),)
        return (float(order.index(path.name)), mtime)
    return priority


def _cache_of(root: Path, count: int, size: int = 100) -> list[str]:
    names = [f"{k}-{k + 1}" for k in range(count)]
    for name in names:
        _extent_file(root, f"v1/d/g/extents/main/0/{name}", size)
    return names


def test_evict_removes_in_priority_order_down_to_the_target(tmp_path):
    names = _cache_of(tmp_path, 11)  # 1100 bytes
    order = [names[k] for k in (5, 2, 9, 0, 1, 3, 4, 6, 7, 8, 10)]
    removed: list[Path] = []
    assert evict(tmp_path, 1000, _priority_by_name(order), removed_paths=removed) == (900, 200)
    assert [path.name for path in removed] == order[:2]
    assert sorted(p.name for p, _, _ in scan_extents(tmp_path)) == sorted(order[2:])
    assert (tmp_path / "evict.lock").exists()


def test_evict_does_nothing_at_or_under_the_bound(tmp_path):
    names = _cache_of(tmp_path, 10)
    assert evict(tmp_path, 1000, _priority_by_name(names)) == (1000, 0)
    assert evict(tmp_path, 5000, _priority_by_name(names)) == (1000, 0)
    assert len(scan_extents(tmp_path)) == 10


def test_evict_takes_the_target_given_and_lists_nothing_unasked(tmp_path):
    names = _cache_of(tmp_path, 10)
    assert evict(tmp_path, 999, _priority_by_name(names), target=0.5) == (400, 600)
    assert sorted(p.name for p, _, _ in scan_extents(tmp_path)) == names[6:]


def test_evict_stops_at_an_extent_that_is_needed_now(tmp_path):
    names = _cache_of(tmp_path, 10)
    removed: list[Path] = []
    priority = _priority_by_name(names, infinite=tuple(names[2:]))
    assert evict(tmp_path, 500, priority, removed_paths=removed) == (800, 200)
    assert [path.name for path in removed] == [names[0], names[1]]
    assert len(scan_extents(tmp_path)) == 8


def test_evict_makes_a_missing_root_and_its_lock_file(tmp_path):
    previous = os.umask(0o022)
    try:
        assert evict(tmp_path / "new" / "deeper", 10, _priority_by_name([])) == (0, 0)
    finally:
        os.umask(previous)
    assert (tmp_path / "new" / "deeper").is_dir()
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "deeper" / "evict.lock").st_mode) == 0o644


def test_evict_by_age_removes_the_oldest_first(tmp_path):
    names = _cache_of(tmp_path, 4)
    for age, name in zip((30, 10, 40, 20), names):
        stamp = time.time() - age
        os.utime(tmp_path / f"v1/d/g/extents/main/0/{name}", (stamp, stamp))
    removed: list[Path] = []
    assert evict(tmp_path, 300, lambda path, mtime: (mtime,), removed_paths=removed) == (200, 200)
    assert [path.name for path in removed] == [names[2], names[0]]


def test_an_extent_another_process_removed_meanwhile_counts_as_removed(tmp_path):
    names = _cache_of(tmp_path, 4)

    def priority(path: Path, mtime: float) -> tuple[float, ...]:
        if path.name == names[0]:
            path.unlink(missing_ok=True)  # another process got there between the scan and the unlink
        return (float(names.index(path.name)), mtime)

    assert evict(tmp_path, 300, priority) == (200, 200)
    assert sorted(p.name for p, _, _ in scan_extents(tmp_path)) == names[2:]


def _in_child(work) -> int:
    """Run ``work()`` in a forked child; its exit status (0: True)."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        signal.alarm(60)
        try:
            os._exit(0 if work() else 1)
        except BaseException:
            os._exit(2)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def _other_process_can_lock(path: Path, byte: int) -> bool:
    def attempt() -> bool:
        fd = os.open(path, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, byte, os.SEEK_SET)
            return True
        except OSError:
            return False
    status = _in_child(attempt)
    assert status in (0, 1)
    return status == 0


def test_a_lock_file_locks_one_byte_per_extent_against_other_processes(tmp_path):
    path = tmp_path / "locks" / "main-0.lock"
    lock = LockFile(path)
    assert path.is_file() and lock.path == path
    assert lock.acquire(3) is True
    assert [_other_process_can_lock(path, byte) for byte in (2, 3, 4)] == [True, False, True]
    lock.release(3)
    assert _other_process_can_lock(path, 3)
    assert lock.acquire(5, blocking=False) is True
    assert not _other_process_can_lock(path, 5)
    lock.close()
    assert lock.fd == -1
    assert _other_process_can_lock(path, 5)  # closing drops the process's locks
    lock.close()  # twice is harmless


def test_a_byte_another_process_holds_is_refused_without_waiting(tmp_path):
    path = tmp_path / "main-0.lock"
    lock = LockFile(path)
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child holds byte 7 until told (or its parent is gone)
        signal.alarm(60)
        os.close(done_w)
        os.close(ready_r)
        fd = os.open(path, os.O_RDWR)
        fcntl.lockf(fd, fcntl.LOCK_EX, 1, 7, os.SEEK_SET)
        os.write(ready_w, b"1")
        os.read(done_r, 1)
        os._exit(0)
    try:
        os.read(ready_r, 1)
        started = time.monotonic()
        assert lock.acquire(7, blocking=False) is False
        assert time.monotonic() - started < 5
        assert lock.acquire(6, blocking=False) is True and lock.acquire(8, blocking=False) is True
        waited = threading.Event()

        def blocking() -> None:
            lock.acquire(7)
            waited.set()

        thread = threading.Thread(target=blocking, daemon=True)
        thread.start()
        assert not waited.wait(0.3)  # a blocking acquire waits for the other process
        os.write(done_w, b"1")
        assert waited.wait(10)
    finally:
        os.write(done_w, b"1")
        os.waitpid(pid, 0)
        for fd in (ready_r, ready_w, done_r, done_w):
            os.close(fd)
        lock.close()


def test_one_process_evicts_at_a_time(tmp_path):
    names = _cache_of(tmp_path, 3)
    (tmp_path / "evict.lock").touch()
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child holds the eviction lock until told (or its parent is gone)
        signal.alarm(60)
        os.close(done_w)
        os.close(ready_r)
        fd = os.open(tmp_path / "evict.lock", os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(ready_w, b"1")
        os.read(done_r, 1)
        os._exit(0)
    try:
        os.read(ready_r, 1)
        result: list[tuple[int, int]] = []
        thread = threading.Thread(target=lambda: result.append(evict(tmp_path, 150, _priority_by_name(names))),
                                  daemon=True)
        thread.start()
        thread.join(0.3)
        assert thread.is_alive() and not result
        os.write(done_w, b"1")
        thread.join(10)
        assert result == [(100, 200)]
    finally:
        os.write(done_w, b"1")
        os.waitpid(pid, 0)
        for fd in (ready_r, ready_w, done_r, done_w):
            os.close(fd)


def test_a_temp_file_is_stale_only_past_the_hour(tmp_path, monkeypatch):
    from packer.remote import cache as cache_module

    at_hour = _extent_file(tmp_path, "v1/k/g/extents/main/0/.tmp-hour", 1)
    past = _extent_file(tmp_path, "v1/k/g/extents/main/0/.tmp-past", 1)
    os.utime(at_hour, (1_000_000_000, 1_000_000_000))
    os.utime(past, (999_999_999, 999_999_999))
    monkeypatch.setattr(cache_module, "time", types.SimpleNamespace(time=lambda: 1_000_003_600.0))
    assert scan_extents(tmp_path) == []
    assert at_hour.exists() and not past.exists()


def test_a_stale_temp_another_process_removed_meanwhile_is_skipped(tmp_path, monkeypatch):
    from packer.remote import cache as cache_module

    temp = _extent_file(tmp_path, "v1/k/g/extents/main/0/.tmp-old", 1, age=7200)
    extent = _extent_file(tmp_path, "v1/k/g/extents/main/0/64-128", 64)

    class RacingOs:
        """``os`` where another process removes a temp file right after this one stats it."""

        def __getattr__(self, name: str) -> Any:
            return getattr(os, name)

        def stat(self, path: str) -> os.stat_result:
            result = os.stat(path)
            if os.path.basename(path).startswith("."):
                os.unlink(path)
            return result

    monkeypatch.setattr(cache_module, "os", RacingOs())
    assert [(path, size) for path, size, _ in scan_extents(tmp_path)] == [(extent, 64)]
    assert not temp.exists()
