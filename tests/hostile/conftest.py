"""The hostile-input tests count their trials; a session that ran any of them prints the counts last."""

from __future__ import annotations

import json
from typing import Iterator

import pytest

from helpers import HOSTILE_TRIALS


@pytest.fixture(scope="session", autouse=True)
def _print_trial_counts() -> Iterator[None]:
    # scripts/reliability_report.py runs pytest -s and reads this line
    yield
    print(f"\nhostile input trials: {json.dumps(dict(sorted(HOSTILE_TRIALS.items())), sort_keys=True)}")
