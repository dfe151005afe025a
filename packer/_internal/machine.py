"""What this machine offers a run: the CPU cores this process may use."""

from __future__ import annotations

import os

__all__ = ["available_cpus"]


def available_cpus() -> int:
    """The cores this process may use: respects taskset and cgroup CPU affinity, at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)
