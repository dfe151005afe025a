"""Declared fields through a view and a mixture: every kind of field column (fixed and variable
arrays, class sets, text, image fields) is gathered through the selection or joined across streams."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers import FIELDS, make_field_source

import packer
from packer import errors
from packer.writer import BuildOptions, build


def _build(root: Path, name: str, fields=FIELDS, count: int = 8, rows=None) -> Path:
    manifest = make_field_source(root / f"{name}-src", count)
    if rows is not None:
        manifest.write_text("".join(json.dumps(r) + "\n" for r in rows(manifest)), "utf-8")
    build(manifest, root / name, BuildOptions(fields=fields, shard_size=600, shuffle=False, alignment=64),
          workers=1, progress=False)
    return root / name


def _values(ds, i: int) -> dict:
    out = {}
    for spec in ds.fields:
        value = ds.value(spec.name, i)
        out[spec.name] = value if isinstance(value, str) else np.asarray(value).tolist()
    return out


@pytest.fixture(scope="module")
def with_fields(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("view-fields"), "ds")


def test_a_view_gathers_every_kind_of_field(with_fields, tmp_path):
    (path,) = packer.view(with_fields, tmp_path / "v.pkview", where="caption != a photo number 2 ✓")
    with packer.open_dataset(with_fields) as base, packer.open_dataset(path) as view:
        rows = view.base_rows.tolist()
        assert len(rows) == 7 and 2 not in [int(base.key(i).split("/")[1].split(".")[0]) for i in rows]
        for k, i in enumerate(rows):
            assert _values(view, k) == _values(base, i)
            assert view.sample_info(k)["fields"] == base.sample_info(i)["fields"]
        assert np.array_equal(view.field_array("depth"), base.field_array("depth")[rows])
    with pytest.raises(errors.OptionError, match="--where: field 'depth' .* holds more than one value per sample"):
        packer.view(with_fields, tmp_path / "x.pkview", where="depth > 1")


def test_a_mixture_joins_the_fields_of_its_streams_and_refuses_what_it_cannot(with_fields, tmp_path):
    plain_fields = tuple(f for f in FIELDS if not f.startswith("mask="))
    one = _build(tmp_path, "one", plain_fields, 5)
    two = _build(tmp_path, "two", plain_fields, 7)
    mixture = packer.Mixture([one, two])
    with packer.open_dataset(one) as a, packer.open_dataset(two) as b:
        expected = [_values(a, i) for i in range(len(a))] + [_values(b, i) for i in range(len(b))]
    got = [_values(mixture, i) for i in range(len(mixture))]
    assert [{k: v for k, v in g.items() if k != "stream"} for g in got] == expected
    assert [g["stream"] for g in got] == [0] * 5 + [1] * 7
    with pytest.raises(errors.OptionError, match="not supported yet"):
        packer.Mixture([with_fields, with_fields])
    with pytest.raises(errors.OptionError, match="must declare the same fields"):
        packer.Mixture([one, with_fields])
    named = _build(tmp_path, "named", ("stream=int64",), 3,
                   rows=lambda m: [{**json.loads(line), "stream": 1} for line in m.read_text("utf-8").splitlines()])
    with pytest.raises(errors.OptionError, match="the streams declare a field 'stream'"):
        packer.Mixture([named])
