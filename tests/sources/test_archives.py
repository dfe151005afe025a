"""Archive sources: tar (plain, compressed), tar of tars, zip, WebDataset; hostile members; determinism, parts, resume."""

from __future__ import annotations

import io
import json
import os
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.writer import build
from packer.sources import tar_stream
from packer.sources import SourceOptions, list_source
from packer.sources.detect import expand_braces
from packer.sources.sniff import sniff_container
from packer.writer.run import finish
from packer.dataset import open_dataset
from packer.errors import EmptySourceError, SourceError
from packer._internal.names import ESCAPED_FIELD, unescape_key
from packer import BuildSettings, LayoutSettings, RunOptions
from helpers import with_source

OPTIONS = BuildSettings(layout=LayoutSettings(shard_size=12 << 10, seed=3))


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (10 + seed % 4, 12, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=80)
    return out.getvalue()


FILES = {f"{c}/{i:03d}.jpg": jpeg(n * 10 + i) for n, c in enumerate(("cat", "dog", "emu")) for i in range(6)}


def add(archive: tarfile.TarFile, name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE,
        link: str = "") -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
    archive.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)


def write_tar(path: Path, files: dict[str, bytes], mode: str = "w") -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as archive:
        for name, data in files.items():
            add(archive, name, data)
    return path


def packed(out: Path) -> dict[str, tuple[bytes, str]]:
    with open_dataset(out, verify_checksums=True) as ds:
        return {ds.key(i): (ds.read(i), ds.classes[int(ds.labels[i])] if ds.classes else str(int(ds.labels[i])))
                for i in range(len(ds))}


def dataset_files(path: Path) -> dict[str, bytes]:
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and p.name != ".packer.lock"}


EXPECTED = {key: (data, key.split("/")[0]) for key, data in FILES.items()}


@pytest.mark.parametrize("mode, suffix", [("w", "tar"), ("w:gz", "tar.gz"), ("w:bz2", "tar.bz2"), ("w:xz", "tar.xz")])
def test_tar_of_class_folders(tmp_path: Path, mode: str, suffix: str) -> None:
    source = write_tar(tmp_path / f"data.{suffix}.bin", FILES, mode)  # the name says nothing: the bytes do
    assert sniff_container(source) == ("tar" if mode == "w" else f"tar.{suffix[4:]}")
    result = build(source, tmp_path / "ds", OPTIONS, RunOptions(workers=2))
    assert result.sample_count == len(FILES) and not result.rejected
    assert packed(tmp_path / "ds") == EXPECTED
    assert not (tmp_path / "ds" / ".packer-build").exists()  # the spool went with the staging folder


def test_tar_of_tars_is_one_class_per_inner_tar(tmp_path: Path) -> None:
    inner = {}
    for cls in ("cat", "dog", "emu"):
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            for key, data in FILES.items():
                if key.startswith(cls + "/"):
                    add(archive, key.split("/")[1], data)
        inner[f"{cls}.tar"] = buffer.getvalue()
    for mode in ("w", "w:gz"):
        source = write_tar(tmp_path / f"train-{mode[-2:]}.tar", inner, mode)
        build(source, tmp_path / f"ds{mode}", OPTIONS, RunOptions(workers=2))
        assert packed(tmp_path / f"ds{mode}") == EXPECTED


def test_zip(tmp_path: Path) -> None:
    source = tmp_path / "data.zip"
    with zipfile.ZipFile(source, "w") as archive:
        for n, (key, data) in enumerate(FILES.items()):
            archive.writestr(key, data, compress_type=(zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED,
                                                       zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)[n % 4])
    build(source, tmp_path / "ds", OPTIONS, RunOptions(workers=2))
    assert packed(tmp_path / "ds") == EXPECTED


