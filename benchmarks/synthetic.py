"""Datasets written straight in the packer format, for benchmarks that need a million samples in seconds.

``make_synthetic_dataset`` writes ``num_samples`` copies of one payload (``tiny_jpeg``: an 8x8
real JPEG of about 350 bytes) as shards and an index committed by packer's own commit step, with
keys like ``class_042/img_0001234.jpg`` (``sample_key``). ``bench_memory.py`` measures worker
memory on it; ``bench_peers.py`` measures open time and batched reads.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np

__all__ = ["CLASSES", "tiny_jpeg", "sample_key", "make_synthetic_dataset"]

CLASSES = 1000


def tiny_jpeg(size: int = 8, seed: int = 0) -> bytes:
    """A small real RGB JPEG (``size`` x ``size``), deterministic."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(
        buffer, "JPEG", quality=75, optimize=True)
    return buffer.getvalue()


def sample_key(i: int, label: int) -> str:
    return f"class_{label:03d}/img_{i:07d}.jpg"


def make_synthetic_dataset(out: Path, num_samples: int, payload: bytes, *, alignment: int = 1,
                           samples_per_shard: int = 125_000, classes: int = CLASSES) -> Path:
    """Write a dataset of ``num_samples`` copies of ``payload`` straight in the packer format.

    No source folder and no per-file build: shard files are written from a tiled buffer and the
    index is committed with ``packer.writer.commit.commit_dataset`` (which validates it). Labels are
    ``i % classes``. A complete dataset already at ``out`` with the same count is reused.

    Returns:
        ``out``.
    """
    from packer import format as fmt
    from packer.writer.commit import commit_dataset
    from packer.writer.staging import STAGING_DIR
    from packer._internal.imageinfo import probe_image

    out = Path(out)
    manifest = out / fmt.MANIFEST_NAME
    if manifest.exists():
        try:
            if json.loads(manifest.read_bytes())["sample_count"] == num_samples:
                return out
        except (ValueError, KeyError):
            pass
    (out / STAGING_DIR).mkdir(parents=True, exist_ok=True)
    (out / fmt.SHARD_DIR).mkdir(parents=True, exist_ok=True)
    info = probe_image(payload)
    size = len(payload)
    stride = fmt.align_up(size, alignment)
    data_offset = fmt.shard_data_offset(alignment)
    row = np.zeros(stride, dtype=np.uint8)
    row[:size] = np.frombuffer(payload, dtype=np.uint8)
    shards, offsets = [], []
    for number, first in enumerate(range(0, num_samples, samples_per_shard)):
        count = min(samples_per_shard, num_samples - first)
        header = fmt.ShardHeader(alignment=alignment, sample_count=count, file_size=data_offset + count * stride,
                                 shard_number=number)
        body = np.tile(row, count)
        hasher = fmt.Hasher()
        hasher.update(header.encode())
        hasher.update(body)
        digest = hasher.intdigest()
        relative = fmt.shard_file_name(number, digest)
        with open(out / relative, "wb") as handle:
            handle.write(header.encode())
            handle.write(memoryview(body))
            handle.flush()
            os.fsync(handle.fileno())  # written back now: dirty page cache would show in smaps
        shards.append(fmt.ShardEntry(path=relative, size=header.file_size, checksum=digest, sample_count=count))
        offsets.append(data_offset + np.arange(count, dtype=np.uint64) * np.uint64(stride))
    labels = np.arange(num_samples, dtype=np.int64) % classes
    keys = "".join(sample_key(i, label) for i, label in enumerate(labels.tolist())).encode()
    key_lengths = np.array([len(sample_key(i, 0)) for i in range(num_samples)], dtype=np.uint64)
    key_offsets = np.zeros(num_samples + 1, dtype=np.uint64)
    np.cumsum(key_lengths, out=key_offsets[1:])
    counts = [s.sample_count for s in shards]
    columns = {
        "shard": np.repeat(np.arange(len(shards), dtype=np.uint32), counts),
        "offset": np.concatenate(offsets),
        "size": np.full(num_samples, size, dtype=np.uint64),
        "checksum": np.full(num_samples, fmt.checksum(payload), dtype=np.uint64),
        "label": labels,
        "width": np.full(num_samples, info.width, dtype=np.uint32),
        "height": np.full(num_samples, info.height, dtype=np.uint32),
        "channels": np.full(num_samples, info.channels, dtype=np.uint8),
        "image_format": np.full(num_samples, info.image_format, dtype=np.uint8),
        "key_offsets": key_offsets,
        "keys": np.frombuffer(keys, dtype=np.uint8),
        "meta_offsets": np.zeros(num_samples + 1, dtype=np.uint64),
        "meta": np.zeros(0, dtype=np.uint8),
    }
    commit_dataset(out, columns, shards, classes=[f"class_{c:03d}" for c in range(classes)],
                   codec={"name": "passthrough"}, alignment=alignment,
                   build_info={"synthetic": True, "packed": num_samples}, rejected=[], history=[])
    return out
