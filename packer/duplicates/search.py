"""Near-neighbour search over 128-bit hashes: multi-index hashing, never all pairs.

The rule (Norouzi, Punjani and Fleet, "Fast search in Hamming space with multi-index hashing",
CVPR 2012). The 128 bits are cut into six chunks of 21 or 22 bits (each 64-bit word into 21 + 21
+ 22). If two hashes differ in at most ``t`` bits and chunk ``c`` is probed within ``r_c`` bits
with ``sum(r_c + 1) > t``, then by the pigeonhole principle one chunk differs in at most its
``r_c`` bits; so every pair within ``t`` is found by looking up, for every hash and every chunk,
the hashes whose chunk is within ``r_c`` bits of its own (one table lookup per bit pattern), and
the exact distance is computed only for those candidates. The chunks of word 0 (the 64 lowest
frequencies, where near-duplicates differ least) are probed within 2 bits (232 patterns of 21
bits), those of word 1 within 1 (22 patterns): ``MAX_EXACT`` = 3 * 3 + 3 * 2 - 1 = 14. Each
lookup finds ``N / 2^21`` hashes on average (half a hash for a million), against the 5 * 10^11
comparisons of all pairs.

What is guaranteed. A pair is reported when its distance is at most ``threshold`` *and* one of
its chunks differs in at most that chunk's radius. For ``threshold <= MAX_EXACT`` the second
condition follows from the first, so the result is exactly every pair within the threshold (the
tests compare it with brute force). Above, a pair whose differences are spread over every chunk
(3 or more in each chunk of word 0, 2 or more in each of word 1) is not a candidate;
``brute_force_pairs`` applies the same definition, and the benchmark reports how many planted
copies within the threshold that rule loses (none on its corpus of real photographs:
near-duplicates differ mostly in the high frequencies, so a chunk of the lowest ones rarely
differs in more than 2 bits).

Mirrored matches (``flips=True``): the mirrored image's hash is ``hash ^ FLIP_MASK`` (see
``phash``), so a second round of lookups with the flipped chunk keys finds the pairs whose
distance after mirroring one side is within the threshold, at twice the cost.

Cost (benchmarks/bench_duplicates.py, 1,000,000 random hashes on this project's 2-core VM):
11.5 s and 390 MiB with two threads, 16 s and 245 MiB with one (the hours of all pairs avoided). Everything is vectorised numpy: for
each chunk the hashes are sorted by chunk value once; the lookups of one bit pattern are one
gather into a dense table of 2^21 or 2^22 entries (the first hash of each chunk value; the rare
values held by several hashes are expanded apart), done in sorted order so consecutive lookups
touch neighbouring memory.
"""

from __future__ import annotations

import functools
import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..errors import OptionError
from .phash import FLIP_MASK, HASH_BITS, HASH_WORDS

__all__ = ["Pairs", "near_pairs", "brute_force_pairs", "CHUNKS", "RADII", "MAX_EXACT", "chunk_distances"]

#: (word, first bit, width, radius) of each chunk: a pair is a candidate when one of its chunks
#: differs in at most that chunk's radius bits. Word 0 holds the 64 lowest frequencies, where
#: near-duplicates differ least: its chunks are probed within 2 bits (232 lookups a hash), word 1's
#: within 1 (22 lookups), which halves the cost of probing every chunk within 2.
CHUNKS = tuple((word, first, width, 2 - word) for word in range(HASH_WORDS)
               for first, width in ((0, 21), (21, 21), (42, 22)))
#: The largest threshold for which the search is exact (every pair within it is found): the
#: pigeonhole bound, one less than the sum of (radius + 1) over the chunks.
MAX_EXACT = sum(radius + 1 for *_, radius in CHUNKS) - 1
assert sum(width for _, _, width, _ in CHUNKS) == HASH_BITS


@dataclass(frozen=True)
class Pairs:
    """Pairs of rows, ``first < second``, sorted by (first, second).

    Attributes:
        first, second: int64 row numbers of the hash array searched.
        distance: int64 Hamming distance (after mirroring ``second`` when ``mirrored``).
        mirrored: bool, True where the pair matches only as mirror images (closer mirrored
            than as they are).
    """

    first: np.ndarray
    second: np.ndarray
    distance: np.ndarray
    mirrored: np.ndarray

    def __len__(self) -> int:
        return len(self.first)

    @staticmethod
    def empty() -> "Pairs":
        none = np.zeros(0, dtype=np.int64)
        return Pairs(none, none, none, np.zeros(0, dtype=bool))


def _check(hashes: np.ndarray, threshold: int) -> np.ndarray:
    hashes = np.ascontiguousarray(hashes, dtype=np.uint64)
    if hashes.ndim != 2 or hashes.shape[1] != HASH_WORDS:
        raise OptionError(f"hashes must be an (N, {HASH_WORDS}) uint64 array, got shape {hashes.shape}")
    if isinstance(threshold, bool) or not isinstance(threshold, (int, np.integer)) or not 0 <= threshold <= HASH_BITS:
        raise OptionError(f"threshold must be an integer number of bits from 0 to {HASH_BITS}, got {threshold!r}")
    return hashes


