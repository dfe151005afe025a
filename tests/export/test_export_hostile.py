"""packer export against hostile names and destinations (issue 25, item 3): every example of the issue,
then the classes they stand for. Each either writes exactly what a build reads back, or is refused
with a typed error before anything is written (``UnsafeExportError``, exit 2), or, with
``--skip-unsafe``, skipped, counted per reason and listed."""

from __future__ import annotations

import io
import json
import os
import tarfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from packer import format as fmt
from packer.cli import _register, cli
from packer.dataset import open_dataset
from packer.errors import OptionError, OutputExistsError, UnsafeExportError
from packer.export import export
from packer.export import safewrite
from packer.export.safewrite import remove_entry
from packer.writer import build
from packer.writer.plan import BuildOptions
from helpers import rewrite_index

OPTIONS = BuildOptions(shard_size=16 << 10, seed=1)


def png(value: int, size: tuple[int, int] = (5, 4)) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.full((*size, 3), value, np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def tree(root: Path) -> dict[bytes, bytes]:
    base = os.fsencode(root)
    out = {}
    for folder, _, files in os.walk(base):
        for name in files:
            full = os.path.join(folder, name)
            with open(full, "rb") as handle:
                out[os.path.relpath(full, base)] = handle.read()
    return out


def manifest_dataset(root: Path, rows: list[dict[str, Any]], *, fields: tuple[str, ...] = (),
                     files: dict[str, bytes] | None = None) -> Path:
    """A dataset built from a JSONL manifest; ``files`` are written under ``root/src`` first (default:
    a distinct PNG for each row's path)."""
    source = root / "src"
    for number, (name, data) in enumerate((files or {row["path"]: png(10 * i) for i, row in enumerate(rows)}).items()):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)
    (source / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), "utf-8")
    build(source / "rows.jsonl", root / "ds", BuildOptions(shard_size=16 << 10, seed=1, fields=fields),
          workers=1, progress=False)
    return root / "ds"


def folder_dataset(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "src" / name).write_bytes(data)
    build(root / "src", root / "ds", OPTIONS, workers=1, progress=False)
    return root / "ds"


def by_key(path: Path) -> dict[str, tuple[bytes, str]]:
    with open_dataset(path) as ds:
        return {ds.key(i): (ds.read(i), ds.classes[ds.labels[i]] if ds.classes else str(ds.labels[i]))
                for i in range(len(ds))}


def run_cli(*args: str) -> Any:
    _register()
    return CliRunner().invoke(cli, ["export", *map(str, args)])


# --- the examples ------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["folder", "webdataset"])
def test_overwrite_never_follows_a_symlink_already_in_the_destination(tmp_path: Path, target: str) -> None:
    """OUT/cat -> an outside folder, OUT/.shard-000000.tar.partial (the old fixed temp name) -> an
    outside file: nothing outside OUT is written, ever. A destination holding links (what no export
    writes) is refused; OUT itself a link is replaced, not followed; a previous export is replaced
    as a whole."""
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1), "dog/0.png": png(2)})
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    (out / "cat").symlink_to(victim)
    (out / ".shard-000000.tar.partial").symlink_to(victim / "keep.txt")
    with pytest.raises(OutputExistsError, match="could not have written"):
        export(ds, out, to=target, overwrite=True)
    assert tree(victim) == {b"keep.txt": b"mine"}
    (out / "cat").unlink()
    (out / ".shard-000000.tar.partial").unlink()
    out.rmdir()
    out.symlink_to(victim, target_is_directory=True)
    export(ds, out, to=target, overwrite=True)
    assert not out.is_symlink() and tree(victim) == {b"keep.txt": b"mine"}
    export(ds, out, to=target, overwrite=True, classes=["dog"])  # a previous export: replaced as a whole
    names = sorted(tree(out))
    assert names == ([b"dog/0.png"] if target == "folder" else [b"shard-000000.tar"])
    assert sorted(os.listdir(tmp_path)) == ["ds", "out", "src", "victim"]  # no stage left beside OUT


def test_tar_overwrite_replaces_a_link_and_its_temp_name_is_not_predictable(tmp_path: Path) -> None:
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1)})
    victim = tmp_path / "victim.tar"
    victim.write_bytes(b"mine")
    (tmp_path / "all.tar").symlink_to(victim)
    (tmp_path / f".all.tar.{os.getpid()}.partial").symlink_to(victim)  # the old, pid-based temp name
    export(ds, tmp_path / "all.tar", to="tar", overwrite=True)
    assert victim.read_bytes() == b"mine"
    assert not (tmp_path / "all.tar").is_symlink()
    with tarfile.open(tmp_path / "all.tar") as archive:
        assert archive.getnames() == ["cat/0.png"]
    with pytest.raises(OutputExistsError, match="a tar export replaces a file only"):
        export(ds, tmp_path / "src", to="tar", overwrite=True)


