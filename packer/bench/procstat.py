"""The CPU accounting ``packer bench`` reads from ``/proc`` (no psutil): a process's on-CPU time and
time spent waiting for a CPU (``schedstat``), the bytes it read from storage (``io``), its children.
"""

from __future__ import annotations

import os

# --- /proc accounting ---------------------------------------------------------------------------

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _read_stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    return text[text.rfind(")") + 2:].split()


def process_cpu_seconds(pid: int) -> float | None:
    """CPU seconds process ``pid`` used so far (all its threads, user + system), or None.

    Sums the nanosecond on-CPU times of ``/proc/<pid>/task/*/schedstat``; falls back to
    utime + stime of ``/proc/<pid>/stat``, which count in clock ticks (10 ms: too coarse for a
    short run).
    """
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat", "rb") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (OSError, IndexError, ValueError):
        pass
    fields = _read_stat(pid)
    if fields is None or len(fields) < 13:
        return None
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # fields 14 and 15 of stat(5)


def run_queue_seconds(pid: int) -> float | None:
    """Seconds process ``pid``'s main thread spent runnable but waiting for a CPU, or None.

    From ``/proc/<pid>/schedstat`` (on-CPU ns, run-queue wait ns, timeslices). A worker that
    waits here is CPU-bound on cores shared with other processes, not waiting on I/O.
    """
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            fields = f.read().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def storage_read_bytes(pid: int) -> int | None:
    """Bytes process ``pid`` caused to be read from storage so far (``read_bytes`` of
    ``/proc/<pid>/io``: page-cache hits are not counted, mmap page faults are), or None."""
    try:
        with open(f"/proc/{pid}/io", "rb") as f:
            for line in f:
                if line.startswith(b"read_bytes:"):
                    return int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return None


def child_pids(parent: int | None = None) -> list[int]:
    """Pids of the live child processes of ``parent`` (default: this process), from /proc."""
    parent = os.getpid() if parent is None else parent
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    children = []
    for entry in entries:
        if entry.isdigit():
            fields = _read_stat(int(entry))
            if fields is not None and len(fields) > 1 and fields[1] == str(parent):
                children.append(int(entry))
    return sorted(children)
