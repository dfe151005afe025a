"""``PackedDataModule``: packed datasets as a Lightning ``LightningDataModule`` whose checkpoints
resume mid-epoch exactly, in any world size (``pip install 'packer-shards[lightning]'``).

What it wires for you
---------------------
* **Splits**: ``train``, ``val`` and ``test``, each a dataset folder or a
  ``packer.torch.PackedDataset``; every split given must have the training split's class list
  (``ClassListMismatchError`` at construction, before any process starts).
* **Samplers**: a ``PackedBatchSampler`` per split, its rank and world size taken from the
  ``Trainer`` (so run the ``Trainer`` with ``use_distributed_sampler=False``: Lightning would
  otherwise try to replace it with a ``DistributedSampler``; the module refuses that with the fix).
  Training reads ``order`` (a ``packer.ReadOrder``, ``ReadOrder("random")`` by default);
  validation and test read ``"sequential"``, the tail padded from the start like
  ``DistributedSampler`` does.
* **Resume**: the module's ``state_dict`` (saved by Lightning in every checkpoint, under the
  module's class name) is the training sampler's position after *the batches Lightning's loop
  processed*, read from the loop's own progress counter. The loop is the only one that knows that
  number: a DataLoader prefetches, and Lightning fixes an epoch's length once and counts its
  batches itself. ``Trainer.fit(..., ckpt_path=...)`` then reads exactly the samples the saved run
  had not trained on, none twice, with any number of ranks, workers or batch size.

How a resumed epoch meets Lightning's counting
----------------------------------------------
Lightning restores its own batch counter (``N`` batches done in the epoch) and ends the epoch when
the counter reaches the loader's length. The training loader therefore reports ``N + R``, ``R``
being the batches left for this run's world size. When the world size changed, ``N + R`` differs
from a full epoch's length and Lightning would keep it for the epochs after; the module then asks
Lightning to build the training loader once more at the next epoch
(``trainer.reload_dataloaders_every_n_epochs``, put back afterwards).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Iterator, Mapping

from .errors import MissingDependencyError, OptionError

try:
    import lightning.pytorch as _pl
except ImportError as _exc:  # pragma: no cover - exercised only without lightning
    raise MissingDependencyError(
        f"packer.lightning needs Lightning, which is not installed ({_exc}); install it with "
        f"pip install 'packer-shards[lightning]'") from None

import torch.utils.data as torch_data

from .classes import check_classes
from .dataset import Dataset
from .order import ORDER_KEYWORDS, ReadOrder, read_order_from
from .torch import PackedBatchSampler, PackedDataset, collate

__all__ = ["PackedDataModule", "STATE_VERSION"]

#: The version of ``PackedDataModule.state_dict``; a state of another version is refused.
STATE_VERSION = 1
#: The training order when none is given.
DEFAULT_ORDER = ReadOrder("random")
#: The old order keywords of ``PackedDataModule`` (the Trainer gives the rank and world size).
_MODULE_KEYWORDS = {name: field for name, field in ORDER_KEYWORDS.items() if name not in ("rank", "world_size")}


class _TrainLoader(torch_data.DataLoader):
    """The training loader: reports Lightning's length for the epoch, iterates lazily, counts.

    ``__iter__`` is a generator, so the batch sampler is first asked for indices when the loop
    takes the first batch: Lightning calls ``iter()`` before ``set_epoch`` (and DataLoader
    workers ask the sampler as soon as the iterator exists), which would otherwise read the
    previous epoch's order. The data module owns the position: Lightning would restore a loader's
    own state only after fixing the epoch's length, and counts batches without prefetching in mind.
    """

    def __init__(self, *args: Any, batches_before: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Batches of the loaded epoch that were read before the loaded position (Lightning's
        #: count); 0 once a later epoch begins.
        self.batches_before = batches_before
        #: Batches handed to the loop in the current iteration.
        self.yielded = 0
        #: The epoch whose iteration began last (None: none yet).
        self.iteration_epoch: int | None = None

    def __len__(self) -> int:
        return self.batches_before + len(self.batch_sampler)

    # Lightning warns that a mid-epoch checkpoint of a loader without these cannot resume; this
    # one resumes through its data module, whose state (under the module's class name) holds the
    # position: the loader saves nothing of its own and has nothing to load.
    def state_dict(self) -> dict[str, Any]:
        """Empty: the position is ``PackedDataModule.state_dict``'s."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Nothing to load: ``PackedDataModule.load_state_dict`` placed this loader already."""

    def __iter__(self) -> Iterator[Any]:
        if self.iteration_epoch is not None:
            self.batches_before = 0  # only the loaded epoch begins part-way
        self.iteration_epoch = self.batch_sampler.epoch
        self.yielded = 0
        for batch in super().__iter__():
            self.yielded += 1
            yield batch