def test_a_key_that_lands_on_another_samples_path_is_refused_not_lost(tmp_path: Path) -> None:
    """dog/x.png labelled cat goes to cat/dog/x.png, where cat/dog/x.png labelled cat already is."""
    ds = manifest_dataset(tmp_path, [{"path": "dog/x.png", "label": "cat"}, {"path": "cat/dog/x.png", "label": "cat"}],
                          files={"dog/x.png": png(1), "cat/dog/x.png": png(2)})
    with pytest.raises(UnsafeExportError, match="1 name-collision") as caught:
        export(ds, tmp_path / "out")
    assert caught.value.skipped == {"name-collision": 1} and caught.value.exit_code == 2
    assert not (tmp_path / "out").exists()
    result = export(ds, tmp_path / "out", skip_unsafe=True)
    assert (result.samples, result.skipped) == (1, {"name-collision": 1})
    assert len(tree(tmp_path / "out")) == 1  # one file, and the count says 1
    run = run_cli(ds, tmp_path / "out2", "--json")
    assert run.exit_code == 2 and "UnsafeExportError" in run.stdout and not (tmp_path / "out2").exists()
    run = run_cli(ds, tmp_path / "out3", "--json", "--skip-unsafe")
    assert run.exit_code == 0, run.output
    document = json.loads(run.stdout)
    assert document["samples"] == 1 and document["skipped"] == {"name-collision": 1}
    assert document["skipped_examples"][0]["reason"] == "name-collision"


@pytest.mark.parametrize("image, field", [("img/a.json", "caption=text"), ("img/b.mask.png", "mask=image")])
@pytest.mark.parametrize("target", ["folder", "tar", "webdataset"])
def test_an_image_named_like_its_own_side_file_is_refused(tmp_path: Path, image: str, field: str, target: str) -> None:
    files = {image: png(3), "img/c.png": png(4), "img/c.mask.png": png(5), "img/b.mask.mask.png": png(6)}
    row: dict[str, Any] = {"path": image, "label": "cat"}
    other: dict[str, Any] = {"path": "img/c.png", "label": "cat"}
    if field.startswith("caption"):
        row["caption"], other["caption"] = "x", "y"
    else:
        row["mask"], other["mask"] = "img/b.mask.mask.png", "img/c.mask.png"
    ds = manifest_dataset(tmp_path, [row, other], fields=(field,), files=files)
    out = tmp_path / ("out.tar" if target == "tar" else "out")
    with pytest.raises(UnsafeExportError) as caught:
        export(ds, out, to=target)
    assert sum(caught.value.skipped.values()) == 1 and not out.exists()
    result = export(ds, out, to=target, skip_unsafe=True)
    assert result.samples == 1 and result.skipped_unsafe == 1


@pytest.mark.parametrize("target", ["folder", "tar"])
def test_a_class_name_holding_nul_is_refused_not_a_crash_or_cut_short(tmp_path: Path, target: str) -> None:
    ds = manifest_dataset(tmp_path, [{"path": "a.png", "label": "ca\u0000t"}, {"path": "b.png", "label": "dog"}])
    out = tmp_path / ("out.tar" if target == "tar" else "out")
    with pytest.raises(UnsafeExportError, match="NUL"):
        export(ds, out, to=target)
    assert not out.exists()
    result = export(ds, out, to=target, skip_unsafe=True)
    assert (result.samples, result.skipped) == (1, {"unsafe-name": 1})
    if target == "tar":
        with tarfile.open(out) as archive:
            assert archive.getnames() == ["dog/b.png"]
    else:
        assert list(tree(out)) == [b"dog/b.png"]


def test_folder_to_webdataset_and_back_loses_nothing_silently(tmp_path: Path) -> None:
    """cat/a.1.png and cat/a.2.png share the WebDataset key cat/a (the name up to the first dot), which
    a WebDataset build takes for one sample: refused, or skipped and reported; cat/x.y.png alone, and
    every other name, comes back byte for byte."""
    files = {"cat/a.1.png": png(1), "cat/a.2.png": png(2), "cat/x.y.png": png(3), "dog/b.png": png(4)}
    ds = folder_dataset(tmp_path, files)
    with pytest.raises(UnsafeExportError, match="share the side-file key 'cat/a'"):
        export(ds, tmp_path / "wds", to="webdataset")
    result = export(ds, tmp_path / "wds", to="webdataset", skip_unsafe=True)
    assert (result.samples, result.skipped) == (3, {"name-collision": 1})
    build(tmp_path / "wds", tmp_path / "again", OPTIONS, workers=1, progress=False)
    original, again = by_key(ds), by_key(tmp_path / "again")
    assert set(again) == {"cat/a.1.png", "cat/x.y.png", "dog/b.png"}
    assert {k: v[0] for k, v in again.items()} == {k: original[k][0] for k in again}


