"""Read orders: which samples each rank and worker reads, in which order, as a function of (seed, epoch).

Pure numpy, no torch: every reader (``packer.torch``, ``packer.threaded``, ``packer.dali``,
``packer.grain``, ``packer.lightning``, ``packer.gpu``) shares it.

**The order value.** Which samples come in which order for whom is one frozen value,
``ReadOrder`` (``packer.ReadOrder``): kind, seed, batch size (None: the reader's own), drop rule,
rank and world size (None: ``torch.distributed``'s, ``resolve_rank``), block settings. Every
reader takes it as ``order=``; the order keywords readers took before go through one conversion,
``read_order_from``, with a ``DeprecationWarning``.

Three layers, each a plain function of its arguments (no global RNG, no hidden state):

1. **The global epoch order** ``epoch_order(kind, num_samples, seed=, epoch=)``: a permutation of
   ``0..num_samples-1`` that depends only on (kind, seed, epoch) and, for ``"block"``, the block
   boundaries and window.

   * ``"sequential"``: index order (storage order: samples are packed in index order).
   * ``"random"``: a uniform random permutation.
   * ``"block"``: a locality-preserving shuffle for datasets larger than RAM or on network
     filesystems. The index is cut into *blocks*, runs of consecutive samples of one shard
     spanning about ``block_bytes`` of the file (``index_blocks``). The order of the blocks is
     shuffled, then the samples of every ``window`` consecutive (shuffled) blocks are shuffled
     together. A reader can fetch each block with one large read (or one ``WILLNEED`` hint) and
     never needs more than a window of blocks in flight.

   Seeding: ``numpy.random.Generator(PCG64([seed, epoch]))``, so epochs differ, and one seed
   reproduces a run on any machine.

2. **Dealing to ranks** ``deal(order, consumed=, rank=, world_size=, batch_size=, drop_last=)``.
   The epoch is consumed as a *prefix* of the global order in global steps of
   ``world_size * batch_size`` samples: at step ``s`` the ranks together take positions
   ``[s*W*B, (s+1)*W*B)`` and rank ``r`` takes the ``r``-th slice of ``B`` of them. So after any
   number of steps, the samples consumed are exactly the first ``consumed`` positions of the global
   order, whatever the world size, batch size or number of workers: a job can save
   ``(seed, epoch, consumed)`` and resume with a different number of workers or ranks, and it sees
   exactly the remaining samples of the epoch, none twice.

   With the ``"block"`` order each global step is sorted by sample index before it is split, so a
   rank's batch comes from about ``1/world_size`` of the step's blocks, read as long contiguous
   runs, and different ranks read different blocks. (Each rank's batches are then less mixed
   than the global batch; the global batch is unchanged.)

   **Equal shares (the pad/drop rule).** From a position ``consumed`` the ``R = N - consumed``
   remaining positions are cut to a length every rank can share equally:

   * ``drop_last=False`` (default): ``R`` is padded up to a multiple of ``world_size`` with the
     first positions of the epoch order (wrapping around), as ``DistributedSampler`` does. Every
     rank gets ``ceil(R / W)`` samples; all batches are full except possibly the last one, which
     has the same size on every rank. At most ``W - 1`` samples are seen twice per epoch.
   * ``drop_last=True``: ``R`` is cut down to a multiple of ``W * B``, dropping the end of the
     epoch order; every rank gets only full batches. At most ``W*B - 1`` samples are skipped.

   Either way every rank gets the same number of samples and of batches, by construction.

3. **Dealing to workers**: a rank's batches go round-robin to its DataLoader workers, worker
   ``w`` of ``K`` taking batches ``w, w+K, ...`` (``RankPlan.worker_batches``). This is the order
   in which ``torch.utils.data.DataLoader`` collects results from its workers, so a loader's
   ``k``-th batch is the rank's ``k``-th batch and ``RankPlan.consumed_after(k)`` is the global
   position to save.

4. **The cursor** ``EpochCursor``: the one object every reader (``packer.torch``'s samplers and
   iterable dataset, ``packer.gpu``'s loaders, ``packer.dali``'s sources) keeps its place with:
   the order, the *sample space* it orders, this rank, the ``(epoch, start)`` position and a
   count of what it handed out; ``state_dict`` / ``load_state_dict`` turn that into the
   ``(seed, epoch, consumed)`` state above. What is ordered is pluggable (``SampleSpace``:
   ``num_samples``, ``epoch_order(order, epoch)``, ``identity()``), so mixtures and views plug
   in without touching the readers; a dataset's space is ``IndexSpace`` (blocks measured in
   bytes from its index, or uniform blocks for a bare count), and a state records its identity
   so that a state from another space is refused (``StateMismatchError``, naming what differs).
   Where the position lives is pluggable too (``Position``), so a torch reader can keep it in
   shared memory for its persistent workers.

5. **Passes after a resume.** A position loaded with ``load_state_dict`` is used *once*: the pass
   that follows the load reads exactly the rest of the saved epoch, and every later pass is a
   whole epoch. The epoch number changes only when the caller says so: ``set_epoch`` (or DALI's
   epoch counter) selects the next pass's epoch; a loop that never calls ``set_epoch`` reads the
   same epoch number again, pass after pass, as ``DistributedSampler`` does. So a resumed run reads
   what the uninterrupted run would have, pass for pass. ``Position.claim`` implements the rule
   for every reader: each process (or DataLoader worker) that begins a pass claims the start once,
   and a second claim of the same load finds it used and starts at 0.

Why one module of ~1100 lines (the house guide is ~700): the five parts above are one rule, what a
reader reads after ``(seed, epoch, consumed)``, and each part is written against the others'
invariants (a prefix of the global order, steps of ``world_size * batch_size``, a start claimed
once, a state refused by the space it was not made on). Kept together they are read, and
mutation-tested (``scripts/mutate.py order``), as one unit; the code is pure functions plus the
value, the space and the cursor that call them, with no I/O to split off.
"""

from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Protocol

import numpy as np
import xxhash

from .deprecation import warn_deprecated
from .errors import OptionError, StateMismatchError, UnexpectedKeywordError

__all__ = [
    "ORDERS", "DEFAULT_BLOCK_BYTES", "DEFAULT_WINDOW", "DEFAULT_BLOCK_SAMPLES", "STATE_VERSION",
    "epoch_rng", "sequential_order", "random_order", "index_blocks", "uniform_blocks", "block_order",
    "epoch_order", "RankShare", "rank_share", "RankPlan", "deal", "ReadOrder", "ORDER_KEYWORDS", "read_order_from",
    "resolve_rank", "LAUNCHER_VARIABLES", "SampleSpace", "IndexSpace", "sample_space", "Position", "POSITION_SLOTS",
    "EpochCursor", "CursorReader", "check_epoch", "MAX_EPOCH",
]

