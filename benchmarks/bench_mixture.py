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

With ``--memory``, also the private memory (USS: private clean + dirty pages, ``smaps_rollup``)
of each of 2 forked DataLoader workers after 1,024 samples read through ``PackedDataset`` +
``PackedBatchSampler`` (random order, batches of 32), for the dataset, the view of all of it and
the 3-stream mixture, each in a fresh child process, for the block order (the readers' default:
its blocks are measured from the index in the parent, so a view's or a mixture's gathered columns
are shared with the workers) and the random order (nothing gathered before the fork: each worker
gathers the columns it reads).
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
    parser.add_argument("--memory", action="store_true", help="also measure DataLoader worker memory")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return worker_memory(args.child)
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
    if args.memory:
        import json
        import subprocess

        import os

        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                            os.environ.get("PYTHONPATH", "")])}
        print("\nDataLoader worker memory (2 forked workers, 1,024 samples read; MiB private per worker):")
        for kind in ("block", "random"):
            for label, child in [("dataset", ["dataset", str(base)]), ("view (all N)", ["view", str(whole)]),
                                 ("mixture (3 streams)", ["mixture", *map(str, streams)])]:
                out = subprocess.run([sys.executable, __file__, "--child", kind, *child], capture_output=True,
                                     text=True, check=True, env=env).stdout
                uss = json.loads(out.strip().splitlines()[-1])
                print(f"  {kind + ' order, ' + label:<36} " + ", ".join(f"{v:.1f}" for v in uss))
    return 0


def worker_memory(child: list[str]) -> int:
    """In a fresh process: 2 forked workers read 1,024 samples; print each worker's USS in MiB (JSON)."""
    import json
    import os

    from torch.utils.data import DataLoader

    from packer.torch import PackedBatchSampler, PackedDataset

    order, kind, paths = child[0], child[1], child[2:]
    source = packer.Mixture(paths, seed=0) if kind == "mixture" else packer.open_dataset(paths[0])
    assert hasattr(packer, "Mixture") and packer.__file__.startswith(str(Path(__file__).resolve().parents[1]))
    data = PackedDataset(source, decode=False, fields=("index",))
    sampler = PackedBatchSampler(data, batch_size=32, order=ReadOrder(order, seed=0))

    def uss(_: int) -> None:
        return None

    loader = DataLoader(data, batch_sampler=sampler, num_workers=2, persistent_workers=True,
                        collate_fn=lambda samples: len(samples), worker_init_fn=uss)
    iterator = iter(loader)
    for _ in range(32):
        next(iterator)
    sizes = []
    for worker in iterator._workers:  # the live worker processes
        total = 0
        with open(f"/proc/{worker.pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1])
        sizes.append(total / 1024)
    print(json.dumps(sizes))
    os._exit(0)


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
