"""packer.Writer: a dataset written sample by sample, with packer build's guarantees (issue 35).

Each test can fail: the dataset is compared with a folder build of the same bytes, the order with
the write order, a killed or failing block with "nothing that opens".
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import packer
from packer import BuildSettings, LabelSettings, LayoutSettings, RunOptions
from packer.errors import BuildError, BuildLockedError, EmptySourceError, OptionError, OutputExistsError, PackerError
from packer.writer import build
from packer.writer.staging import STAGING_DIR

SMALL = dict(shard_size=16 << 10, workers=1)


def jpeg(seed: int, size: tuple[int, int] = (20, 24)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (*size, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "JPEG", quality=85)
    return out.getvalue()


def samples(path: Path) -> list[tuple[str, bytes, object]]:
    with packer.open_dataset(path, verify_checksums=True) as ds:
        return [(ds.key(i), ds.read(i), ds.classes[int(ds.labels[i])] if ds.classes else int(ds.labels[i]))
                for i in range(len(ds))]


def opens(path: Path) -> bool:
    try:
        with packer.open_dataset(path):
            return True
    except PackerError:
        return False


def test_bytes_written_are_the_bytes_stored_with_the_labels_and_keys(tmp_path: Path) -> None:
    with packer.Writer(tmp_path / "out", **SMALL) as writer:
        keys = [writer.write(jpeg(i), "cat" if i % 2 else "dog") for i in range(12)]
    assert keys == [f"{i:09d}" for i in range(12)]
    found = {key: (data, label) for key, data, label in samples(tmp_path / "out")}
    assert found == {f"{i:09d}": (jpeg(i), "cat" if i % 2 else "dog") for i in range(12)}
    assert writer.result is not None and writer.result.sample_count == 12
    assert not (tmp_path / "out" / STAGING_DIR).exists()
    with packer.open_dataset(tmp_path / "out") as ds:
        assert ds.classes == ("cat", "dog")
        assert ds.manifest.build["settings"]["source"]["kind"] == "python"


def test_the_same_writes_give_the_same_bytes_and_a_folder_build_the_same_samples(tmp_path: Path) -> None:
    listed = sorted(range(10), key=lambda i: (i % 2, i))  # the folder's listing order: cat/..., then dog/...
    for name in ("a", "b"):
        with packer.Writer(tmp_path / name, **SMALL) as writer:
            for i in listed:
                writer.write(jpeg(i), ["cat", "dog"][i % 2], key=f"{['cat', 'dog'][i % 2]}/{i:03d}.jpg")
    files = lambda p: {f.relative_to(p).as_posix(): f.read_bytes() for f in p.rglob("*")  # noqa: E731
                       if f.is_file() and f.name != ".packer.lock" and f.name != "build-report.jsonl"}
    assert files(tmp_path / "a") == files(tmp_path / "b")
    for i in range(10):
        path = tmp_path / "src" / ["cat", "dog"][i % 2] / f"{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(jpeg(i))
    build(tmp_path / "src", tmp_path / "folder", BuildSettings(layout=LayoutSettings(shard_size=16 << 10)),
          RunOptions(workers=1))
    assert samples(tmp_path / "a") == samples(tmp_path / "folder")  # same keys, bytes, labels, order


def test_class_by_class_writes_come_back_shuffled_unless_asked_not_to(tmp_path: Path) -> None:
    for shuffle in (True, False):
        out = tmp_path / f"shuffle-{shuffle}"
        with packer.Writer(out, shuffle=shuffle, **SMALL) as writer:
            for i in range(40):
                writer.write(jpeg(i), f"class{i // 10}")
        labels = [label for _, _, label in samples(out)]
        firsts = labels[:10]
        if shuffle:
            assert len(set(firsts)) > 1 and labels != sorted(labels)
        else:
            assert labels == sorted(labels)


def test_arrays_pil_images_and_tensors_are_stored_losslessly(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    rgb = rng.integers(0, 255, (9, 7, 3), dtype=np.uint8)
    gray = rng.integers(0, 255, (5, 6), dtype=np.uint8)
    rgba = rng.integers(0, 255, (4, 4, 4), dtype=np.uint8)
    torch = pytest.importorskip("torch")
    with packer.Writer(tmp_path / "png", **SMALL) as writer:
        writer.write(rgb, 0, key="rgb")
        writer.write(Image.fromarray(rgb), 0, key="pil")
        writer.write(torch.from_numpy(rgb).permute(2, 0, 1).contiguous(), 0, key="tensor")
        writer.write(gray, 0, key="gray")
        writer.write(rgba, 0, key="rgba")
    with packer.open_dataset(tmp_path / "png") as ds:
        by_key = {ds.key(i): i for i in range(len(ds))}
        for key in ("rgb", "pil", "tensor"):
            assert ds.read(by_key[key])[:8] == b"\x89PNG\r\n\x1a\n"
            assert np.array_equal(np.asarray(Image.open(io.BytesIO(ds.read(by_key[key])))), rgb)
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(ds.read(by_key["gray"])))), gray)
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(ds.read(by_key["rgba"])))), rgba)
    with packer.Writer(tmp_path / "raw", codec="raw:size=9x7", **SMALL) as writer:
        writer.write(rgb, 3)
        writer.write(Image.fromarray(rgb), 3)
    with packer.open_dataset(tmp_path / "raw") as ds:
        assert ds.manifest.build["codec_notes"] == {"kept size": 2}
        for i in range(2):
            assert np.array_equal(np.frombuffer(ds.read(i), dtype=np.uint8).reshape(9, 7, 3), rgb)  # the spooled BMP's pixels


def test_a_bad_sample_is_rejected_for_the_reason_the_same_bytes_get_in_a_folder(tmp_path: Path) -> None:
    bad = {"text.jpg": b"this is not an image", "cut.jpg": jpeg(3)[:60], "empty.jpg": b""}
    (tmp_path / "src" / "a").mkdir(parents=True)
    for name, data in bad.items():
        (tmp_path / "src" / "a" / name).write_bytes(data)
    (tmp_path / "src" / "a" / "good.jpg").write_bytes(jpeg(1))
    folder = build(tmp_path / "src", tmp_path / "folder", BuildSettings(), RunOptions(workers=1))
    with packer.Writer(tmp_path / "out", workers=1) as writer:
        for name, data in [*bad.items(), ("good.jpg", jpeg(1))]:
            writer.write(data, "a", key=f"a/{name}")
        writer.write("a/good.jpg", "a", key="a/path.jpg")  # a path is not an image
        writer.write(np.zeros((4, 4, 3), dtype=np.float32), "a", key="a/float.jpg")
        writer.write(jpeg(2), 1.5, key="a/label.jpg")
    reasons = {r.key: (r.reason, r.message) for r in writer.result.rejected}
    expected = {r.key: (r.reason, r.message) for r in folder.rejected}
    assert {key: reasons[key] for key in expected} == expected
    assert reasons["a/path.jpg"][0] == "bad-sample" and "got str" in reasons["a/path.jpg"][1]
    assert reasons["a/float.jpg"][0] == "bad-sample" and "float32" in reasons["a/float.jpg"][1]
    assert reasons["a/label.jpg"][0] == "bad-label"
    report = (tmp_path / "out" / "build-report.jsonl").read_text()
    assert "not-an-image" in report and "bad-sample" in report


def test_on_error_fail_raises_at_write_and_at_the_end(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="bad-sample: an image is encoded bytes"):
        with packer.Writer(tmp_path / "a", on_error="fail", workers=1) as writer:
            writer.write(3.5, 0)
    assert not (tmp_path / "a").exists()
    with pytest.raises(BuildError, match="not-an-image"):
        with packer.Writer(tmp_path / "b", on_error="fail", workers=1) as writer:
            writer.write(jpeg(0), 0)
            writer.write(b"nope", 0)
    assert not opens(tmp_path / "b") and not (tmp_path / "b" / STAGING_DIR).exists()


def test_duplicate_keys_are_refused_at_write_naming_the_key(tmp_path: Path) -> None:
    with packer.Writer(tmp_path / "out", **SMALL) as writer:
        writer.write(jpeg(0), 0, key="x/1.jpg")
        with pytest.raises(OptionError, match="key 'x/1.jpg' was already written"):
            writer.write(jpeg(1), 0, key="x/1.jpg")
        writer.write(jpeg(2), 0)  # key 000000002 (the third write)
        with pytest.raises(OptionError, match="key '000000002' was already written"):
            writer.write(jpeg(3), 0, key="000000002")
        writer.write(jpeg(4), 0, key="000000005")
        with pytest.raises(OptionError, match="key '000000005', the number of this write, was given"):
            writer.write(jpeg(5), 0)
        with pytest.raises(OptionError, match="a key is non-empty text"):
            writer.write(jpeg(6), 0, key="")
    assert sorted(key for key, _, _ in samples(tmp_path / "out")) == ["000000002", "000000005", "x/1.jpg"]


def test_an_exception_in_the_block_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(ZeroDivisionError):
        with packer.Writer(tmp_path / "out", **SMALL) as writer:
            writer.write(jpeg(0), 0)
            1 / 0
    assert not (tmp_path / "out").exists()
    (tmp_path / "kept").mkdir()
    with pytest.raises(KeyboardInterrupt):
        with packer.Writer(tmp_path / "kept", **SMALL) as writer:
            writer.write(jpeg(0), 0)
            raise KeyboardInterrupt
    assert list((tmp_path / "kept").iterdir()) == []
    writer = packer.Writer(tmp_path / "aborted", **SMALL).__enter__()
    writer.write(jpeg(0), 0)
    writer.abort()
    assert not (tmp_path / "aborted").exists() and writer.result is None


def test_sigkill_inside_the_block_leaves_nothing_that_opens_and_the_next_writer_cleans_up(tmp_path: Path) -> None:
    out = tmp_path / "out"
    pid = os.fork()
    if pid == 0:  # the child writes, then dies without a chance to clean up
        try:
            with packer.Writer(out, **SMALL) as writer:
                for i in range(20):
                    writer.write(jpeg(i), 0)
                writer._spool._file.flush()  # noqa: SLF001 - the bytes reach the spool file
                os.kill(os.getpid(), signal.SIGKILL)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    assert (out / STAGING_DIR / "spool").is_dir() and not (out / "manifest.json").exists()
    assert not opens(out)
    with packer.Writer(out, **SMALL) as writer:  # the next writer starts over
        writer.write(jpeg(99), 0)
    assert [key for key, _, _ in samples(out)] == ["000000000"] and not (out / STAGING_DIR).exists()


def test_sigkill_while_the_dataset_is_committed_leaves_nothing_that_opens(tmp_path: Path) -> None:
    """Killed inside __exit__ (packing the shards): no manifest; a build into OUT starts over."""
    import packer.writer.pack as pack_module

    out = tmp_path / "out"
    pid = os.fork()
    if pid == 0:
        try:
            original = pack_module._hash_file
            calls = [0]

            def dying(path):  # noqa: ANN001, ANN202
                calls[0] += 1
                if calls[0] == 2:
                    os.kill(os.getpid(), signal.SIGKILL)
                return original(path)

            pack_module._hash_file = dying
            with packer.Writer(out, **SMALL) as writer:
                for i in range(30):
                    writer.write(jpeg(i, (40, 40)), 0)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status)
    assert (out / STAGING_DIR).is_dir() and not opens(out)


def test_a_writer_refuses_an_output_holding_a_dataset_or_locked(tmp_path: Path) -> None:
    with packer.Writer(tmp_path / "out", **SMALL) as writer:
        writer.write(jpeg(0), 0)
    with pytest.raises(OutputExistsError, match="pass overwrite=True"):
        packer.Writer(tmp_path / "out", **SMALL).__enter__()
    with packer.Writer(tmp_path / "out", overwrite=True, **SMALL) as writer:
        writer.write(jpeg(1), 0)
        writer.write(jpeg(2), 0)
    assert len(samples(tmp_path / "out")) == 2
    (tmp_path / "src" / "a").mkdir(parents=True)
    (tmp_path / "src" / "a" / "1.jpg").write_bytes(jpeg(0))
    with packer.Writer(tmp_path / "busy", **SMALL) as writer:
        with pytest.raises(BuildLockedError):
            build(tmp_path / "src", tmp_path / "busy", BuildSettings(), RunOptions(workers=1))
        with pytest.raises(BuildLockedError):
            packer.Writer(tmp_path / "busy", **SMALL).__enter__()
        writer.write(jpeg(0), 0)


def test_writer_options_are_checked_and_named(tmp_path: Path) -> None:
    with pytest.raises(OptionError, match=r"--shard-size must be at least 1 byte .*got 0"):
        packer.Writer(tmp_path / "out", shard_size=0)
    with pytest.raises(OptionError, match=r"--shard-size must be at least the alignment \(4096 bytes\)"):
        packer.Writer(tmp_path / "out", shard_size=3, alignment=4096)
    with pytest.raises(OptionError, match="shard_size= is given twice"):
        packer.Writer(tmp_path / "out", shard_size=1 << 20, settings=BuildSettings(layout=LayoutSettings(shard_size=2 << 20)))
    with pytest.raises(OptionError, match="not for a Writer"):
        packer.Writer(tmp_path / "out", run=RunOptions(resume=True))
    with pytest.raises(OptionError, match="record the source kind 'python'"):
        packer.Writer(tmp_path / "out", settings=BuildSettings(source=packer.SourceSettings(kind="folder")))
    with pytest.raises(OptionError, match="unexpected keyword argument 'colour'"):
        packer.Writer(tmp_path / "out", colour="red")
    with pytest.raises(OptionError, match="settings must be a packer.BuildSettings"):
        packer.Writer(tmp_path / "out", settings={"codec": "raw"})
    with pytest.raises(OptionError, match="run must be a packer.RunOptions"):
        packer.Writer(tmp_path / "out", run={"workers": 2})
    writer = packer.Writer(tmp_path / "out")
    with pytest.raises(OptionError, match="not open"):
        writer.write(jpeg(0), 0)
    with writer:
        with pytest.raises(OptionError, match="already open"):
            writer.__enter__()
        writer.write(jpeg(0), 0)
    assert "closed" in repr(writer) and writer.samples_written == 1


def test_nothing_written_is_an_empty_source_with_a_report(tmp_path: Path) -> None:
    with pytest.raises(EmptySourceError, match="nothing to pack"):
        with packer.Writer(tmp_path / "out", workers=1) as writer:
            writer.write(b"junk", 0)
    assert "not-an-image" in (tmp_path / "out" / "build-report.jsonl").read_text()
    assert not opens(tmp_path / "out")


def test_classes_fields_and_whole_samples(tmp_path: Path) -> None:
    with packer.Writer(tmp_path / "out", classes=["zebra", "ant"], fields=["boxes=float32[N,4]", "caption=text"],
                       **SMALL) as writer:
        writer.write(jpeg(0), "ant", boxes=np.array([[1, 2, 3, 4]], dtype=np.float32), caption="one")
        writer.write({"image": jpeg(1), "label": "zebra", "boxes": [[0, 0, 1, 1], [2, 2, 3, 3]], "caption": "two",
                      "key": "second"})
        writer.write((jpeg(2), {"label": "zebra", "boxes": np.zeros((0, 4)), "caption": "three"}))
        writer.write(jpeg(3), "ant", boxes=[[1, 2, 3]], caption="bad box")  # bad-field
        writer.write(jpeg(4), "ant", caption="no boxes")  # a missing field: bad-field
        writer.write(jpeg(5), "ant", colour="red")  # not declared
        writer.write(jpeg(6), "lion", boxes=[], caption="unknown class")
    reasons = sorted(r.reason for r in writer.result.rejected)
    assert reasons == ["bad-field", "bad-field", "bad-field", "unknown-class"]
    with packer.open_dataset(tmp_path / "out") as ds:
        assert ds.classes == ("zebra", "ant")
        by_key = {ds.key(i): i for i in range(len(ds))}
        assert set(by_key) == {"000000000", "second", "000000002"}
        assert ds.value("boxes", by_key["second"]).tolist() == [[0, 0, 1, 1], [2, 2, 3, 3]]
        assert ds.value("caption", by_key["000000000"]) == "one"
        assert int(ds.labels[by_key["000000002"]]) == 0


@pytest.mark.parametrize("width", [5, 7, 8])
def test_the_plain_bmp_decoder_gives_pillows_pixels(width: int) -> None:
    """decode_image reads a 24-bit BMP with numpy (the Writer's spool format): Pillow's pixels, for
    row padding of 1-3 bytes or none, bottom-up and top-down rows; a cut one goes to Pillow."""
    from packer.decode import decode_image
    from packer.errors import DecodeError
    from packer.format import ImageFormat
    from packer.writer.samples import image_bytes

    pixels = np.random.default_rng(width).integers(0, 255, (6, width, 3), dtype=np.uint8)
    ours = image_bytes(pixels, reencoded=True)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "BMP")
    top_down = bytearray(buffer.getvalue())
    top_down[22:26] = (-6).to_bytes(4, "little", signed=True)
    rows = bytes(top_down[54:])
    stride = len(rows) // 6
    top_down[54:] = b"".join(rows[(5 - k) * stride:(6 - k) * stride] for k in range(6))
    for data in (ours, buffer.getvalue(), bytes(top_down)):
        assert np.array_equal(decode_image(data, ImageFormat.BMP), np.asarray(Image.open(io.BytesIO(data)).convert("RGB")))
        assert np.array_equal(decode_image(data, ImageFormat.BMP), pixels)
    with pytest.raises(DecodeError):
        decode_image(ours[:-5], ImageFormat.BMP)
