"""``packer.Writer`` and ``packer.pack`` to a dataset URL (issue 35): packed in the node cache and
uploaded through ``packer build``'s path, the manifest last; the loopback S3 server only."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import options_for

import packer
from packer.errors import OutputExistsError, PackerError


def jpeg(seed: int) -> bytes:
    out = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (16, 12, 3), dtype=np.uint8)).save(out, "JPEG")
    return out.getvalue()


def _samples(url: str, options) -> dict[str, tuple[bytes, str]]:  # noqa: ANN001
    with packer.open_dataset(url, remote=options) as ds:
        return {ds.key(i): (ds.read(i), ds.classes[int(ds.labels[i])]) for i in range(len(ds))}


def test_a_writer_to_a_url_uploads_the_dataset_manifest_last(s3, tmp_path: Path) -> None:
    url = f"s3://{s3.bucket}/written"
    options = options_for(s3, tmp_path / "cache")
    with packer.Writer(url, workers=1, shard_size=16 << 10, remote=options) as writer:
        for i in range(8):
            writer.write(jpeg(i), "ab"[i % 2])
    assert _samples(url, options_for(s3, tmp_path / "reader")) == {
        f"{i:09d}": (jpeg(i), "ab"[i % 2]) for i in range(8)}
    assert not any((tmp_path / "cache" / "uploads").rglob("*.spool"))  # the spools are gone
    with pytest.raises(OutputExistsError, match="overwrite=True"):
        packer.Writer(url, workers=1, remote=options).__enter__()
    with pytest.raises(ZeroDivisionError):  # a failed block uploads nothing: the old dataset stays
        with packer.Writer(url, workers=1, overwrite=True, remote=options) as writer:
            writer.write(jpeg(99), "a")
            1 / 0
    assert len(_samples(url, options_for(s3, tmp_path / "reader2"))) == 8


def test_pack_to_a_url(s3, tmp_path: Path) -> None:
    url = f"s3://{s3.bucket}/packed"
    options = options_for(s3, tmp_path / "cache")
    packer.pack(range(10), url, lambda i: (jpeg(i), "ab"[i % 3 % 2]), workers=2, remote=options)
    found = _samples(url, options_for(s3, tmp_path / "reader"))
    assert found == {f"{i:09d}": (jpeg(i), "ab"[i % 3 % 2]) for i in range(10)}
    with pytest.raises(PackerError, match="read-only"):
        packer.pack(range(2), "https://example.invalid/ds", lambda i: jpeg(i), workers=1)