#: The order kinds understood by ``epoch_order``.
ORDERS = ("sequential", "random", "block")
#: Default block size for the block shuffle: large enough for one efficient sequential read on a
#: network filesystem, small enough that a window of blocks fits comfortably in the page cache.
DEFAULT_BLOCK_BYTES = 4 << 20
#: Default number of consecutive shuffled blocks whose samples are shuffled together (128 MiB).
DEFAULT_WINDOW = 32
#: Block length, in samples, when only the sample count is known (no index to measure bytes).
DEFAULT_BLOCK_SAMPLES = 64
#: Version of the dictionaries returned by ``ReadOrder.state_dict``.
STATE_VERSION = 1


def _check_nonnegative(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise OptionError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def _check_positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise OptionError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def epoch_rng(seed: int, epoch: int) -> np.random.Generator:
    """The generator for one epoch: ``PCG64([seed, epoch])``, independent of any global RNG."""
    return np.random.Generator(np.random.PCG64([_check_nonnegative("seed", seed),
                                                _check_nonnegative("epoch", epoch)]))


def sequential_order(num_samples: int) -> np.ndarray:
    """``0..num_samples-1`` as int64 (index order, which is storage order)."""
    return np.arange(_check_nonnegative("num_samples", num_samples), dtype=np.int64)


def random_order(num_samples: int, *, seed: int, epoch: int) -> np.ndarray:
    """A uniform random permutation of ``0..num_samples-1`` (int64), a function of (seed, epoch)."""
    return epoch_rng(seed, epoch).permutation(_check_nonnegative("num_samples", num_samples)).astype(np.int64)


def index_blocks(offset: np.ndarray, size: np.ndarray, shard: np.ndarray,
                 block_bytes: int = DEFAULT_BLOCK_BYTES) -> np.ndarray:
    """Cut an index into blocks of consecutive samples of one shard spanning about ``block_bytes``.

    A block is a maximal run of consecutive samples in the same shard whose offsets fall in the
    same ``block_bytes``-aligned window of the shard file, so it is one contiguous byte range of
    at most ``block_bytes`` plus its last sample. A sample larger than ``block_bytes`` is a block
    of its own. Vectorised: a few array passes, no Python loop over samples.

    Args:
        offset: the index's ``offset`` column (byte offset of each sample in its shard).
        size: the index's ``size`` column (kept for the signature's symmetry with readers that
            compute byte ranges; the cut only needs the offsets).
        shard: the index's ``shard`` column.
        block_bytes: the target block span in bytes.

    Returns:
        int64 block boundaries ``b`` of length ``blocks + 1``: block ``j`` holds samples
        ``b[j]..b[j+1]-1``; ``b[0] == 0`` and ``b[-1] == len(offset)``.
    """
    block_bytes = _check_positive("block_bytes", block_bytes)
    count = len(offset)
    if len(size) != count or len(shard) != count:
        raise OptionError("offset, size and shard must have the same length")
    if count == 0:
        return np.zeros(1, dtype=np.int64)
    block_of = np.asarray(offset, dtype=np.uint64) // np.uint64(block_bytes)
    starts = np.empty(count, dtype=bool)
    starts[0] = True
    np.not_equal(block_of[1:], block_of[:-1], out=starts[1:])
    starts[1:] |= np.asarray(shard[1:]) != np.asarray(shard[:-1])
    del block_of
    return np.append(np.flatnonzero(starts), count).astype(np.int64)


def uniform_blocks(num_samples: int, block_samples: int = DEFAULT_BLOCK_SAMPLES) -> np.ndarray:
    """Block boundaries of ``block_samples`` consecutive samples each (the last may be shorter).

    For readers that only know the sample count; ``index_blocks`` measures blocks in bytes.
    """
    num_samples = _check_nonnegative("num_samples", num_samples)
    block_samples = _check_positive("block_samples", block_samples)
    return np.append(np.arange(0, num_samples, block_samples, dtype=np.int64), num_samples).astype(np.int64)


def block_order(blocks: np.ndarray, *, seed: int, epoch: int, window: int = DEFAULT_WINDOW) -> np.ndarray:
    """The block shuffle: shuffle the blocks, then the samples within each window of blocks.

    Args:
        blocks: block boundaries from ``index_blocks`` or ``uniform_blocks``.
        seed, epoch: the order is a function of these (and ``blocks``, ``window``) only.
        window: how many consecutive shuffled blocks have their samples shuffled together;
            1 keeps each block's samples in storage order.

    Returns:
        An int64 permutation of ``0..blocks[-1]-1``.
    """
    window = _check_positive("window", window)
    bounds = np.asarray(blocks, dtype=np.int64)
    if bounds.ndim != 1 or len(bounds) < 1 or bounds[0] != 0 or np.any(np.diff(bounds) < 0):
        raise OptionError("blocks must be non-decreasing boundaries starting at 0")
    rng = epoch_rng(seed, epoch)
    count = int(bounds[-1])
    block_count = len(bounds) - 1
    if count == 0:
        return np.zeros(0, dtype=np.int64)
    lengths = np.diff(bounds)
    perm = rng.permutation(block_count)
    placed_lengths = lengths[perm]
    placed_ends = np.cumsum(placed_lengths)
    # Output position p inside placed block q comes from sample bounds[perm[q]] + (p - start of q).
    order = np.arange(count, dtype=np.int64)
    order += np.repeat(bounds[perm] - (placed_ends - placed_lengths), placed_lengths)
    if window > 1:
        window_ends = placed_ends[window - 1::window].tolist()
        if not window_ends or window_ends[-1] != count:
            window_ends.append(count)
        start = 0
        for end in window_ends:  # one shuffle per window: (blocks / window) calls, not per sample
            rng.shuffle(order[start:end])
            start = end
    return order


def epoch_order(kind: str, num_samples: int, *, seed: int = 0, epoch: int = 0,
                blocks: np.ndarray | None = None, window: int = DEFAULT_WINDOW) -> np.ndarray:
    """The global order of one epoch: a permutation of ``0..num_samples-1`` (int64).

    Args:
        kind: ``"sequential"``, ``"random"`` or ``"block"``.
        num_samples: the dataset's sample count.
        seed, epoch: the order is a function of these only (and the block layout).
        blocks: block boundaries for ``"block"`` (default: ``uniform_blocks(num_samples)``).
        window: blocks per shuffle window for ``"block"``.

    Raises:
        OptionError: an unknown kind, or blocks that do not cover ``num_samples``.
    """
    num_samples = _check_nonnegative("num_samples", num_samples)
    if kind == "sequential":
        return sequential_order(num_samples)
    if kind == "random":
        return random_order(num_samples, seed=seed, epoch=epoch)
    if kind == "block":
        if blocks is None:
            blocks = uniform_blocks(num_samples)
        if int(blocks[-1]) != num_samples:
            raise OptionError(f"blocks cover {int(blocks[-1])} samples, expected {num_samples}")
        return block_order(blocks, seed=seed, epoch=epoch, window=window)
    raise OptionError(f"unknown order {kind!r}; choose one of {list(ORDERS)}")


@dataclass(frozen=True)
class RankShare:
    """How much of the rest of an epoch each rank reads (arithmetic only, no order needed).

    Attributes:
        num_samples: the dataset's sample count.
        world_size, batch_size: how the epoch is dealt.
        consumed: the global position the share starts from (clamped to the sample count).
        total: global positions covered from there, padding included, a multiple of world_size.
        per_rank: samples each rank reads (``total // world_size``).
        full_steps: global steps of ``world_size * batch_size`` samples.
        num_batches: batches per rank (``full_steps`` plus one partial batch if any).
    """

    num_samples: int
    world_size: int
    batch_size: int
    consumed: int
    total: int
    per_rank: int
    full_steps: int
    num_batches: int

    def consumed_after(self, batches: int) -> int:
        """The global position once every rank has consumed its first ``batches`` batches.

        All ranks move in lock step, so this is the same on every rank: save it (with the seed
        and epoch) to resume. Once the last batch is consumed it is ``num_samples``: the epoch
        is done (padding and the dropped tail included).
        """
        batches = _check_nonnegative("batches", batches)
        if batches >= self.num_batches:
            return self.num_samples
        return self.consumed + batches * self.world_size * self.batch_size

    def consumed_after_samples(self, samples: int) -> int:
        """Like ``consumed_after`` for a count of this rank's samples (only whole batches count)."""
        samples = _check_nonnegative("samples", samples)
        if samples >= self.per_rank:
            return self.num_samples
        return self.consumed_after(samples // self.batch_size)


def rank_share(num_samples: int, *, consumed: int, world_size: int, batch_size: int,
               drop_last: bool) -> RankShare:
    """Apply the pad/drop rule (see the module docstring) to the rest of an epoch."""
    num_samples = _check_nonnegative("num_samples", num_samples)
    consumed = min(_check_nonnegative("consumed", consumed), num_samples)
    world_size = _check_positive("world_size", world_size)
    batch_size = _check_positive("batch_size", batch_size)
    remaining = num_samples - consumed
    step = world_size * batch_size
    total = (remaining // step) * step if drop_last else -(-remaining // world_size) * world_size
    full_steps = total // step
    num_batches = full_steps + (1 if total % step else 0)
    return RankShare(num_samples=num_samples, world_size=world_size, batch_size=batch_size, consumed=consumed,
                     total=total, per_rank=total // world_size, full_steps=full_steps, num_batches=num_batches)


@dataclass(frozen=True)
class RankPlan:
    """One rank's share of one epoch from a global position: its samples, cut into batches.

    Attributes:
        indices: int64 sample indices this rank reads, in order.
        batch_bounds: int64, ``num_batches + 1`` offsets into ``indices``.
        share: the arithmetic of the share (see ``RankShare``).
    """

    indices: np.ndarray
    batch_bounds: np.ndarray
    share: RankShare

    @property
    def num_batches(self) -> int:
        return len(self.batch_bounds) - 1

    def __len__(self) -> int:
        return len(self.indices)

    def batch(self, k: int) -> np.ndarray:
        """The sample indices of this rank's batch ``k`` (a view)."""
        if not 0 <= k < self.num_batches:
            raise IndexError(f"batch {k} out of range: this rank has {self.num_batches} batches")
        return self.indices[self.batch_bounds[k]:self.batch_bounds[k + 1]]

    def worker_batches(self, worker: int, num_workers: int) -> range:
        """The batches DataLoader worker ``worker`` of ``num_workers`` serves: round-robin."""
        num_workers = _check_positive("num_workers", num_workers)
        if not 0 <= worker < num_workers:
            raise OptionError(f"worker {worker} out of range for {num_workers} workers")
        return range(worker, self.num_batches, num_workers)

    def consumed_after(self, batches: int) -> int:
        """The global position once every rank has consumed its first ``batches`` batches."""
        return self.share.consumed_after(batches)

    def consumed_after_samples(self, samples: int) -> int:
        """The global position once every rank has consumed its first ``samples`` samples."""
        return self.share.consumed_after_samples(samples)


def deal(order: np.ndarray, *, consumed: int = 0, rank: int = 0, world_size: int = 1, batch_size: int = 1,
         drop_last: bool = False, sort_steps: bool = False) -> RankPlan:
    """Deal the rest of an epoch's global order to one rank (see the module docstring).

    Args:
        order: the epoch's global order (``epoch_order``).
        consumed: global samples already consumed this epoch (a prefix of ``order``).
        rank, world_size: which share to return.
        batch_size: samples per rank per global step.
        drop_last: the drop rule instead of the pad rule.
        sort_steps: sort each global step by sample index before splitting it among ranks, so each
            rank reads contiguous runs (used for the block order).

    Returns:
        The rank's ``RankPlan``.
    """
    world_size = _check_positive("world_size", world_size)
    rank = _check_nonnegative("rank", rank)
    if rank >= world_size:
        raise OptionError(f"rank {rank} out of range for world_size {world_size}")
    order = np.asarray(order, dtype=np.int64)
    count = len(order)
    share = rank_share(count, consumed=consumed, world_size=world_size, batch_size=batch_size,
                       drop_last=drop_last)
    step = world_size * batch_size
    end = share.consumed + share.total
    sequence = order[share.consumed:min(end, count)]  # a view: no copy of the epoch order
    if end > count:  # padding wraps around to the first positions of the epoch order
        sequence = np.concatenate([sequence, order[np.arange(end - count) % count]])
    elif sort_steps:
        sequence = sequence.copy()  # sorted in place below: never touch the caller's order
    head = sequence[:share.full_steps * step].reshape(share.full_steps, step)
    tail = sequence[share.full_steps * step:]
    if sort_steps:
        head.sort(axis=1)
        tail.sort()
    mine = [head.reshape(share.full_steps, world_size, batch_size)[:, rank, :].reshape(-1)]
    if len(tail):
        mine.append(tail.reshape(world_size, -1)[rank])
    indices = np.concatenate(mine)
    bounds = np.arange(0, share.full_steps * batch_size + 1, batch_size, dtype=np.int64)
    if len(tail):
        bounds = np.append(bounds, len(indices))
    return RankPlan(indices=indices, batch_bounds=bounds, share=share)


def _blocks_fingerprint(blocks: np.ndarray) -> str:
    bounds = np.ascontiguousarray(blocks, dtype="<i8")
    return f"{len(bounds) - 1}:{xxhash.xxh3_64_intdigest(memoryview(bounds).cast('B')):016x}"


def _check_optional(check: Any, name: str, value: object) -> int | None:
    return None if value is None else check(name, value)


#: How launchers tell each process it is one of several: (world size variable, rank variable, who
#: sets them). torchrun (and torch.distributed.launch) set WORLD_SIZE and RANK; Slurm's srun sets
#: SLURM_NTASKS and SLURM_PROCID.
LAUNCHER_VARIABLES = (("WORLD_SIZE", "RANK", "torchrun"), ("SLURM_NTASKS", "SLURM_PROCID", "Slurm"))


def resolve_rank(rank: int | None = None, world_size: int | None = None) -> tuple[int, int]:
    """``(rank, world_size)``: as given, else from ``torch.distributed`` when initialised, else (0, 1).

    Never imports torch: ``torch.distributed`` is asked only when torch is already imported (a
    process group cannot exist otherwise), so torch-free readers (DALI, Grain) follow the same rule.
    A process that a launcher started as one of several (``LAUNCHER_VARIABLES`` say more than one
    in the environment, read at this call) but without a process group would otherwise take rank
    0 of 1 and read the whole dataset on every rank: that is refused.

    Raises:
        OptionError: only one of the two is given, rank is outside ``0..world_size-1``, or the
            environment says several ranks and no process group is initialised (the message names
            the fix: ``torch.distributed.init_process_group`` first, or the ranks in the order).
    """
    if rank is None and world_size is None:
        dist = getattr(sys.modules.get("torch"), "distributed", None)
        if dist is not None and dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            _refuse_launched_without_a_group()
            rank, world_size = 0, 1
    elif rank is None or world_size is None:
        raise OptionError("give both rank and world_size, or neither (to use torch.distributed)")
    if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) or world_size < 1:
        raise OptionError(f"world_size must be a positive integer, got {world_size!r}")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size:
        raise OptionError(f"rank must be an integer in 0..{world_size - 1}, got {rank!r}")
    return int(rank), int(world_size)


def _refuse_launched_without_a_group() -> None:
    for size_name, rank_name, launcher in LAUNCHER_VARIABLES:
        launched = os.environ.get(size_name, "").strip()
        if launched.isdigit() and int(launched) > 1:
            this = os.environ.get(rank_name, "?").strip() or "?"
            raise OptionError(
                f"the environment says this process is rank {this} of {int(launched)} ({size_name}={int(launched)}, "
                f"{rank_name}={this}: set by {launcher}), but torch.distributed is not initialised, so this reader "
                f"would read every sample on every rank: call torch.distributed.init_process_group() before making "
                f"it (its rank and world size then come from the process group), or pass rank= and world_size= in "
                f"the order (order=packer.ReadOrder(..., rank={this}, world_size={int(launched)}); rank=0, "
                f"world_size=1 to read the whole dataset in this process)")


@dataclass(frozen=True, repr=False)
class ReadOrder:
    """Which samples come in which order for whom: the one order value every packer reader takes.

    ``PackedSampler(data, order=ReadOrder("block", seed=0, batch_size=256))``, and the same value
    for ``PackedBatchSampler``, ``PackedIterableDataset``, ``PackedDataLoader``, ``ThreadedLoader``,
    the DALI sources, Grain's ``EpochOrdered``, ``PackedDataModule`` and the GPU loaders; a kind
    string (``order="block"``) is short for ``ReadOrder("block")``. Torch-free, picklable, small:
    ``blocks`` are not stored here but measured from what is read (``IndexSpace``), so nothing
    proportional to the dataset travels with it. ``packer.ReadOrder`` is this class.

    Attributes:
        kind: ``"sequential"``, ``"random"`` or ``"block"``.
        seed: the run's seed; orders are functions of ``(seed, epoch)``.
        block_bytes: block span for ``"block"`` when blocks are measured from an index.
        window: blocks per shuffle window for ``"block"``.
        batch_size: samples per rank per global step; None: the reader's own batch size (a reader
            given another one refuses it, ``resolved``); arithmetic without a reader counts 1.
        drop_last: the drop rule (full batches only) instead of the pad rule.
        rank, world_size: this reader's share (keyword only); None for both: ``torch.distributed``
            when initialised, else rank 0 of 1 (``resolve_rank``). ``plan`` and ``share`` without
            a reader count None as rank 0 of 1.
        block_samples: cut blocks by this many samples instead of by bytes (keyword only).
    """

    kind: str = "random"
    seed: int = 0
    block_bytes: int = DEFAULT_BLOCK_BYTES
    window: int = DEFAULT_WINDOW
    batch_size: int | None = None
    drop_last: bool = False
    rank: int | None = field(default=None, kw_only=True)
    world_size: int | None = field(default=None, kw_only=True)
    block_samples: int | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if self.kind not in ORDERS:
            raise OptionError(f"unknown order {self.kind!r}; choose one of {list(ORDERS)}")
        _check_nonnegative("seed", self.seed)
        _check_positive("block_bytes", self.block_bytes)
        _check_positive("window", self.window)
        _check_optional(_check_positive, "batch_size", self.batch_size)
        _check_optional(_check_positive, "block_samples", self.block_samples)
        if not isinstance(self.drop_last, (bool, np.bool_)):
            raise OptionError(f"drop_last must be True or False, got {self.drop_last!r}")
        if (self.rank, self.world_size) != (None, None):
            resolve_rank(self.rank, self.world_size)

    def __repr__(self) -> str:
        changed = [f"{item.name}={getattr(self, item.name)!r}" for item in fields(self)[1:]
                   if getattr(self, item.name) != item.default]
        return f"ReadOrder({', '.join([repr(self.kind), *changed])})"

    def resolved(self, *, batch_size: int | None = None, reader: str = "the reader") -> "ReadOrder":
        """This order as a reader runs it: the reader's batch size filled in where this order has
        none, and ``rank``/``world_size`` resolved (``resolve_rank``).

        Args:
            batch_size: the reader's own batch size (None: it has none; this order's stands).
            reader: the reader's name, for the message.

        Raises:
            OptionError: this order's ``batch_size`` is not the reader's.
        """
        if batch_size is not None and self.batch_size is not None and batch_size != self.batch_size:
            raise OptionError(f"{reader} has batch_size={batch_size} but its order has batch_size={self.batch_size}; "
                              f"give the same, or leave the order's out (None: the reader's)")
        rank, world_size = resolve_rank(self.rank, self.world_size)
        return replace(self, batch_size=self.batch_size if batch_size is None else batch_size, rank=rank,
                       world_size=world_size)

    def _share_of(self, rank: int | None, world_size: int | None) -> tuple[int, int]:
        """``rank``/``world_size`` as given, else this order's, else rank 0 of 1."""
        rank = self.rank if rank is None else rank
        world_size = self.world_size if world_size is None else world_size
        return 0 if rank is None else rank, 1 if world_size is None else world_size

    def epoch_order(self, num_samples: int, epoch: int, blocks: np.ndarray | None = None) -> np.ndarray:
        """The global order of ``epoch`` over ``num_samples`` samples (for a sample space, call
        ``space.epoch_order(order, epoch)``)."""
        return epoch_order(self.kind, num_samples, seed=self.seed, epoch=epoch, blocks=blocks, window=self.window)

    def plan(self, space: Any, *, epoch: int, consumed: int = 0, rank: int | None = None,
             world_size: int | None = None, blocks: np.ndarray | None = None) -> RankPlan:
        """Rank ``rank``'s plan for the rest of ``epoch`` from global position ``consumed``.

        Args:
            space: a sample space (``SampleSpace``), or a sample count (``blocks``: its blocks).
            epoch, consumed: where in the run.
            rank, world_size: which share (default: this order's, else rank 0 of 1).
        """
        space = sample_space(space, blocks)
        rank, world_size = self._share_of(rank, world_size)
        batch_size = 1 if self.batch_size is None else self.batch_size
        share = rank_share(space.num_samples, consumed=consumed, world_size=world_size, batch_size=batch_size,
                           drop_last=self.drop_last)
        if share.total == 0:  # nothing left: skip computing the permutation
            empty = np.zeros(0, dtype=np.int64)
            return RankPlan(indices=empty, batch_bounds=np.zeros(1, dtype=np.int64), share=share)
        order = space.epoch_order(self, epoch)  # deal() reads it as int64
        if np.shape(order) != (space.num_samples,):
            raise OptionError(f"{type(space).__name__}.epoch_order gave {np.shape(order)} sample numbers for an epoch "
                              f"of {space.num_samples}")
        return deal(order, consumed=share.consumed, rank=rank, world_size=world_size,
                    batch_size=batch_size, drop_last=self.drop_last, sort_steps=self.kind == "block")

    def share(self, num_samples: int, *, consumed: int = 0, world_size: int | None = None) -> RankShare:
        """The pad/drop arithmetic for the rest of an epoch (no permutation computed)."""
        return rank_share(num_samples, consumed=consumed, world_size=self._share_of(None, world_size)[1],
                          batch_size=1 if self.batch_size is None else self.batch_size, drop_last=self.drop_last)

    def state_dict(self, space: Any, *, epoch: int, consumed: int,
                   blocks: np.ndarray | None = None) -> dict[str, Any]:
        """The resumable position: a small JSON-ready dict.

        It records what decides the global order (so a resume with other settings is refused,
        not silently wrong): the order and seed, for the block order the window, and the sample
        space's ``identity`` (a dataset's: the sample count and, for the block order, a fingerprint
        of the block boundaries, ``"<count>:<xxh3>"``); then ``(epoch, consumed)``. World size,
        batch size and worker count are deliberately absent: the position is valid under any of them.

        Args:
            space: a sample space, or a sample count (``blocks``: its block boundaries).

        Raises:
            OptionError: a space whose identity names one of the keys above.
        """
        space = sample_space(space, blocks)
        state: dict[str, Any] = {"version": STATE_VERSION, "order": self.kind, "seed": self.seed,
                                 "epoch": _check_nonnegative("epoch", epoch),
                                 "consumed": min(_check_nonnegative("consumed", consumed), space.num_samples)}
        if self.kind == "block":
            state["window"] = self.window
        identity = space.identity(self)
        clash = sorted(set(identity) & set(state))
        if clash:
            raise OptionError(f"{type(space).__name__}.identity() names {clash}, which a read-order state keeps "
                              f"for itself")
        state.update(identity)
        return state

    def check_state(self, state: Mapping[str, Any], space: Any,
                    blocks: np.ndarray | None = None) -> tuple[int, int]:
        """Validate a ``state_dict`` against these settings and ``space``; returns ``(epoch, consumed)``.

        Raises:
            StateMismatchError: the state was saved with a different order, seed, window or sample
                space (another dataset size, block layout or mixture): the message names the key
                that differs, since resuming would read the wrong samples.
            OptionError: the state is malformed.
        """
        space = sample_space(space, blocks)
        if not isinstance(state, Mapping):
            raise OptionError(f"a read-order state must be a dict, got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise OptionError(f"read-order state version {state.get('version')!r} is not {STATE_VERSION}")
        expected = self.state_dict(space, epoch=0, consumed=0)
        others = sorted((set(expected) | set(state)) - set(_STATE_KEYS) - {"epoch", "consumed"})
        for key in (*_STATE_KEYS, *others):
            if state.get(key) != expected.get(key):
                raise StateMismatchError(f"the saved state has {key}={state.get(key)!r} but this reader has "
                                         f"{expected.get(key)!r}; resuming would not see the remaining samples "
                                         f"of the saved epoch")
        epoch = _check_nonnegative("epoch", state.get("epoch"))
        if epoch > MAX_EPOCH:  # the position is an int64: numpy would raise OverflowError
            raise OptionError(f"the saved state's epoch must be at most 2**63 - 1 (a reader's position is an int64), "
                              f"got {epoch!r}")
        consumed = _check_nonnegative("consumed", state.get("consumed"))
        if consumed > space.num_samples:
            raise OptionError(f"consumed={consumed} exceeds the {space.num_samples} samples of an epoch")
        return epoch, consumed


#: The largest epoch a reader keeps (its position is an int64 cell, shared with DataLoader workers).
MAX_EPOCH = (1 << 63) - 1

#: The keys of a read-order state that decide the global order, compared first by ``check_state``.
_STATE_KEYS = ("order", "seed", "num_samples", "window", "blocks")

#: The order keywords readers took before ``ReadOrder`` (deprecated there), by the field they set.
ORDER_KEYWORDS: Mapping[str, str] = {name: name for name in (
    "seed", "rank", "world_size", "drop_last", "block_bytes", "window", "block_samples")}


def read_order_from(order: "ReadOrder | str | None", deprecated: Mapping[str, Any] | None = None, *,
                    reader: str, default: ReadOrder | None = None, keywords: Mapping[str, str] = ORDER_KEYWORDS,
                    old_defaults: Mapping[str, Any] | None = None) -> ReadOrder:
    """A reader's ``order=`` argument, and the order keywords it took before, as one ``ReadOrder``.

    The one conversion every reader calls: ``order`` is a ``ReadOrder``, a kind string (short for
    ``default`` with that kind) or None (``default``); ``deprecated`` holds the old keywords the
    caller gave (``seed=``, ``rank=``, ...), which still work for one release, applied on top with a
    ``DeprecationWarning`` that spells the new call (``packer.deprecation``: it names the caller's line).

    Args:
        order: the reader's ``order=`` argument.
        deprecated: the other keyword arguments the reader was given (its ``**kwargs``).
        reader: the reader's name, for the messages.
        default: the reader's default order (``ReadOrder()`` if None).
        keywords: the old keyword names this reader accepted, each with the ``ReadOrder`` field it
            sets (``{"shard_id": "rank", ...}`` for DALI's).
        old_defaults: values the old keywords had when left out, where they differ from the
            order's (DALI's ``shard_id=0, num_shards=1``): a call that uses old keywords keeps
            reading what it read.

    Raises:
        UnexpectedKeywordError: a keyword this reader never took (also a ``TypeError``, with
            Python's message for an unknown keyword).
        OptionError: ``order`` is not an order, or old keywords beside an explicit ``ReadOrder``,
            or a value ``ReadOrder`` refuses.
    """
    base = ReadOrder() if default is None else default
    if order is None:
        result = base
    elif isinstance(order, str):
        if order not in ORDERS:
            raise OptionError(f"unknown order {order!r}; choose one of {list(ORDERS)} (or a packer.ReadOrder)")
        result = replace(base, kind=order)
    elif isinstance(order, ReadOrder):
        result = order
    else:
        raise OptionError(f"{reader}: order must be a packer.ReadOrder or one of {list(ORDERS)}, "
                          f"got {type(order).__name__}")
    given = dict(deprecated or {})
    if not given:
        return result
    unknown = [name for name in given if name not in keywords]
    if unknown:
        raise UnexpectedKeywordError(f"{reader}() got an unexpected keyword argument {unknown[0]!r}")
    if isinstance(order, ReadOrder):
        raise OptionError(f"{reader}: {', '.join(f'{name}=' for name in given)} and order={order!r} both say how "
                          f"to read; put them in the ReadOrder")
    typed = ", ".join(f"{name}=" for name in given)
    changes = {keywords[name]: value for name, value in {**(old_defaults or {}), **given}.items()}
    try:
        result = replace(result, **changes)
    except OptionError as exc:
        renamed = [f"{name}= sets {keywords[name]}" for name in given if keywords[name] != name]
        if not renamed:
            raise
        raise OptionError(f"{exc.message} ({', '.join(renamed)})") from None
    warn_deprecated(f"{reader}({typed}) is deprecated and goes in the next release: pass order=packer.{result!r}")
    return result


def check_epoch(epoch: object) -> int:
    """Return ``epoch`` as an int if it is a non-negative integer up to ``MAX_EPOCH``.

    Raises:
        OptionError: anything else (bools included; an epoch past 2**63 - 1 too, not an
            OverflowError from the int64 position).
    """
    if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
        raise OptionError(f"epoch must be a non-negative integer, got {epoch!r}")
    if epoch > MAX_EPOCH:
        raise OptionError(f"epoch must be at most 2**63 - 1 (a reader's position is an int64), got {epoch!r}")
    return int(epoch)


class SampleSpace(Protocol):
    """What an ``EpochCursor`` orders: the seam where datasets, mixtures and views plug in.

    A space says how many samples an epoch has, which sample numbers an epoch reads in which order
    for a ``ReadOrder``, and what identifies it in a saved state; the cursor deals that order to
    ranks and workers and keeps the position (``deal``, ``Position``), whatever the space is.
    ``IndexSpace`` is a single dataset's (or a bare count's). Spaces are pickled to DataLoader
    workers: keep them cheap to pickle (recompute what is proportional to the dataset lazily).
    """

    @property
    def num_samples(self) -> int:
        """The length of every epoch's order: what a state's ``consumed`` counts up to."""

    def epoch_order(self, order: ReadOrder, epoch: int) -> np.ndarray:
        """The ``num_samples`` sample numbers ``epoch`` reads, in order (int64): a function of the
        order's kind, seed and block settings and of ``epoch`` only. Blocks are the space's business."""

    def identity(self, order: ReadOrder | None = None) -> dict[str, Any]:
        """What a state records of this space (JSON-ready, keys other than a state's own): a state
        whose identity differs is refused, naming the key. With a block ``order``, what its blocks
        depend on is included."""


def _is_index(source: Any) -> bool:
    """An open dataset or index (``packer.dataset.DatasetIndex``): it has the index columns."""
    return hasattr(getattr(source, "index", None), "offset")


class IndexSpace:
    """The plain sample space: the samples of one dataset (or a bare count), in index order.

    Blocks for the ``"block"`` order are measured in bytes from the dataset's index
    (``index_blocks`` with the order's ``block_bytes``), or cut every ``block_samples`` samples
    when the order says so or there is no index (``uniform_blocks``). They are computed on first
    use in each process and never pickled: a DataLoader worker recomputes them from the index.

    Args:
        index: an open dataset or index, or a callable returning one (opened on first use, e.g. in
            a DALI worker), or None for a bare count.
        num_samples: the sample count (default: the index's length; required with a callable).
        blocks: explicit block boundaries (or a callable returning them) instead of measuring
            them: what the cursor's ``blocks=`` gives.
    """

    def __init__(self, index: Any = None, *, num_samples: int | None = None, blocks: Any = None) -> None:
        # A dataset that orders itself (a packer.Mixture: its epochs are its streams' shares) gives
        # its own space, which every reader then uses through this one.
        own = getattr(index, "own_space", None) if index is not None and not callable(index) else None
        self._own: Any = own() if own is not None and blocks is None else None
        if self._own is not None:
            num_samples = self._own.num_samples
        if num_samples is None:
            if index is None or callable(index):
                raise OptionError("IndexSpace needs num_samples without an open index")
            num_samples = len(index)
        self._num_samples = _check_nonnegative("num_samples", num_samples)
        self._index = index
        self._explicit = blocks
        self._cached: tuple[tuple[int, int | None], np.ndarray] | None = None

    @classmethod
    def of(cls, source: Any, blocks: Any = None) -> "IndexSpace":
        """The space of a dataset, an index, an object holding one as ``.dataset`` (a
        ``PackedDataset``), a sample count, or anything with a length (a count).

        Raises:
            OptionError: none of these.
        """
        inner = getattr(source, "dataset", None)
        if _is_index(inner):
            source = inner
        if isinstance(source, (int, np.integer)) and not isinstance(source, bool):
            return cls(num_samples=int(source), blocks=blocks)
        if _is_index(source):
            return cls(source, blocks=blocks)
        try:
            count = len(source)
        except TypeError:
            raise OptionError(f"expected a packer dataset or a sample count, got {type(source).__name__}") from None
        return cls(num_samples=count, blocks=blocks)

    @property
    def num_samples(self) -> int:
        return self._num_samples

    def blocks(self, order: ReadOrder) -> np.ndarray:
        """The block boundaries ``order``'s block shuffle uses here (cached for its block settings)."""
        if callable(self._explicit):
            self._explicit = self._explicit()
        if self._explicit is not None:
            return np.asarray(self._explicit)
        key = (order.block_bytes, order.block_samples)
        if self._cached is None or self._cached[0] != key:
            index = self._index() if callable(self._index) else self._index
            if order.block_samples is None and index is not None:
                columns = index.index
                bounds = index_blocks(columns.offset, columns.size, columns.shard, order.block_bytes)
            else:
                bounds = uniform_blocks(self._num_samples, order.block_samples or DEFAULT_BLOCK_SAMPLES)
            self._cached = (key, bounds)
        return self._cached[1]

    def epoch_order(self, order: ReadOrder, epoch: int) -> np.ndarray:
        """``epoch_order`` of ``order``'s kind over this space (the block order over its blocks)."""
        if self._own is not None:
            return self._own.epoch_order(order, epoch)
        blocks = self.blocks(order) if order.kind == "block" else None
        return order.epoch_order(self._num_samples, epoch, blocks)

    def identity(self, order: ReadOrder | None = None) -> dict[str, Any]:
        """``{"num_samples": N}``, and for a block ``order`` the fingerprint of its blocks here."""
        if self._own is not None:
            return self._own.identity(order)
        identity: dict[str, Any] = {"num_samples": self._num_samples}
        if order is not None and order.kind == "block":
            identity["blocks"] = _blocks_fingerprint(self.blocks(order))
        return identity

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_cached"] = None  # proportional to the dataset: recomputed where it is used
        return state


def sample_space(source: Any, blocks: Any = None) -> SampleSpace:
    """``source`` as a sample space: a space as it is; else ``IndexSpace.of(source, blocks)``.

    Raises:
        OptionError: ``blocks`` beside a space (its blocks are its own), or not a dataset or count.
    """
    if all(hasattr(source, name) for name in ("num_samples", "epoch_order", "identity")):
        if blocks is not None:
            raise OptionError(f"blocks= is for a sample count; a {type(source).__name__} has its own")
        return source
    return IndexSpace.of(source, blocks)


#: Readers (DataLoader workers) a ``Position`` can tell apart when they claim a loaded start.
POSITION_SLOTS = 1024


class Position:
    """Where a reader is: ``(epoch, start)``, ``start`` the global position its next pass begins at,
    and which of its readers have already begun a pass from a loaded ``start``.

    The cells live in one small int64 array: ``[epoch, start, claimed_by, claimed[0..slots-1]]``
    (``claimed_by``: the number of readers of the pass that used the load, 0 while unused).
    ``packer.torch`` substitutes a shared-memory array so that ``set_epoch`` and ``load_state_dict``
    in the main process reach persistent DataLoader workers, and so that the workers of one pass
    agree on what they claimed.

    Args:
        slots: how many readers (DataLoader workers) can claim a loaded start in one pass.
    """

    def __init__(self, slots: int = 1) -> None:
        self.slots = _check_positive("slots", slots)
        self._cells = self._allocate(3 + self.slots)

    def _allocate(self, count: int) -> Any:
        """The cell array (a subclass puts it in shared memory)."""
        return np.zeros(count, dtype=np.int64)

    def get(self) -> tuple[int, int]:
        return int(self._cells[0]), int(self._cells[1])

    def set(self, epoch: int, start: int) -> None:
        """Select ``(epoch, start)`` (``set_epoch``: the start is 0 or the loaded one)."""
        self._cells[0] = int(epoch)
        self._cells[1] = int(start)

    def load(self, epoch: int, start: int) -> None:
        """A loaded position: ``start`` is for the one pass that follows (no reader has claimed it)."""
        self._cells[2:] = 0
        self.set(epoch, start)

    def claim(self, reader: int = 0, readers: int = 1) -> int:
        """The start of the pass reader ``reader`` of ``readers`` begins now.

        The loaded start for each reader's first pass after the load (every reader of that pass
        claims it once); 0 from then on, and the stored start drops to 0 so that the positions
        counted in later passes start there too. A pass with another number of readers than the
        one that used the load is a later pass.

        Raises:
            OptionError: more readers than ``slots``.
        """
        start = self.peek(reader, readers)
        if start == 0:
            self._cells[1] = 0
            return 0
        self._cells[2] = readers
        self._cells[3 + reader] = 1
        return start

    def peek(self, reader: int = 0, readers: int = 1) -> int:
        """The start ``claim(reader, readers)`` would return now, claiming nothing.

        Raises:
            OptionError: more readers than ``slots``.
        """
        start = int(self._cells[1])
        if start == 0:
            return 0
        if not 0 <= reader < min(readers, self.slots):
            raise OptionError(f"reader {reader} of {readers}: this position tells apart at most {self.slots} "
                              f"readers (DataLoader workers)")
        # Flags are only ever set by claim() and cleared by load(): two readers beginning the same
        # pass at once can both claim, and a reader of a later pass never takes the load for unused.
        if int(self._cells[3 + reader]) == 0 and int(self._cells[2]) in (0, readers):
            return start
        return 0


class EpochCursor:
    """A reader's place in its run: the order, the sample space it orders, its rank, the
    ``(epoch, start)`` position.

    Args:
        read_order: the order (kind, seed, batch size, drop rule, block settings, rank).
        space: the sample space it orders (``SampleSpace``: a dataset's ``IndexSpace``, a
            mixture's, ...), or a sample count.
        rank, world_size: this reader's share (default: the order's, else rank 0 of 1; the
            cursor's ``read_order`` holds the ones it uses).
        blocks: with a sample count, its block boundaries for the ``"block"`` order, or a callable
            returning them (computed on first use, e.g. per worker process), or None.
        position: where ``(epoch, start)`` is stored (default: a private ``Position``).

    The unit of ``handed_out`` is the reader's item: a batch for batch readers, a sample for
    sample readers (``count_samples=True``).
    """

    def __init__(self, read_order: ReadOrder, space: Any, *, rank: int | None = None,
                 world_size: int | None = None, blocks: Any = None, position: Position | None = None,
                 count_samples: bool = False) -> None:
        rank, world_size = read_order._share_of(rank, world_size)
        world_size = _check_positive("world_size", world_size)
        rank = _check_nonnegative("rank", rank)
        if rank >= world_size:
            raise OptionError(f"rank {rank} out of range for world_size {world_size}")
        self.space: SampleSpace = sample_space(space, blocks)
        #: The order this cursor deals, with the rank and world size it deals them to.
        self.read_order = replace(read_order, rank=rank, world_size=world_size)
        self.position = position if position is not None else Position()
        self.count_samples = count_samples
        #: Items handed out since the current iteration began (batches, or samples).
        self.handed_out = 0
        #: ``(epoch, start)`` of the pass this cursor began last (None before its first).
        self.pass_position: tuple[int, int] | None = None

    @property
    def rank(self) -> int:
        return int(self.read_order.rank)  # type: ignore[arg-type]  # filled in above

    @property
    def world_size(self) -> int:
        return int(self.read_order.world_size)  # type: ignore[arg-type]

    @property
    def num_samples(self) -> int:
        """Samples in an epoch of the space."""
        return self.space.num_samples

    @property
    def blocks(self) -> np.ndarray | None:
        """The block boundaries of the ``"block"`` order in the space (None for other orders, or a
        space without blocks of its own): what readers advise the kernel to read ahead."""
        blocks = getattr(self.space, "blocks", None)
        return blocks(self.read_order) if blocks is not None and self.read_order.kind == "block" else None

    def with_blocks(self, blocks: Any) -> "EpochCursor":
        """A shallow copy ordering a bare count of the same size with ``blocks`` (an array, a
        callable or None) as its block boundaries."""
        twin = copy.copy(self)
        twin.space = IndexSpace(num_samples=self.num_samples, blocks=blocks)
        return twin

    @property
    def epoch(self) -> int:
        return self.position.get()[0]

    @property
    def start(self) -> int:
        """The global position the next iteration starts from (0 unless resumed)."""
        return self.position.get()[1]

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (and so the order) of the next iteration.

        The position loaded by ``load_state_dict`` is kept when ``epoch`` is the loaded epoch (for
        the one pass that follows the load); any other epoch starts at its beginning.
        """
        epoch = check_epoch(epoch)
        current, start = self.position.get()
        if epoch != current:
            self.handed_out = 0
        self.position.set(epoch, start if epoch == current else 0)

    def share(self) -> RankShare:
        """This rank's share of the rest of the current epoch (no permutation computed)."""
        return self.read_order.share(self.num_samples, consumed=self.start)

    def plan(self, epoch: int | None = None, start: int | None = None) -> RankPlan:
        """This rank's plan for the rest of the current epoch (or of ``epoch`` from ``start``)."""
        current, position = self.position.get()
        epoch = current if epoch is None else epoch
        start = (position if epoch == current else 0) if start is None else start
        return self.read_order.plan(self.space, epoch=epoch, consumed=start)

    def begin(self, reader: int = 0, readers: int = 1) -> RankPlan:
        """Start a pass: reset the hand-out count and return the plan it follows.

        The pass after ``load_state_dict`` reads the rest of the loaded epoch; every later pass
        reads its whole epoch (``Position.claim``), whether or not ``set_epoch`` was called.

        Args:
            reader, readers: which DataLoader worker of how many begins the pass (a pass read
                by several workers claims the loaded position once in each).
        """
        self.handed_out = 0
        start = self.position.claim(reader, readers)
        epoch = self.epoch
        self.pass_position = (epoch, start)
        return self.read_order.plan(self.space, epoch=epoch, consumed=start)

    def begin_at(self, epoch: int, start: int) -> RankPlan:
        """Start a pass at an explicit position (a DataLoader worker's own saved state), claiming
        nothing from the shared position."""
        self.handed_out = 0
        self.pass_position = (check_epoch(epoch), _check_nonnegative("start", start))
        return self.plan(epoch, start)

    def consumed(self, *, batches: int | None = None, samples: int | None = None) -> int:
        """The global position after this rank consumed ``batches`` (or ``samples``) of the current
        iteration; by default what this cursor counted as handed out."""
        share = self.share()
        if batches is not None and samples is not None:
            raise OptionError("give batches or samples consumed, not both")
        if batches is not None:
            return share.consumed_after(batches)
        if samples is not None:
            return share.consumed_after_samples(samples)
        if self.count_samples:
            return share.consumed_after_samples(self.handed_out)
        return share.consumed_after(self.handed_out)

    def state_dict(self, *, batches: int | None = None, samples: int | None = None) -> dict[str, Any]:
        """The resumable state (``ReadOrder.state_dict``) after ``batches``/``samples`` consumed."""
        return self.read_order.state_dict(self.space, epoch=self.epoch,
                                          consumed=self.consumed(batches=batches, samples=samples))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at a saved position: the next iteration reads exactly the rest of that epoch.

        Raises:
            StateMismatchError: the state was saved with another order, seed or sample space.
            OptionError: not a read-order state.
        """
        epoch, consumed = self.read_order.check_state(state, self.space)
        self.position.load(epoch, consumed)
        self.handed_out = 0
        self.pass_position = None


class CursorReader:
    """The order/position surface every packer reader exposes (torch samplers and iterable dataset,
    GPU loaders), delegated to its ``cursor``: one implementation of set_epoch / state_dict / resume."""

    cursor: EpochCursor

    @property
    def read_order(self) -> ReadOrder:
        return self.cursor.read_order

    @property
    def rank(self) -> int:
        return self.cursor.rank

    @property
    def world_size(self) -> int:
        return self.cursor.world_size

    @property
    def num_samples(self) -> int:
        return self.cursor.num_samples

    @property
    def epoch(self) -> int:
        return self.cursor.epoch

    @property
    def start(self) -> int:
        """The global position the next iteration starts from (0 unless resumed)."""
        return self.cursor.start

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (a loaded mid-epoch position is kept for its epoch,
        for the one pass that follows the load)."""
        self.cursor.set_epoch(epoch)

    def share(self) -> RankShare:
        """This rank's share of the rest of the current epoch (no permutation computed)."""
        return self.cursor.share()

    def plan(self) -> RankPlan:
        """This rank's plan for the rest of the current epoch."""
        return self.cursor.plan()

    def state_dict(self, *, batches_consumed: int | None = None,
                   samples_consumed: int | None = None) -> dict[str, Any]:
        """The resumable position ``{"order", "seed", "epoch", "consumed", ...}`` (JSON-ready).

        Args:
            batches_consumed: this reader's batches this rank consumed since the current epoch's
                iteration started (from the loaded position, when resumed).
            samples_consumed: or the samples this rank consumed (only whole batches count).

        Without either, what this object handed out in its last iteration: exact only when it
        is iterated directly (a DataLoader prefetches; ``packer.torch.PackedDataLoader`` counts for you).
        """
        return self.cursor.state_dict(batches=batches_consumed, samples=samples_consumed)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position: the next iteration reads exactly the rest of that epoch.

        Valid for any world size, batch size and number of workers. Used once: later passes are
        whole epochs (of the same epoch number unless ``set_epoch`` says otherwise).

        Raises:
            OptionError: the state was saved with another order, seed or dataset size.
        """
        self.cursor.load_state_dict(state)
