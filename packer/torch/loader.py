"""``PackedDataLoader``: a DataLoader that counts the batches the loop received, so that its
``state_dict`` resumes exactly where training stopped.

Resuming mid-epoch
------------------
The position in an epoch is ``(seed, epoch, consumed)``, ``consumed`` counting samples globally
(see ``packer.order``), so it is valid for any number of workers, ranks and batch sizes. Every
reader keeps its place in a ``packer.order.EpochCursor``. The simple, safe wiring is
``PackedDataLoader``, which counts the batches your loop received (a DataLoader prefetches, so a
reader cannot know that by itself)::

    sampler = PackedBatchSampler(dataset, batch_size=256, order="random", seed=0)
    loader = PackedDataLoader(dataset, batch_sampler=sampler, num_workers=8, collate_fn=collate,
                              pin_memory=True, persistent_workers=True)
    if checkpoint:
        loader.load_state_dict(checkpoint["loader"])
    for epoch in range(loader.epoch, epochs):
        loader.set_epoch(epoch)        # keeps the loaded position for the loaded epoch
        for images, labels in loader:
            ...
            save({"loader": loader.state_dict()})

A loaded position is used once: the pass after ``load_state_dict`` reads the rest of the saved
epoch, and every later pass a whole epoch, of the epoch ``set_epoch`` selects or, in a loop that
never calls it, of the same epoch number again (as ``DistributedSampler`` does). Every packer
reader follows this rule (``packer.order``, "Passes after a resume").

With a plain ``DataLoader``, count yourself and say what you counted:
``batch_sampler.state_dict(batches_consumed=step)`` (its own batches),
``sampler.state_dict(samples_consumed=step * batch_size)`` for a ``PackedSampler``
(``batches_consumed`` on a sampler that was not told the batch size raises rather than resume
at the wrong place), ``dataset.state_dict(batches_consumed=step)`` for a
``PackedIterableDataset``, whose position lives in a small shared-memory tensor so that
``set_epoch``/``load_state_dict`` reach persistent workers. Without an argument a reader
reports what it handed out itself, which is exact only when it is iterated directly.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch.utils.data as torch_data

from ..errors import OptionError
from .iterable import PackedIterableDataset
from .samplers import PackedBatchSampler, PackedSampler


class PackedDataLoader(torch_data.DataLoader):
    """A ``DataLoader`` that knows how far its packer reader got: ``state_dict()`` with no arguments.

    It counts the batches it has handed to *your loop* (not what its workers prefetched), and
    asks its packer reader (a ``PackedBatchSampler`` as ``batch_sampler``, a ``PackedSampler``
    as ``sampler``, or a ``PackedIterableDataset`` as dataset) for the matching position. So the
    natural wiring cannot resume at the wrong place::

        loader = PackedDataLoader(train, sampler=PackedSampler(train, seed=0), batch_size=64,
                                  num_workers=8, pin_memory=True)
        loader.load_state_dict(checkpoint["loader"])      # if resuming
        for epoch in range(loader.epoch, epochs):
            loader.set_epoch(epoch)
            for images, labels in loader:
                ...
                save({"loader": loader.state_dict()})

    Takes every ``DataLoader`` argument. It tells a ``PackedSampler`` its batch size, so that
    each global step takes the next ``world_size x batch_size`` samples of the epoch order (and
    the block order keeps its locality); a sampler given another batch size is refused, as is a
    ``PackedIterableDataset`` whose batches are not the loader's (``batch_size=None`` for a
    batched one, the dataset's ``batch_size`` or None for ``batched=False``).

    Raises:
        OptionError: no packer reader to track, or a reader whose batch size is not the loader's.
    """

    def __init__(self, dataset: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(dataset, *args, **kwargs)
        reader = self._packer_reader()
        if isinstance(reader, PackedSampler) and self.batch_size is not None:
            reader.use_batch_size(int(self.batch_size))
        if isinstance(reader, PackedIterableDataset):
            wanted = None if reader.batched else reader.batch_size
            if self.batch_size not in (wanted, None):  # None: the loop receives the reader's items
                kind = "yields batches" if reader.batched else f"yields samples in batches of {reader.batch_size}"
                raise OptionError(f"the PackedIterableDataset {kind}, but the DataLoader's batch_size is "
                                  f"{self.batch_size}: pass batch_size={wanted} to the loader")
        self._yielded = 0

    def _packer_reader(self) -> Any:
        batch_sampler = self.batch_sampler
        if isinstance(batch_sampler, PackedBatchSampler):
            return batch_sampler
        if isinstance(self.sampler, PackedSampler):
            return self.sampler
        if isinstance(self.dataset, PackedIterableDataset):
            return self.dataset
        raise OptionError("PackedDataLoader tracks a packer reader: pass batch_sampler=PackedBatchSampler(...), "
                          "sampler=PackedSampler(...) or a PackedIterableDataset")

    def __iter__(self) -> Iterator[Any]:
        self._yielded = 0
        for batch in super().__iter__():
            self._yielded += 1  # counted as your loop receives it: prefetched batches are not consumed
            yield batch

    @property
    def epoch(self) -> int:
        return self._packer_reader().epoch

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration (forwarded to the reader)."""
        self._packer_reader().set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The position after the batches this loader handed out in its current iteration."""
        reader = self._packer_reader()
        if isinstance(reader, PackedSampler):  # the loader batches samples: count samples
            return reader.state_dict(samples_consumed=self._yielded * int(self.batch_size or 1))
        if isinstance(reader, PackedIterableDataset) and not reader.batched:
            return reader.state_dict(samples_consumed=self._yielded * int(self.batch_size or 1))
        return reader.state_dict(batches_consumed=self._yielded)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the reader at a saved position (before iterating)."""
        self._packer_reader().load_state_dict(state)
        self._yielded = 0
