"""packer.lightning with the real Lightning: a 2-rank CPU fit (DDP over gloo) killed mid-epoch
resumes from its checkpoint in another world size and trains on every sample exactly once per
epoch; class lists across splits; the Trainer settings the module needs."""

from __future__ import annotations

import json
import os
import signal
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

L = pytest.importorskip("lightning", reason="the Lightning tests need lightning: pip install 'packer-shards[lightning]'")
import torch  # noqa: E402  (lightning imports torch)
from lightning.pytorch.callbacks import Callback, ModelCheckpoint  # noqa: E402

from helpers import write_images  # noqa: E402
from packer import ClassListMismatchError, OptionError, ReadOrder  # noqa: E402
from packer.lightning import PackedDataModule  # noqa: E402
from packer.writer import build  # noqa: E402
from packer.writer.plan import BuildOptions  # noqa: E402

SAMPLES = 48
BATCH = 4


def _build(root: Path, name: str, classes: dict[str, int]) -> Path:
    write_images(root / f"{name}-src", classes, size=8)
    out = root / name
    build(root / f"{name}-src", out, BuildOptions(shard_size=8 << 10, classes=("a", "b", "c")), workers=1)
    return out


@pytest.fixture(scope="module")
def splits(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lightning")
    return {"train": _build(root, "train", {"a": 20, "b": 16, "c": 12}),
            "val": _build(root, "val", {"a": 3, "b": 2, "c": 2})}


class Recorder(L.LightningModule):
    """Trains nothing; appends every batch it trains on to ``log/rank-R.jsonl``."""

    def __init__(self, log: str) -> None:
        super().__init__()
        self.log_dir = log
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.val_seen: list[int] = []

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        record = {"epoch": self.current_epoch, "step": self.global_step + 1, "rank": self.global_rank,
                  "batch_idx": batch_idx, "indices": batch["index"].tolist()}
        with open(Path(self.log_dir) / f"rank-{self.global_rank}.jsonl", "a") as out:
            out.write(json.dumps(record) + "\n")
        return (self.weight * batch["label"].float()).sum()

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self.val_seen.extend(batch["index"].tolist())

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class KillAt(Callback):
    """SIGKILLs every rank when it is about to train batch ``batch_idx`` of epoch 0 (the
    checkpoint of an earlier step is on disk; what was trained since is lost)."""

    def __init__(self, batch_idx: int) -> None:
        self.batch_idx = batch_idx

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:  # noqa: ANN001
        if trainer.current_epoch == 0 and batch_idx == self.batch_idx:
            os.kill(os.getpid(), signal.SIGKILL)


def _trainer(tmp: Path, *, devices: int, epochs: int = 2, callbacks: list | None = None, **kw) -> L.Trainer:
    options = dict(accelerator="cpu", devices=devices, max_epochs=epochs, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, use_distributed_sampler=False, default_root_dir=str(tmp),
                   callbacks=callbacks or [], num_sanity_val_steps=0, enable_checkpointing=bool(callbacks))
    if devices > 1:
        options["strategy"] = "ddp_fork"  # DDP over gloo in forked processes: no re-import per rank
    options.update(kw)
    return L.Trainer(**options)


def _module(splits: dict[str, Path], **kw) -> PackedDataModule:
    return PackedDataModule(splits["train"], splits["val"], batch_size=BATCH, order=ReadOrder("random", seed=7),
                            train_options={"fields": ("index", "label"), "decode": False},
                            eval_options={"fields": ("index", "label"), "decode": False}, **kw)


def _records(log: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(log.glob("rank-*.jsonl")) for line in path.read_text().splitlines()]


def test_killed_two_rank_fit_resumes_in_one_rank_with_every_sample_once(splits, tmp_path):
    log = tmp_path / "log"
    log.mkdir()
    checkpoints = tmp_path / "ckpt"
    saver = ModelCheckpoint(dirpath=checkpoints, every_n_train_steps=2, save_top_k=-1, save_last=False)
    trainer = _trainer(tmp_path, devices=2, callbacks=[saver, KillAt(batch_idx=3)])
    with pytest.raises(Exception, match="SIGKILL|signal 9|exit"):
        trainer.fit(Recorder(str(log)), datamodule=_module(splits))
    saved = sorted(checkpoints.glob("*.ckpt"))
    assert [p.name for p in saved] == ["epoch=0-step=2.ckpt"]  # step 3 trained, killed before step 4
    before = _records(log)
    assert {r["rank"] for r in before} == {0, 1} and max(r["step"] for r in before) == 3
    kept = [i for r in before if r["step"] <= 2 for i in r["indices"]]  # what the checkpoint holds
    assert len(kept) == 2 * 2 * BATCH and len(set(kept)) == len(kept)

    for path in log.glob("*.jsonl"):
        path.unlink()
    resumed = Recorder(str(log))
    data = _module(splits)
    trainer = _trainer(tmp_path, devices=1, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ckpt2")])
    trainer.fit(resumed, datamodule=data, ckpt_path=str(saved[0]))
    after = _records(log)
    assert {r["rank"] for r in after} == {0}
    epoch0 = kept + [i for r in after if r["epoch"] == 0 for i in r["indices"]]
    epoch1 = [i for r in after if r["epoch"] == 1 for i in r["indices"]]
    assert sorted(epoch0) == list(range(SAMPLES)), Counter(epoch0).most_common(3)
    assert sorted(epoch1) == list(range(SAMPLES)), Counter(epoch1).most_common(3)
    # Lightning counted the resumed epoch from its checkpoint (2 batches) plus this run's 8, and
    # the next epoch as a whole one-rank epoch (12 batches): its loader was made again.
    assert [r["batch_idx"] for r in after if r["epoch"] == 0] == list(range(2, 10))
    assert [r["batch_idx"] for r in after if r["epoch"] == 1] == list(range(12))
    assert trainer.reload_dataloaders_every_n_epochs == 0  # borrowed once, put back
    assert sorted(resumed.val_seen) == sorted(list(range(7)) * 2)  # validated after each epoch
    assert trainer.global_step == 2 + 8 + 12


def test_state_is_the_position_after_the_batches_lightning_processed_and_resumes_on_two_ranks(splits, tmp_path):
    """A one-process fit stopped after a checkpoint at step 5 of 12: the module's state (the
    checkpoint holds it under its class name) is the position after 5 batches, whatever a worker
    prefetched; resumed on 2 ranks, the rest of the epoch is dealt between them, none twice."""
    log = tmp_path / "log"
    log.mkdir()
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=5, save_top_k=-1)
    trainer = _trainer(tmp_path, devices=1, epochs=1, callbacks=[saver], max_steps=5)
    trainer.fit(Recorder(str(log)), datamodule=_module(splits, num_workers=1))  # a worker prefetches ahead
    path = tmp_path / "ckpt" / "epoch=0-step=5.ckpt"
    state = torch.load(path, weights_only=False)["PackedDataModule"]
    assert state["loop_batches"] == 5
    assert state["train"]["consumed"] == 5 * BATCH and state["train"]["epoch"] == 0
    assert state["train"]["order"] == "random" and state["train"]["seed"] == 7
    seen = [i for r in _records(log) for i in r["indices"]]
    first = PackedDataModule(splits["train"], batch_size=BATCH, seed=7,
                             train_options={"fields": ("index", "label"), "decode": False})
    order = [i for batch in first.train_dataloader() for i in batch["index"].tolist()]
    assert seen == order[:5 * BATCH]

    for record in log.glob("*.jsonl"):
        record.unlink()
    trainer = _trainer(tmp_path, devices=2, epochs=2)
    trainer.fit(Recorder(str(log)), datamodule=_module(splits), ckpt_path=str(path))
    records = _records(log)
    rest = [i for r in records if r["epoch"] == 0 for i in r["indices"]]
    assert sorted(rest) == sorted(order[5 * BATCH:])  # 28 samples: 3 full steps and 2 x 2
    assert sorted(i for r in records if r["epoch"] == 1 for i in r["indices"]) == list(range(SAMPLES))
    for rank in (0, 1):
        assert [r["batch_idx"] for r in records if r["rank"] == rank and r["epoch"] == 0] == [5, 6, 7, 8]
        assert [r["batch_idx"] for r in records if r["rank"] == rank and r["epoch"] == 1] == list(range(6))


def test_a_checkpoint_at_the_end_of_an_epoch_starts_the_next(splits, tmp_path):
    saver = ModelCheckpoint(dirpath=tmp_path / "ckpt", save_top_k=-1, every_n_epochs=1)
    log = tmp_path / "log"
    log.mkdir()
    trainer = _trainer(tmp_path, devices=1, epochs=1, callbacks=[saver])
    trainer.fit(Recorder(str(log)), datamodule=_module(splits))
    (path,) = (tmp_path / "ckpt").glob("*.ckpt")
    for record in log.glob("*.jsonl"):
        record.unlink()
    trainer = _trainer(tmp_path, devices=1, epochs=2)
    trainer.fit(Recorder(str(log)), datamodule=_module(splits), ckpt_path=str(path))
    records = _records(log)
    assert {r["epoch"] for r in records} == {1}
    assert sorted(i for r in records for i in r["indices"]) == list(range(SAMPLES))


def test_one_class_list_across_splits(splits, tmp_path):
    other = _build(tmp_path, "other", {"a": 2, "b": 2})
    build(tmp_path / "other-src", tmp_path / "ab", BuildOptions(shard_size=8 << 10), workers=1)  # classes a, b
    with pytest.raises(ClassListMismatchError, match="'c'"):
        PackedDataModule(splits["train"], tmp_path / "ab", batch_size=BATCH)
    with pytest.raises(ClassListMismatchError):
        PackedDataModule(splits["train"], test=tmp_path / "ab", batch_size=BATCH)
    data = PackedDataModule(splits["train"], splits["val"], other, batch_size=BATCH)  # built with one list
    assert data.classes == ("a", "b", "c")


def test_options_are_checked(splits):
    with pytest.raises(OptionError, match="at least one split"):
        PackedDataModule(batch_size=BATCH)
    with pytest.raises(OptionError, match="batch_size must be a positive integer"):
        PackedDataModule(splits["train"], batch_size=0)
    from packer.torch import PackedDataset

    with pytest.raises(OptionError, match="only to splits given as paths"):
        PackedDataModule(PackedDataset(splits["train"]), batch_size=BATCH, train_options={"decode": False})
    with pytest.raises(OptionError, match=r"an open dataset \(a view, a packer.Mixture\) or a packer.torch.PackedDataset, got "):
        PackedDataModule(42, batch_size=BATCH)
    data = _module(splits)
    with pytest.raises(OptionError, match="version"):
        data.load_state_dict({"version": 99, "train": {}, "loop_batches": 0})
    with pytest.raises(OptionError, match="loop_batches"):
        data.load_state_dict({"version": 1, "train": {}, "loop_batches": -1})
    for train in (None, [1, 2]):
        with pytest.raises(OptionError) as caught:
            data.load_state_dict({"version": 1, "train": train, "loop_batches": 0})
        assert caught.value.message == "the saved state has no training position ('train')"
    with pytest.raises(OptionError) as caught:
        PackedDataModule(val=splits["val"], batch_size=BATCH).train_dataloader()
    assert caught.value.message == "PackedDataModule has no train split: give train= to fit"
    data.load_state_dict({"version": 1, "train": {"version": 1, "order": "random", "seed": 8, "num_samples": SAMPLES,
                                                  "epoch": 0, "consumed": 8}, "loop_batches": 1})
    with pytest.raises(OptionError, match="seed=8"):
        data.train_dataloader()  # saved with another seed: the rest of that epoch is not this order's


def test_the_distributed_sampler_setting_is_refused_with_the_fix(splits, tmp_path):
    trainer = _trainer(tmp_path, devices=2, epochs=1, use_distributed_sampler=True)
    with pytest.raises(Exception, match="use_distributed_sampler=False"):
        trainer.fit(Recorder(str(tmp_path)), datamodule=_module(splits))


def test_the_distributed_sampler_setting_is_refused_in_this_process_too(splits, tmp_path):
    """The check itself, in the test process (the fit above refuses in its forked ranks): a
    two-rank Trainer attached as Lightning attaches it, before any rank starts."""
    data = _module(splits)
    data.trainer = _trainer(tmp_path, devices=2, epochs=1, use_distributed_sampler=True)
    assert data.trainer.world_size == 2
    for make in (data.train_dataloader, data.val_dataloader):
        with pytest.raises(OptionError) as caught:
            make()
        assert caught.value.message.startswith("PackedDataModule deals each rank its share itself "
                                               "(PackedBatchSampler): create the Trainer with "
                                               "use_distributed_sampler=False")
    data.trainer = _trainer(tmp_path, devices=2, epochs=1)  # use_distributed_sampler=False: dealt by the module
    assert len(data.train_dataloader()) == SAMPLES // (2 * BATCH)


def test_without_a_trainer_the_loader_counts_what_it_handed_out(splits):
    data = _module(splits)
    loader = data.train_dataloader()
    assert len(loader) == SAMPLES // BATCH
    batches = iter(loader)
    taken = [next(batches)["index"].tolist() for _ in range(3)]
    state = data.state_dict()
    assert state["loop_batches"] == 3 and state["train"]["consumed"] == 3 * BATCH
    again = _module(splits)
    again.load_state_dict(state)
    rest = [i for batch in again.train_dataloader() for i in batch["index"].tolist()]
    assert sorted(rest + [i for b in taken for i in b]) == list(range(SAMPLES))
    assert len(again.train_dataloader()) == SAMPLES // BATCH  # a second loader starts the epoch afresh


def test_the_training_order_is_one_value_and_the_old_keywords_still_work(splits):
    """``order=ReadOrder(...)`` is the training order; the old keywords read the same for a release,
    with a warning; the order's rank and world size are the Trainer's, its batch size the module's."""
    order = ReadOrder("block", seed=3, block_bytes=4096, window=2, drop_last=True)
    with warnings.catch_warnings():  # the new spelling, and what the module makes with it, warn of nothing
        warnings.filterwarnings("error", ".*is deprecated and goes in the next release", DeprecationWarning)
        new = PackedDataModule(splits["train"], splits["val"], batch_size=BATCH, order=order,
                               train_options={"fields": ("index",), "decode": False},
                               eval_options={"fields": ("index",), "decode": False})
        new.train_dataloader()
        new.val_dataloader()
    with pytest.warns(DeprecationWarning) as caught:
        old = PackedDataModule(splits["train"], batch_size=BATCH, order="block", seed=3, block_bytes=4096, window=2,
                               drop_last=True, train_options={"fields": ("index",), "decode": False})
    assert str(caught[0].message) == (
        "PackedDataModule(seed=, block_bytes=, window=, drop_last=) is deprecated and goes in the next release: "
        "pass order=packer.ReadOrder('block', seed=3, block_bytes=4096, window=2, drop_last=True)")
    assert new.order == old.order == order
    read = [[b["index"].tolist() for b in module.train_dataloader()] for module in (new, old)]
    assert read[0] == read[1] and all(len(b) == BATCH for b in read[0])
    assert new.train_dataloader().batch_sampler.read_order == replace(order, batch_size=BATCH, rank=0, world_size=1)
    with pytest.raises(TypeError, match="unexpected keyword argument 'rank'"):  # never an option of the module
        PackedDataModule(splits["train"], batch_size=BATCH, rank=0)
    with pytest.raises(OptionError) as caught:
        PackedDataModule(splits["train"], batch_size=BATCH, order=ReadOrder(rank=0, world_size=2))
    assert caught.value.message == ("PackedDataModule takes each rank's share from the Trainer; leave rank and "
                                    "world_size out of order=ReadOrder('random', rank=0, world_size=2)")
    with pytest.raises(OptionError) as caught:
        PackedDataModule(splits["train"], batch_size=BATCH, order=ReadOrder(batch_size=BATCH * 2))
    assert caught.value.message == (f"PackedDataModule has batch_size={BATCH} but its order has batch_size="
                                    f"{BATCH * 2}; give the same, or leave the order's out")
    assert PackedDataModule(splits["train"], batch_size=BATCH, order=ReadOrder(batch_size=BATCH)).order.batch_size == BATCH


# --- positions as a property: resumed k times at random points (issue 41) -----------------------------


class _FakeTrainer:
    """What the module reads of a Trainer: rank, world size, and the loop's processed-batch count
    (set by the test to what the loop trained, not what the loader prefetched)."""

    def __init__(self, rank: int, world_size: int, processed: int) -> None:
        from types import SimpleNamespace

        self.global_rank, self.world_size = rank, world_size
        self.reload_dataloaders_every_n_epochs = 0
        self.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(
            current=SimpleNamespace(processed=processed))))


