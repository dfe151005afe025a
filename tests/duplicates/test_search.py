"""The multi-index search against brute force: the same pairs, distances and mirror flags."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packer.duplicates.phash import FLIP_MASK
from packer.duplicates.search import MAX_EXACT, RADII, brute_force_pairs, chunk_distances, near_pairs
from packer.errors import OptionError


def _rows(pairs) -> set[tuple[int, int, int, bool]]:  # noqa: ANN001
    return set(zip(pairs.first.tolist(), pairs.second.tolist(), pairs.distance.tolist(), pairs.mirrored.tolist()))


def _hashes(seed: int, count: int, copies: int, max_flips: int, mirrored: float) -> np.ndarray:
    """Random hashes with planted copies (a few bits flipped, some mirrored) and exact repeats."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(0, 2 ** 64, size=(count, 2), dtype=np.uint64, endpoint=False)
    if count < 2:
        return hashes
    for _ in range(copies):
        source, target = rng.integers(0, count, 2)
        copy = hashes[source].copy()
        for bit in rng.choice(128, int(rng.integers(0, max_flips + 1)), replace=False):
            copy[bit // 64] ^= np.uint64(1) << np.uint64(bit % 64)
        if rng.random() < mirrored:
            copy ^= FLIP_MASK
        hashes[target] = copy
    return hashes


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), count=st.integers(0, 160), copies=st.integers(0, 60),
       max_flips=st.integers(0, 40), threshold=st.integers(0, 40), flips=st.booleans())
def test_the_search_equals_brute_force(seed: int, count: int, copies: int, max_flips: int, threshold: int,
                                       flips: bool) -> None:
    hashes = _hashes(seed, count, copies, max_flips, 0.3 if flips else 0.0)
    assert _rows(near_pairs(hashes, threshold, flips=flips, workers=1 + seed % 3)) == _rows(
        brute_force_pairs(hashes, threshold, flips=flips))


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2 ** 32 - 1), threshold=st.integers(0, MAX_EXACT))
def test_up_to_max_exact_every_pair_within_the_threshold_is_found(seed: int, threshold: int) -> None:
    hashes = _hashes(seed, 120, 80, MAX_EXACT, 0.0)
    every = brute_force_pairs(hashes, threshold, chunk_rule=False)
    assert _rows(near_pairs(hashes, threshold)) == _rows(every)


def test_above_max_exact_only_pairs_spread_over_every_chunk_are_missed() -> None:
    base = np.zeros((1, 2), dtype=np.uint64)
    spread = base.copy()
    for word, first, width in ((0, 0, 21), (0, 21, 21), (0, 42, 22)):
        spread[0, word] |= np.uint64(0b111 << first)  # 3 bits in each chunk of word 0
    for first in (0, 21, 42):
        spread[0, 1] |= np.uint64(0b11 << first)  # 2 in each of word 1: 15 bits, no chunk within its radius
    assert (chunk_distances(base, spread) > RADII).all()
    hashes = np.concatenate([base, spread])
    assert len(brute_force_pairs(hashes, 15, chunk_rule=False)) == 1
    assert len(near_pairs(hashes, 15)) == 0 == len(brute_force_pairs(hashes, 15))
    lighter = spread.copy()
    lighter[0, 1] ^= np.uint64(1)  # one chunk of word 1 now within 1 bit: a candidate
    assert len(near_pairs(np.concatenate([base, lighter]), 15)) == 1


def test_a_large_set_finds_every_planted_copy_and_nothing_else() -> None:
    rng = np.random.default_rng(3)
    hashes = rng.integers(0, 2 ** 64, size=(60_000, 2), dtype=np.uint64, endpoint=False)
    sources, targets = rng.choice(len(hashes), size=(2, 300), replace=False)
    hashes[targets] = hashes[sources] ^ np.array([1 << 5 | 1 << 40, 1 << 9], dtype=np.uint64)
    pairs = near_pairs(hashes, 20, workers=2)
    assert _rows(pairs) == _rows(near_pairs(hashes, 20, workers=1))
    assert _rows(pairs) == {(min(a, b), max(a, b), 3, False) for a, b in zip(sources.tolist(), targets.tolist())}


@pytest.mark.parametrize("threshold", [-1, 129, 2.5, True, "8"])
def test_a_bad_threshold_is_an_option_error(threshold: object) -> None:
    with pytest.raises(OptionError, match="threshold must be an integer number of bits from 0 to 128"):
        near_pairs(np.zeros((2, 2), np.uint64), threshold)  # type: ignore[arg-type]


def test_hashes_of_the_wrong_shape_are_an_option_error() -> None:
    with pytest.raises(OptionError, match=r"hashes must be an \(N, 2\) uint64 array, got shape \(4,\)"):
        near_pairs(np.zeros(4, np.uint64), 3)
