"""Issue 25, the sources half: every example a door broke, each a test of the rule that now holds for
every door (the source contract, sources/contract.py), written against the public build/append
API so that each one fails on the code before the contract (main at 5108e06/6caf3ca) and passes now.
"""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import time
import tracemalloc
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fuzz_sources  # scripts/: the structure-aware archive builders
from packer.dataset import open_dataset, open_index
from packer.errors import BuildError, MissingDependencyError, PackerError, SourceError
from packer.writer import build
from packer import BuildSettings, LabelSettings, LayoutSettings, RunOptions, SourceSettings
from helpers import with_source

OPTIONS = BuildSettings(layout=LayoutSettings(shard_size=64 << 10, seed=1))
REPO = Path(__file__).resolve().parents[2]


def jpeg(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (12 + seed % 5, 16, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=85)
    return out.getvalue()


def write_tar(path: Path, files: dict[str, bytes], mode: str = "w") -> Path:
    with tarfile.open(path, mode, format=tarfile.PAX_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def tar_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def samples(out: Path) -> dict[str, tuple[bytes, str]]:
    """key -> (bytes, class name or the integer label as text), read through a verifying open."""
    with open_dataset(out, verify_checksums=True) as ds:
        return {ds.key(i): (ds.read(i), ds.classes[int(ds.labels[i])] if ds.classes else str(int(ds.labels[i])))
                for i in range(len(ds))}


def reasons(result: object) -> dict[str, str]:
    return {r.key: r.reason for r in result.rejected}  # type: ignore[attr-defined]


def run_cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "packer", *argv], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


VAL = {"cat/0.jpg": jpeg(0), "cat/1.jpg": jpeg(1), "horse/0.jpg": jpeg(2)}
TRAIN_CLASSES = ("cat", "dog", "zebra")


def archive_source(tmp_path: Path, kind: str, files: dict[str, bytes]) -> Path:
    """``class/name`` files as a tar, a zip, or a WebDataset shard (``.cls`` members naming the class)."""
    if kind == "tar":
        return write_tar(tmp_path / "val.tar", files)
    if kind == "zip":
        with zipfile.ZipFile(tmp_path / "val.zip", "w") as archive:
            for name, data in files.items():
                archive.writestr(name, data)
        return tmp_path / "val.zip"
    shard = {}
    for number, (name, data) in enumerate(files.items()):
        shard[f"{number:04d}.jpg"] = data
        shard[f"{number:04d}.cls"] = name.split("/")[0].encode()
    return write_tar(tmp_path / "val-000000.tar", shard)


# --- silent wrong labels -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["tar", "zip", "webdataset"])
def test_classes_are_applied_to_tar_zip_and_webdataset(tmp_path: Path, kind: str) -> None:
    """A validation archive of cat and horse built with the training list (cat, dog, zebra): cat is 0
    as in training and horse is unknown-class, not ``cat=0, horse=1`` (1 is dog in training)."""
    source = archive_source(tmp_path, kind, VAL)
    result = build(source, tmp_path / "out", replace(OPTIONS, labels=LabelSettings(classes=TRAIN_CLASSES)),
                   RunOptions(workers=1))
    with open_index(tmp_path / "out") as index:
        assert index.classes == TRAIN_CLASSES
        assert set(index.labels.tolist()) == {0}
    assert sorted(reasons(result).values()) == ["unknown-class"]
    assert {v for _, v in samples(tmp_path / "out").values()} == {"cat"}


def test_classes_from_a_training_dataset_through_the_cli(tmp_path: Path) -> None:
    train = write_tar(tmp_path / "train.tar", {f"{c}/{i}.jpg": jpeg(10 + i) for c in TRAIN_CLASSES for i in range(2)})
    assert run_cli("build", str(train), str(tmp_path / "train-ds"), "-q").returncode == 0
    val = archive_source(tmp_path, "tar", VAL)
    done = run_cli("build", str(val), str(tmp_path / "val-ds"), "-q", "--classes-from", str(tmp_path / "train-ds"))
    assert done.returncode == 0, done.stderr
    assert "3 classes from the given class list" in done.stderr
    with open_index(tmp_path / "val-ds") as index:
        assert index.classes == TRAIN_CLASSES and set(index.labels.tolist()) == {0}


def unlabeled_source(tmp_path: Path, kind: str, labels: list[str | None]) -> Path:
    """One sample per label (None: no label), as a WebDataset shard or a Parquet file."""
    if kind == "webdataset":
        shard: dict[str, bytes] = {}
        for number, label in enumerate(labels):
            shard[f"{number:04d}.jpg"] = jpeg(40 + number)
            if label is not None:
                shard[f"{number:04d}.cls"] = label.encode()
            shard[f"{number:04d}.txt"] = b"a caption"
        return write_tar(tmp_path / "new-000000.tar", shard)
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"image": pa.array([jpeg(40 + n) for n in range(len(labels))]),
                      "label": pa.array(labels, type=pa.string())})
    pq.write_table(table, tmp_path / "new.parquet")
    return tmp_path / "new.parquet"


