"""``packer inspect`` tells the truth about small datasets and names what it shows: nearest-rank
percentiles (the p95 of two shards is the larger), class names beside a field's class ids."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from helpers import FIELDS, make_field_source, write_images
from packer.cli import _register, cli
from packer.dataset import open_index
from packer.inspect.fields import percentile_stats
from packer.inspect.summary import format_summary, summarize
from packer.writer import BuildOptions, build

_register()


def test_percentiles_of_two_values_are_nearest_rank() -> None:
    stats = percentile_stats(np.array([10, 30]))
    assert (stats["min"], stats["p5"], stats["median"], stats["p95"], stats["max"]) == (10, 10, 10, 30, 30)
    ten = percentile_stats(np.arange(1, 11))
    assert (ten["p5"], ten["median"], ten["p95"]) == (1, 5, 10)


def test_p95_of_two_shards_is_the_larger(tmp_path: Path) -> None:
    write_images(tmp_path / "src", {"a": 6, "b": 5}, size=40)
    build(tmp_path / "src", tmp_path / "ds", BuildOptions(shard_size=32 << 10, shuffle=False, alignment=4096), workers=1,
          progress=False)
    summary = summarize(tmp_path / "ds")
    shards = summary["shards"]
    assert shards["count"] == 2
    assert shards["samples"]["min"] != shards["samples"]["max"]
    assert shards["samples"]["p95"] == shards["samples"]["max"]
    assert shards["bytes"]["p95"] == shards["bytes"]["max"]
    line = next(line for line in format_summary(summary).splitlines() if "shard size" in line)
    shown = re.search(r"max (\S+ \S+) \(p5 \S+ \S+, p95 (\S+ \S+)\)", line)
    assert shown is not None and shown.group(1) == shown.group(2), line


def test_sample_shows_class_names_beside_ids(tmp_path: Path) -> None:
    manifest = make_field_source(tmp_path / "src")
    build(manifest, tmp_path / "ds", BuildOptions(fields=FIELDS), workers=1, progress=False)
    with open_index(tmp_path / "ds") as index:
        number = next(i for i in range(len(index)) if len(index.field_value("tags", i)) == 2)
        ids = index.field_value("tags", number).tolist()
        classes = next(spec.classes for spec in index.fields if spec.name == "tags")
    result = CliRunner().invoke(cli, ["inspect", str(tmp_path / "ds"), "--sample", str(number)])
    assert result.exit_code == 0, result.output
    expected = ", ".join(f'"{classes[t]}"' for t in ids)
    assert f"tags       {ids} = [{expected}]" in result.output
