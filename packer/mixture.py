"""Weighted mixtures of datasets: ``packer.Mixture`` of ``packer.Stream``s, read by every reader as one dataset.

A mixture is two things at once:

- a **dataset** (a ``Dataset``): the concatenation of its streams' datasets (folders, URLs or
  views, mixed freely). Global sample ``g`` is sample ``g - offset[s]`` of stream ``s``; the index
  columns are the streams' columns end to end (gathered on first use), shard ``n`` is a stream's
  shard, and reads go to that stream's dataset. Each sample carries its stream number as the
  declared field ``stream`` (an int64 scalar: ``fields=("image", "label", "stream")``).
- a **sample space** (``packer.order.SampleSpace``, through ``own_space``): what an epoch reads.
  Each stream takes ``count[s]`` samples per epoch (``weight``, ``repeat`` or ``choose``, as MDS
  defines them). Stream ``s`` has an endless sequence: its own epoch orders (the reader's order
  kind over the stream's own blocks, seeded by ``(seed, s)``) one after another, and mixture epoch
  ``e`` takes positions ``[e * count[s], (e + 1) * count[s])`` of it. So within a stream samples
  are drawn without replacement and coverage carries over between epochs (a stream taken at 10 %
  sees each of its samples once in 10 epochs). The streams' picks are cut into runs (one sample
  for the random order; for the block order a stream's mean block length, ``run_length``) and the
  runs are shuffled together by ``(seed, epoch)``: a function of the seeds and the epoch only, the
  same on any machine.

The readers deal a mixture's epoch to ranks and workers like any epoch (``packer.order.deal``), so
resume at another world size, worker count or batch size is exact; a saved state records the
streams' identities, their per-epoch counts, the seed and the class list, and a state of another
mixture is refused (``StateMismatchError``) naming which of these differs.

Labels: ``classes="per-stream"`` keeps each stream's labels (the mixture's class list is theirs when
every stream has the same list, else empty: ``stream_classes`` has each); ``classes="union"``
merges the lists by name (sorted by their UTF-8 bytes) and renumbers each stream's labels into it.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from . import format as fmt
from .codecs import codec_for
from .dataset import Batch, Dataset, as_sample_indices, open_dataset
from .errors import OptionError, SampleIndexError
from .fields import FieldSpec
from .order import IndexSpace, ReadOrder
from .place import LocalFiles
from .selection import LazyColumns

__all__ = ["Stream", "Mixture", "MixtureSpace", "STREAM_FIELD", "RUN_SAMPLES"]

#: The declared field every sample of a mixture carries: the number of its stream.
STREAM_FIELD = FieldSpec(name="stream", kind="array", dtype="int64", shape=())
#: The fewest samples per run when the block order interleaves streams (``MixtureSpace.run_length``).
RUN_SAMPLES = 64
#: Class-list modes.
CLASS_MODES = ("per-stream", "union")


@dataclass(frozen=True)
class Stream:
    """One dataset of a mixture and how much of it an epoch takes (at most one of the three).

    Args:
        source: a dataset folder, URL or view file, or an open ``Dataset`` (a view too).
        weight: relative share of the mixture's ``epoch_size`` (MDS's ``proportion``).
        repeat: this many times the stream's size per epoch (0.5: half of it; 2: all of it twice).
        choose: exactly this many samples per epoch.
        name: a name for messages (default: the dataset's location).
    """

    source: Any
    weight: float | None = None
    repeat: float | None = None
    choose: int | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        given = [key for key in ("weight", "repeat", "choose") if getattr(self, key) is not None]
        if len(given) > 1:
            raise OptionError(f"a Stream takes one of weight=, repeat= and choose=, got "
                              f"{' and '.join(key + '=' for key in given)}")
        for key in ("weight", "repeat"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                      or not math.isfinite(value) or value <= 0):
                raise OptionError(f"Stream {key}= must be a number above 0, got {value!r}")
        if self.choose is not None and (isinstance(self.choose, bool) or not isinstance(self.choose, (int, np.integer))
                                        or self.choose < 0):
            raise OptionError(f"Stream choose= must be a non-negative integer, got {self.choose!r}")


def _plan_counts(sizes: Sequence[int], streams: Sequence[Stream], epoch_size: int | None) -> list[int]:
    """Samples each stream gives an epoch (MDS's rules; weights by largest remainder, exact sum)."""
    weighted = [k for k, s in enumerate(streams) if s.weight is not None]
    if epoch_size is not None and not weighted:
        raise OptionError("epoch_size= goes with weight= streams; repeat= and choose= set each stream's count")
    counts = []
    for stream, size in zip(streams, sizes):
        if stream.choose is not None:
            counts.append(int(stream.choose))
        elif stream.repeat is not None:
            counts.append(int(round(stream.repeat * size)))
        else:
            counts.append(int(size))  # a weighted stream's, replaced below
    if weighted:
        fixed = sum(c for k, c in enumerate(counts) if k not in weighted)
        total = sum(sizes[k] for k in weighted) if epoch_size is None else epoch_size - fixed
        if total < 0:
            raise OptionError(f"epoch_size={epoch_size} is smaller than the {fixed} samples the repeat= and choose= "
                              f"streams take")
        weights = np.array([streams[k].weight for k in weighted], dtype=np.float64)
        exact = weights / weights.sum() * total
        shares = np.floor(exact).astype(np.int64)
        for j in np.argsort(-(exact - shares), kind="stable")[:int(total - shares.sum())]:
            shares[j] += 1
        for k, share in zip(weighted, shares.tolist()):
            counts[k] = int(share)
    return counts


def _stream_identity(dataset: Dataset) -> str:
    """What a saved state records of a stream: its index checksum and count, and a view's checksum."""
    text = f"{fmt.checksum_hex(dataset.manifest.index.checksum)}:{len(dataset)}"
    if dataset.view is not None:
        text += f":view-{fmt.checksum_hex(dataset.view.checksum)}"
    return text


class MixtureSpace:
    """The sample space of a mixture (module docstring): ``num_samples`` is the epoch's size."""

    def __init__(self, mixture: "Mixture") -> None:
        self._mixture = mixture
        self._spaces: list[IndexSpace] | None = None

    @property
    def num_samples(self) -> int:
        return int(sum(self._mixture.counts))

    def _stream_spaces(self) -> list[IndexSpace]:
        if self._spaces is None:
            self._spaces = [IndexSpace(ds) for ds in self._mixture.datasets]
        return self._spaces

    def stream_order(self, order: ReadOrder, stream: int, epoch: int) -> np.ndarray:
        """Stream ``stream``'s local sample numbers for mixture epoch ``epoch`` (``counts[stream]`` of them)."""
        mixture = self._mixture
        size, count = len(mixture.datasets[stream]), mixture.counts[stream]
        if count == 0:
            return np.zeros(0, dtype=np.int64)
        if size == 0:
            raise OptionError(f"stream {stream} ({mixture.names[stream]}) is empty but asked for {count} samples")
        start, end = epoch * count, (epoch + 1) * count
        own = replace(order, seed=mixture.stream_seed(stream, order.seed))
        space = self._stream_spaces()[stream]
        pieces = []
        for k in range(start // size, (end - 1) // size + 1):  # the stream-epochs this epoch's range covers
            whole = space.epoch_order(own, k)
            lo, hi = max(start - k * size, 0), min(end - k * size, size)
            pieces.append(whole[lo:hi])
        return np.concatenate(pieces).astype(np.int64, copy=False)

    def epoch_order(self, order: ReadOrder, epoch: int) -> np.ndarray:
        mixture = self._mixture
        picks = [self.stream_order(order, s, epoch) + mixture.offsets[s] for s in range(len(mixture.datasets))]
        if order.kind == "sequential":
            return np.concatenate(picks) if picks else np.zeros(0, dtype=np.int64)
        rng = np.random.default_rng([mixture.seed, order.seed, epoch, 0x6D6978])  # "mix": apart from the streams' seeds
        if order.kind == "random":
            merged = np.concatenate(picks)
            return merged[rng.permutation(len(merged))]
        runs = []
        for stream, pick in enumerate(picks):
            run = self.run_length(order, stream)
            runs += [pick[i:i + run] for i in range(0, len(pick), run)]
        if not runs:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([runs[k] for k in rng.permutation(len(runs))])

    def run_length(self, order: ReadOrder, stream: int) -> int:
        """Samples of stream ``stream`` kept together when the block order interleaves the streams:
        ``order.block_samples`` when set, else the stream's mean block length (its block order's
        unit of locality), at least ``RUN_SAMPLES``."""
        if order.block_samples:
            return int(order.block_samples)
        size = len(self._mixture.datasets[stream])
        blocks = len(self._stream_spaces()[stream].blocks(order)) - 1
        return max(RUN_SAMPLES, size // max(blocks, 1))

    def identity(self, order: ReadOrder | None = None) -> dict[str, Any]:
        mixture = self._mixture
        return {"num_samples": self.num_samples,
                "mixture": [_stream_identity(ds) for ds in mixture.datasets],
                "mixture_counts": list(mixture.counts), "mixture_seed": mixture.seed,
                "mixture_classes": f"{mixture.class_mode}:{mixture.classes_checksum or '-'}"}

    def __getstate__(self) -> dict[str, Any]:
        return {"_mixture": self._mixture, "_spaces": None}


class _ConcatColumns(LazyColumns):
    """The streams' index columns end to end (``format.IndexColumns``' attributes), on first use."""

    _PLAIN = ("offset", "size", "checksum", "width", "height", "channels", "image_format")
    _BLOBS = {"key_offsets": ("key_offsets", "keys"), "keys": ("key_offsets", "keys"),
              "meta_offsets": ("meta_offsets", "meta"), "meta": ("meta_offsets", "meta")}

    def __init__(self, mixture: "Mixture") -> None:
        super().__init__()
        self._mixture = mixture
        self.field_columns: Mapping[str, np.ndarray] = _ConcatFields(self)

    def __len__(self) -> int:
        return int(self._mixture.offsets[-1])

    def _gather(self, name: str) -> np.ndarray:
        mixture = self._mixture
        parts = [ds.index for ds in mixture.datasets]
        if name in self._PLAIN:
            return np.concatenate([getattr(p, name) for p in parts])
        if name == "shard":
            return np.concatenate([np.asarray(p.shard, dtype=np.int64) + first
                                   for p, first in zip(parts, mixture.shard_offsets)])
        if name == "label":
            return np.concatenate([mixture.label_maps[s](np.asarray(p.label)) for s, p in enumerate(parts)])
        if name in self._BLOBS:
            offsets_name, blob_name = self._BLOBS[name]
            pair = _concat_blobs([(getattr(p, offsets_name), getattr(p, blob_name)) for p in parts])
            self._cache[offsets_name], self._cache[blob_name] = pair
            return self._cache[name]
        raise AttributeError(name)

    def field(self, name: str) -> np.ndarray:
        mixture = self._mixture
        if name == STREAM_FIELD.column:
            counts = [len(ds) for ds in mixture.datasets]
            return np.repeat(np.arange(len(counts), dtype="<i8"), counts).view(np.uint8)
        spec = next(s for s in mixture.manifest.fields if name in s.columns())
        columns = [ds.index.field_columns for ds in mixture.datasets]
        if spec.variable:
            offsets, data = _concat_blobs([(c[spec.offsets_column], c[spec.column]) for c in columns])
            return offsets if name == spec.offsets_column else data
        return np.concatenate([c[name] for c in columns])

    def __getattr__(self, name: str) -> np.ndarray:
        if name.startswith("_") or name not in (*self._PLAIN, *self._BLOBS, "shard", "label"):
            raise AttributeError(name)
        return self._column(name)


def _concat_blobs(pairs: Sequence[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Blob columns ``(offsets, bytes)`` end to end, each part's offsets shifted by the bytes before it."""
    offsets = [np.zeros(1, dtype=np.uint64)]
    shift = 0
    for part_offsets, blob in pairs:
        part = np.asarray(part_offsets, dtype=np.uint64)
        offsets.append(part[1:] - part[0] + np.uint64(shift))
        shift += int(part[-1] - part[0])
    data = np.concatenate([np.asarray(blob)[int(o[0]):int(o[-1])] for o, blob in pairs]) if pairs else np.zeros(0, np.uint8)
    return np.concatenate(offsets), data


class _ConcatFields(Mapping[str, np.ndarray]):
    def __init__(self, owner: _ConcatColumns) -> None:
        self._owner = owner

    def _names(self) -> list[str]:
        return [name for spec in self._owner._mixture.manifest.fields for name in spec.columns()]

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._names():
            raise KeyError(name)
        marked = f"@{name}"
        cache = self._owner._cache
        column = cache.get(marked)
        if column is None:
            with self._owner._lock:
                column = cache.get(marked)
                if column is None:
                    column = cache[marked] = self._owner.field(name)
        return column

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


class _Renumber:
    """A stream's labels in the mixture's class list: ``table[label]`` for a class label, others kept."""

    def __init__(self, table: np.ndarray | None) -> None:
        self.table = table

    def __call__(self, labels: np.ndarray) -> np.ndarray:
        labels = np.asarray(labels, dtype=np.int64)
        if self.table is None or not len(self.table):
            return labels
        named = (labels >= 0) & (labels < len(self.table))
        return np.where(named, self.table[np.where(named, labels, 0)], labels)


class _MixturePlace:
    """The place of a mixture: each call split by stream and passed to that stream's dataset."""

    backend = "mixture"
    options = None

    def __init__(self, mixture: "Mixture") -> None:
        self._mixture = mixture
        self.folder = mixture.datasets[0].place.folder
        self.manifest_bytes = b""
        self._plan_streams: np.ndarray | None = None
        self._local = all(isinstance(ds.place, LocalFiles) for ds in mixture.datasets)

    def _split(self, indices: Any) -> list[tuple[int, np.ndarray]]:
        numbers = np.asarray(indices, dtype=np.int64).reshape(-1)
        streams = np.searchsorted(self._mixture.offsets, numbers, side="right") - 1
        return [(s, numbers[streams == s] - self._mixture.offsets[s]) for s in np.unique(streams).tolist()]

    def plan(self, indices: Any) -> None:
        if self._local:
            return  # every stream is a folder: nothing to fetch ahead, nothing to count per batch
        numbers = np.asarray(indices, dtype=np.int64).reshape(-1)
        self._plan_streams = np.searchsorted(self._mixture.offsets, numbers, side="right") - 1
        self._advanced = 0
        self._stream_positions = np.zeros(len(self._mixture.datasets), dtype=np.int64)
        for stream, local in self._split(numbers):
            self._mixture.datasets[stream].plan_reads(local)

    def advance(self, position: int) -> None:
        """Each stream's position in its part of the plan: counted from the last call on (positions
        only grow within a plan), so an epoch's calls cost its length once, not once per batch."""
        if self._plan_streams is None or position <= self._advanced:
            return
        step = self._plan_streams[self._advanced:position]
        self._advanced = position
        self._stream_positions += np.bincount(step, minlength=len(self._mixture.datasets))
        for stream in np.unique(step).tolist():
            self._mixture.datasets[stream].reads_advanced(int(self._stream_positions[stream]))

    def ensure(self, indices: np.ndarray) -> None:
        for stream, local in self._split(indices):
            ds = self._mixture.datasets[stream]
            ds.place.ensure(ds._base_numbers(local))

    def stats(self) -> dict[str, int] | None:
        found = [ds.remote_stats() for ds in self._mixture.datasets]
        found = [f for f in found if f]
        if not found:
            return None
        return {key: sum(f.get(key, 0) for f in found) for key in found[0]}

    def build_report(self, must_contain: bytes = b"") -> None:
        return None

    def close(self) -> None:
        """The streams close with the mixture."""


def _check_epoch_fits(total: int, datasets: Sequence[Dataset], streams: Sequence[Stream]) -> None:
    """Refuse an epoch whose order (int64 sample numbers, computed whole by every reader) could not
    fit in this machine's memory: ``choose=10**12`` is a typo, not a plan, and would otherwise end
    in numpy's allocation error at the first epoch. The datasets this mixture opened are closed."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound known
        return
    if 8 * total > memory:
        for stream, dataset in zip(streams, datasets):
            if dataset is not stream.source:
                dataset.close()
        raise OptionError(f"the mixture's epoch of {total:,} samples needs its order in memory "
                          f"({8 * total / 2**30:,.1f} GiB of sample numbers), more than this machine's "
                          f"{memory / 2**30:,.1f} GiB: lower choose=, repeat= or epoch_size")


class Mixture(Dataset):
    """Several datasets read as one, each stream taking its planned share of every epoch (module docstring).

    Args:
        streams: ``Stream``s (a bare dataset, path or view is ``Stream(it)``: all of it once per epoch).
        epoch_size: samples per epoch when streams have weights (default: the streams' total size).
        seed: seeds the streams' orders and their interleaving, together with the reader's order seed.
        classes: ``"per-stream"`` (keep each stream's labels) or ``"union"`` (one class list by name).
        backend, verify_checksums, remote: for streams opened from paths (``open_dataset``'s).

    Raises:
        OptionError: no streams, bad counts, streams whose codecs or declared fields differ, image
            fields, a stream field named ``stream``, or an unknown ``classes`` mode.
    """

    def __init__(self, streams: Sequence[Stream | Any], *, epoch_size: int | None = None, seed: int = 0,
                 classes: str = "per-stream", backend: str = "mmap", verify_checksums: bool = False,
                 remote: Any = None) -> None:
        if isinstance(streams, (str, os.PathLike, Dataset, Stream)) or not len(streams):
            raise OptionError("Mixture takes a non-empty list of packer.Stream (or datasets)")
        if classes not in CLASS_MODES:
            raise OptionError(f"classes must be one of {list(CLASS_MODES)}, got {classes!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2 ** 63:
            raise OptionError(f"seed must be an integer from 0 to 2**63-1, got {seed!r}")
        if epoch_size is not None and (isinstance(epoch_size, bool) or not isinstance(epoch_size, (int, np.integer))
                                       or epoch_size < 1):
            raise OptionError(f"epoch_size must be a positive integer, got {epoch_size!r}")
        self.streams = tuple(s if isinstance(s, Stream) else Stream(s) for s in streams)
        self.seed, self.epoch_size, self.class_mode = int(seed), epoch_size, classes
        self._settings = {"backend": backend, "verify_checksums": verify_checksums, "remote": remote}
        self.datasets = tuple(s.source if isinstance(s.source, Dataset) else open_dataset(
            s.source, backend=backend, verify_checksums=verify_checksums, remote=remote) for s in self.streams)
        self.names = tuple(s.name or ds.location for s, ds in zip(self.streams, self.datasets))
        self.counts = tuple(_plan_counts([len(ds) for ds in self.datasets], self.streams, epoch_size))
        _check_epoch_fits(sum(self.counts), self.datasets, self.streams)
        sizes = [len(ds) for ds in self.datasets]
        self.offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.offsets[1:])
        shard_counts = [len(ds.manifest.shards) for ds in self.datasets]
        self.shard_offsets = np.zeros(len(shard_counts) + 1, dtype=np.int64)
        np.cumsum(shard_counts, out=self.shard_offsets[1:])
        self._shard_owners = [(stream, local) for stream, count in enumerate(shard_counts) for local in range(count)]
        self._classes_and_maps()
        self.manifest = self._merged_manifest()
        # what Dataset's methods read (packer.dataset): a mixture has no folder, view or place of its own
        self.view = None
        self._view_bytes = None
        self._count = int(self.offsets[-1])
        self._shard_firsts = np.concatenate([
            np.asarray(ds._shard_firsts[:-1], dtype=np.int64) + first
            for ds, first in zip(self.datasets, self.offsets[:-1])] + [self.offsets[-1:]])
        self._stored_firsts = self._shard_firsts
        if any(ds.view is not None for ds in self.datasets) and codec_for(self).sample_shape is not None:
            raise OptionError("a mixture with a view of stored pixels (codec raw) as a stream is not supported yet; "
                              "mix the datasets themselves")
        self.index = _ConcatColumns(self)  # type: ignore[assignment]
        for name in ("shard", "offset", "size", "label"):  # what every read touches: joined here, in the
            getattr(self.index, name)                      # parent, so forked workers share the pages
        self.place = _MixturePlace(self)  # type: ignore[assignment]
        self.path = self.place.folder
        self.url = None
        self._location = self.datasets[0]._location
        self._manifest_bytes = b""
        # One mmap path when every stream is mapped; else each stream reads its part of a batch.
        names = {ds.backend_name for ds in self.datasets}
        self.backend_name = names.pop() if len(names) == 1 else "mixed"
        self.verify_checksums = verify_checksums
        self.max_open_shards = self.datasets[0].max_open_shards
        self._open: OrderedDict[Any, Any] = OrderedDict()
        self._open_lock = threading.Lock()
        self._pid = os.getpid()

    # --- labels ---
    def _classes_and_maps(self) -> None:
        lists = [tuple(ds.classes) for ds in self.datasets]
        self.stream_classes = tuple(lists)
        if self.class_mode == "union":
            union = tuple(sorted({name for names in lists for name in names}, key=lambda n: n.encode("utf-8")))
            where = {name: k for k, name in enumerate(union)}
            self._classes = union
            self.label_maps = tuple(_Renumber(np.array([where[n] for n in names], dtype=np.int64)) for names in lists)
        else:
            self._classes = lists[0] if all(names == lists[0] for names in lists) else ()
            self.label_maps = tuple(_Renumber(None) for _ in lists)

    def _merged_manifest(self) -> fmt.Manifest:
        first = self.datasets[0].manifest

        def codec_of(manifest: fmt.Manifest) -> dict[str, Any]:
            return {k: v for k, v in manifest.codec.items() if k != "notes"}

        for name, ds in zip(self.names, self.datasets):
            if codec_of(ds.manifest) != codec_of(first):
                raise OptionError(f"the streams of a mixture must share a codec: {self.names[0]} has "
                                  f"{codec_of(first)}, {name} has {codec_of(ds.manifest)}")
            if tuple(ds.manifest.fields) != tuple(first.fields):
                raise OptionError(f"the streams of a mixture must declare the same fields: {self.names[0]} has "
                                  f"{[s.name for s in first.fields]}, {name} has {[s.name for s in ds.manifest.fields]}")
        if any(spec.kind == "image" for spec in first.fields):
            raise OptionError("a mixture of datasets with image fields is not supported yet (their parallel shards)")
        if any(spec.name == STREAM_FIELD.name for spec in first.fields):
            raise OptionError(f"the streams declare a field {STREAM_FIELD.name!r}, the name a mixture gives each "
                              f"sample's stream number")
        limits = [ds.manifest.max_pixels for ds in self.datasets]
        return replace(first, sample_count=int(self.offsets[-1]), classes=self._classes, build={}, history=(),
                       shards=tuple(entry for ds in self.datasets for entry in ds.manifest.shards),
                       fields=(*first.fields, STREAM_FIELD),
                       max_pixels=None if any(limit is None for limit in limits) else max(limits))

    @property
    def classes(self) -> tuple[str, ...]:
        return self._classes

    @property
    def classes_checksum(self) -> str | None:
        if self._classes:
            return fmt.class_list_checksum(self._classes)
        digests = [fmt.class_list_checksum(names) if names else "-" for names in self.stream_classes]
        return ",".join(digests)

    @property
    def location(self) -> str:
        return "mixture(" + ", ".join(self.names) + ")"

    def stream_seed(self, stream: int, order_seed: int = 0) -> int:
        """The seed of stream ``stream``'s own orders: a function of the mixture's seed, the reader's
        order seed and ``stream``."""
        return int(np.random.default_rng([self.seed, order_seed, stream, 0x73]).integers(0, 2 ** 63 - 1))

    def stream_of(self, i: int) -> int:
        """The stream sample ``i`` comes from."""
        return int(np.searchsorted(self.offsets, self._check(i), side="right") - 1)

    def own_space(self) -> MixtureSpace:
        """The sample space every reader orders this mixture by (``packer.order.IndexSpace`` asks)."""
        space = getattr(self, "_space", None)
        if space is None:
            space = self._space = MixtureSpace(self)
        return space

    # --- bytes: each shard is a stream's ---
    def shard(self, number: int, field: str | None = None) -> Any:
        stream, local = self._shard_owners[number]
        return self.datasets[stream].shard(local, field)

    def shard_alignment(self, shard: int) -> int:
        """Shard ``shard``'s stream's alignment (streams built with other alignments mix)."""
        return self.datasets[self._shard_owners[shard][0]].alignment

    def read_batch(self, indices: Sequence[int] | np.ndarray) -> Batch:
        """``Dataset.read_batch``; streams read through other backends (a URL's node cache) each read
        their part of the batch, joined into one ``Batch`` in the order asked."""
        if self.backend_name == "mmap":
            return super().read_batch(indices)
        idx = as_sample_indices(indices).reshape(-1)
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise SampleIndexError(f"batch holds index {int(idx[(idx < -n) | (idx >= n)][0])}, outside "
                                   f"{-n}..{n - 1} (a dataset of {n} samples)")
        idx = np.where(idx < 0, idx + n, idx)
        streams = np.searchsorted(self.offsets, idx, side="right") - 1
        starts = np.zeros(len(idx), dtype=np.int64)
        sizes = np.zeros(len(idx), dtype=np.int64)
        chunks, position = [], 0
        for stream in np.unique(streams).tolist():
            rows = np.flatnonzero(streams == stream)
            part = self.datasets[stream].read_batch(idx[rows] - self.offsets[stream])
            starts[rows] = np.asarray(part.starts, dtype=np.int64) + position
            sizes[rows] = part.sizes
            chunks.append(np.asarray(part.data).reshape(-1).view(np.uint8))
            position += chunks[-1].size
        data = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint8)
        return Batch(data=data, starts=starts, sizes=sizes)

    def _base_numbers(self, indices: np.ndarray) -> np.ndarray:
        return indices

    def build_report(self, must_contain: bytes = b"") -> None:
        return None

    # --- pickling: the streams' datasets (each a few KB) and the settings ---
    def __getstate__(self) -> dict[str, Any]:
        return {"streams": [replace(s, source=ds) for s, ds in zip(self.streams, self.datasets)],
                "epoch_size": self.epoch_size, "seed": self.seed, "classes": self.class_mode,
                "settings": self._settings}

    def __setstate__(self, state: dict[str, Any]) -> None:
        Mixture.__init__(self, state["streams"], epoch_size=state["epoch_size"], seed=state["seed"],
                         classes=state["classes"], **state["settings"])

    def close(self) -> None:
        for stream, ds in zip(self.streams, self.datasets):
            if not isinstance(stream.source, Dataset):
                ds.close()