def unlabeled_key(kind: str, number: int) -> str:
    return f"{number:04d}.jpg" if kind == "webdataset" else f"new/{number:09d}"


@pytest.mark.parametrize("kind", ["webdataset", "parquet"])
def test_append_never_gives_unlabeled_samples_the_last_class(tmp_path: Path, kind: str) -> None:
    from packer.writer.append import append

    build(write_tar(tmp_path / "base.tar", {"cat/0.jpg": jpeg(0), "dog/0.jpg": jpeg(1)}), tmp_path / "ds", OPTIONS, RunOptions(workers=1))
    result = append(tmp_path / "ds", unlabeled_source(tmp_path, kind, ["cat", None, None]), run=RunOptions(workers=1))
    got = samples(tmp_path / "ds")
    assert got[unlabeled_key(kind, 0)][1] == "cat"
    for number in (1, 2):  # a label of -1 used as a numpy index was the last class, "dog"
        assert unlabeled_key(kind, number) not in got
        assert reasons(result)[unlabeled_key(kind, number)] == "unlabeled"
    assert sorted(v for _, v in got.values()) == ["cat", "cat", "dog"]


@pytest.mark.parametrize("kind", ["webdataset", "parquet"])
def test_names_mixed_with_unlabeled_samples_build_a_dataset_that_opens(tmp_path: Path, kind: str) -> None:
    source = unlabeled_source(tmp_path, kind, ["cat", "dog", None, "cat", None])
    result = build(source, tmp_path / "out", OPTIONS, RunOptions(workers=1))
    got = samples(tmp_path / "out")  # opens: no label -1 beside a class list (SPEC R40)
    assert sorted(v for _, v in got.values()) == ["cat", "cat", "dog"]
    assert {k: r for k, r in reasons(result).items()} == {unlabeled_key(kind, 2): "unlabeled",
                                                          unlabeled_key(kind, 4): "unlabeled"}
    with pytest.raises(SourceError, match=r"2 sample\(s\) have no label \(--on-error fail\)"):
        build(source, tmp_path / "strict", OPTIONS, RunOptions(workers=1, on_error="fail"))


# --- archives ----------------------------------------------------------------------------------------

def test_overlapping_zip_members_are_rejected_not_expanded(tmp_path: Path) -> None:
    """Thousands of central-directory entries naming one deflated member (the overlapping-member zip
    bomb: 5 KB gave 59 MB) pack it once; every other entry is accounted for as overlapping."""
    image = jpeg(7)
    entries = [fuzz_sources.ZipEntry(b"cat/kernel.jpg", image, method=8)]
    entries += [fuzz_sources.ZipEntry(f"cat/copy{n:04d}.jpg".encode(), image, method=8, points_to=0)
                for n in range(2000)]
    source = tmp_path / "bomb.zip"
    source.write_bytes(fuzz_sources.zip_archive(entries))
    result = build(source, tmp_path / "out", OPTIONS, RunOptions(workers=1))
    assert result.sample_count == 1 and result.payload_bytes <= source.stat().st_size
    assert set(reasons(result).values()) == {"overlapping-member"} and len(result.rejected) == 2000


