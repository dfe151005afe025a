"""benchmarks/harness.py: stretches count the CPU of children, rounds rotate, rows hold medians and ratios."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

import harness


def spin(seconds: float) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def test_measure_counts_wall_own_cpu_and_a_waited_child() -> None:
    child = "import time\nend = time.process_time() + 0.2\nwhile time.process_time() < end: pass"
    stretch = harness.measure(lambda: (spin(0.1), subprocess.run([sys.executable, "-c", child], check=True))[0],
                              items=10)
    assert stretch.items == 10
    assert stretch.cpu_seconds >= 0.28  # 0.1 here + 0.2 in the child (its start-up adds more)
    assert stretch.seconds >= 0.28
    assert stretch.rate == pytest.approx(10 / stretch.seconds)


def test_measure_takes_the_count_or_a_dict_from_the_body() -> None:
    assert harness.measure(lambda: 7).items == 7
    stretch = harness.measure(lambda: {"items": 3, "note": "x"})
    assert stretch.items == 3 and stretch.extra == {"note": "x"}
    with pytest.raises(ValueError, match="no item count"):
        harness.measure(lambda: None)


def test_interleave_rotates_the_order_each_round() -> None:
    order: list[str] = []

    def candidate(name: str):  # noqa: ANN202
        return name, lambda: (order.append(name), harness.Stretch(items=1, seconds=1.0, cpu_seconds=0.5))[1]

    done = harness.interleave([candidate("a"), candidate("b"), candidate("c")], 3, log=None)
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert {name: len(runs) for name, runs in done.items()} == {"a": 3, "b": 3, "c": 3}


def test_summarize_takes_the_median_round_and_ratios_against_the_baseline() -> None:
    results = {
        "base": [harness.Stretch(100, 1.0, 2.0), harness.Stretch(100, 2.0, 2.0), harness.Stretch(100, 4.0, 2.0)],
        "fast": [harness.Stretch(100, 0.5, 0.5), harness.Stretch(100, 0.25, 0.5), harness.Stretch(100, 1.0, 0.5)],
    }
    base, fast = harness.summarize(results)
    assert base.rate == 50 and base.best_rate == 100 and base.cpu_ms == pytest.approx(20.0)
    assert fast.rate == 200 and fast.ratio == pytest.approx(4.0) and fast.cpu_ratio == pytest.approx(0.25)
    assert base.cores == pytest.approx(6.0 / 7.0)
    again = harness.summarize(results, baseline="fast")
    assert again[0].ratio == pytest.approx(0.25)
    text = harness.table([base, fast], unit="images")
    assert "4.00x" in text and "0.25x" in text and "CPU ms/image" in text and "'base'" in text
    tiny = harness.summarize({"small": [harness.Stretch(100_000, 1.0, 0.5)]})
    assert "CPU us/image" in harness.table(tiny, unit="images") and "5.000" in harness.table(tiny, unit="images")


def test_run_for_and_timed_loop_count_items() -> None:
    stretch = harness.measure(harness.run_for(lambda: 2, 0.05))
    assert stretch.items >= 2 and stretch.items % 2 == 0
    assert harness.timed_loop(lambda: 5, 0.02) > 0


def test_evict_reports_files_it_cannot_open(tmp_path) -> None:  # noqa: ANN001
    real = tmp_path / "a.bin"
    real.write_bytes(b"x" * 8192)
    assert harness.evict([real]) is True
    assert harness.evict([real, tmp_path / "missing"]) is False
    assert harness.warm([real, tmp_path / "missing"]) == 8192