def test_zip_damage_and_bombs_are_member_rejections(tmp_path: Path) -> None:
    source = tmp_path / "data.zip"
    with zipfile.ZipFile(source, "w") as archive:
        archive.writestr("cat/good.jpg", FILES["cat/000.jpg"])
        archive.writestr("cat/damaged.jpg", FILES["cat/001.jpg"])
        archive.writestr("cat/bomb.bin", bytes(4 << 20), compress_type=zipfile.ZIP_DEFLATED)
        archive.writestr("../escape.jpg", FILES["cat/002.jpg"])
        link = zipfile.ZipInfo("cat/link.jpg")
        link.external_attr = 0o120777 << 16
        archive.writestr(link, "good.jpg")
    data = bytearray(source.read_bytes())
    where = data.find(FILES["cat/001.jpg"][-60:-40])
    data[where] ^= 0xFF  # same size, wrong CRC
    source.write_bytes(bytes(data))
    result = build(source, tmp_path / "ds", OPTIONS, RunOptions(workers=1))
    reasons = {r.key: r.reason for r in result.rejected}
    assert reasons == {"cat/damaged.jpg": "unreadable", "cat/bomb.bin": "decompression-bomb",
                       "../escape.jpg": "outside-root", "cat/link.jpg": "not-a-file"}
    assert list(packed(tmp_path / "ds")) == ["cat/good.jpg"]


def test_hostile_tar_members_are_accounted_for(tmp_path: Path) -> None:
    source = tmp_path / "hostile.tar"
    with tarfile.open(source, "w", format=tarfile.GNU_FORMAT) as archive:
        add(archive, "cat/ok.jpg", FILES["cat/000.jpg"])
        add(archive, "cat", kind=tarfile.DIRTYPE)
        add(archive, "../up.jpg", FILES["cat/001.jpg"])
        add(archive, "/etc/abs.jpg", FILES["cat/001.jpg"])
        add(archive, "cat/sym.jpg", kind=tarfile.SYMTYPE, link="/etc/passwd")
        add(archive, "cat/hard.jpg", kind=tarfile.LNKTYPE, link="cat/ok.jpg")
        add(archive, "cat/fifo", kind=tarfile.FIFOTYPE)
        add(archive, "cat/.DS_Store", b"\0\0\0\1Bud1")
        add(archive, "cat/ok.jpg", FILES["cat/000.jpg"])  # the same bytes again: a duplicate
        add(archive, "cat/big.jpg", bytes(5000))
        add(archive, "top.jpg", FILES["cat/002.jpg"])
        add(archive, "cat/text.jpg", b"not an image at all")
        info = tarfile.TarInfo("cat/caf\udce9.jpg")  # a Latin-1 name: not UTF-8
        data = FILES["cat/003.jpg"]
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    listing = list_source(source, SourceOptions(max_member_size=4096))
    assert {r.key: r.reason for r in listing.rejected} == {
        "../up.jpg": "outside-root", "/etc/abs.jpg": "outside-root", "cat/sym.jpg": "not-a-file",
        "cat/hard.jpg": "not-a-file", "cat/fifo": "not-a-file", "cat/.DS_Store": "hidden-file",
        "cat/ok.jpg": "duplicate-entry", "cat/big.jpg": "oversize-member", "top.jpg": "not-in-class-folder"}
    result = build(source, tmp_path / "ds", OPTIONS, RunOptions(workers=1))
    assert {r.key: r.reason for r in result.rejected}["cat/text.jpg"] == "not-an-image"
    with open_dataset(tmp_path / "ds") as ds:
        keys = {ds.key(i): i for i in range(len(ds))}
        assert ds.read(keys["cat/ok.jpg"]) == FILES["cat/000.jpg"]  # the first copy is packed
        row = keys["cat/caf%E9.jpg"]
        assert ds.metadata(row)[ESCAPED_FIELD] is True
        assert unescape_key("cat/caf%E9.jpg") == b"cat/caf\xe9.jpg"
        assert ds.read(row) == FILES["cat/003.jpg"]


@pytest.mark.parametrize("second", [b"a second copy", b"x" * len(FILES["cat/000.jpg"])])
def test_a_name_repeated_with_other_bytes_is_a_key_collision(tmp_path: Path, second: bytes) -> None:
    """Issue 38: a member repeated under one name with different bytes (other size, or same size) was
    dropped as a duplicate and the build exited 0; it is a key collision now, refused by name."""
    source = tmp_path / "twice.tar"
    with tarfile.open(source, "w", format=tarfile.GNU_FORMAT) as archive:
        add(archive, "cat/ok.jpg", FILES["cat/000.jpg"])
        add(archive, "cat/other.jpg", FILES["cat/001.jpg"])
        add(archive, "cat/ok.jpg", second)
    with pytest.raises(SourceError) as caught:
        build(source, tmp_path / "ds", OPTIONS, RunOptions(workers=1))
    assert caught.value.message.startswith("1 key(s) name two different images (a key collision")
    assert "'cat/ok.jpg'" in caught.value.message and caught.value.path == str(source)
    assert not (tmp_path / "ds" / "manifest.json").exists()