def test_zip_entry_declaring_a_terabyte_is_a_rejection_not_a_memory_error(tmp_path: Path) -> None:
    entries = [fuzz_sources.ZipEntry(b"cat/ok.jpg", jpeg(1)),
               fuzz_sources.ZipEntry(b"cat/huge.jpg", jpeg(2), compress_size=1 << 40, zip64=True)]
    source = tmp_path / "huge.zip"
    source.write_bytes(fuzz_sources.zip_archive(entries))
    result = build(source, tmp_path / "out", OPTIONS, RunOptions(workers=1))
    assert list(samples(tmp_path / "out")) == ["cat/ok.jpg"]
    assert reasons(result) == {"cat/huge.jpg": "truncated"}
    assert "past the end of the archive" in result.rejected[0].message


def test_concatenated_tars_and_multi_member_tar_gz_pack_every_part(tmp_path: Path) -> None:
    first = {"cat/0.jpg": jpeg(0), "cat/1.jpg": jpeg(1)}
    second = {"dog/0.jpg": jpeg(2), "emu/0.jpg": jpeg(3)}
    (tmp_path / "cat.tar").write_bytes(tar_bytes(first) + tar_bytes(second))  # `cat a.tar b.tar`
    (tmp_path / "cat.tar.gz").write_bytes(gzip.compress(tar_bytes(first)) + gzip.compress(tar_bytes(second)))
    expected = {key: (data, key.split("/")[0]) for key, data in {**first, **second}.items()}
    for name in ("cat.tar", "cat.tar.gz"):
        result = build(tmp_path / name, tmp_path / f"out-{name}", OPTIONS, RunOptions(workers=1))
        assert samples(tmp_path / f"out-{name}") == expected and not result.rejected