def test_unknown_keys_are_refused_not_skipped(tmp_path: Path) -> None:
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1), "dog/0.png": png(2)})
    (tmp_path / "keys.txt").write_text("cat/0.png\r\ncat/9.png\nnope.png\n")
    with pytest.raises(OptionError, match=r"2 of the 3 keys listed .* are not in this dataset \(first: 'cat/9.png', "
                                          r"'nope.png'\)"):
        export(ds, tmp_path / "out", keys=tmp_path / "keys.txt")
    run = run_cli(ds, tmp_path / "out", "--keys", tmp_path / "keys.txt")
    assert run.exit_code == 2 and "not in this dataset" in run.output and not (tmp_path / "out").exists()
    (tmp_path / "keys.txt").write_text("cat/0.png\r\n")  # CRLF keys files are read too
    assert export(ds, tmp_path / "out", keys=tmp_path / "keys.txt").samples == 1


@pytest.mark.parametrize("special", ["/dev/zero", "fifo", "folder"])
def test_keys_file_is_read_bounded_and_regular_files_only(tmp_path: Path, special: str) -> None:
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1)})
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "fifo"
        os.mkfifo(path)
    elif special == "folder":
        path = tmp_path / "src"
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            export(ds, tmp_path / "out", keys=path)
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            outcome.append(exc)

    worker = threading.Thread(target=call, daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(20)
    assert not worker.is_alive(), "export --keys blocked or read without bound"
    assert time.monotonic() - started < 20
    assert len(outcome) == 1 and isinstance(outcome[0], OptionError) and "not a regular file" in str(outcome[0])


def test_text_fields_come_out_where_their_declaration_reads_them(tmp_path: Path) -> None:
    """A WebDataset with .txt captions built with --field caption=text@txt: the export writes .txt
    members (not a "caption" key in .json), so a rebuild with the same declaration takes every sample."""
    shard = tmp_path / "in.tar"
    with tarfile.open(shard, "w") as archive:
        for i in range(4):
            for suffix, data in (("png", png(9 * i)), ("cls", str(i % 2).encode()),
                                 ("txt", f"caption {i}\twith tab ✓".encode())):
                info = tarfile.TarInfo(f"{i:04d}.{suffix}")
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    declared = BuildOptions(shard_size=16 << 10, seed=1, fields=("caption=text@txt",))
    build(shard, tmp_path / "ds", declared, workers=1, progress=False, source_kind="webdataset")
    for target in ("folder", "webdataset"):
        export(tmp_path / "ds", tmp_path / target, to=target)
        again = tmp_path / f"again-{target}"
        result = build(tmp_path / target, again, declared, workers=1, progress=False,
                       source_kind="folder" if target == "folder" else "webdataset")
        assert result.sample_count == 4 and not result.rejected
        with open_dataset(tmp_path / "ds") as before, open_dataset(again) as after:
            captions = {before.key(i).rsplit("/", 1)[-1]: before.field_value("caption", i) for i in range(4)}
            assert {after.key(i).rsplit("/", 1)[-1]: after.field_value("caption", i) for i in range(4)} == captions


def test_a_float_field_holding_nan_is_never_written_as_invalid_json(tmp_path: Path) -> None:
    rows = [{"path": f"img/{i}.png", "label": "cat", "depth": [i, i + 0.5]} for i in range(3)]
    ds = manifest_dataset(tmp_path, rows, fields=("depth=float32[2]",))
    with open_dataset(ds) as opened:
        nan_key = opened.key(1)

    def poison(columns: dict[str, np.ndarray]) -> None:
        values = columns["f_depth"].view("<f4").copy()
        values[2] = np.nan
        columns["f_depth"] = values.view(np.uint8)

    rewrite_index(ds, poison)
    for target in ("folder", "webdataset"):
        with pytest.raises(UnsafeExportError, match="NaN"):
            export(ds, tmp_path / target, to=target)
        result = export(ds, tmp_path / target, to=target, skip_unsafe=True)
        assert result.skipped == {"unrepresentable": 1} and result.samples == 2
        assert result.skipped_examples[0][0] == nan_key
    for name, data in tree(tmp_path / "folder").items():
        if name.endswith(b".json"):
            json.loads(data, parse_constant=lambda c: pytest.fail(f"{name!r} holds {c}"))


# --- the classes behind them: every unsafe name, from a hostile index --------------------------------

def with_keys(folder: Path, keys: list[bytes], escaped: bool = False) -> None:
    """Give the samples of ``folder`` these keys (a hand-made index; the checksum is made to match)."""

    def change(columns: dict[str, np.ndarray]) -> None:
        blob = b"".join(keys)
        columns["keys"] = np.frombuffer(blob, dtype=np.uint8).copy()
        columns["key_offsets"] = np.concatenate([[0], np.cumsum([len(k) for k in keys])]).astype(np.uint64)
        if escaped:
            meta = [fmt.json_ready({"escaped_name": True}) for _ in keys]
            encoded = [json.dumps(m, separators=(",", ":")).encode() for m in meta]
            columns["meta"] = np.frombuffer(b"".join(encoded), dtype=np.uint8).copy()
            columns["meta_offsets"] = np.concatenate([[0], np.cumsum([len(e) for e in encoded])]).astype(np.uint64)

    rewrite_index(folder, change)


UNSAFE_KEYS = [
    (b"cat/../../escape.png", "'..' path component"),
    (b"cat/./x.png", "'.' path component"),
    (b"cat//x.png", "an empty path component"),
    (b"/etc/x.png", "an absolute path"),
    (b"cat/x\x00y.png", "a NUL byte"),
    (b"cat/.hidden.png", "hidden component"),
    (b"cat/" + b"n" * 252 + b".png", "a component of 256 bytes"),
    (b"cat/" + b"d/" * 2100 + b"x.png", "a path of"),
]


#: Plain parameter ids (scripts/mutate.py selects tests by node id: a key's bytes in an id, a NUL or a
#: truncated path, made three of them unselectable there).
UNSAFE_KEY_IDS = ["dotdot", "dot", "empty-component", "absolute", "nul", "hidden", "long-component", "long-path"]


@pytest.mark.parametrize("key, message", UNSAFE_KEYS, ids=UNSAFE_KEY_IDS)
@pytest.mark.parametrize("target", ["folder", "tar", "webdataset"])
def test_every_unsafe_key_is_refused_or_skipped_and_nothing_escapes(tmp_path: Path, key: bytes, message: str,
                                                                   target: str) -> None:
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1), "cat/1.png": png(2)})
    with open_dataset(ds) as opened:
        keys = [opened.key(i).encode() for i in range(len(opened))]
    keys[keys.index(b"cat/1.png")] = key
    with_keys(ds, keys)
    out = tmp_path / "deep" / ("out.tar" if target == "tar" else "out")
    with pytest.raises(UnsafeExportError, match=message.replace("(", r"\(").replace(")", r"\)")):
        export(ds, out, to=target)
    assert not out.exists()
    result = export(ds, out, to=target, skip_unsafe=True)
    assert (result.samples, result.skipped) == (1, {"unsafe-name": 1})
    assert sorted(os.listdir(tmp_path)) == ["deep", "ds", "src"] and sorted(os.listdir(out.parent)) == [out.name]