def test_damaged_tar_is_a_source_error(tmp_path: Path) -> None:
    source = write_tar(tmp_path / "x.tar", FILES)
    data = bytearray(source.read_bytes())
    data[512 * 3 + 100: 512 * 3 + 160] = b"\x07" * 60  # a header in the middle becomes garbage
    source.write_bytes(bytes(data[: len(data) // 2]))
    gz = tmp_path / "x.tar.gz"
    write_tar(gz, FILES, "w:gz")
    gz.write_bytes(gz.read_bytes()[:-200])
    for damaged in (source, gz):
        with pytest.raises(SourceError, match="damaged"):
            build(damaged, tmp_path / "ds", OPTIONS, RunOptions(workers=1))


def test_compressed_bomb_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = write_tar(tmp_path / "bomb.tar.gz", {"cat/zeros.jpg": bytes(8 << 20)}, "w:gz")
    monkeypatch.setattr(tar_stream, "_BOMB_FLOOR", 1 << 20)  # the real floor is 1 GiB
    with pytest.raises(SourceError, match="decompression bomb"):
        build(source, tmp_path / "ds", OPTIONS, RunOptions(workers=1))


def webdataset_shards(folder: Path, *, json_labels: bool = False) -> list[Path]:
    folder.mkdir()
    shards = []
    items = list(FILES.items())
    for shard in range(3):
        path = folder / f"train-{shard:06d}.tar"
        with tarfile.open(path, "w") as archive:
            for n, (key, data) in enumerate(items[shard * 6:(shard + 1) * 6]):
                sample = f"{key.split('/')[0]}_{n + shard * 6:04d}"
                if json_labels:
                    add(archive, f"{sample}.json", json.dumps({"label": key.split("/")[0], "w": 1}).encode())
                else:
                    add(archive, f"{sample}.cls", str(("cat", "dog", "emu").index(key.split("/")[0])).encode())
                add(archive, f"{sample}.jpg", data)
                add(archive, f"{sample}.txt", b"a caption")
        shards.append(path)
    return shards


def test_webdataset_folder_pattern_and_labels(tmp_path: Path) -> None:
    shards = webdataset_shards(tmp_path / "wds")
    pattern = str(tmp_path / "wds" / "train-{000000..000002}.tar")
    assert expand_braces(pattern) == [str(p) for p in shards]
    build(pattern, tmp_path / "a", OPTIONS, RunOptions(workers=2))
    build(tmp_path / "wds", tmp_path / "b", OPTIONS, RunOptions(workers=1))
    same = lambda files: {name: data for name, data in files.items()  # noqa: E731
                          if name not in ("manifest.json", "build-report.jsonl")}
    # The same samples, byte for byte; the manifest's informational build object names the source
    # as it was given (a pattern or a folder), so only it may differ.
    assert same(dataset_files(tmp_path / "a")) == same(dataset_files(tmp_path / "b"))
    manifests = [json.loads((tmp_path / x / "manifest.json").read_text()) for x in "ab"]
    assert [{k: v for k, v in m.items() if k != "build"} for m in manifests] == [
        {k: v for k, v in manifests[1].items() if k != "build"}] * 2
    with open_dataset(tmp_path / "a") as ds:
        assert len(ds) == 18 and ds.classes == ()
        for i in range(len(ds)):
            key = ds.key(i)
            assert ds.read(i) == FILES[f"{key.split('_')[0]}/{int(key[4:8]) % 6:03d}.jpg"]
            assert int(ds.labels[i]) == ("cat", "dog", "emu").index(key.split("_")[0])
            assert ds.metadata(i)["txt"] == "a caption"
    named = webdataset_shards(tmp_path / "wds2", json_labels=True)
    build(named[0], tmp_path / "c", with_source(OPTIONS, kind="webdataset"), RunOptions(workers=1))
    with open_dataset(tmp_path / "c") as ds:
        assert ds.classes == ("cat",) and ds.metadata(0)["json"]["w"] == 1


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "webdataset"])
def test_deterministic_parts_and_resume(tmp_path: Path, kind: str) -> None:
    if kind == "webdataset":
        source: Path | str = str(tmp_path / "wds" / "train-{000000..000002}.tar")
        webdataset_shards(tmp_path / "wds")
    else:
        source = write_tar(tmp_path / f"src.{kind}", FILES, "w" if kind == "tar" else "w:gz")
    build(source, tmp_path / "one", OPTIONS, RunOptions(workers=1))
    build(source, tmp_path / "two", OPTIONS, RunOptions(workers=2))
    assert dataset_files(tmp_path / "one") == dataset_files(tmp_path / "two")
    split = tmp_path / "split"
    for k in (1, 0):
        build(source, split, OPTIONS, RunOptions(workers=1, part=(k, 2)))
    finish(split, source)
    assert dataset_files(split) == dataset_files(tmp_path / "one")
    resumed = tmp_path / "resumed"
    build(source, resumed, OPTIONS, RunOptions(workers=1, part=(0, 2)))
    build(source, resumed, OPTIONS, RunOptions(workers=2, resume=True))
    assert dataset_files(resumed) == dataset_files(tmp_path / "one")


def test_resume_refuses_a_changed_archive(tmp_path: Path) -> None:
    from packer.errors import BuildError

    source = write_tar(tmp_path / "src.tar", FILES)
    out = tmp_path / "ds"
    build(source, out, OPTIONS, RunOptions(workers=1, part=(0, 2)))
    write_tar(source, dict(list(FILES.items())[:5]))
    os.utime(source, ns=(1, 1))
    with pytest.raises(BuildError, match="planned from"):
        build(source, out, OPTIONS, RunOptions(workers=1, resume=True))


def test_tar_zst(tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard")
    plain = write_tar(tmp_path / "plain.tar", FILES)
    source = tmp_path / "data.tar.zst"
    source.write_bytes(zstandard.ZstdCompressor().compress(plain.read_bytes()))
    assert sniff_container(source) == "tar.zst"
    build(source, tmp_path / "ds", OPTIONS, RunOptions(workers=2))
    assert packed(tmp_path / "ds") == EXPECTED


def test_parquet_huggingface_layout(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    names = ["cat", "dog", "emu"]
    keys = list(FILES)
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({
        "image": pa.array([{"bytes": FILES[k], "path": k} for k in keys] + [{"bytes": None, "path": "x.jpg"}],
                          type=image_type),
        "label": pa.array([names.index(k.split("/")[0]) for k in keys] + [0], type=pa.int64()),
    })
    hf = {"info": {"features": {"image": {"_type": "Image"},
                                "label": {"_type": "ClassLabel", "names": names}}}}
    table = table.replace_schema_metadata({b"huggingface": json.dumps(hf).encode()})
    (tmp_path / "hf" / "data").mkdir(parents=True)
    pq.write_table(table.slice(0, 10), tmp_path / "hf" / "data" / "train-00000-of-00002.parquet", row_group_size=4)
    pq.write_table(table.slice(10), tmp_path / "hf" / "data" / "train-00001-of-00002.parquet", row_group_size=4)
    (tmp_path / "hf" / "README.md").write_text("a dataset card")
    result = build(tmp_path / "hf", tmp_path / "ds", OPTIONS, RunOptions(workers=2))
    assert {r.key: r.reason for r in result.rejected} == {"x.jpg": "not-an-image"}
    assert packed(tmp_path / "ds") == EXPECTED
    build(tmp_path / "hf", tmp_path / "ds1", OPTIONS, RunOptions(workers=1))
    assert dataset_files(tmp_path / "ds1") == dataset_files(tmp_path / "ds")
    plain = pa.table({"img": pa.array([FILES[k] for k in keys]), "cls": pa.array([k.split("/")[0] for k in keys])})
    pq.write_table(plain, tmp_path / "plain.bin")
    build(tmp_path / "plain.bin", tmp_path / "ds2", with_source(OPTIONS, label_field="cls"), RunOptions(workers=1))
    with open_dataset(tmp_path / "ds2") as ds:
        assert ds.classes == ("cat", "dog", "emu") and ds.key(0).startswith("plain/")


def test_a_webdataset_whose_keys_have_folders_is_recognised_by_its_shared_keys(tmp_path: Path) -> None:
    """``a/000.jpg`` then ``a/000.cls``: the first member alone looks like a class folder, the
    label member sharing its key says samples (a tar of class folders would give class ``a``)."""
    files = {}
    for i in range(4):
        files[f"a/{i:03d}.jpg"] = jpeg(i)
        files[f"a/{i:03d}.cls"] = str(i % 2).encode()
    write_tar(tmp_path / "shard.tar", files)
    build(tmp_path / "shard.tar", tmp_path / "ds", OPTIONS, RunOptions(workers=1))
    assert packed(tmp_path / "ds") == {f"a/{i:03d}.jpg": (jpeg(i), str(i % 2)) for i in range(4)}
    # a class folder holding a stray text file stays a tar of class folders
    write_tar(tmp_path / "classes.tar", {"cat/notes.txt": b"hello", **FILES})
    result = build(tmp_path / "classes.tar", tmp_path / "ds2", OPTIONS, RunOptions(workers=1))
    assert packed(tmp_path / "ds2") == EXPECTED and [r.key for r in result.rejected] == ["cat/notes.txt"]


@pytest.mark.parametrize("member, body, label, message", [
    ("cls", b"7", 7, None),
    ("cls", b" 007\n", 7, None),                  # zero-padded, surrounding space: int() reads it so
    ("cls", b"-3", -3, None),
    ("cls", b"9223372036854775807", (1 << 63) - 1, None),
    ("cls", b"9223372036854775808", None, "does not fit in a signed 64-bit integer"),
    ("cls", b"9" * 5000, None, "does not fit in a signed 64-bit integer"),
    ("cls", b"1_0", None, "looks like an integer but is not plain ASCII digits"),
    ("cls", "\u0663".encode(), None, "looks like an integer but is not plain ASCII digits"),
    ("cls", b"", None, "the .cls member is empty"),
    ("json", b'{"label": 4}', 4, None),
    ("json", b'{"label": null}', -1, None),
    ("json", b'{"other": 1}', -1, None),
    ("json", b'{"label": 3.0}', None, "is 3.0: expected an integer or a class name"),
    ("json", b'{"label": true}', None, "is true: expected an integer or a class name"),
    ("json", b'{"label": ""}', None, 'is "": expected an integer or a class name'),
    ("json", b'{"label": 123456789012345678901234}', None, "does not fit in a signed 64-bit integer"),
])
def test_webdataset_labels_are_read_strictly(tmp_path: Path, member: str, body: bytes, label: int | None,
                                             message: str | None) -> None:
    """A label is an integer as written or refused by name (``bad-label``): never a traceback, a
    float turned into no label, or a boolean into one."""
    write_tar(tmp_path / "shard.tar", {"000.jpg": jpeg(0), f"000.{member}": body, "001.jpg": jpeg(1),
                                       "001.cls": b"1"})
    result = build(tmp_path / "shard.tar", tmp_path / "ds", OPTIONS, RunOptions(workers=1))
    labels = {key: int(value) for key, (_, value) in packed(tmp_path / "ds").items()}
    if message is None:
        assert labels == {"000.jpg": label, "001.jpg": 1} and not result.rejected
    else:
        assert labels == {"001.jpg": 1}
        [rejection] = result.rejected
        assert (rejection.key, rejection.reason) == ("000.jpg", "bad-label") and message in rejection.message


def test_webdataset_mixing_integer_and_name_labels_names_one_of_each(tmp_path: Path) -> None:
    write_tar(tmp_path / "shard.tar", {"000.jpg": jpeg(0), "000.cls": b"5", "001.jpg": jpeg(1), "001.cls": b"owl"})
    with pytest.raises(SourceError, match=r"labels mix integers \(first: 5\) and class names \(first: 'owl'\)"):
        build(tmp_path / "shard.tar", tmp_path / "ds", OPTIONS, RunOptions(workers=1))


def test_parquet_labels_booleans_are_two_classes_and_floats_are_refused(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    keys = list(FILES)[:4]
    pq.write_table(pa.table({"img": pa.array([FILES[k] for k in keys]), "label": pa.array([True, False, None, True])}),
                   tmp_path / "bool.parquet")
    build(tmp_path / "bool.parquet", tmp_path / "b", OPTIONS, RunOptions(workers=1))
    with open_dataset(tmp_path / "b") as ds:
        assert sorted((ds.key(i), int(ds.labels[i])) for i in range(len(ds))) == [
            ("bool/000000000", 1), ("bool/000000001", 0), ("bool/000000002", -1), ("bool/000000003", 1)]
    pq.write_table(pa.table({"img": pa.array([FILES[k] for k in keys[:2]]), "label": pa.array([1.5, 2.0])}),
                   tmp_path / "float.parquet")
    with pytest.raises(EmptySourceError, match="no packable members"):
        build(tmp_path / "float.parquet", tmp_path / "f", OPTIONS, RunOptions(workers=1))
    report = [json.loads(line) for line in (tmp_path / "f" / "build-report.jsonl").read_text().splitlines()][1:]
    assert [(r["key"], r["reason"]) for r in report] == [("float/000000000", "bad-label"),
                                                         ("float/000000001", "bad-label")]
    assert "holds '1.5' (float): expected an integer or a class name" in report[0]["message"]
    summary = json.loads((tmp_path / "f" / "build-report.jsonl").read_text().splitlines()[0])
    assert (summary["settings"]["source"]["kind"], summary["rejected"]) == ("parquet", 2)


def test_cli_build_from_archives(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from packer.cli import _register, cli

    _register()
    runner = CliRunner()
    source = write_tar(tmp_path / "src.tar", FILES)
    run = runner.invoke(cli, ["build", str(source), str(tmp_path / "ds"), "-q", "--json"])
    assert run.exit_code == 0, run.output
    broken = tmp_path / "broken.tar.gz"
    broken.write_bytes((tmp_path / "src.tar").read_bytes()[:0] + b"\x1f\x8b" + bytes(100))
    bad = runner.invoke(cli, ["build", str(broken), str(tmp_path / "ds2"), "-q", "--source-kind", "tar"])
    assert bad.exit_code == 2 and "tar" in bad.output


@pytest.mark.parametrize("kind", ["tar", "tar.gz", "zip"])
def test_cut_archives_fail_cleanly(tmp_path: Path, kind: str) -> None:
    """An archive cut anywhere is a SourceError or a build whose lost members are rejections: never a crash."""
    whole = tmp_path / f"whole.{kind}"
    if kind == "zip":
        with zipfile.ZipFile(whole, "w", zipfile.ZIP_DEFLATED) as archive:
            for key, data in FILES.items():
                archive.writestr(key, data)
    else:
        write_tar(whole, FILES, "w" if kind == "tar" else "w:gz")
    data = whole.read_bytes()
    for n, cut in enumerate(sorted({1, 300, 513, len(data) // 3, len(data) // 2, len(data) - 700, len(data) - 1})):
        source = tmp_path / f"cut{n}.{kind}"
        source.write_bytes(data[:cut])
        try:
            result = build(source, tmp_path / f"ds{n}", OPTIONS, RunOptions(workers=1))
        except SourceError:
            continue
        assert result.sample_count + len(result.rejected) >= 1
        assert {r.reason for r in result.rejected} <= {"truncated", "not-an-image", "unreadable"}


def test_append_from_a_compressed_archive(tmp_path: Path) -> None:
    from packer.writer.append import append

    first = dict(list(FILES.items())[:9])
    rest = dict(list(FILES.items())[9:])
    build(write_tar(tmp_path / "a.tar", first), tmp_path / "ds", OPTIONS, RunOptions(workers=1))
    result = append(tmp_path / "ds", write_tar(tmp_path / "b.tar.gz", rest, "w:gz"), run=RunOptions(workers=1))
    assert result.sample_count >= len(rest)
    assert packed(tmp_path / "ds") == EXPECTED
    assert not (tmp_path / "ds" / ".packer-append-spool").exists()


def test_each_kind_of_archive_damage_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import gzip

    def message(source: Path) -> str:
        with pytest.raises(SourceError) as caught:
            build(source, tmp_path / f"{source.name}-ds", OPTIONS, RunOptions(workers=1))
        assert caught.value.path == str(source)
        return caught.value.message

    whole = write_tar(tmp_path / "whole.tar", FILES).read_bytes()
    # bytes after the end-of-archive blocks that are neither zeros nor another tar
    garbage = tmp_path / "garbage.tar"
    garbage.write_bytes(whole + b"\x07" * 2048)
    assert message(garbage) == (f"the tar archive is damaged at offset {len(whole)}: a member header there cannot be "
                                f"read (the members before it were listed; nothing after it can be)")
    # a compressed stream cut before its end
    compressed = gzip.compress(whole)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(compressed[: len(compressed) // 2])
    assert message(cut).startswith("the archive's compressed stream is damaged or truncated: ")
    # a compressed stream damaged near its start: zlib's own error was a traceback out of source detection
    scrambled = tmp_path / "scrambled.tar.gz"
    scrambled.write_bytes(compressed[:200] + bytes(b ^ 0x55 for b in compressed[200:400]) + compressed[400:])
    assert message(scrambled) == "the source is a compressed stream, but not a tar packer can read (nor a manifest)"

    # a zstd frame whose checksum does not match (zstandard's own error type, not an OSError)
    zstandard = pytest.importorskip("zstandard")
    frame = zstandard.ZstdCompressor(write_checksum=True).compress(whole)
    damaged = tmp_path / "damaged.tar.zst"
    damaged.write_bytes(frame[:-4] + bytes(b ^ 0xFF for b in frame[-4:]))
    assert message(damaged).startswith("the archive's compressed stream is damaged or truncated: zstd")

    # a read error of the disk while the members are listed
    def failing_members(archive: tarfile.TarFile):
        raise OSError(errno.EIO, "Input/output error")
        yield  # a generator, as the real one is

    monkeypatch.setattr(tar_stream, "tar_members", failing_members)
    assert message(tmp_path / "whole.tar") == "cannot read the archive: Input/output error"


def test_a_compressed_tar_whose_header_claims_more_than_the_stream_holds(tmp_path: Path) -> None:
    """A whole, valid gzip stream around a tar cut inside its member: tarfile's stream mode skips the
    member by reading toward the size its header states (1 GiB here) and gets nothing back; the
    spooling reader stops it after a few empty reads, naming the lie, instead of some 100,000 more."""
    import gzip

    header = tarfile.TarInfo("cat/big.jpg")
    header.size = 1 << 30
    present = jpeg(0) * (65536 // len(jpeg(0)) + 1)  # enough for the listing's peek at the member
    source = tmp_path / "lying.tar.gz"
    source.write_bytes(gzip.compress(header.tobuf(tarfile.USTAR_FORMAT) + present))
    with pytest.raises(SourceError) as caught:
        build(source, tmp_path / "ds", OPTIONS, RunOptions(workers=1))
    assert type(caught.value) is SourceError and caught.value.path == str(source)
    assert caught.value.message == ("the compressed tar ends inside a member: a header claims more bytes than the "
                                    "archive holds")
    assert not (tmp_path / "ds" / "manifest.json").exists()


class _FailingSpool(io.FileIO):
    """A spool file whose writes fail as a full or failing disk's do (the kernel's errno)."""

    error = 0

    def write(self, data):  # type: ignore[no-untyped-def]
        raise OSError(self.error, os.strerror(self.error))


@pytest.mark.parametrize("code, message", [
    ("ENOSPC", "the disk is full while decompressing the archive into the build's spool; free space and run again"),
    ("EIO", "cannot write the build's spool: Input/output error"),
    ("EROFS", "cannot write the build's spool: Read-only file system")])
def test_a_spool_write_that_fails_is_named_as_a_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: str,
                                                      message: str) -> None:
    """Issue 38: a tar.gz whose spool could not be written was "cannot read the archive" (for EIO,
    EROFS: any errno but ENOSPC); the archive reads fine, the spool's write failed."""
    import builtins
    import errno

    from packer.errors import BuildError

    source = write_tar(tmp_path / "train.tar.gz", {f"cat/{n}.jpg": jpeg(n) for n in range(12)}, "w:gz")
    real_open = builtins.open

    def spool_open(path, mode="r", *args, **kwargs):  # type: ignore[no-untyped-def]
        if "spool-" in str(path) and "w" in mode:
            failing = type("Failing", (_FailingSpool,), {"error": getattr(errno, code)})
            return io.BufferedWriter(failing(path, "w"), 1 << 16)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(tar_stream, "open", spool_open, raising=False)
    with pytest.raises(BuildError) as caught:
        build(source, tmp_path / "out", OPTIONS, RunOptions(workers=1))
    assert caught.value.message == message
    assert "spool-" in str(caught.value.path)
    assert not (tmp_path / "out" / ".packer-build").exists()
