"""The source contract's rules on listings made by hand (packer/sources/contract.py): what a new door
gets for free by returning a RawListing, rule by rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from packer.errors import EmptySourceError, OptionError, SourceError
from packer.sources import RawListingBuilder, SourceOptions, apply_contract
from packer.sources.archive_listing import ArchiveListing
from packer.sources.members import RAW, ZIP_DEFLATED
from packer import LabelSettings

ROOT = Path("/nowhere")


def listing(*labels: object, kind: str = "manifest", declared: tuple[str, ...] = (), numbering: bool = False):  # type: ignore[no-untyped-def]
    """A door's listing: one entry per label; a label is None (none), an int, "text", or ("name", s)."""
    out = RawListingBuilder()
    for number, label in enumerate(labels):
        if label is None:
            written = RawListingBuilder.NONE
        elif isinstance(label, int):
            written = out.int_label(label)
        elif isinstance(label, tuple):
            written = out.name_label(label[1])
        else:
            written = out.text_label(str(label))
        out.add(f"k{number}.jpg".encode(), 10, written)
    return out.finish(ROOT, kind, declared_classes=declared, declared_numbering=numbering)


def apply(raw, **options):  # type: ignore[no-untyped-def]
    """The contract with the label settings (classes, label_type, classes_origin) and the rest as given."""
    labels = {name: options.pop(name) for name in ("classes", "label_type", "classes_origin") if name in options}
    result = apply_contract(raw, SourceOptions(labels=LabelSettings(**labels), **options))
    return result.classes, result.labels.tolist(), result.label_type, {r.key: r.reason for r in result.rejected}


# --- labels ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("labels, options, expected", [
    # auto: digits are integers, other text class names (sorted), "007" only looks like an integer
    (("3", "10"), {}, ((), [3, 10], "int", {})),
    (("zebra", "ant", "zebra"), {}, (("ant", "zebra"), [1, 0, 1], "str", {})),
    (("1", "007", "2"), {}, ((), [1, 2], "int", {"k1.jpg": "bad-label"})),
    # str: every label a name, integers too
    ((3, "3", "x"), {"label_type": "str"}, (("3", "x"), [0, 0, 1], "str", {})),
    # int: what is not an integer is rejected, a folder's class name too
    (("3", "cat", ("name", "dog")), {"label_type": "int"}, ((), [3], "int", {"k1.jpg": "bad-label", "k2.jpg": "bad-label"})),
    # a given list: text is a name, an integer indexes the list
    (("dog", "wolf", "1"), {"classes": ("cat", "dog", "1")}, (("cat", "dog", "1"), [1, 2], "str", {"k1.jpg": "unknown-class"})),
    ((0, 2, 3), {"classes": ("cat", "dog", "emu")}, (("cat", "dog", "emu"), [0, 2], "str", {"k2.jpg": "unknown-class"})),
    # unlabeled samples: rejected beside names, -1 beside integers, a dataset without labels alone
    (("cat", None), {}, (("cat",), [0], "str", {"k1.jpg": "unlabeled"})),
    ((4, None), {}, ((), [4, -1], "int", {})),
    ((None, None), {}, ((), [-1, -1], "none", {})),
    (("cat", None), {"classes": ("cat",)}, (("cat",), [0], "str", {"k1.jpg": "unlabeled"})),
    # append: the dataset's list extended by new names, sorted; or kept fixed
    (("emu", "ant", "cat"), {"classes": ("cat",), "new_classes": "extend"}, (("cat", "ant", "emu"), [2, 1, 0], "str", {})),
    (("emu", "cat"), {"classes": ("cat",), "new_classes": "reject"}, (("cat",), [0], "str", {"k0.jpg": "unknown-class"})),
    ((7, None), {"classes": ()}, ((), [7, -1], "int", {})),
])
def test_label_rules(labels: tuple[object, ...], options: dict, expected: tuple) -> None:
    assert apply(listing(*labels), **options) == expected


