"""The shared harness of packer's benchmarks: timed stretches, interleaved rounds, medians, CPU time, ratio tables.

Every benchmark in this folder compares candidates measured in the same run against a baseline
measured in the same run, because the machines they run on are shared and noisy:

* ``measure(body)`` times one stretch: wall seconds and CPU seconds of this process *and* its
  children (DataLoader workers and subprocesses: live ones from ``/proc``, finished ones from
  ``getrusage(RUSAGE_CHILDREN)``), and the items the body says it handled.
* ``interleave(candidates, rounds)`` runs every candidate once per round, in a rotated order
  (round ``r`` starts with candidate ``r``), so background load and warm-up hit them all alike.
* ``summarize(results, baseline)`` turns the stretches into ``Row``s: the median round's
  items/s, CPU time per item over all rounds (the steadier figure on a shared machine), and
  both as ratios to the baseline's.
* ``table(rows)`` prints them; ``machine_load()`` says how busy the machine was.
* ``timed_loop`` / ``median_rate`` time a tight body for a fixed time (micro-measurements).
* ``evict`` / ``drop_all`` control the page cache before a cold measurement.

Benchmarks import it as a sibling module (this folder is on ``sys.path`` when one of them runs,
and ``tests/conftest.py`` puts it there for the tests); importing it also puts ``scripts/`` on
``sys.path`` for ``make_sample``.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
for _folder in (REPO, REPO / "scripts"):  # packer itself (when not installed) and make_sample
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

__all__ = ["Stretch", "Row", "measure", "interleave", "summarize", "table", "machine_load", "timed_loop",
           "median_rate", "run_for", "child_pids", "evict", "drop_all", "warm", "describe_load", "REPO"]

# The /proc accounting is packer bench's own (packer/bench/procstat.py): one parser for both.
from packer.bench.procstat import child_pids, process_cpu_seconds  # noqa: E402


# --- CPU time of this process and its children -----------------------------------------------------

def _finished_children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# --- one stretch --------------------------------------------------------------------------------

@dataclass
class Stretch:
    """One timed run of one candidate."""

    items: float  # samples, images, files, or MB for byte-moving benchmarks
    seconds: float
    cpu_seconds: float
    #: what the body returned besides its item count (a dict), e.g. memory readings
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else float("nan")


def measure(body: Callable[[], Any], *, items: float | None = None) -> Stretch:
    """Time ``body()``: wall seconds, CPU seconds of this process and its children, items.

    Args:
        body: the work. It returns the number of items it handled (an int), or a dict with
            ``"items"`` and anything else to keep (``Stretch.extra``).
        items: the item count, when known beforehand (what ``body`` returns is then ignored).

    Returns:
        The ``Stretch``. CPU time counts this process (all its threads), the children alive at
        the start and the end of the stretch (``/proc``), and the children that finished and
        were waited for during it (``RUSAGE_CHILDREN``; a child started and waited for inside
        the body is counted whole).
    """
    live = {pid: process_cpu_seconds(pid) for pid in child_pids()}
    finished0 = _finished_children_cpu()
    main0 = time.process_time()
    start = time.perf_counter()
    result = body()
    seconds = time.perf_counter() - start
    cpu = time.process_time() - main0 + _finished_children_cpu() - finished0
    for pid, before in live.items():
        after = process_cpu_seconds(pid)
        if before is not None and after is not None:
            cpu += after - before
    extra: dict[str, Any] = {}
    if items is not None:  # the body's own result is not a count
        count = items
    elif isinstance(result, dict):
        extra = dict(result)
        count = float(extra.pop("items"))
    elif result is None:
        raise ValueError("the body returned no item count and no items= was given")
    else:
        count = float(result)
    return Stretch(items=count, seconds=seconds, cpu_seconds=cpu, extra=extra)


# --- rounds ---------------------------------------------------------------------------------------

def interleave(candidates: Sequence[tuple[str, Callable[[], Stretch]]], rounds: int, *,
               log: Any = sys.stderr, unit: str = "items") -> dict[str, list[Stretch]]:
    """Run every candidate once per round, the order rotated each round; its stretches by name.

    Args:
        candidates: ``(name, run)`` pairs; ``run()`` measures one stretch (usually ``measure``).
        rounds: how many times each candidate runs.
        log: where a line per stretch goes (None: nowhere).
        unit: what the items are, for the log lines.
    """
    done: dict[str, list[Stretch]] = {name: [] for name, _ in candidates}
    for r in range(rounds):
        for k in range(len(candidates)):
            name, run = candidates[(k + r) % len(candidates)]
            stretch = run()
            done[name].append(stretch)
            if log is not None:
                cpu = 1e3 * stretch.cpu_seconds / max(stretch.items, 1e-12)
                print(f"  round {r + 1}/{rounds} {name}: {stretch.rate:,.0f} {unit}/s, {1e3 * cpu:.1f} CPU us/"
                      f"{unit.removesuffix('s')}",
                      file=log, flush=True)
    return done


@dataclass
class Row:
    """One candidate's summary over its rounds, and its ratios to the baseline's."""

    name: str
    items: float
    rate: float            # the median round's items/s
    best_rate: float       # the best round's items/s
    rates: list[float]     # every round's items/s
    cpu_ms: float          # CPU milliseconds per item over all rounds
    cores: float           # CPU seconds / wall seconds over all rounds
    ratio: float = float("nan")      # rate / baseline rate (above 1: faster)
    cpu_ratio: float = float("nan")  # cpu_ms / baseline cpu_ms (below 1: less CPU per item)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "items": self.items, "items_per_s": self.rate, "best_items_per_s": self.best_rate,
                "items_per_s_rounds": [round(r, 1) for r in self.rates], "cpu_ms_per_item": self.cpu_ms,
                "cores_busy": self.cores, "ratio": self.ratio, "cpu_ratio": self.cpu_ratio, **self.extra}


def summarize(results: dict[str, list[Stretch]], baseline: str | None = None) -> list[Row]:
    """``Row``s in the candidates' order, ratios against ``baseline`` (default: the first)."""
    rows = []
    for name, stretches in results.items():
        if not stretches:
            continue
        items = sum(s.items for s in stretches)
        wall = sum(s.seconds for s in stretches)
        cpu = sum(s.cpu_seconds for s in stretches)
        rates = [s.rate for s in stretches]
        rows.append(Row(name=name, items=items, rate=statistics.median(rates), best_rate=max(rates), rates=rates,
                        cpu_ms=1e3 * cpu / max(items, 1e-12), cores=cpu / wall if wall > 0 else float("nan"),
                        extra=dict(stretches[-1].extra)))
    if rows:
        base = next((row for row in rows if row.name == baseline), rows[0])
        for row in rows:
            row.ratio = row.rate / base.rate if base.rate else float("nan")
            row.cpu_ratio = row.cpu_ms / base.cpu_ms if base.cpu_ms else float("nan")
    return rows


