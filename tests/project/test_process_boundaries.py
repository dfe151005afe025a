"""Everything that crosses a worker or rank boundary arrives whole (issue 31, item 3).

DataLoader workers, build workers and checkpoints move these objects by pickle: every
``PackerError`` subclass (found by walking the class tree, so a new one is checked without
editing this file) with all its fields, datasets (``packer.dataset.Dataset`` and the torch
readers), the fused transforms, samplers and their shared position, build options, and the
state dicts a training loop saves. Each test compares every field of the copy with the original,
then the behaviour (the same bytes, the same order).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import inspect
import json
import multiprocessing
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import packer.errors
from packer.dataset import open_dataset
from packer.errors import PackerError
from packer.writer import build
from packer.writer.plan import BuildOptions

from helpers import png_folder


def all_error_classes() -> list[type[PackerError]]:
    found, todo = [], [PackerError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(set(found), key=lambda c: c.__name__)


#: Values (not the defaults) for the keyword fields a subclass adds to path, sample and offset.
EXTRA_FIELDS: dict[str, Any] = {
    "skipped": {"unsafe-name": 2, "name-collision": 1},
    "examples": [("../a.png", "unsafe-name", "its key: '..' path component"),
                 ("cat/b.png", "name-collision", "'cat/b.png' is already written for another sample")],
    "key": "cat/missing.png",
}


def make_error(cls: type[PackerError]) -> PackerError:
    """An instance with every field set to a value that is not its default."""
    where: dict[str, Any] = dict(path="/data/ds/shards/shard-00001.pks", sample=7, offset=2 ** 40 + 3)
    params = [p for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self"]
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for extra in (p.name for p in params if p.kind == p.KEYWORD_ONLY and p.name not in where):
        if extra not in EXTRA_FIELDS:
            raise AssertionError(f"{cls.__name__} has the field {extra!r}: give it a value in EXTRA_FIELDS")
        where[extra] = EXTRA_FIELDS[extra]
    if positional == ["message"]:
        return cls(f"{cls.__name__}: expected this, got that ✓", **where)
    if positional == ["reason", "message"]:
        return cls("too-many-pixels", f"{cls.__name__}: 1 000 000 000 pixels", **where)
    raise AssertionError(f"{cls.__name__}{inspect.signature(cls.__init__)}: add a recipe for its arguments here, "
                         "and carry its new fields in PackerError.__reduce__")


def fields_of(error: PackerError) -> dict[str, Any]:
    return {"type": type(error), "vars": vars(error), "str": str(error), "args": error.args,
            "exit_code": error.exit_code}


ERRORS = all_error_classes()


def test_the_class_tree_is_what_the_module_exports() -> None:
    assert {c.__name__ for c in ERRORS} == set(packer.errors.__all__)
    assert len(ERRORS) >= 25


@pytest.mark.parametrize("cls", ERRORS, ids=lambda c: c.__name__)
def test_every_error_round_trips_through_pickle_with_every_field(cls: type[PackerError]) -> None:
    error = make_error(cls)
    assert error.path and error.sample == 7 and error.offset == 2 ** 40 + 3
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        copy = pickle.loads(pickle.dumps(error, protocol=protocol))
        assert fields_of(copy) == fields_of(error)
        assert isinstance(copy, ValueError) == isinstance(error, ValueError)


@pytest.mark.parametrize("cls", [c for c in ERRORS if c is not PackerError][:3], ids=lambda c: c.__name__)
def test_an_error_without_a_place_round_trips_too(cls: type[PackerError]) -> None:
    error = cls("no place") if cls.__name__ != "RejectedImageError" else cls("empty-file", "no place")
    copy = pickle.loads(pickle.dumps(error))
    assert fields_of(copy) == fields_of(error)
    assert (copy.path, copy.sample, copy.offset, str(copy)) == (None, None, None, "no place")


def _raise_in_worker(name: str) -> None:
    raise make_error(getattr(packer.errors, name))


def test_errors_raised_in_a_worker_process_reach_the_parent_intact() -> None:
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
        futures = {cls: pool.submit(_raise_in_worker, cls.__name__) for cls in ERRORS}
        for cls, future in futures.items():
            with pytest.raises(cls) as caught:
                future.result(timeout=60)
            assert type(caught.value) is cls
            assert fields_of(caught.value) == fields_of(make_error(cls))


# --- datasets, transforms, samplers, build options, state dicts ------------------------------------------

@pytest.fixture(scope="module")
def dataset_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("boundaries")
    build(png_folder(tmp / "src", 23), tmp / "ds", BuildOptions(shard_size=8192, alignment=512), workers=1,
          progress=False)
    return tmp / "ds"


def test_a_dataset_round_trips_with_its_options_and_reads_the_same_bytes(dataset_path: Path) -> None:
    for backend, verify, max_open in (("mmap", False, 8), ("pread", True, 1)):
        with open_dataset(dataset_path, backend=backend, verify_checksums=verify, max_open_shards=max_open) as ds:
            ds.get(0)  # an open shard is not pickled: the copy opens its own
            copy = pickle.loads(pickle.dumps(ds))
            assert copy.__getstate__() == ds.__getstate__()
            assert (copy.backend_name, copy.verify_checksums, copy.max_open_shards) == (backend, verify, max_open)
            assert len(copy) == len(ds) and copy.classes == ds.classes
            assert [copy.key(i) for i in range(len(ds))] == [ds.key(i) for i in range(len(ds))]
            assert np.array_equal(copy.labels, ds.labels)
            assert all(bytes(copy.get(i)) == bytes(ds.get(i)) for i in range(len(ds)))
            copy.close()


def test_build_options_round_trip_with_every_field() -> None:
    options = BuildOptions(shard_size=8192, alignment=512, seed=11, shuffle=False, classes=("b", "a"))
    copy = pickle.loads(pickle.dumps(options))
    assert copy == options and dataclasses.asdict(copy) == dataclasses.asdict(options)


def _torch() -> Any:
    pytest.importorskip("torch")
    import packer.torch

    return packer.torch


def test_fused_transforms_round_trip_and_crop_the_same(dataset_path: Path) -> None:
    pt = _torch()
    from packer.transforms import CenterCrop, RandomResizedCrop

    for transform in (RandomResizedCrop(9, scale=(0.3, 0.9), seed=5), CenterCrop(7)):
        dataset = pt.PackedDataset(dataset_path, decode=transform)
        copy = pickle.loads(pickle.dumps(dataset))
        assert vars(pickle.loads(pickle.dumps(transform))).keys() == vars(transform).keys()
        for i in (0, 5, 22):
            image, label = dataset[i]
            image2, label2 = copy[i]
            assert label == label2 and image.shape == image2.shape and bool((image == image2).all())


def _sampler_fields(sampler: Any) -> dict[str, Any]:
    cursor = sampler.cursor
    return {"state": sampler.state_dict(), "epoch": sampler.epoch, "len": len(sampler),
            "batch_size": getattr(sampler, "batch_size", None), "drop_last": getattr(sampler, "drop_last", None),
            "read_order": cursor.read_order, "position": cursor.position.get(), "handed_out": cursor.handed_out}


def test_samplers_round_trip_with_their_position_and_deal_the_same(dataset_path: Path) -> None:
    pt = _torch()
    dataset = pt.PackedDataset(dataset_path, decode=False)
    for make in (lambda: pt.PackedSampler(dataset, order="block", block_bytes=2048, seed=3, rank=1, world_size=2),
                 lambda: pt.PackedBatchSampler(dataset, batch_size=3, order="random", seed=9, rank=0, world_size=2,
                                               drop_last=True)):
        whole = make()
        whole.set_epoch(2)
        first = list(whole)
        running = make()
        running.set_epoch(2)
        it = iter(running)
        next(it), next(it)
        per_sampler = {"samples_consumed": 2} if isinstance(running, pt.PackedSampler) else {"batches_consumed": 2}
        sampler = make()
        sampler.load_state_dict(running.state_dict(**per_sampler))
        copy = pickle.loads(pickle.dumps(sampler))
        assert _sampler_fields(copy) == _sampler_fields(sampler)
        assert list(copy) == list(sampler) == first[2:] and len(first) > 2


def test_a_batch_sampler_and_its_sampler_share_one_position_after_pickling(dataset_path: Path) -> None:
    pt = _torch()
    batches = pt.PackedBatchSampler(pt.PackedDataset(dataset_path, decode=False), batch_size=5, seed=1)
    copy = pickle.loads(pickle.dumps(batches))
    assert copy.sampler.cursor.position is copy.cursor.position
    copy.set_epoch(4)
    assert copy.sampler.epoch == 4
    assert [i for batch in copy for i in batch] == list(copy.sampler)


def test_an_iterable_dataset_round_trips_and_reads_the_same_batches(dataset_path: Path) -> None:
    pt = _torch()
    dataset = pt.PackedIterableDataset(dataset_path, batch_size=4, decode=False, order="block", block_bytes=2048,
                                       seed=7, rank=1, world_size=2)
    dataset.set_epoch(3)
    dataset.load_state_dict(dataset.state_dict(batches_consumed=1))
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.state_dict() == dataset.state_dict() and len(copy) == len(dataset) and copy.epoch == 3

    def labels(reader: Any) -> list[list[int]]:
        return [batch[1].tolist() for batch in reader]

    assert labels(copy) == labels(dataset)


@pytest.mark.parametrize("wiring", ["sampler", "batch_sampler", "iterable"])
def test_loader_state_dicts_are_plain_data_that_resume_in_a_new_loader(dataset_path: Path, wiring: str) -> None:
    pt = _torch()

    def loader() -> Any:
        if wiring == "iterable":
            return pt.PackedDataLoader(pt.PackedIterableDataset(dataset_path, batch_size=3, decode=False, seed=2),
                                       batch_size=None)
        dataset = pt.PackedDataset(dataset_path, decode=False)
        if wiring == "sampler":
            return pt.PackedDataLoader(dataset, batch_size=3, sampler=pt.PackedSampler(dataset, seed=2),
                                       collate_fn=lambda samples: [label for _, label in samples])
        return pt.PackedDataLoader(dataset, batch_sampler=pt.PackedBatchSampler(dataset, batch_size=3, seed=2),
                                   collate_fn=lambda samples: [label for _, label in samples])

    def as_list(batch: Any) -> list[int]:
        return batch[1].tolist() if wiring == "iterable" else list(batch)

    first = loader()
    first.set_epoch(1)
    whole = [as_list(b) for b in first]
    it = iter(first)
    seen = [as_list(next(it)) for _ in range(2)]
    state = first.state_dict()
    assert pickle.loads(pickle.dumps(state)) == state
    assert json.loads(json.dumps(state)) == state, "a state dict holds plain JSON data only"
    second = loader()
    second.load_state_dict(pickle.loads(pickle.dumps(state)))
    rest = [as_list(b) for b in second]
    assert seen + rest == whole
