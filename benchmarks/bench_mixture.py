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
    return 0


if __name__ == "__main__":
    sys.exit(main())
