"""Where each declared field goes when a dataset is exported (``export/plan.py``'s side-file rule,
issue 41's mutmut round): every kind of ``--field`` source written as the member a build reads it
from, with exactly the bytes that build reads back; captions a text member would change go into
the ``.json``; a WebDataset sample's own ``.json`` metadata kept beside the field values; a field
that reads the whole ``.json``; and the refusals that name why a sample cannot go out."""

from __future__ import annotations

import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer.dataset import open_dataset
from packer.errors import UnsafeExportError
from packer.export import export
from packer.export.plan import TARGETS, Entry, SampleNamer
from packer.sources.sidefiles import MAX_SIDE_MEMBER_BYTES
from packer import BuildSettings, LabelSettings, LayoutSettings, RunOptions, SourceSettings, build_dataset

from helpers import rewrite_index

RUN = RunOptions(workers=1, progress=False)


def settings(fields: tuple[str, ...], kind: str = "auto") -> BuildSettings:
    return BuildSettings(source=SourceSettings(kind=kind), layout=LayoutSettings(shard_size=16 << 10, seed=1),
                         labels=LabelSettings(fields=fields))


def image(value: int, kind: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((4, 5, 3), value, np.uint8)).save(buffer, format=kind)
    return buffer.getvalue()


def tree(root: Path) -> dict[str, bytes]:
    return {path.relative_to(root).as_posix(): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def strict_json(value: Any) -> bytes:
    """What a side file's JSON is: sorted keys, UTF-8 as written (not ``\\u`` escapes), no NaN."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, allow_nan=False).encode("utf-8")


def manifest_build(root: Path, rows: list[dict[str, Any]], files: dict[str, bytes], fields: tuple[str, ...]) -> Path:
    source = root / "src"
    for name, data in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    (source / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), "utf-8")
    result = build_dataset(source / "rows.jsonl", root / "ds", settings(fields), RUN)
    assert result.sample_count == len(rows) and not result.rejected
    return root / "ds"


def wds_shard(path: Path, samples: list[list[tuple[str, bytes]]]) -> Path:
    with tarfile.open(path, "w") as archive:
        for members in samples:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return path


#: One field of every kind of source, in an order that is not sorted: an image field whose source has
#: no image extension (stored JPEG: ``.depth.jpg``), one whose source has (``.mask.png``), numeric classes, a member ending in ``.json``, a
#: number read from a ``.txt`` member (as JSON text), captions from ``.txt``, texts in the ``.json``.
FIELDS = ("zeta=text", "depth=image@depth", "mask=image@mask.png", "tags=classes(80)", "boxes=float32[N,4]@boxes.json",
          "score=float32@score.txt", "caption=text@txt", "alpha=text")
#: Captions: a plain one goes out as the .txt member; one that a build would change when it reads a
#: text member (line ends stripped, a leading BOM dropped) goes into the .json under its source; an
#: empty one is an empty .txt member.
CAPTIONS = ["plain caption ✓", "ends in a new line\n", "ends in a return\r", "\ufeffstarts with a BOM", ""]


@pytest.fixture(scope="module")
def every_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("side-files")
    files, rows = {}, []
    for i, caption in enumerate(CAPTIONS):
        files[f"img/{i}.png"] = image(10 * i)
        files[f"img/{i}.d.jpg"] = image(30 * i, "JPEG")
        files[f"img/{i}.m.png"] = image(20 * i)
        rows.append({"path": f"img/{i}.png", "label": "cat", "zeta": "z", "alpha": "dög ✓", "depth": f"img/{i}.d.jpg", "mask.png": f"img/{i}.m.png",
                     "tags": [i, 5], "boxes.json": [[i, 1.5, 2, 3]] * (i % 2), "score.txt": i + 0.5, "txt": caption})
    return manifest_build(root, rows, files, FIELDS)


def number(key: str) -> int:
    """``3`` for the key ``img/3.png``."""
    return int(key.split("/")[1].split(".")[0])


def expected_side_files(i: int, prefix: str, stored_depth: bytes, stored_mask: bytes) -> dict[str, bytes]:
    caption = CAPTIONS[i]
    document: dict[str, Any] = {"zeta": "z", "alpha": "dög ✓", "tags": [i, 5]}
    files = {f"{prefix}{i}.depth.jpg": stored_depth, f"{prefix}{i}.mask.png": stored_mask,
             f"{prefix}{i}.boxes.json": strict_json([[float(i), 1.5, 2.0, 3.0]] * (i % 2)),
             f"{prefix}{i}.score.txt": strict_json(i + 0.5)}
    if caption.endswith(("\n", "\r")) or caption.startswith("\ufeff"):
        document["txt"] = caption
    else:
        files[f"{prefix}{i}.txt"] = caption.encode("utf-8")
    files[f"{prefix}{i}.json"] = strict_json(document)
    return files


@pytest.mark.parametrize("target", ["folder", "webdataset"])
def test_every_field_goes_to_the_member_its_declaration_reads(every_source: Path, tmp_path: Path, target: str) -> None:
    out = tmp_path / "out"
    result = export(every_source, out, to=target)
    assert (result.samples, result.skipped) == (len(CAPTIONS), {})
    if target == "folder":
        written, prefix = tree(out), "cat/img/"
    else:
        written = {}
        for shard in sorted(out.glob("*.tar")):
            with tarfile.open(shard) as archive:
                written.update({m.name: archive.extractfile(m).read() for m in archive.getmembers()})
        prefix = "img/"
    with open_dataset(every_source) as ds:
        expected = {}
        for row in range(len(ds)):
            i = number(ds.key(row))
            expected[f"{prefix}{i}.png"] = ds.read(row)
            expected.update(expected_side_files(i, prefix, bytes(ds.field_bytes("depth", row)),
                                                bytes(ds.field_bytes("mask", row))))
            if target == "webdataset":
                expected[f"{prefix}{i}.cls"] = b"0"
    assert written == expected


def test_an_export_of_every_source_kind_builds_back_to_the_same_values(every_source: Path, tmp_path: Path) -> None:
    export(every_source, tmp_path / "out")
    again = tmp_path / "again"
    result = build_dataset(tmp_path / "out", again, settings(FIELDS), RUN)
    assert result.sample_count == len(CAPTIONS) and not result.rejected
    with open_dataset(every_source) as before, open_dataset(again) as after:
        index = {after.key(j): j for j in range(len(after))}
        for i in range(len(before)):
            j = index["cat/" + before.key(i)]
            assert after.field_value("caption", j) == before.field_value("caption", i) == CAPTIONS[number(before.key(i))]
            for name in ("zeta", "alpha"):
                assert after.field_value(name, j) == before.field_value(name, i)
            for name in ("tags", "boxes", "score"):
                assert after.field_value(name, j).tolist() == before.field_value(name, i).tolist()
            for name in ("depth", "mask"):
                assert bytes(after.field_bytes(name, j)) == bytes(before.field_bytes(name, i))


def test_a_field_that_reads_the_whole_json_is_that_member(tmp_path: Path) -> None:
    """``boxes=...@json``: the ``.json`` member is the value itself, an empty list included; a
    sample without a ``.json`` value writes no ``.json``."""
    files = {f"img/{i}.png": image(10 * i) for i in range(3)}
    rows = [{"path": f"img/{i}.png", "label": "cat", "json": [[i, 1, 2, 3]] * i} for i in range(3)]
    ds = manifest_build(tmp_path / "whole", rows, files, ("boxes=float32[N,4]@json",))
    export(ds, tmp_path / "out")
    assert {name: data for name, data in tree(tmp_path / "out").items() if not name.endswith(".png")} == {
        f"cat/img/{i}.json": strict_json([[float(i), 1.0, 2.0, 3.0]] * i) for i in range(3)}
    captions = manifest_build(tmp_path / "captions", [{**row, "txt": f"c{i}"} for i, row in enumerate(rows)], files,
                              ("caption=text@txt",))
    export(captions, tmp_path / "captions-out")
    assert sorted(tree(tmp_path / "captions-out")) == sorted(
        name for i in range(3) for name in (f"cat/img/{i}.png", f"cat/img/{i}.txt"))


def test_a_whole_json_field_beside_values_that_go_into_the_json_is_refused_by_name(tmp_path: Path) -> None:
    files = {f"img/{i}.png": image(10 * i) for i in range(2)}
    rows = [{"path": f"img/{i}.png", "label": "cat", "json": [[i, 1, 2, 3]], "tags": [i]} for i in range(2)]
    ds = manifest_build(tmp_path, rows, files, ("boxes=float32[N,4]@json", "tags=classes(8)"))
    with pytest.raises(UnsafeExportError) as caught:
        export(ds, tmp_path / "out")
    assert caught.value.skipped == {"unrepresentable": 2}
    assert caught.value.examples[0] == ("img/0.png", "unrepresentable",
                                        "a field reads the whole .json member while other values go into it")
    assert not (tmp_path / "out").exists()


def wds_with_metadata(root: Path) -> Path:
    """A WebDataset whose ``.json`` holds a declared field and metadata of its own."""
    samples = [[(f"{i:04d}.png", image(9 * i)), (f"{i:04d}.cls", str(i % 2).encode()),
                (f"{i:04d}.json", json.dumps({"zz": i, "boxes": [[i, 1, 2, 3]], "extra": 7, "aa": "ü"}).encode())]
               for i in range(3)]
    shard = wds_shard(root / "in.tar", samples)
    build_dataset(shard, root / "ds", settings(("boxes=float32[N,4]",), "webdataset"), RUN)
    return root / "ds"


def test_a_webdataset_sample_keeps_its_own_json_metadata_beside_the_field_values(tmp_path: Path) -> None:
    ds = wds_with_metadata(tmp_path)
    export(ds, tmp_path / "out", to="webdataset")
    (shard,) = sorted((tmp_path / "out").glob("*.tar"))
    with tarfile.open(shard) as archive:
        documents = {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.name.endswith(".json")}
    assert documents == {f"{i:04d}.json": strict_json({"aa": "ü", "boxes": [[float(i), 1.0, 2.0, 3.0]], "extra": 7,
                                                       "zz": i}) for i in range(3)}


def test_json_metadata_holding_nan_is_refused_with_what_holds_it(tmp_path: Path) -> None:
    """A hand-edited index whose stored ``.json`` metadata holds NaN: strict JSON cannot hold it, and
    the refusal says that the metadata is what holds it (not a field)."""
    ds = wds_with_metadata(tmp_path)

    def poison(columns: dict[str, np.ndarray]) -> None:
        offsets = columns["meta_offsets"]
        blob = bytes(columns["meta"])
        parts = [blob[int(a):int(b)].replace(b'"extra":7', b'"extra":NaN') for a, b in zip(offsets[:-1], offsets[1:])]
        columns["meta"] = np.frombuffer(b"".join(parts), dtype=np.uint8).copy()
        columns["meta_offsets"] = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.uint64)

    rewrite_index(ds, poison)
    with pytest.raises(UnsafeExportError) as caught:
        export(ds, tmp_path / "out", to="webdataset")
    assert caught.value.skipped == {"unrepresentable": 3}
    assert caught.value.examples[0] == ("0000.png", "unrepresentable",
                                        "its .json metadata holds NaN or an infinity, which strict JSON cannot hold")


def test_a_float_field_holding_nan_is_refused_naming_the_field(tmp_path: Path) -> None:
    files = {f"img/{i}.png": image(10 * i) for i in range(2)}
    rows = [{"path": f"img/{i}.png", "label": "cat", "depth": [i, 0.5]} for i in range(2)]
    ds = manifest_build(tmp_path, rows, files, ("depth=float32[2]",))

    def poison(columns: dict[str, np.ndarray]) -> None:
        values = columns["f_depth"].view("<f4").copy()
        values[0] = np.inf
        columns["f_depth"] = values.view(np.uint8)

    rewrite_index(ds, poison)
    for target in ("folder", "tar", "webdataset"):
        with pytest.raises(UnsafeExportError) as caught:
            export(ds, tmp_path / f"out-{target}", to=target)
        assert caught.value.examples == [("img/0.png", "unrepresentable",
                                          "field 'depth' holds NaN or an infinity, which JSON (what a build reads "
                                          "side files as) cannot hold")]


def test_an_image_field_in_a_format_without_an_image_extension_is_refused_with_the_builds_reason(
        tmp_path: Path) -> None:
    """A PCX mask has no extension a build takes for an image (``.pcx`` is not one): a build of the
    export would reject the sample, and the refusal quotes the build's reason and message."""
    files = {"img/0.png": image(10), "img/0.m.pcx": image(40, "PCX")}
    ds = manifest_build(tmp_path, [{"path": "img/0.png", "label": "cat", "mask": "img/0.m.pcx"}], files,
                        ("mask=image@mask",))
    with pytest.raises(UnsafeExportError) as caught:
        export(ds, tmp_path / "out")
    assert caught.value.examples == [("img/0.png", "unrepresentable",
                                      "a build would reject it (bad-field: field 'mask': the sample has no member "
                                      "cat/img/0.mask.<image extension>)")]
    # the naming rule: a format without a usual extension is named by its format name, a code this
    # version does not know (a newer writer's, or a damaged index) as "unknown"
    with open_dataset(ds) as opened:
        assert [e.name for e in SampleNamer(opened, TARGETS["folder"]).entries(0).entries] == [
            b"cat/img/0.png", b"cat/img/0.mask.pcx"]
    rewrite_index(ds, lambda columns: columns.update(f_mask__format=np.array([200], dtype=np.uint8)))
    with open_dataset(ds) as opened:
        assert [e.name for e in SampleNamer(opened, TARGETS["tar"]).entries(0).entries] == [
            b"cat/img/0.png", b"cat/img/0.mask.unknown"]


def test_a_side_file_over_what_a_build_reads_is_caught_at_the_limit(tmp_path: Path) -> None:
    """A build reads a side file a value field takes up to ``MAX_SIDE_MEMBER_BYTES`` (several values
    of a sample's ``.json`` together can pass it): a member of exactly that size is read (and here
    gives another value), one byte more is a rejection naming its size."""
    files = {"img/0.png": image(1)}
    ds = manifest_build(tmp_path, [{"path": "img/0.png", "label": "cat", "a": "short"}], files, ("a=text",))
    with open_dataset(ds) as opened:
        namer = SampleNamer(opened, TARGETS["folder"])
        for size, problem in ((MAX_SIDE_MEMBER_BYTES, "a build would read field 'a' back as another value"),
                              (MAX_SIDE_MEMBER_BYTES + 1,
                               f"a build would reject it (bad-field: field 'a': cat/img/0.json is "
                               f"{MAX_SIDE_MEMBER_BYTES + 1} bytes, over the {MAX_SIDE_MEMBER_BYTES} bytes read from "
                               f"a side file)")):
            document = b'{"a": "' + b"x" * (size - 9) + b'"}'
            assert len(document) == size
            sample = namer.entries(0)
            sample.entries[1] = Entry(b"cat/img/0.json", document)
            assert namer.read_back_problem(sample) == problem


def test_two_fields_whose_sources_differ_only_in_case_are_refused_naming_the_member_a_build_drops(
        tmp_path: Path) -> None:
    """A build takes one member per suffix, whatever its case: of ``0.Note.json`` and ``0.note.json``
    it would drop the second (``duplicate-entry``), so the sample cannot go out as it is."""
    files = {"img/0.png": image(1)}
    rows = [{"path": "img/0.png", "label": "cat", "Note.json": [1], "note.json": [2]}]
    ds = manifest_build(tmp_path, rows, files, ("a=int32[1]@Note.json", "b=int32[1]@note.json"))
    with pytest.raises(UnsafeExportError) as caught:
        export(ds, tmp_path / "out")
    assert caught.value.examples == [("img/0.png", "unrepresentable",
                                      "a build would not use 'cat/img/0.note.json' (duplicate-entry)")]