def _distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.bitwise_count(a ^ b).sum(axis=-1, dtype=np.int64)


def chunk_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Differing bits per chunk, ``(..., 6)``, for hashes ``a`` and ``b`` (broadcast)."""
    x = np.asarray(a, dtype=np.uint64) ^ np.asarray(b, dtype=np.uint64)
    return np.stack([np.bitwise_count((x[..., word] >> np.uint64(first)) & np.uint64((1 << width) - 1))
                     for word, first, width, _ in CHUNKS], axis=-1).astype(np.int64)


#: Most chunks searched at once (each thread holds its chunk's tables).
MAX_WORKERS = 3

#: Each chunk's radius, in CHUNKS order.
RADII = np.array([radius for *_, radius in CHUNKS], dtype=np.int64)


@functools.lru_cache(maxsize=8)
def _masks(width: int, radius: int) -> tuple[int, ...]:
    """Every bit pattern of at most ``radius`` set bits in ``width`` bits (0 included)."""
    return tuple(sum(1 << b for b in bits) for count in range(radius + 1)
                 for bits in itertools.combinations(range(width), count))


class _Collector:
    """Found pairs, kept as arrays until the end."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, bool]] = []

    def add(self, first: np.ndarray, second: np.ndarray, distance: np.ndarray, mirrored: bool) -> None:
        # list.append is atomic: the search threads share one collector
        if len(first):
            self.parts.append((first.astype(np.int64), second.astype(np.int64), distance.astype(np.int64), mirrored))

    def pairs(self) -> Pairs:
        if not self.parts:
            return Pairs.empty()
        a = np.concatenate([p[0] for p in self.parts])
        b = np.concatenate([p[1] for p in self.parts])
        distance = np.concatenate([p[2] for p in self.parts])
        mirrored = np.concatenate([np.full(len(p[0]), p[3]) for p in self.parts])
        first, second = np.minimum(a, b), np.maximum(a, b)
        # one row per pair: the smallest distance wins, direct before mirrored at a tie
        order = np.lexsort((mirrored, distance, second, first))
        first, second, distance, mirrored = first[order], second[order], distance[order], mirrored[order]
        keep = np.ones(len(first), dtype=bool)
        keep[1:] = (first[1:] != first[:-1]) | (second[1:] != second[:-1])
        return Pairs(first[keep], second[keep], distance[keep], mirrored[keep])


def near_pairs(hashes: np.ndarray, threshold: int, *, flips: bool = False, workers: int = 1) -> Pairs:
    """Every pair of rows of ``hashes`` within ``threshold`` bits (module docstring: exact up to
    ``MAX_EXACT``; above, pairs with a chunk within its radius).

    Args:
        hashes: ``(N, 2)`` uint64 (``phash`` hashes).
        threshold: the largest Hamming distance reported.
        flips: also pair an image with the mirror image of another.
        workers: chunks searched at once, one thread each (numpy's gathers release the GIL);
            each holds its own tables (about 150 MB for a million hashes), so at most
            ``MAX_WORKERS`` run.

    Raises:
        OptionError: a threshold outside 0..128, or hashes of the wrong shape.
    """
    hashes = _check(hashes, threshold)
    found = _Collector()
    if len(hashes) < 2:
        return found.pairs()
    rounds = [(0, 0, False)] + ([(int(FLIP_MASK[0]), int(FLIP_MASK[1]), True)] if flips else [])
    words = (np.ascontiguousarray(hashes[:, 0]), np.ascontiguousarray(hashes[:, 1]))

    def search_chunk(chunk: tuple[int, int, int, int]) -> None:
        word, first_bit, width, radius = chunk
        table = _ChunkTable(words, word, first_bit, width, threshold)
        for xor_lo, xor_hi, mirrored in rounds:
            xor_chunk = ((xor_lo, xor_hi)[word] >> first_bit) & ((1 << width) - 1)
            patterns = sorted({mask ^ xor_chunk for mask in _masks(width, radius)})
            for top, group in itertools.groupby(patterns, key=lambda p: p.bit_length() - 1):
                if top < 0:
                    table.same_bucket(found, xor_lo, xor_hi, mirrored)
                else:
                    table.probe(found, top, list(group), xor_lo, xor_hi, mirrored)

    workers = max(1, min(int(workers), MAX_WORKERS, len(CHUNKS)))
    if workers == 1:
        for chunk in CHUNKS:
            search_chunk(chunk)
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="packer-search") as pool:
            list(pool.map(search_chunk, CHUNKS))
    return found.pairs()