def table(rows: Iterable[Row], *, unit: str = "items", baseline: str | None = None, name_width: int = 44,
          columns: Sequence[tuple[str, Callable[[Row], str]]] = ()) -> str:
    """The rows as an aligned text table: median items/s and its ratio, CPU ms per item and its ratio.

    ``columns`` adds ``(heading, format(row))`` columns at the right.
    """
    rows = list(rows)
    base = baseline or (rows[0].name if rows else "")
    # Microseconds when every row is under 0.1 ms per item (small images), so three digits show.
    micro = bool(rows) and max(row.cpu_ms for row in rows) < 0.1
    cpu_unit, cpu_scale = ("CPU us/", 1e3) if micro else ("CPU ms/", 1.0)
    places = 4 if not micro and min(row.cpu_ms for row in rows) < 0.1 else 3  # small rows beside large ones
    item = unit[:-2] if unit.endswith(("ches", "shes", "xes")) else unit.removesuffix("s")
    head = (f"{'':<{name_width}} {unit + '/s':>12} {'ratio':>7} "
            f"{cpu_unit + item:>16} {'ratio':>7}")
    head += "".join(f" {heading:>12}" for heading, _ in columns)
    lines = [head]
    for row in rows:
        line = (f"{row.name:<{name_width}} {row.rate:>12,.0f} {row.ratio:>6.2f}x {row.cpu_ms * cpu_scale:>16.{places}f} "
                f"{row.cpu_ratio:>6.2f}x")
        line += "".join(f" {fmt(row):>12}" for _, fmt in columns)
        lines.append(line)
    lines.append(f"(ratios against '{base}' in the same run: {unit}/s median round / baseline's; CPU per "
                 f"{item} / baseline's, below 1.00x is less CPU)")
    return "\n".join(lines)