def test_a_source_numbering_its_classes_reads_integers_as_its_names() -> None:
    declared = ("cat", "dog", "emu")
    assert apply(listing(2, "0", 5, None, numbering=True, declared=declared, kind="parquet")) == (
        declared, [2, 0], "str", {"k2.jpg": "unknown-class", "k3.jpg": "unlabeled"})
    # crossed with a given list: through the names
    assert apply(listing(2, 0, numbering=True, declared=declared), classes=("emu", "cat"))[:2] == (("emu", "cat"), [0, 1])


def test_declared_names_join_the_names_found_and_must_be_unique() -> None:
    assert apply(listing(("name", "dog"), declared=("cat", "dog"), kind="folder"))[:2] == (("cat", "dog"), [1])
    with pytest.raises(SourceError, match="declares class names more than once \\('cat'\\)"):
        apply(listing(0, declared=("cat", "cat"), numbering=True))
    with pytest.raises(SourceError, match="unpaired surrogate"):
        apply(listing(0, declared=("c\ud800",), numbering=True))


@pytest.mark.parametrize("labels, options, message", [
    ((1, "cat"), {}, r"labels mix integers \(first: 1\) and class names \(first: 'cat'\): k0.jpg and k1.jpg"),
    (("cat",), {"classes": ()}, "the dataset has integer labels"),
])
def test_label_refusals(labels: tuple, options: dict, message: str) -> None:
    with pytest.raises(SourceError, match=message):
        apply(listing(*labels), **options)


def test_a_class_list_for_a_source_without_labels_is_an_option_error() -> None:
    with pytest.raises(OptionError, match="--classes does not apply to a COCO source"):
        apply(listing(None, kind="coco"), classes=("cat",))


def test_on_error_fail_refuses_label_rejections() -> None:
    with pytest.raises(SourceError, match=r"1 sample\(s\) are not in the class list \(--on-error fail\), e.g. k1.jpg"):
        apply(listing("cat", "wolf"), classes=("cat",), on_error="fail")


def test_text_that_is_not_unicode_is_a_rejection_not_a_crash() -> None:
    assert apply(listing("ok", "bad\udcff"))[3] == {"k1.jpg": "bad-label"}


# --- duplicates, sizes, the empty source --------------------------------------------------------------------

def test_duplicates_sizes_and_metadata() -> None:
    out = RawListingBuilder()
    out.add(b"a.jpg", 10, out.text_label("cat"))
    out.add(b"a.jpg", 10, out.text_label("cat"))  # a repeat
    out.add(b"big.jpg", 5000, out.text_label("cat"))
    out.add(b"meta.jpg", 10, out.text_label("cat"), meta=b"x" * (16 << 20 | 1))
    result = apply_contract(out.finish(ROOT, "manifest"), SourceOptions(max_file_size=4096))
    assert {r.key: r.reason for r in result.rejected} == {"a.jpg": "duplicate-entry", "big.jpg": "file-too-large",
                                                          "meta.jpg": "bad-metadata"}
    assert [result.key(i) for i in range(len(result))] == ["a.jpg"]


def test_the_empty_source_names_its_reasons() -> None:
    out = RawListingBuilder()
    out.reject("x.jpg", "missing", "file does not exist")
    with pytest.raises(EmptySourceError, match="what the door says \\(1 rejected: 1 missing"):
        apply_contract(out.finish(ROOT, "manifest", empty_what="what the door says"))


# --- archive members ----------------------------------------------------------------------------------------

def archive(tmp_path: Path, members: list[tuple[str, int, int, int, int]], size: int = 10_000,
            regions: list[tuple[int, int]] = ()):  # type: ignore[assignment, no-untyped-def]
    """A listing of members (key, offset, stored, expanded, method) in one container of ``size`` bytes;
    ``regions``: (start, end) of inner regions, used by members whose method is -1 - index."""
    container = tmp_path / "archive.bin"
    container.write_bytes(bytes(size))
    out = ArchiveListing(None)
    number = out.add_container(str(container))
    made = [out.add_region(number, start, end) for start, end in regions]
    for key, offset, stored, expanded, method in members:
        region = made[-1 - method] if method < 0 else None
        out.add(key, expanded, out.name_label(key.split("/")[0]), number, offset, stored,
                RAW if method < 0 else method, region=region)
    return out.finish(tmp_path, "zip")


