"""What every reader does with epochs: following ``set_epoch`` together with the dataset's seeded
crops, and the dataset a reader tells the order it will read. (The order itself, its sample space
and position are ``packer.order``'s ``ReadOrder``, ``IndexSpace`` and ``EpochCursor``.)"""

from __future__ import annotations

from typing import Any


def _seeded_crops(source: Any) -> Any:
    """The seeded fused transform (``decode=RandomResizedCrop(..., seed=)``) of a packer dataset,
    or None: its draws are a function of (seed, epoch, index), so it must follow the epoch."""
    from ..transforms import DecodeTransform

    decode = getattr(getattr(source, "_pipeline", None), "decode", None)
    return decode if isinstance(decode, DecodeTransform) and getattr(decode, "seed", None) is not None else None


def _planned_dataset(source: Any) -> Any:
    """The ``packer.dataset.Dataset`` under ``source`` (a ``PackedDataset`` or a dataset), or None:
    the reader tells it the order it will read (``plan_reads``), which a dataset in object storage
    prefetches; a sample count has none."""
    for candidate in (source, getattr(source, "dataset", None)):
        if hasattr(candidate, "plan_reads") and hasattr(candidate, "reads_advanced"):
            return candidate
    return None


class _FollowsEpoch:
    """``set_epoch`` and ``load_state_dict`` also move the dataset's seeded crops: a loop that moves
    only the sampler (the DistributedSampler habit), or resumes without calling ``set_epoch``, would
    otherwise train on epoch 0's crops."""

    _crops: Any = None

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch of the next iteration, and of the dataset's seeded crops if any."""
        super().set_epoch(epoch)  # type: ignore[misc]
        if self._crops is not None:
            self._crops.set_epoch(epoch)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position (``CursorReader.load_state_dict``); the crops follow its epoch."""
        super().load_state_dict(state)  # type: ignore[misc]
        if self._crops is not None:
            self._crops.set_epoch(self.epoch)  # type: ignore[attr-defined]