def test_an_escaped_key_is_checked_after_unescaping(tmp_path: Path) -> None:
    """%2F..%2F inside an escaped (non-UTF-8) key decodes to ../: checked on the bytes written."""
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1), "cat/1.png": png(2)})
    with open_dataset(ds) as opened:
        order = [opened.key(i) for i in range(len(opened))]
    with_keys(ds, [b"cat/caf%E9.png" if k == "cat/0.png" else b"cat/%2E%2E%2F%2E%2E%2Fx.png" for k in order],
              escaped=True)
    result = export(ds, tmp_path / "out", skip_unsafe=True)
    assert result.skipped == {"unsafe-name": 1}
    assert list(tree(tmp_path / "out")) == [b"cat/caf\xe9.png"]


@pytest.mark.parametrize("target, name", [("tar", "cat/a\\b.png"), ("webdataset", "cat/a\\b.png"),
                                          ("webdataset", "C:/x.png")])
def test_names_an_archive_reader_would_rewrite_are_refused_in_archives(tmp_path: Path, target: str, name: str) -> None:
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1), "cat/1.png": png(2)})
    with open_dataset(ds) as opened:
        keys = [name.encode() if opened.key(i) == "cat/1.png" else opened.key(i).encode() for i in range(2)]
    with_keys(ds, keys)
    result = export(ds, tmp_path / ("o.tar" if target == "tar" else "o"), to=target, skip_unsafe=True)
    assert result.skipped == {"unsafe-name": 1}
    if name == "cat/a\\b.png":  # a folder holds it, and a folder build reads it back
        assert export(ds, tmp_path / "folder").samples == 2
        build(tmp_path / "folder", tmp_path / "again", OPTIONS, workers=1, progress=False)
        assert "cat/a\\b.png" in by_key(tmp_path / "again")