def test_members_inside_their_archive_and_region(tmp_path: Path) -> None:
    raw = archive(tmp_path, [("c/in.jpg", 0, 100, 100, RAW), ("c/past.jpg", 9_950, 100, 100, RAW),
                             ("c/huge.jpg", 200, 1 << 40, 100, RAW), ("c/inner-ok.jpg", 1_000, 50, 50, -1),
                             ("c/inner-lies.jpg", 1_100, 200, 200, -1)], regions=[(1_000, 1_200)])
    result = apply_contract(raw)
    assert {r.key: r.reason for r in result.rejected} == {"c/past.jpg": "truncated", "c/huge.jpg": "truncated",
                                                          "c/inner-lies.jpg": "truncated"}
    assert "past the end of its class tar (bytes 1000..1200)" in {r.key: r.message for r in result.rejected}[
        "c/inner-lies.jpg"]


def test_overlapping_members_and_bombs(tmp_path: Path) -> None:
    raw = archive(tmp_path, [("c/a.jpg", 0, 500, 500, ZIP_DEFLATED), ("c/same.jpg", 0, 500, 500, ZIP_DEFLATED),
                             ("c/inside.jpg", 100, 50, 50, ZIP_DEFLATED), ("c/next.jpg", 530, 10, 10, ZIP_DEFLATED),
                             ("c/bomb.jpg", 2_000, 1_000, 5 << 20, ZIP_DEFLATED)])
    result = apply_contract(raw, SourceOptions(max_member_size=1 << 30))
    assert {r.key: r.reason for r in result.rejected} == {
        "c/same.jpg": "overlapping-member", "c/inside.jpg": "overlapping-member", "c/bomb.jpg": "decompression-bomb"}
    assert [result.key(i) for i in range(len(result))] == ["c/a.jpg", "c/next.jpg"]


def test_an_archive_whose_members_expand_past_its_size_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """Ten members of 900 KiB from 400 bytes each: no one of them over the per-member guard (1 MiB),
    together 1,800 times the archive."""
    import packer.sources.contract as contract

    members = [(f"c/{n}.jpg", n * 500, 400, 900 << 10, ZIP_DEFLATED) for n in range(10)]
    assert len(apply_contract(archive(tmp_path, members, size=5_000), SourceOptions(max_member_size=1 << 30))) == 10
    monkeypatch.setattr(contract, "_TOTAL_FLOOR", 0)  # the real floor (1 GiB) lets small archives through
    with pytest.raises(SourceError, match="over 1000 times its size, a decompression bomb"):
        apply_contract(archive(tmp_path, members, size=5_000), SourceOptions(max_member_size=1 << 30))


def test_oversize_members(tmp_path: Path) -> None:
    raw = archive(tmp_path, [("c/a.jpg", 0, 100, 100, RAW), ("c/b.jpg", 200, 3_000, 3_000, RAW)])
    result = apply_contract(raw, SourceOptions(max_member_size=1_000))
    assert {r.key: r.reason for r in result.rejected} == {"c/b.jpg": "oversize-member"}


def test_a_new_door_is_a_function_returning_a_raw_listing(tmp_path: Path) -> None:
    """What the HuggingFace save_to_disk door (or any other) writes: list, label as written, done."""
    def list_my_format(rows: list[tuple[str, object]]):  # type: ignore[no-untyped-def]
        out = RawListingBuilder()
        for key, label in rows:
            out.add(key.encode(), 1, out.text_label(label) if isinstance(label, str) else RawListingBuilder.NONE)
        return out.finish(tmp_path, "my-format", empty_what="my format lists nothing")

    result = apply_contract(list_my_format([("a", "dog"), ("b", "cat"), ("c", None)]),
                            SourceOptions(labels=LabelSettings(classes=("cat", "dog", "emu"))))
    assert result.classes == ("cat", "dog", "emu") and result.labels.tolist() == [1, 0]
    assert [(r.key, r.reason) for r in result.rejected] == [("c", "unlabeled")]
    assert np.array_equal(result.sizes, np.array([1, 1], dtype=np.uint64))
