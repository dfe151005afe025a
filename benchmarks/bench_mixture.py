"""Open time of a view and of a 3-stream mixture against opening the dataset itself (issue 36).

    python benchmarks/bench_mixture.py [--samples 1000000] [--rounds 5] [--folder /tmp/packer-bench-mixture]

Datasets are written straight in the format (``synthetic.make_synthetic_dataset``, reused between
runs): one of ``--samples`` samples, and three streams of a third each. Candidates, interleaved over
``--rounds`` rounds (``harness.interleave``; the table gives the median round and its ratio):

- ``open dataset``: ``packer.open_dataset`` of the whole dataset (manifest, index mapped, hashed and
  validated): the baseline;
- ``open view (all N)``: a view file selecting every sample (the largest view: N sample numbers read,
  checked and the base's rows checksummed);
- ``open view (half)``: a view of a 50 % split;
- ``open mixture (3 streams)``: ``packer.Mixture`` of the three streams (three opens);
- ``... + first epoch``: the same, then what a reader does first: the labels column and the block
  order of epoch 0 (a view gathers its columns on first use; a mixture joins its streams' and
  orders each stream): against ``open dataset + first epoch``.

With ``--read N``, also the throughput of reading one epoch of N samples (block order, batches of
256 through ``PackedBatchSampler`` and ``Dataset.read_batch``, the bytes touched) from one dataset
against a 2-stream mixture of two datasets of N/2 samples each (the same samples, every sample
once per epoch).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import harness
import synthetic

import packer
from packer.order import IndexSpace, ReadOrder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/packer-bench-mixture"))
    parser.add_argument("--read", type=int, default=0, help="also time reading an epoch of this many samples")
    args = parser.parse_args(argv)
    n = args.samples
    payload = synthetic.tiny_jpeg()
    base = synthetic.make_synthetic_dataset(args.folder / f"all-{n}", n, payload)
    thirds = [n // 3 + (1 if k < n % 3 else 0) for k in range(3)]
    streams = [synthetic.make_synthetic_dataset(args.folder / f"stream{k}-{count}", count, synthetic.tiny_jpeg(seed=k))
               for k, count in enumerate(thirds)]
    (whole,) = packer.view(base, args.folder / f"all-{n}.pkview", overwrite=True)
    halves = packer.view(base, args.folder / f"half-{n}", split="0.5:0.5", overwrite=True)
    order = ReadOrder("block", seed=1)

    def opened(path):
        def body() -> int:
            with packer.open_dataset(path) as ds:
                return len(ds)
        return body

    def mixture() -> int:
        mixed = packer.Mixture([packer.Stream(s, weight=1) for s in streams], epoch_size=n)
        count = len(mixed)
        mixed.close()
        return count

    def first_epoch(make):
        def body() -> int:
            ds = make()
            labels = ds.labels
            epoch = IndexSpace(ds).epoch_order(order, 0)
            count = int(len(epoch)) + 0 * int(labels[:1].sum())
            ds.close()
            return count
        return body

    candidates = [
        ("open dataset", lambda: harness.measure(opened(base), items=1)),
        ("open view (all N)", lambda: harness.measure(opened(whole), items=1)),
        ("open view (half)", lambda: harness.measure(opened(halves[0]), items=1)),
        ("open mixture (3 streams)", lambda: harness.measure(mixture, items=1)),
        ("open dataset + first epoch", lambda: harness.measure(first_epoch(lambda: packer.open_dataset(base)), items=1)),
        ("open view (all N) + first epoch",
         lambda: harness.measure(first_epoch(lambda: packer.open_dataset(whole)), items=1)),
        ("open mixture + first epoch", lambda: harness.measure(first_epoch(lambda: packer.Mixture(
            [packer.Stream(s, weight=1) for s in streams], epoch_size=n)), items=1)),
    ]
    before = harness.machine_load()
    results = harness.interleave(candidates, args.rounds, log=None)
    print(f"{n:,} samples; view and mixture against the dataset; {args.rounds} interleaved rounds; "
          f"{harness.describe_load(before, harness.machine_load())}")
    opens = {name: results[name] for name in list(results)[:4]}
    print(harness.table(harness.summarize(opens), unit="opens", name_width=34,
                        columns=[("median ms", lambda row: f"{1e3 / row.rate:.1f}"),
                                 ("x dataset", lambda row: f"{1 / row.ratio:.2f}")]))
    epochs = {name: results[name] for name in list(results)[4:]}
    print(harness.table(harness.summarize(epochs), unit="opens", name_width=34,
                        columns=[("median ms", lambda row: f"{1e3 / row.rate:.1f}"),
                                 ("x dataset", lambda row: f"{1 / row.ratio:.2f}")]))
    if args.read:
        read_epochs(args.read, args.folder, args.rounds)
    return 0


def read_epochs(n: int, folder: Path, rounds: int) -> None:
    """One epoch read from one dataset against the same samples as a 2-stream mixture."""
    from packer.torch import PackedBatchSampler

    payload = synthetic.tiny_jpeg()
    whole = synthetic.make_synthetic_dataset(folder / f"read-all-{n}", n, payload, alignment=512)
    halves = [synthetic.make_synthetic_dataset(folder / f"read-half{k}-{n // 2}", n // 2, payload, alignment=512)
              for k in range(2)]

    def epoch(make):
        def body() -> int:
            ds = make()
            sampler = PackedBatchSampler(ds, batch_size=256, order=ReadOrder("block", seed=1))
            count = 0
            for batch in sampler:
                data = ds.read_batch(batch)
                count += len(data)
            ds.close()
            return count
        return body

    results = harness.interleave([
        ("one dataset", lambda: harness.measure(epoch(lambda: packer.open_dataset(whole)))),
        ("2-stream mixture", lambda: harness.measure(epoch(lambda: packer.Mixture(halves)))),
    ], rounds, log=None)
    print(f"\nreading an epoch of {n:,} samples (block order, batches of 256, read_batch), {rounds} rounds:")
    print(harness.table(harness.summarize(results), unit="samples", name_width=34))


if __name__ == "__main__":
    sys.exit(main())
