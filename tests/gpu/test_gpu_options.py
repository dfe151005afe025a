"""The GPU loaders' settings are checked by name on any machine (no GPU needed): devices, positive
integers, and an options object of the right type (issue 31's promise inventory)."""

from __future__ import annotations

import pytest

from packer.errors import OptionError


def test_a_device_that_is_neither_cuda_nor_cpu_is_refused() -> None:
    pytest.importorskip("torch")
    from packer.gpu import resolve_device

    with pytest.raises(OptionError) as caught:
        resolve_device("meta")
    assert caught.value.message == "device must be a CUDA device or 'cpu', got 'meta'"
    assert str(resolve_device("cpu")) == "cpu"


@pytest.mark.parametrize("name, value", [("read_block", 0), ("io_threads", True), ("block_bytes", 2.5)])
def test_sizes_and_thread_counts_must_be_positive_integers(name: str, value: object) -> None:
    from packer.gpu import GpuLoaderOptions

    with pytest.raises(OptionError) as caught:
        GpuLoaderOptions(**{name: value})
    assert caught.value.message == f"{name} must be a positive integer, got {value!r}"


def test_merge_refuses_options_of_another_type() -> None:
    from packer.gpu import GpuLoaderOptions

    with pytest.raises(OptionError) as caught:
        GpuLoaderOptions.merge({"io": "host"}, {})  # type: ignore[arg-type]
    assert caught.value.message == "options must be a GpuLoaderOptions, got dict"
    assert GpuLoaderOptions.merge(None, {"io_threads": 2}).io_threads == 2