class _ChunkTable:
    """One chunk's lookup structure: the hashes sorted by chunk value, the start of each value's
    run in that order (a dense table of 2^width + 1 entries), and each run's first hash."""

    def __init__(self, words: tuple[np.ndarray, np.ndarray], word: int, first_bit: int, width: int,
                 threshold: int) -> None:
        chunk = ((words[word] >> np.uint64(first_bit)) & np.uint64((1 << width) - 1)).astype(np.uint32)
        self.order = np.argsort(chunk, kind="stable").astype(np.int32)
        self.chunk = chunk[self.order]
        self.lo = words[0][self.order]
        self.hi = words[1][self.order]
        counts = np.bincount(self.chunk, minlength=1 << width)
        self.starts = np.zeros((1 << width) + 1, dtype=np.int32)
        np.cumsum(counts, out=self.starts[1:])
        self.occupancy = np.minimum(counts, 255).astype(np.uint8)
        # most lookups find one hash or none (half a hash per value for a million): the first hash
        # of each run answers them with one gather
        filled = np.flatnonzero(counts)
        self.head_lo = np.zeros(1 << width, dtype=np.uint64)
        self.head_hi = np.zeros(1 << width, dtype=np.uint64)
        self.head_lo[filled] = self.lo[self.starts[filled]]
        self.head_hi[filled] = self.hi[self.starts[filled]]
        self.threshold = np.uint8(threshold) if threshold < 255 else threshold

    def _close(self, lo: np.ndarray, hi: np.ndarray, other_lo: np.ndarray, other_hi: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:
        distance = np.bitwise_count(lo ^ other_lo) + np.bitwise_count(hi ^ other_hi)
        return distance <= self.threshold, distance

    def same_bucket(self, found: _Collector, xor_lo: int, xor_hi: int, mirrored: bool) -> None:
        """Pairs whose chunks are equal: neighbours in sorted order ``gap`` apart, for every gap
        up to the longest run."""
        chunk, lo, hi = self.chunk, self.lo ^ np.uint64(xor_lo), self.hi ^ np.uint64(xor_hi)
        gap = 1
        while gap < len(chunk):
            at = np.flatnonzero(chunk[:-gap] == chunk[gap:])
            if not len(at):
                break
            ok, distance = self._close(lo[at], hi[at], self.lo[at + gap], self.hi[at + gap])
            found.add(self.order[at[ok]], self.order[at[ok] + gap], distance[ok], mirrored)
            gap += 1

    def probe(self, found: _Collector, top: int, patterns: list[int], xor_lo: int, xor_hi: int,
              mirrored: bool) -> None:
        """Pairs whose chunks differ by exactly one of ``patterns`` (all with highest bit
        ``top``), each pair found once: from the side whose chunk has bit ``top`` clear (the other
        side's value is then the larger)."""
        side = np.flatnonzero((self.chunk & np.uint32(1 << top)) == 0).astype(np.int32)
        side_chunk = self.chunk[side]
        mine_lo = self.lo[side] ^ np.uint64(xor_lo)
        xor_hi = np.uint64(xor_hi)
        for pattern in patterns:
            keys = side_chunk ^ np.uint32(pattern)
            # the first word alone rules out nearly every lookup; the second is read for the rest
            near = np.flatnonzero(np.bitwise_count(mine_lo ^ self.head_lo[keys]) <= self.threshold)
            if len(near):
                rows, heads = side[near], keys[near]
                ok, distance = self._close(self.lo[rows] ^ np.uint64(xor_lo), self.hi[rows] ^ xor_hi,
                                           self.head_lo[heads], self.head_hi[heads])
                ok &= self.occupancy[heads] != 0
                found.add(self.order[rows[ok]], self.order[self.starts[heads[ok]]], distance[ok], mirrored)
            more = np.flatnonzero(self.occupancy[keys] > 1)
            if not len(more):
                continue
            runs = keys[more]
            firsts = self.starts[runs] + 1
            sizes = self.starts[runs + 1] - firsts
            ends = np.cumsum(sizes)
            positions = np.repeat(firsts - (ends - sizes), sizes) + np.arange(int(ends[-1]), dtype=np.int32)
            rows = np.repeat(more, sizes)
            near = np.flatnonzero(np.bitwise_count(mine_lo[rows] ^ self.lo[positions]) <= self.threshold)
            if not len(near):
                continue
            rows, positions = side[rows[near]], positions[near]
            ok, distance = self._close(self.lo[rows] ^ np.uint64(xor_lo), self.hi[rows] ^ xor_hi,
                                       self.lo[positions], self.hi[positions])
            found.add(self.order[rows[ok]], self.order[positions[ok]], distance[ok], mirrored)


def brute_force_pairs(hashes: np.ndarray, threshold: int, *, flips: bool = False,
                      chunk_rule: bool = True) -> Pairs:
    """The reference: every pair compared (quadratic; for tests and small sets). With
    ``chunk_rule``, the same definition as ``near_pairs`` above ``MAX_EXACT``."""
    hashes = _check(hashes, threshold)
    found = _Collector()
    rounds = [(np.zeros(HASH_WORDS, dtype=np.uint64), False)] + ([(FLIP_MASK, True)] if flips else [])
    for row in range(len(hashes) - 1):
        others = hashes[row + 1:]
        for xor, mirrored in rounds:
            mine = hashes[row] ^ xor
            distance = _distance(mine[None, :], others)
            ok = distance <= threshold
            if chunk_rule and threshold > MAX_EXACT:
                ok &= (chunk_distances(mine[None, :], others) <= RADII).any(axis=1)
            hits = np.flatnonzero(ok)
            found.add(np.full(len(hits), row), hits + row + 1, distance[hits], mirrored)
    return found.pairs()