# --- the machine ----------------------------------------------------------------------------------

def machine_load() -> dict[str, Any]:
    """The 1-minute load average, the CPU count and the CPU pressure (PSI ``some avg60``, %) if known."""
    pressure = None
    try:
        first = Path("/proc/pressure/cpu").read_text().split("\n")[0]
        pressure = float(first.split("avg60=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        pass
    return {"loadavg_1m": os.getloadavg()[0], "cpus": os.cpu_count(), "cpu_pressure_avg60": pressure}


def describe_load(before: dict[str, Any], after: dict[str, Any]) -> str:
    """One line about the machine's load before and after the measurements."""
    return (f"machine: {before['cpus']} CPUs; load average {before['loadavg_1m']:.2f} before, "
            f"{after['loadavg_1m']:.2f} after; CPU pressure (share of time a task waited for a core) "
            f"{before['cpu_pressure_avg60']} / {after['cpu_pressure_avg60']} %")


# --- micro-measurements ---------------------------------------------------------------------------

def timed_loop(body: Callable[[], int], min_seconds: float = 1.0) -> float:
    """Items/s of ``body`` (which returns how many items it handled), repeated >= ``min_seconds``
    after one warm-up call."""
    body()
    count, start = 0, time.perf_counter()
    while True:
        count += body()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return count / elapsed


def run_for(body: Callable[[], int], seconds: float) -> Callable[[], int]:
    """A body for ``measure`` that calls ``body`` (which returns items handled) for ``seconds``."""
    def run() -> int:
        count, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            count += body()
        return count
    return run


def median_rate(body: Callable[[], int], repeats: int = 3, min_seconds: float = 0.5) -> float:
    """The median of ``repeats`` ``timed_loop`` rates."""
    return statistics.median(timed_loop(body, min_seconds) for _ in range(repeats))


# --- the page cache -------------------------------------------------------------------------------

def drop_all() -> bool:
    """Flush and drop the whole page cache (needs root); False when not allowed."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as handle:
            handle.write("3\n")
    except OSError:
        return False
    return True


def evict(paths: Iterable[str | Path], *, whole_cache: bool = False) -> bool:
    """Make the next reads of ``paths`` come from the device; False if some file could not be evicted.

    Without ``whole_cache``, each file is flushed and its pages dropped with
    ``posix_fadvise(DONTNEED)`` (no root needed, other files keep their pages).
    """
    if whole_cache:
        return drop_all()
    ok = True
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fdatasync(fd)  # dirty pages cannot be dropped
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        except OSError:
            ok = False
    return ok


def warm(paths: Iterable[str | Path]) -> int:
    """Read every file once (into the page cache); the bytes read."""
    total = 0
    for path in paths:
        path = Path(path)
        if not path.is_file():
            continue
        with open(path, "rb") as handle:
            while chunk := handle.read(8 << 20):
                total += len(chunk)
    return total