def test_an_inner_tar_member_lying_about_its_size_is_not_packed_with_the_next_members_bytes(tmp_path: Path) -> None:
    second = fuzz_sources.tar_member(b"0.jpg", jpeg(0))
    lie = len(jpeg(1)) + 3000  # its data would run past cat.tar's end, into dog.tar's bytes
    cat = fuzz_sources.tar_archive([second, fuzz_sources.tar_header(b"1.jpg", lie) + jpeg(1).ljust(
        (len(jpeg(1)) + 511) // 512 * 512, b"\x00")])
    assert lie > len(cat) - len(second) - 512
    outer = write_tar(tmp_path / "train.tar", {"cat.tar": bytes(cat), "dog.tar": tar_bytes({"0.jpg": jpeg(2)})})
    result = build(outer, tmp_path / "out", OPTIONS, RunOptions(workers=1))
    got = samples(tmp_path / "out")
    assert got == {"cat/0.jpg": (jpeg(0), "cat"), "dog/0.jpg": (jpeg(2), "dog")}
    assert reasons(result)["cat/1.jpg"] == "truncated" and set(reasons(result)) <= {"cat/1.jpg", "cat.tar"}
    assert "past the end of its class tar" in {r.key: r.message for r in result.rejected}["cat/1.jpg"]


@pytest.mark.timeout(60)
def test_a_brace_pattern_is_counted_before_it_is_expanded(tmp_path: Path) -> None:
    """Each range under the old per-range cap, the product 10^10: refused at once, nothing built."""
    pattern = str(tmp_path / "train-{0000..9999}-{0000..9999}-{00..99}.tar")
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(SourceError, match="names more than 1000000 files"):
            build(pattern, tmp_path / "out", OPTIONS, RunOptions(workers=1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - started < 10 and peak < 16 << 20


def sparse_webdataset(path: Path, members: int, size: int) -> Path:
    """One key: an image, a .cls, and ``members`` text members of ``size`` zero bytes (holes on disk)."""
    with open(path, "wb") as handle:
        for name, data in (("k.jpg", jpeg(3)), ("k.cls", b"1")):
            handle.write(fuzz_sources.tar_member(name.encode(), data))
        for number in range(members):
            handle.write(fuzz_sources.tar_header(f"k.part{number:03d}.txt".encode(), size))
            handle.seek(size, os.SEEK_CUR)  # a hole: the member's bytes read back as zeros
        handle.write(b"\x00" * 1024)
    return path


def test_one_webdataset_key_with_hundreds_of_large_members_is_bounded_and_accounted(tmp_path: Path) -> None:
    source = sparse_webdataset(tmp_path / "one-key.tar", 300, 1 << 20)  # 300 MiB of text members
    tracemalloc.start()
    try:
        result = build(source, tmp_path / "out", with_source(OPTIONS, kind="webdataset"), RunOptions(workers=1))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 48 << 20, f"{peak >> 20} MiB held for one sample"
    with open_dataset(tmp_path / "out") as ds:
        assert len(ds) == 1 and ds.key(0) == "k.jpg" and len(ds.metadata(0)["txt"]) == 1 << 20
    # the first .txt is the sample's metadata; every other one is in the report, none dropped silently
    assert sorted(reasons(result)) == [f"k.part{n:03d}.txt" for n in range(1, 300)]
    assert set(reasons(result).values()) == {"unused-member"}
    assert "already has a .txt member (k.part000.txt)" in result.rejected[0].message


def test_one_webdataset_key_with_hundreds_of_members_and_fields_is_bounded(tmp_path: Path) -> None:
    """With declared fields every text member is a candidate: at most 32 MiB of them are read for one
    sample and 4 MiB kept as its metadata; the rest are in the report."""
    from packer.errors import EmptySourceError

    source = sparse_webdataset(tmp_path / "one-key.tar", 200, 1 << 20)
    tracemalloc.start()
    try:
        settings = replace(OPTIONS, source=SourceSettings(kind="webdataset"),
                           labels=LabelSettings(fields=("caption=text@part000.txt",)))
        result = build(source, tmp_path / "out", settings, RunOptions(workers=1))
        rejected = result.rejected
    except EmptySourceError as exc:  # the sample's 4 MiB of NUL text escape past the metadata limit
        rejected = exc.rejected  # type: ignore[attr-defined]
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 128 << 20, f"{peak >> 20} MiB held for one sample"
    unused = {r.key for r in rejected if r.reason == "unused-member"}
    assert len(unused) >= 190 and all(key.startswith("k.part") for key in unused)


def test_a_tar_zst_without_zstandard_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    zstandard = pytest.importorskip("zstandard")
    source = tmp_path / "train.tar.zst"
    source.write_bytes(zstandard.ZstdCompressor().compress(tar_bytes({"cat/0.jpg": jpeg(0)})))
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard now fails
    with pytest.raises(MissingDependencyError, match=r"pip install 'packer-shards\[zstd\]'"):
        build(source, tmp_path / "out", OPTIONS, RunOptions(workers=1))
    assert not (tmp_path / "out" / ".packer-build").exists()


def test_no_spool_is_left_after_a_bomb_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from packer.sources import tar_stream as tar_door

    source = write_tar(tmp_path / "bomb.tar.gz", {"cat/zeros.jpg": bytes(8 << 20)}, "w:gz")
    monkeypatch.setattr(tar_door, "_BOMB_FLOOR", 1 << 20)  # the real floor is 1 GiB
    with pytest.raises(SourceError, match="decompression bomb"):
        build(source, tmp_path / "out", OPTIONS, RunOptions(workers=1))
    assert not (tmp_path / "out" / ".packer-build").exists()


def test_no_spool_is_left_after_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from packer.sources import tar_stream as tar_door

    source = write_tar(tmp_path / "train.tar.gz", {f"cat/{n}.jpg": jpeg(n) for n in range(40)}, "w:gz")
    real = tar_door._Tee.readinto

    def full_disk(self, buffer):  # type: ignore[no-untyped-def]
        if self.count > 4096:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, buffer)

    monkeypatch.setattr(tar_door._Tee, "readinto", full_disk)
    with pytest.raises(BuildError, match="disk is full"):
        build(source, tmp_path / "out", OPTIONS, RunOptions(workers=1))
    assert not (tmp_path / "out" / ".packer-build").exists()


def test_repeated_classlabel_names_are_refused_not_merged(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"image": pa.array([jpeg(n) for n in range(3)]), "label": pa.array([0, 1, 2])})
    hf = {"info": {"features": {"label": {"_type": "ClassLabel", "names": ["cat", "cat", "dog"]}}}}
    pq.write_table(table.replace_schema_metadata({b"huggingface": json.dumps(hf).encode()}), tmp_path / "hf.parquet")
    with pytest.raises(SourceError, match="declares class names more than once \\('cat'\\)"):
        build(tmp_path / "hf.parquet", tmp_path / "out", OPTIONS, RunOptions(workers=1))


# --- every user-supplied file ----------------------------------------------------------------------------

@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    for number in range(2):
        (tmp_path / "src" / "cat").mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / "cat" / f"{number}.jpg").write_bytes(jpeg(number))
    return tmp_path / "src"


def test_a_deeply_nested_fields_file_is_a_usage_error(tmp_path: Path, image_folder: Path) -> None:
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    done = run_cli("build", str(image_folder), str(tmp_path / "out"), "-q", "--fields", str(tmp_path / "deep.json"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--fields: nests arrays or objects deeper than 64 levels" in done.stderr


def test_fields_from_dev_zero_is_refused_not_read(tmp_path: Path, image_folder: Path) -> None:
    started = time.monotonic()
    done = run_cli("build", str(image_folder), str(tmp_path / "out"), "-q", "--fields", "/dev/zero", timeout=60)
    assert done.returncode == 2 and "--fields: a device, not a regular file" in done.stderr
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("how", ["--fields", "--classes", "coco"])
def test_a_fifo_named_as_a_user_file_is_refused_not_waited_on(tmp_path: Path, image_folder: Path, how: str) -> None:
    fifo = tmp_path / ("pipe.json" if how != "--classes" else "classes.txt")
    os.mkfifo(fifo)
    if how == "coco":
        argv = ["build", str(fifo), str(tmp_path / "out"), "-q", "--source-kind", "coco", "--root", str(image_folder)]
    else:
        argv = ["build", str(image_folder), str(tmp_path / "out"), "-q", how, str(fifo)]
    try:
        done = run_cli(*argv, timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail(f"packer build {how} FIFO waited on the FIFO")
    assert done.returncode == 2 and "a FIFO, not a regular file" in done.stderr, done.stderr


@pytest.mark.timeout(180)
def test_source_detection_walks_a_1200_level_folder_without_recursion(tmp_path: Path) -> None:
    """The only class holds its image 1,200 folders down: detection (is it Parquet?) must not
    recurse per level as os.walk does (RecursionError on Python 3.11)."""
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    fd = os.open(src / "a", os.O_RDONLY)
    for _ in range(1200):  # os.makedirs itself recurses per level
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    image = os.open("deep.jpg", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(image, jpeg(5))
    os.close(image)
    os.close(fd)
    try:
        result = build(src, tmp_path / "out", OPTIONS, RunOptions(workers=1))
        assert result.sample_count == 1
    finally:  # pytest's own cleanup (shutil.rmtree) recurses per level too; rm does not
        subprocess.run(["rm", "-rf", str(src / "a" / "d")], check=True)


#: Walks that remain, each with the reason its depth is not the user's to choose.
WALKS_ALLOWED = {
    "packer/remote/cache.py": "the node cache's own layout (dataset/generation/extents), written by packer",
}


def test_nothing_in_packer_walks_a_users_tree_recursively() -> None:
    """The class of the bug above: no os.walk, Path.walk or rglob in packer (the walks that recurse
    per level, or are easy to point at a user's tree); every walk of a user's tree is an explicit
    stack. A walk of a tree packer itself lays out is listed in ``WALKS_ALLOWED`` with its reason."""
    offenders = []
    for path in sorted((REPO / "packer").rglob("*.py")):
        relative = path.relative_to(REPO).as_posix()
        text = path.read_text("utf-8").replace("ast.walk(", "")
        for needle in ("os.walk(", ".rglob(", ".walk("):
            if needle in text and relative not in WALKS_ALLOWED:
                offenders.append(f"{relative}: {needle}")
    assert not offenders