@pytest.mark.parametrize("label", ["", ".", "..", "a/b", ".hidden", "x" * 256, "\udc80bad"])
def test_every_unsafe_class_name_is_refused_for_class_folders(tmp_path: Path, label: str) -> None:
    ds = manifest_dataset(tmp_path, [{"path": "a.png", "label": "ok"}, {"path": "b.png", "label": "ok"}])
    document = json.loads((ds / "manifest.json").read_text("utf-8"))
    document["classes"] = [label]
    (ds / "manifest.json").write_text(json.dumps(document), "utf-8")
    with pytest.raises(UnsafeExportError, match="class name"):
        export(ds, tmp_path / "out")
    assert export(ds, tmp_path / "wds", to="webdataset").samples == 2  # .cls holds the number: no folder needed


def test_a_drive_letter_class_is_refused_in_a_tar_only(tmp_path: Path) -> None:
    ds = manifest_dataset(tmp_path, [{"path": "a.png", "label": "C:"}, {"path": "b.png", "label": "d"}])
    with pytest.raises(UnsafeExportError, match="drive-letter"):
        export(ds, tmp_path / "out.tar", to="tar")
    assert export(ds, tmp_path / "out").samples == 2
    build(tmp_path / "out", tmp_path / "again", OPTIONS, workers=1, progress=False)
    assert sorted(folder for _, folder in by_key(tmp_path / "again").values()) == ["C:", "d"]


def test_an_unlabeled_folder_named_like_a_class_is_a_label_collision(tmp_path: Path) -> None:
    """1/a.png unlabeled keeps its folder 1; b.png labelled 1 goes to 1/b.png: a folder build would give
    both label 1, so the second of them (in dataset order) is a label collision."""
    rows = [{"path": "1/a.png", "caption": "a"}, {"path": "b.png", "label": 1, "caption": "b"},  # no label: -1
            {"path": "c.png", "label": 2, "caption": "c"}]
    ds = manifest_dataset(tmp_path, rows, fields=("caption=text",),
                          files={"1/a.png": png(1), "b.png": png(2), "c.png": png(3)})
    with open_dataset(ds) as opened:
        assert sorted(opened.labels.tolist()) == [-1, 1, 2]
    with pytest.raises(UnsafeExportError, match="already holds samples of label"):
        export(ds, tmp_path / "out")
    result = export(ds, tmp_path / "out", skip_unsafe=True)
    assert result.skipped == {"label-collision": 1} and result.samples == 2
    assert b"2/c.png" in tree(tmp_path / "out")


def test_overwrite_refuses_to_replace_what_an_export_never_writes(tmp_path: Path) -> None:
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1)})
    home = tmp_path / "home"
    (home / "docs").mkdir(parents=True)
    (home / ".bashrc").write_text("x")
    with pytest.raises(OutputExistsError, match="could not have written"):
        export(ds, home, overwrite=True)
    assert (home / ".bashrc").read_text() == "x"
    with pytest.raises(OptionError, match="is the dataset or holds it"):
        export(ds, tmp_path, overwrite=True)
    with pytest.raises(OptionError, match="inside the dataset folder"):
        export(ds, ds / "inside")
    with pytest.raises(OutputExistsError, match="pass --overwrite"):
        export(ds, home)
    (tmp_path / "empty").mkdir()
    assert export(ds, tmp_path / "empty").samples == 1  # an empty folder is taken without --overwrite


@pytest.mark.parametrize("target", ["tar", "folder"])
def test_overwrite_never_replaces_a_fifo_or_device(tmp_path: Path, target: str) -> None:
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1)})
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    with pytest.raises(OutputExistsError, match="device, FIFO or socket"):
        export(ds, fifo, to=target, overwrite=True)
    assert fifo.is_fifo()