def _as_dataset(source: Any, options: Mapping[str, Any], split: str) -> PackedDataset | None:
    if source is None or isinstance(source, PackedDataset):
        if source is not None and options:
            raise OptionError(f"{split}= is a PackedDataset already: its options are its own, so "
                              f"dataset options apply only to splits given as paths")
        return source
    if isinstance(source, (str, os.PathLike, Dataset)):  # a folder, URL, view file, open view or Mixture
        return PackedDataset(source, **options)
    raise OptionError(f"{split}= must be a dataset folder, a view file, an open dataset (a view, a "
                      f"packer.Mixture) or a packer.torch.PackedDataset, got {type(source).__name__}")


class PackedDataModule(_pl.LightningDataModule):
    """Train/val/test packed datasets for a Lightning ``Trainer``, resumable mid-epoch.

    Example::

        data = PackedDataModule("packed/train", "packed/val", batch_size=256, num_workers=8,
                                train_options={"decode": RandomResizedCrop(224, seed=0)},
                                eval_options={"decode": CenterCrop(224, resize=256)})
        trainer = lightning.Trainer(strategy="ddp", devices=8, use_distributed_sampler=False,
                                    callbacks=[ModelCheckpoint(every_n_train_steps=1000)])
        trainer.fit(model, datamodule=data, ckpt_path="last")   # resumes mid-epoch if there is one

    Args:
        train, val, test: dataset folders or ``packer.torch.PackedDataset`` objects (None: no
            such split). Each split given must have the training split's class list (the first
            split given is the reference when there is no training split).
        batch_size: samples per batch per rank, for training.
        eval_batch_size: the same for validation and test (default ``batch_size``).
        order: the training order, a ``packer.ReadOrder`` or a kind string (default
            ``ReadOrder("random")``): kind, seed, ``drop_last`` (drop the end of each training
            epoch, full batches only, instead of padding it), block settings; its ``batch_size``
            None or ``batch_size``, its rank and world size None (the ``Trainer``'s). Validation
            and test read ``"sequential"``.
        num_workers, pin_memory, persistent_workers, collate_fn: DataLoader arguments (every
            split); ``collate_fn`` defaults to ``packer.torch.collate``.
        loader_options: any other DataLoader arguments (every split), e.g. ``prefetch_factor``.
        train_options: ``PackedDataset`` arguments for a training split given as a path
            (``decode=RandomResizedCrop(224, seed=0)``, ``fields=...``).
        eval_options: the same for validation and test splits given as paths.
        **deprecated: the order keywords of earlier releases (``seed=``, ``drop_last=``,
            ``block_bytes=``, ``window=``, ``block_samples=``): still accepted for one release,
            with a ``DeprecationWarning``.

    Raises:
        ClassListMismatchError: two splits with different class lists.
        OptionError: no split at all, a bad split or batch size, options for a split that is
            already a ``PackedDataset``, or an order with a rank, world size or another batch size.
    """

    def __init__(self, train: Any = None, val: Any = None, test: Any = None, *, batch_size: int,
                 eval_batch_size: int | None = None, order: ReadOrder | str | None = None, num_workers: int = 0,
                 pin_memory: bool = False, persistent_workers: bool = False,
                 collate_fn: Callable[[Any], Any] | None = None, loader_options: Mapping[str, Any] | None = None,
                 train_options: Mapping[str, Any] | None = None, eval_options: Mapping[str, Any] | None = None,
                 **deprecated: Any) -> None:
        super().__init__()
        read_order = read_order_from(order, deprecated, reader="PackedDataModule", default=DEFAULT_ORDER,
                                     keywords=_MODULE_KEYWORDS)
        for name, value in (("batch_size", batch_size), ("eval_batch_size", eval_batch_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise OptionError(f"{name} must be a positive integer, got {value!r}")
        if (read_order.rank, read_order.world_size) != (None, None):
            raise OptionError(f"PackedDataModule takes each rank's share from the Trainer; leave rank and world_size "
                              f"out of order={read_order!r}")
        if read_order.batch_size not in (None, batch_size):
            raise OptionError(f"PackedDataModule has batch_size={batch_size} but its order has batch_size="
                              f"{read_order.batch_size}; give the same, or leave the order's out")
        if train is None and val is None and test is None:
            raise OptionError("PackedDataModule needs at least one split: train=, val= or test=")
        self.train = _as_dataset(train, dict(train_options or {}), "train")
        self.val = _as_dataset(val, dict(eval_options or {}), "val")
        self.test = _as_dataset(test, dict(eval_options or {}), "test")
        splits = [s for s in (self.train, self.val, self.test) if s is not None]
        for other in splits[1:]:
            check_classes(splits[0], other)
        #: The class list every split shares.
        self.classes = tuple(splits[0].classes)
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        #: The training order (its rank and world size come from the Trainer).
        self.order = read_order
        self._loader = dict(loader_options or {})
        self._loader.update(num_workers=num_workers, pin_memory=pin_memory, persistent_workers=persistent_workers,
                            collate_fn=collate_fn or collate)
        self._train_loader: _TrainLoader | None = None
        self._loaded: dict[str, Any] | None = None  # a state from a checkpoint, until the train loader exists
        self._reload_setting: int | None = None  # the Trainer's reload_dataloaders_every_n_epochs, when borrowed

    # --- where this process sits --------------------------------------------------------------------

    def _rank(self) -> tuple[int | None, int | None]:
        trainer = self._trainer_or_none()
        if trainer is None:
            return None, None  # torch.distributed when initialised, else a single process
        return int(trainer.global_rank), int(trainer.world_size)

    def _trainer_or_none(self) -> Any:
        return getattr(self, "trainer", None)

    def _check_trainer(self) -> None:
        trainer = self._trainer_or_none()
        connector = getattr(trainer, "_accelerator_connector", None)
        if trainer is not None and trainer.world_size > 1 and getattr(connector, "use_distributed_sampler", False):
            raise OptionError("PackedDataModule deals each rank its share itself (PackedBatchSampler): create the "
                              "Trainer with use_distributed_sampler=False, or Lightning replaces the sampler with "
                              "a DistributedSampler and the orders, epochs and resume are lost")

    def _loop_batches(self) -> int | None:
        """Batches Lightning's training loop processed in its current epoch, or None outside a fit."""
        trainer = self._trainer_or_none()
        try:
            return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        except AttributeError:
            return None

    # --- loaders ------------------------------------------------------------------------------------

    def _sampler(self, dataset: PackedDataset, batch_size: int, order: ReadOrder) -> PackedBatchSampler:
        rank, world_size = self._rank()
        return PackedBatchSampler(dataset, batch_size=batch_size,
                                  order=dataclasses.replace(order, rank=rank, world_size=world_size))

    def train_dataloader(self) -> _TrainLoader:
        """The training loader, at the loaded position when Lightning resumes from a checkpoint."""
        if self.train is None:
            raise OptionError("PackedDataModule has no train split: give train= to fit")
        self._check_trainer()
        trainer = self._trainer_or_none()
        if self._reload_setting is not None and trainer is not None:
            trainer.reload_dataloaders_every_n_epochs = self._reload_setting  # the borrowed reload happened
            self._reload_setting = None
        sampler = self._sampler(self.train, self.batch_size, self.order)
        before = 0
        if self._loaded is not None:
            state, self._loaded = self._loaded, None
            sampler.load_state_dict(state["train"])
            if sampler.share().num_batches == 0:  # saved at the end of its epoch: the next one starts
                sampler.set_epoch(sampler.epoch + 1)
            else:
                before = state["loop_batches"]
        loader = _TrainLoader(self.train, batch_sampler=sampler, batches_before=before, **self._loader)
        full = sampler.read_order.share(len(self.train), consumed=0, world_size=sampler.world_size).num_batches
        if before and len(loader) != full and trainer is not None:
            # Lightning keeps this epoch's length for the next epochs: have it ask once more.
            self._reload_setting = int(trainer.reload_dataloaders_every_n_epochs)
            trainer.reload_dataloaders_every_n_epochs = 1
        self._train_loader = loader
        return loader

    def _eval_loader(self, dataset: PackedDataset | None) -> torch_data.DataLoader | list[Any]:
        if dataset is None:
            return []  # Lightning's "no loader": the loop is skipped
        self._check_trainer()
        sampler = self._sampler(dataset, self.eval_batch_size, ReadOrder("sequential"))
        return torch_data.DataLoader(dataset, batch_sampler=sampler, **self._loader)

    def val_dataloader(self) -> torch_data.DataLoader | list[Any]:
        """The validation loader: sequential, every rank its share (the tail padded); ``[]``
        without a validation split (Lightning skips the loop)."""
        return self._eval_loader(self.val)

    def test_dataloader(self) -> torch_data.DataLoader | list[Any]:
        """The test loader: sequential, every rank its share (the tail padded); ``[]`` without
        a test split."""
        return self._eval_loader(self.test)

    # --- the position in checkpoints ----------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The training position after the batches Lightning's loop processed (JSON-ready).

        Outside a fit (no trainer), the batches the training loader handed out in its current
        iteration count instead. Empty before a training loader exists, unless a state was loaded.
        """
        loader = self._train_loader
        if loader is None:
            return dict(self._loaded) if self._loaded is not None else {}
        sampler = loader.batch_sampler
        if loader.iteration_epoch != sampler.epoch:
            # The sampler's epoch has not begun: its start, or the loaded position if never iterated.
            before = loader.batches_before if loader.iteration_epoch is None else 0
            return {"version": STATE_VERSION, "train": sampler.state_dict(batches_consumed=0),
                    "loop_batches": before}
        done = self._loop_batches()
        if done is None:
            done = loader.batches_before + loader.yielded
        consumed = max(done - loader.batches_before, 0)
        return {"version": STATE_VERSION, "train": sampler.state_dict(batches_consumed=consumed),
                "loop_batches": done}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume at a saved position: the next training loader reads exactly the rest of that epoch.

        Raises:
            OptionError: not a state of this module (checked again against the dataset, order and
                seed when the training loader is made).
        """
        if not state_dict:
            return
        if not isinstance(state_dict, Mapping) or state_dict.get("version") != STATE_VERSION:
            raise OptionError(f"not a PackedDataModule state of version {STATE_VERSION}: "
                              f"{str(dict(state_dict) if isinstance(state_dict, Mapping) else state_dict)[:120]}")
        batches = state_dict.get("loop_batches")
        if isinstance(batches, bool) or not isinstance(batches, int) or batches < 0:
            raise OptionError(f"the saved loop_batches must be a non-negative integer, got {batches!r}")
        if not isinstance(state_dict.get("train"), Mapping):
            raise OptionError("the saved state has no training position ('train')")
        self._loaded = {"version": STATE_VERSION, "train": dict(state_dict["train"]), "loop_batches": batches}
        self._train_loader = None