def _train_in_runs(splits, runs, batch: int, seed: int, log: list | None = None,
                   ended: dict | None = None) -> dict[int, Counter]:
    """Each run: ``world`` ranks resume from the last saved state, each loader yields up to
    ``steps + prefetch`` batches (a DataLoader reads ahead), the loop trains ``steps`` of them, and
    rank 0's state is saved. Lightning is modelled as it counts: its own batch counter is
    restored from its checkpoint (what it had processed; 0 after an epoch's end) and it ends the
    epoch when the counter reaches the loader's length. A last one-rank run trains to the end of
    its epoch. Returns the samples trained per epoch (``log``: a line per rank and run, for a
    failure's message; ``ended``: each epoch's world size in the run that trained its last batch)."""
    log = [] if log is None else log
    ended = {} if ended is None else ended
    trained: dict[int, Counter] = {}
    state, counter = None, 0
    for world, steps, prefetch in [*runs, (1, 10 ** 6, 0)]:
        saved = None
        for rank in range(world):
            data = PackedDataModule(splits["train"], batch_size=batch, order=ReadOrder("random", seed=seed),
                                    train_options={"fields": ("index",), "decode": False})
            data.trainer = _FakeTrainer(rank, world, counter)
            if state:
                data.load_state_dict(state)
            loader = data.train_dataloader()
            epoch = loader.batch_sampler.epoch
            taken = []
            for batch_number, got in enumerate(loader if steps + prefetch else ()):  # 0: saved before the first
                taken.append(got["index"].tolist())
                if batch_number + 1 == steps + prefetch:
                    break
            done = taken[:max(min(steps, len(loader) - counter), 0)]  # Lightning stops at its length
            if steps == 10 ** 6:  # the last run: an epoch's rest is never empty (one saved at its end starts the next)
                assert done, log
            trained.setdefault(epoch, Counter()).update(i for b in done for i in b)
            processed = counter + len(done)
            data.trainer.fit_loop.epoch_loop.batch_progress.current.processed = processed
            log.append(f"world {world} rank {rank}: epoch {epoch}, Lightning at {counter} of {len(loader)}, "
                       f"trained {len(done)} of {len(taken)} read")
            if rank == 0:
                saved = data.state_dict()
                finished = processed == len(loader)
                if finished:
                    ended[epoch] = world
        state, counter = saved, 0 if finished else processed
    # Lightning goes on to the next epoch: with the same loader and the length it measured for the
    # resumed epoch, unless the module asked it to build the loader again (a resume in another
    # world size); it calls set_epoch, then iterates. The epoch is a whole one, of its length.
    length = len(loader)
    if data.trainer.reload_dataloaders_every_n_epochs == 1:
        loader = data.train_dataloader()
        length = len(loader)
    loader.batch_sampler.set_epoch(epoch + 1)
    assert length == -(-SAMPLES // batch), (length, log)
    # ... and a checkpoint half-way through it resumes in a new process at that point
    half = length // 2
    batches = []
    for got in loader:
        batches.append(got["index"].tolist())
        if len(batches) == half:
            break
    data.trainer.fit_loop.epoch_loop.batch_progress.current.processed = half
    state = data.state_dict()
    data = PackedDataModule(splits["train"], batch_size=batch, order=ReadOrder("random", seed=seed),
                            train_options={"fields": ("index",), "decode": False})
    data.trainer = _FakeTrainer(0, 1, half)
    data.load_state_dict(state)
    loader = data.train_dataloader()
    assert len(loader) == length and loader.batch_sampler.epoch == epoch + 1, (len(loader), length, log)
    batches += [got["index"].tolist() for got in loader]
    assert len(batches) == length, (len(batches), length, log)
    trained[epoch + 1] = Counter(i for got in batches for i in got)
    ended[epoch + 1] = 1
    return trained


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(runs=st.lists(st.tuples(st.integers(1, 3), st.one_of(st.just(0), st.integers(1, 14)), st.sampled_from([0, 0, 2])),
                     max_size=5),
       batch=st.integers(1, 7), seed=st.integers(0, 1 << 32))
@example(runs=[(1, 3, 0), (1, 0, 0)], batch=4, seed=1)  # saved before the resumed loader's first batch
@example(runs=[(2, 5, 2), (3, 0, 0), (1, 2, 2)], batch=3, seed=5)  # other world sizes, read-ahead
def test_resumed_k_times_at_random_points_every_sample_is_trained_once_per_epoch(splits, runs, batch, seed):
    """The saved position is the loop's count, not the loader's read-ahead; a resume in another
    world size, a resume before the first batch, and one at the very end of an epoch (the next
    epoch starts) each leave every sample trained once per epoch: exactly once, but for the pad
    rule's repeats (``packer.order``: the last ``R`` positions padded to a multiple of the world
    size, at most ``W - 1`` samples twice, ``W`` that of the run that ends the epoch)."""
    log: list[str] = []
    ended: dict[int, int] = {}
    trained = _train_in_runs(splits, runs, batch, seed, log, ended)
    for epoch, counts in trained.items():
        assert set(counts) == set(range(SAMPLES)), (epoch, counts, log)  # none skipped
        assert sum(counts.values()) - SAMPLES <= ended[epoch] - 1, (epoch, counts, ended, log)  # only padding twice
        if ended[epoch] == 1:
            assert max(counts.values()) == 1, (epoch, counts, log)


def test_the_positions_property_catches_a_state_that_counts_the_read_ahead(splits, monkeypatch):
    """Break the rule (save the batches the loader handed out, as if the loop had trained the
    read-ahead) and the property fails: the prefetched samples are never trained."""
    runs = [(1, 3, 2)]
    trained = _train_in_runs(splits, runs, 4, 1)
    assert all(sorted(c.elements()) == list(range(SAMPLES)) for c in trained.values())
    monkeypatch.setattr(PackedDataModule, "_loop_batches", lambda self: None)
    trained = _train_in_runs(splits, runs, 4, 1)
    assert len(set(trained[0])) == SAMPLES - 2 * 4  # the two read-ahead batches were never trained


# --- what the module promises outside a fit: refusals by name, defaults, loaders, the saved position (issue 41) ---


def test_every_refusal_names_the_split_or_option_it_is_about(splits):
    with pytest.raises(OptionError) as caught:
        PackedDataModule(batch_size=BATCH)
    assert caught.value.message == "PackedDataModule needs at least one split: train=, val= or test="
    for split in ("train", "val", "test"):
        with pytest.raises(OptionError) as caught:
            PackedDataModule(**{split: 42}, batch_size=BATCH)
        assert caught.value.message == (f"{split}= must be a dataset folder, a view file, an open dataset (a view, a "
                                        f"packer.Mixture) or a packer.torch.PackedDataset, got int")
    from packer.torch import PackedDataset

    with pytest.raises(OptionError) as caught:
        PackedDataModule(PackedDataset(splits["train"]), batch_size=BATCH, train_options={"decode": False})
    assert caught.value.message == ("train= is a PackedDataset already: its options are its own, so dataset options "
                                    "apply only to splits given as paths")
    for name in ("batch_size", "eval_batch_size"):
        for bad in (0, True, 2.5, "4"):
            with pytest.raises(OptionError) as caught:
                PackedDataModule(splits["train"], **{"batch_size": BATCH, name: bad})
            assert caught.value.message == f"{name} must be a positive integer, got {bad!r}"
    data = _module(splits)
    for bad in (True, 2.5, "3", None):
        with pytest.raises(OptionError) as caught:
            data.load_state_dict({"version": 1, "train": {}, "loop_batches": bad})
        assert caught.value.message == f"the saved loop_batches must be a non-negative integer, got {bad!r}"


def test_loaders_take_the_dataloader_arguments_and_their_defaults(splits):
    plain = PackedDataModule(splits["train"], splits["val"], batch_size=BATCH)
    from packer.torch import collate

    for loader in (plain.train_dataloader(), plain.val_dataloader()):
        assert (loader.num_workers, loader.pin_memory, loader.persistent_workers) == (0, False, False)
        assert loader.collate_fn is collate
    own = lambda batch: batch  # noqa: E731
    data = PackedDataModule(splits["train"], splits["val"], batch_size=BATCH, num_workers=2, persistent_workers=True,
                            collate_fn=own, loader_options={"prefetch_factor": 3, "timeout": 5})
    for loader in (data.train_dataloader(), data.val_dataloader()):
        assert (loader.num_workers, loader.persistent_workers, loader.prefetch_factor, loader.timeout) == (2, True, 3, 5)
        assert loader.collate_fn is own


def test_validation_and_test_read_their_split_in_order_by_eval_batch_size(splits):
    data = PackedDataModule(splits["train"], splits["val"], splits["val"], batch_size=BATCH, eval_batch_size=3,
                            eval_options={"fields": ("index",), "decode": False})
    for loader in (data.val_dataloader(), data.test_dataloader()):
        batches = [batch["index"].tolist() for batch in loader]
        assert batches == [[0, 1, 2], [3, 4, 5], [6]]  # the seven validation samples, in order
    assert PackedDataModule(splits["train"], batch_size=BATCH).test_dataloader() == []


def test_a_loaded_state_is_the_state_until_a_training_loader_is_made(splits):
    """Lightning may save a checkpoint between restoring one and asking for the training loader:
    the position saved then is the one loaded, not an empty state."""
    state = {"version": 1, "train": {"version": 1, "order": "random", "seed": 7, "num_samples": SAMPLES, "epoch": 0,
                                     "consumed": 8}, "loop_batches": 2}
    data = _module(splits)
    assert data.state_dict() == {}
    data.load_state_dict(state)
    assert data.state_dict() == state


def _resumed(splits, state: dict, rank: int, world: int, processed: int) -> PackedDataModule:
    data = PackedDataModule(splits["train"], batch_size=BATCH, order=ReadOrder("random", seed=7),
                            train_options={"fields": ("index",), "decode": False})
    data.trainer = _FakeTrainer(rank, world, processed)
    data.load_state_dict(state)
    return data


def test_a_state_saved_at_the_end_of_an_epoch_resumes_at_the_start_of_the_next(splits):
    data = _module(splits)
    data.trainer = _FakeTrainer(0, 1, 0)
    loader = data.train_dataloader()
    first = [batch["index"].tolist() for batch in loader]
    data.trainer.fit_loop.epoch_loop.batch_progress.current.processed = len(first)
    state = data.state_dict()
    assert (state["train"]["epoch"], state["train"]["consumed"]) == (0, SAMPLES)
    resumed = _resumed(splits, state, 0, 1, 0)
    loader = resumed.train_dataloader()
    assert loader.batch_sampler.epoch == 1 and len(loader) == SAMPLES // BATCH
    fresh = _module(splits).train_dataloader()
    fresh.batch_sampler.set_epoch(1)
    assert [b["index"].tolist() for b in loader] == [b["index"].tolist() for b in fresh] != first


def test_the_reload_setting_is_borrowed_only_for_a_resume_in_another_world_size_and_put_back_once(splits):
    """Resumed mid-epoch in the world size it was saved in, the loader's length is a whole epoch's
    and Lightning's reload setting is left alone; in another world size it is set to 1 for one
    reload, then the user's setting is put back, once."""
    data = _module(splits)
    data.trainer = _FakeTrainer(0, 2, 0)
    batches = iter(data.train_dataloader())
    for _ in range(2):
        next(batches)
    data.trainer.fit_loop.epoch_loop.batch_progress.current.processed = 2
    state = data.state_dict()
    same = _resumed(splits, state, 1, 2, 2)
    same.trainer.reload_dataloaders_every_n_epochs = 4
    assert len(same.train_dataloader()) == SAMPLES // (2 * BATCH)
    assert same.trainer.reload_dataloaders_every_n_epochs == 4
    other = _resumed(splits, state, 0, 1, 2)
    other.trainer.reload_dataloaders_every_n_epochs = 4
    assert len(other.train_dataloader()) == 2 + (SAMPLES - 2 * 2 * BATCH) // BATCH
    assert other.trainer.reload_dataloaders_every_n_epochs == 1  # Lightning builds the loader again next epoch
    assert len(other.train_dataloader()) == SAMPLES // BATCH
    assert other.trainer.reload_dataloaders_every_n_epochs == 4  # put back
    other.trainer.reload_dataloaders_every_n_epochs = 0  # the user's own change afterwards is theirs
    other.train_dataloader()
    assert other.trainer.reload_dataloaders_every_n_epochs == 0