def test_a_sample_whose_stored_caption_is_not_utf8_is_reported_not_a_crash(tmp_path: Path) -> None:
    rows = [{"path": f"img/{i}.png", "label": "cat", "caption": f"c{i}"} for i in range(3)]
    ds = manifest_dataset(tmp_path, rows, fields=("caption=text",))

    def damage(columns: dict[str, np.ndarray]) -> None:
        blob = columns["f_caption"].copy()
        blob[0] = 0xFF  # the first caption's first byte: no longer UTF-8
        columns["f_caption"] = blob

    rewrite_index(ds, damage)
    with pytest.raises(UnsafeExportError, match="a stored value cannot be read"):
        export(ds, tmp_path / "out")
    result = export(ds, tmp_path / "out", skip_unsafe=True)
    assert (result.samples, result.skipped) == (2, {"unrepresentable": 1})


def test_a_path_2000_folders_deep_is_written_and_replaced_without_recursion(tmp_path: Path) -> None:
    """Folders are made, and an old export removed, one level at a time (no recursion, no descriptor
    per level): a 2,000-level key (under the 4,095-byte path limit) exports and is replaced."""
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1), "cat/1.png": png(2)})
    deep = b"cat/" + b"d/" * 2000 + b"x.png"
    with open_dataset(ds) as opened:
        keys = [deep if opened.key(i) == "cat/1.png" else opened.key(i).encode() for i in range(2)]
    with_keys(ds, keys)
    try:
        assert export(ds, tmp_path / "out").samples == 2
        with open(os.path.join(os.fsencode(tmp_path / "out"), deep), "rb") as handle:
            assert handle.read() == png(2)
        assert export(ds, tmp_path / "out", overwrite=True, samples="0:2").samples == 2  # the old tree removed
        assert sorted(os.listdir(tmp_path)) == ["ds", "out", "src"]
    finally:  # pytest's own clean-up of old temp folders recurses (shutil.rmtree): leave no deep tree
        parent = os.open(tmp_path, os.O_RDONLY)
        try:
            remove_entry(parent, b"out")
        finally:
            os.close(parent)


def _nested_tree(root: Path) -> None:
    for folder in ("tree/a/b/c", "tree/a/d", "tree/e"):
        (root / folder).mkdir(parents=True, exist_ok=True)
    for name in ("tree/x", "tree/a/y", "tree/a/b/z", "tree/a/b/c/w", "tree/e/v"):
        (root / name).write_bytes(b"1")
    os.symlink(root / "outside", root / "tree/a/link")  # removed as a link, never followed


def test_remove_entry_skips_an_entry_another_process_removed_meanwhile(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Two exports cleaning the same leftover: an entry listed but gone by the time it is removed
    is skipped, and the rest of the folder is still removed."""
    _nested_tree(tmp_path)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "kept").write_bytes(b"2")
    listdir = os.listdir
    monkeypatch.setattr(os, "listdir", lambda fd: ["gone-meanwhile", *listdir(fd)])
    parent = os.open(tmp_path, os.O_RDONLY)
    try:
        remove_entry(parent, b"tree")
    finally:
        os.close(parent)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == ["outside"] and os.listdir(tmp_path / "outside") == ["kept"]


def test_remove_entry_works_in_a_process_whose_standard_input_is_closed(tmp_path: Path) -> None:
    """A daemon runs with descriptor 0 closed, so a folder opened while removing can be descriptor 0:
    it is a folder like any other (not taken for "no sub-folder" and left open)."""
    _nested_tree(tmp_path)
    parent = os.open(tmp_path, os.O_RDONLY)
    saved = os.dup(0)
    os.close(0)
    try:
        remove_entry(parent, b"tree")
        with pytest.raises(OSError):  # every folder it opened is closed again, descriptor 0 included
            os.fstat(0)
    finally:
        os.dup2(saved, 0)
        os.close(saved)
        os.close(parent)
    assert os.listdir(tmp_path) == []


# --- what changes under the writer between the plan and the last file ----------------------------------

def on_stage_created(monkeypatch: pytest.MonkeyPatch, out: Path, act: Callable[[Path], None]) -> None:
    """Run ``act(stage)`` once the safe writer has made OUT's stage, before its first file: what
    another process that found the stage (or edits the dataset) could do while the export writes."""

    def checkpoint(point: str) -> None:
        if point == "stage-created":
            prefix = "." + out.name + safewrite.STAGE_MARK.decode()
            (stage,) = [entry for entry in out.parent.iterdir() if entry.name.startswith(prefix)]
            act(stage)

    monkeypatch.setattr(safewrite, "checkpoint", checkpoint)


def plant_link(victim: Path) -> Callable[[Path], None]:
    return lambda stage: (stage / "cat").symlink_to(victim, target_is_directory=True)


def plant_file(stage: Path) -> None:
    (stage / "cat").write_bytes(b"planted")


def plant_image(stage: Path) -> None:
    (stage / "cat").mkdir()
    (stage / "cat" / "0.png").write_bytes(b"planted")


@pytest.mark.parametrize("plant, message", [
    ("link", "cannot create the folder 'cat' in the export: Not a directory (a file or link is in its place)"),
    ("file", "cannot create the folder 'cat' in the export: Not a directory (a file or link is in its place)"),
    ("image", "'cat/0.png' would be written twice (the file system treats two exported names as one, e.g. by case)"),
])
def test_what_is_planted_in_the_stage_is_never_followed_or_written_over(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch, plant: str,
                                                                       message: str) -> None:
    """A link or file where the export makes a folder, or a file where it writes one (what a file
    system that folds case makes of two names): every file is created O_EXCL and every folder
    opened O_NOFOLLOW in the stage, so the export stops naming the path, follows nothing, publishes
    nothing and leaves no stage."""
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1), "dog/0.png": png(2)})
    victim = tmp_path / "victim"
    victim.mkdir()
    out = tmp_path / "out"
    on_stage_created(monkeypatch, out, {"link": plant_link(victim), "file": plant_file, "image": plant_image}[plant])
    with pytest.raises(OptionError) as caught:
        export(ds, out)
    assert caught.value.message == message
    assert sorted(os.listdir(tmp_path)) == ["ds", "src", "victim"] and os.listdir(victim) == []


def test_an_index_edited_in_place_after_the_plan_stops_the_export(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer names each sample again and refuses one that no longer passes the plan's checks
    (its index rewritten in place, which the reader's mapping sees): the sample is named, nothing
    is published."""
    ds = folder_dataset(tmp_path, {"cat/0.png": png(1), "dog/0.png": png(2)})
    (index,) = ds.glob("index-*.pki")
    out = tmp_path / "out"

    def hide_dog(stage: Path) -> None:
        data = index.read_bytes()
        assert data.count(b"dog/0.png") == 1
        with open(index, "r+b") as handle:  # in place: the open dataset's mapping sees the new key
            handle.seek(data.index(b"dog/0.png"))
            handle.write(b".")

    on_stage_created(monkeypatch, out, hide_dog)
    with pytest.raises(OptionError) as caught:
        export(ds, out)
    assert caught.value.message == ("sample '.og/0.png' changed since the export was planned: its key: the hidden "
                                    "component '.og' (a build skips names starting with '.')")
    assert sorted(os.listdir(tmp_path)) == ["ds", "src"]


# --- publishing OUT, with renameat2 and without it (the fallback of older kernels and file systems) ---

def _contents(path: Path) -> dict[bytes, bytes] | bytes:
    return path.read_bytes() if path.is_file() else tree(path)


@pytest.fixture
def two_classes(tmp_path: Path) -> Path:
    return folder_dataset(tmp_path / "data", {"cat/0.png": png(1), "cat/1.png": png(2), "dog/2.png": png(3)})


def _expected(dataset: Path, root: Path, target: str, **options: Any) -> dict[bytes, bytes] | bytes:
    """What an export gives on its own (with this kernel's renameat2), to compare with."""
    out = root / f"expected-{len(list(root.iterdir()))}" / ("out.tar" if target == "tar" else "out")
    out.parent.mkdir()
    export(dataset, out, to=target, **options)
    return _contents(out)


@pytest.mark.parametrize("mode", ["renameat2", "fallback"])
@pytest.mark.parametrize("target", ["folder", "tar"])
def test_publishing_gives_the_same_out_with_or_without_renameat2(two_classes: Path, tmp_path: Path, target: str,
                                                                 mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new OUT, a new OUT with --overwrite, and an OUT replaced with --overwrite (a folder moved
    aside and removed, a file renamed over): the same bytes whether the kernel has renameat2 or the
    fallback renames run, and nothing left beside OUT (no stage, no moved-aside copy) or anywhere
    else (the working folder stays empty)."""
    all_samples = _expected(two_classes, tmp_path, target)
    cats = _expected(two_classes, tmp_path, target, classes=["cat"])
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    if mode == "fallback":
        monkeypatch.setattr(safewrite, "_renameat2", lambda *args: False)
    name = "out.tar" if target == "tar" else "out"
    for overwrite in (False, True):
        out = tmp_path / f"fresh-{overwrite}" / name
        out.parent.mkdir()
        export(two_classes, out, to=target, overwrite=overwrite)
        assert _contents(out) == all_samples and os.listdir(out.parent) == [name]
    export(two_classes, out, to=target, overwrite=True, classes=["cat"])
    assert _contents(out) == cats and os.listdir(out.parent) == [name]
    assert os.listdir(tmp_path / "cwd") == []


@pytest.mark.parametrize("mode", ["renameat2", "fallback"])
@pytest.mark.parametrize("target", ["folder", "tar"])
@pytest.mark.parametrize("theirs", ["file", "folder"])
def test_an_out_that_appears_before_publishing_is_refused_by_name_with_or_without_renameat2(
        two_classes: Path, tmp_path: Path, target: str, mode: str, theirs: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process writes OUT (a file, or a folder with something in it) after the check at the
    start: without --overwrite it is left as it is and the export is an OutputExistsError naming OUT,
    whichever way this kernel publishes; with --overwrite it is replaced."""
    out = tmp_path / "outs" / ("out.tar" if target == "tar" else "out")
    out.parent.mkdir()

    def someone_else(point: str) -> None:
        if point == "before-publish":
            if theirs == "file":
                out.write_bytes(b"theirs")
            else:
                (out / "theirs").mkdir(parents=True)

    if mode == "fallback":
        monkeypatch.setattr(safewrite, "_renameat2", lambda *args: False)
    monkeypatch.setattr(safewrite, "checkpoint", someone_else)
    with pytest.raises(OutputExistsError) as caught:
        export(two_classes, out, to=target)
    assert caught.value.message == ("the export target appeared while this export ran (another export wrote it); "
                                    "it was left as it is: pass --overwrite to replace it")
    assert caught.value.path == str(out)
    assert (out.read_bytes() == b"theirs") if theirs == "file" else os.listdir(out) == ["theirs"]
    assert os.listdir(out.parent) == [out.name]
    if (theirs == "file") != (target == "tar"):
        return  # --overwrite replaces a folder by a folder and a file by a file, not one by the other
    monkeypatch.setattr(safewrite, "checkpoint", lambda point: None)
    expected = _expected(two_classes, tmp_path, target)
    if theirs == "file":
        out.unlink()
    else:
        os.rmdir(out / "theirs")
        os.rmdir(out)
    monkeypatch.setattr(safewrite, "checkpoint", someone_else)
    export(two_classes, out, to=target, overwrite=True)
    assert _contents(out) == expected and os.listdir(out.parent) == [out.name]


@pytest.mark.parametrize("overwrite", [False, True])
def test_an_out_published_between_the_check_and_the_rename_is_never_replaced_unasked(
        two_classes: Path, tmp_path: Path, overwrite: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The narrowest race: OUT appears after publishing looked and before its no-replace rename.
    That rename fails (EEXIST): without --overwrite OUT is theirs and the export is refused by name;
    with --overwrite it is replaced as asked."""
    out = tmp_path / "outs" / "out"
    out.parent.mkdir()
    expected = _expected(two_classes, tmp_path, "folder")
    real = safewrite._renameat2

    def racing(dir_fd: int, source: bytes, target: bytes, flags: int) -> bool:
        if flags == safewrite._RENAME_NOREPLACE:
            (out / "theirs").mkdir(parents=True)
        return real(dir_fd, source, target, flags)

    monkeypatch.setattr(safewrite, "_renameat2", racing)
    if not overwrite:
        with pytest.raises(OutputExistsError, match="the export target appeared while this export ran"):
            export(two_classes, out)
        assert os.listdir(out) == ["theirs"]
    else:
        export(two_classes, out, overwrite=True)
        assert _contents(out) == expected
    assert os.listdir(out.parent) == ["out"]


def test_a_folder_that_holds_files_is_refused_before_anything_is_staged(tmp_path: Path) -> None:
    """Without --overwrite a non-empty folder is refused by the checks of opening, before a stage
    exists or a sample is read (the publish step would refuse it too, but only after the work);
    an empty folder is taken."""
    from packer.errors import OutputExistsError
    from packer.export.safewrite import StagedOutput

    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    staged = StagedOutput(out, folder=True, overwrite=False)
    with pytest.raises(OutputExistsError, match="the export target exists; pass --overwrite"):
        staged.preflight()
    with pytest.raises(OutputExistsError, match="the export target exists; pass --overwrite"):
        with StagedOutput(out, folder=True, overwrite=False):
            pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (out / "keep.txt").read_text() == "mine"
    (out / "keep.txt").unlink()
    StagedOutput(out, folder=True, overwrite=False).preflight()  # an empty folder may be exported into
