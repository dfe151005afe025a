"""The source contract's rules pinned rule by rule (packer/sources/contract.py), on listings made by
hand: the exact messages, which row of a repeat is packed, the bounds at their edges, the class
list each label form gets, and what an error names as its place. Written against the contract's
surviving mutants (issue 41); ``test_source_contract.py`` holds the first, broader cases."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from packer import LabelSettings
from packer.errors import EmptySourceError, OptionError, SourceError
from packer.fields import parse_field_option
from packer.sources import RawListingBuilder, SourceOptions, apply_contract
from packer.sources.archive_listing import ArchiveListing
from packer.sources.contract import APPEND_ORIGIN, MAX_META_BYTES
from packer.sources.members import RAW, ZIP_DEFLATED

ROOT = Path("/nowhere")
SPOOL = Path("/elsewhere/spool")


def listing(*labels: object, kind: str = "manifest", declared: tuple = (), numbering: bool = False,
            **extra: object):  # type: ignore[no-untyped-def]
    """A door's listing, one entry ``k<i>.jpg`` per label: None (none), an int, "text" or ("name", s)."""
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
    return out.finish(ROOT, kind, declared_classes=declared, declared_numbering=numbering, **extra)


def contract(raw, **options):  # type: ignore[no-untyped-def]
    """apply_contract with the label settings (classes, label_type, classes_origin) and the rest as given."""
    labels = {name: options.pop(name) for name in ("classes", "label_type", "classes_origin") if name in options}
    return apply_contract(raw, SourceOptions(labels=LabelSettings(**labels), **options))


def reasons(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {r.key: r.reason for r in result.rejected}


def messages(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {r.key: r.message for r in result.rejected}


def keys(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [result.key(i) for i in range(len(result))]


# --- the settings values ----------------------------------------------------------------------------

def test_label_settings_default_origin_and_its_record() -> None:
    assert LabelSettings(classes_origin=None).classes_origin == "--classes"  # type: ignore[arg-type]
    record = LabelSettings(classes=("cat",), classes_origin="--classes-from /data/train").to_json()
    assert record == {"classes": ["cat"], "classes_origin": "--classes-from /data/train", "label_type": "auto",
                      "fields": []}
    assert LabelSettings(classes_origin="--classes-from x").to_json()["classes_origin"] is None


def test_source_options_check_bounds_and_messages() -> None:
    options = SourceOptions(max_member_size=1)
    assert options.check() is options  # one byte is a positive limit
    with pytest.raises(OptionError) as error:
        SourceOptions(max_member_size=0).check()
    assert error.value.message == "max_member_size must be a positive number of bytes, got 0"
    with pytest.raises(OptionError) as error:
        SourceOptions(new_classes="grow").check()
    assert error.value.message == "new_classes must be one of reject, extend, got 'grow'"


# --- 1. declared classes ----------------------------------------------------------------------------

@pytest.mark.parametrize("declared, message", [
    (("",), "the source declares a class name that is empty: ''"),
    (("c\ud800",), "the source declares a class name that holds an unpaired surrogate escape (not Unicode text): "
                   "'c\\ud800'"),
    ((3,), "the source declares a class name that is not a string: 3"),
    (("a", "b", "a"), "the source declares class names more than once ('a'): two classes would share one name "
                      "and be merged"),
    (tuple("gfedcba") * 2, "the source declares class names more than once ('a', 'b', 'c', 'd', 'e'): two classes "
                           "would share one name and be merged"),
], ids=["empty", "surrogate", "not-a-string", "one-repeat", "first-five-repeats"])
def test_declared_class_names_are_refused_with_the_name_and_the_root(declared: tuple, message: str) -> None:
    with pytest.raises(SourceError) as error:
        contract(listing(0, declared=declared, numbering=True))
    assert error.value.message == message
    assert error.value.path == str(ROOT)


# --- labels typed from text ---------------------------------------------------------------------------

def test_text_label_messages() -> None:
    long_name = "x" * 90 + "\udcff"
    long_loose = " " + "1" * 90
    long_int = "9" * 45
    huge = "1" * 5000  # past Python's int() digit limit: refused by its length, never parsed
    result = contract(listing("", long_name, long_loose, long_int, huge, "5"))
    assert messages(result) == {
        "k0.jpg": "label '' is empty",
        "k1.jpg": f"label {long_name[:80]!r} holds an unpaired surrogate escape (not Unicode text)",
        "k2.jpg": (f"label {long_loose[:80]!r} looks like an integer but is not plain ASCII digits (spaces, '_', "
                   f"'+', leading zeros or non-ASCII digits): packer reads labels strictly; fix it, or pass "
                   f"--label-type str to use every label as a class name"),
        "k3.jpg": f"label {long_int[:40]} does not fit in a signed 64-bit integer",
        "k4.jpg": f"label {huge[:40]} does not fit in a signed 64-bit integer",
    }
    assert set(reasons(result).values()) == {"bad-label"}
    assert result.labels.tolist() == [5] and result.label_type == "int"


def test_a_class_name_that_is_not_unicode_text_is_a_bad_label() -> None:
    """A door that gives a class name by structure (a folder, a class tar) without escaping it gets
    the same rule as text: a rejection, never an encoding error from sorting the class list."""
    long_name = "c" * 90 + "\udcff"
    result = contract(listing(("name", "dog"), ("name", long_name), "x\udcff", ("name", ""), ("name", "ant")))
    assert result.classes == ("ant", "dog") and result.labels.tolist() == [1, 0]
    assert messages(result) == {
        "k1.jpg": f"label {long_name[:80]!r} holds an unpaired surrogate escape (not Unicode text)",
        "k2.jpg": "label 'x\\udcff' holds an unpaired surrogate escape (not Unicode text)",
        "k3.jpg": "label '' is empty",
    }
    assert set(reasons(result).values()) == {"bad-label"}


def test_label_type_int_messages_for_text_and_for_folder_names() -> None:
    long_text = "c" * 90
    result = contract(listing(long_text, ("name", "dog"), "7"), label_type="int")
    assert messages(result) == {
        "k0.jpg": (f"label {long_text[:80]!r} is not an integer (--label-type int: plain ASCII digits with an "
                   f"optional '-', nothing else)"),
        "k1.jpg": "the label is a class name (the source's folder or class tar), not an integer (--label-type int)",
    }
    assert result.labels.tolist() == [7] and result.classes == ()


def test_label_type_str_reads_every_text_as_a_name() -> None:
    result = contract(listing("007", " 1", "12", 12), label_type="str")
    assert result.classes == (" 1", "007", "12") and result.labels.tolist() == [1, 0, 2, 2]
    assert result.rejected == [] and result.label_type == "str" and result.class_order == "sorted"


# --- the class list each label form gets ----------------------------------------------------------------

def test_class_order_says_where_the_list_came_from() -> None:
    assert contract(listing("cat")).class_order == "sorted"
    assert contract(listing("cat"), classes=("cat",)).class_order == "given"
    assert contract(listing(0, declared=("cat",), numbering=True)).class_order == "source"
    assert contract(listing("cat", declared=("cat", "dog"), declared_across_splits=True)).class_order == "splits"
    assert contract(listing(3)).class_order is None
    assert contract(listing(None)).class_order is None


def test_a_source_numbering_its_classes() -> None:
    declared = ("cat", "dog", "emu")
    result = contract(listing(3, "wolf", "emu", 1, -1, kind="parquet", declared=declared, numbering=True))
    assert result.classes == declared and result.labels.tolist() == [2, 1]
    assert messages(result) == {
        "k0.jpg": "label 3 is outside the 3 class names the source declares (ClassLabel)",
        "k1.jpg": "class 'wolf' is not one of the class names the source declares (ClassLabel)",
        "k4.jpg": "label -1 is outside the 3 class names the source declares (ClassLabel)",
    }
    assert reasons(result) == {"k0.jpg": "unknown-class", "k1.jpg": "unknown-class", "k4.jpg": "unknown-class"}


def test_a_source_numbering_no_classes_builds_an_unlabeled_dataset() -> None:
    result = contract(listing(None, 0, kind="parquet", numbering=True))
    assert result.classes == () and result.label_type == "none" and result.labels.tolist() == [-1]
    assert messages(result) == {"k1.jpg": "label 0 is outside the 0 class names the source declares (ClassLabel)"}


def test_an_append_to_integer_labels_without_any_label_is_unlabeled() -> None:
    result = contract(listing(None, None), classes=())
    assert result.label_type == "none" and result.labels.tolist() == [-1, -1] and result.classes == ()


def test_unlabeled_message() -> None:
    result = contract(listing("cat", None))
    assert messages(result) == {"k1.jpg": "the sample has no label, and this build's labels are class names (-1 is "
                                          "no class)"}


@pytest.mark.parametrize("kind, message", [
    ("coco", "--classes-from /x does not apply to a COCO source: its samples have no main label (-1); the "
             "objects' categories are the 'labels' field"),
    ("manifest", "--classes-from /x does not apply to a manifest source: its samples have no main label (-1)"),
    ("webdataset", "--classes-from /x does not apply to a WebDataset source: its samples have no main label (-1)"),
], ids=["coco", "manifest", "webdataset"])
def test_a_class_list_for_a_source_without_labels(kind: str, message: str) -> None:
    with pytest.raises(OptionError) as error:
        contract(listing(None, kind=kind), classes=("cat",), classes_origin="--classes-from /x")
    assert error.value.message == message
    # the dataset appended to brings its list: its unlabeled samples are rejected, not the option
    with pytest.raises(EmptySourceError):
        contract(listing(None, kind=kind), classes=("cat",), classes_origin=APPEND_ORIGIN)


@pytest.mark.parametrize("empty_path", [None, SPOOL], ids=["root", "empty-path"])
def test_label_refusals_name_the_source(empty_path: Path | None) -> None:
    where = str(empty_path or ROOT)
    with pytest.raises(SourceError) as error:
        contract(listing(1, "cat", empty_path=empty_path))
    assert error.value.path == where
    with pytest.raises(SourceError) as error:
        contract(listing("dog", "5", "6", empty_path=empty_path), classes=("dog",), new_classes="extend")
    assert error.value.message == ("the dataset has class names, but the source labels k1.jpg with the integer 5: "
                                   "appending would add a class named '5'; label the new source by class name (a "
                                   "dataset built with --label-type str reads every label as a name)")
    assert error.value.path == where
    with pytest.raises(SourceError) as error:
        contract(listing("cat", None, empty_path=empty_path), classes=("cat",), on_error="fail")
    assert error.value.message == ("1 sample(s) have no label (--on-error fail), e.g. k1.jpg: the sample has no "
                                   "label, and this build's labels are class names (-1 is no class)")
    assert error.value.path == where
    # always the source's root: the append refusal of class names
    with pytest.raises(SourceError) as error:
        contract(listing("cat", empty_path=empty_path), classes=())
    assert error.value.message == ("the dataset has integer labels (no class names), but the source labels its "
                                   "samples by class name (first: 'cat' at k0.jpg); label them by integer")
    assert error.value.path == str(ROOT)


def test_digits_appended_to_class_names() -> None:
    """``auto`` with extend refuses digits that are not a name; a listed name of digits is fine;
    ``str`` takes them as new names; a fixed list rejects them as unknown."""
    with pytest.raises(SourceError, match="labels k0.jpg with the integer 5"):
        contract(listing("5"), classes=("dog",), new_classes="extend")
    result = contract(listing("5", "dog"), classes=("dog", "5"), new_classes="extend")
    assert result.classes == ("dog", "5") and result.labels.tolist() == [1, 0]
    result = contract(listing("5", "dog", "ant"), classes=("dog",), new_classes="extend", label_type="str")
    assert result.classes == ("dog", "5", "ant") and result.labels.tolist() == [1, 0, 2]
    result = contract(listing("5", "dog"), classes=("dog",), new_classes="reject")
    assert reasons(result) == {"k0.jpg": "unknown-class"} and result.labels.tolist() == [0]
    # a folder's class name of digits is a name by structure, not text that reads as an integer
    result = contract(listing(("name", "5"), ("name", "dog")), classes=("dog",), new_classes="extend")
    assert result.classes == ("dog", "5") and result.labels.tolist() == [1, 0]


def test_on_error_fail_counts_only_label_rejections() -> None:
    with pytest.raises(SourceError) as error:
        contract(listing("cat", "wolf", "emu", ""), classes=("cat",), on_error="fail")
    assert error.value.message.startswith("2 sample(s) are not in the class list (--on-error fail), e.g. k1.jpg: "
                                          "class 'wolf' is not in the class list (--classes)")


# --- 2. duplicates ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, message", [
    ("manifest", "the manifest lists this path more than once"),
    ("coco", "the COCO file lists this file_name more than once; the first is packed"),
    ("folder", "the folder lists this key more than once (a name escaped to the same key); the first is packed"),
    ("python", "two samples were written with this key (an fn's \"key\"); the first is packed"),
    ("tar", "the archive holds this name more than once; the first is packed"),
], ids=["manifest", "coco", "folder", "python", "tar"])
def test_two_entries_under_one_key(kind: str, message: str) -> None:
    out = RawListingBuilder()
    out.add(b"a.jpg", 10, out.int_label(1))
    out.add(b"a.jpg", 20, out.int_label(2))
    result = apply_contract(out.finish(ROOT, kind))
    assert [(r.key, r.reason, r.message) for r in result.rejected] == [("a.jpg", "duplicate-entry", message)]
    assert result.labels.tolist() == [1] and result.sizes.tolist() == [10]


def test_the_first_listed_of_many_repeats_is_packed() -> None:
    """Many repeats of a few keys, interleaved: a sort that is not stable would keep another row."""
    out = RawListingBuilder()
    rng = np.random.default_rng(7)
    order = rng.integers(0, 10, size=3000)
    for row, key in enumerate(order.tolist()):
        out.add(f"key{key}.jpg".encode(), row + 1)
    result = apply_contract(out.finish(ROOT, "manifest"))
    first = {}
    for row, key in enumerate(order.tolist()):
        first.setdefault(f"key{key}.jpg", row + 1)
    assert dict(zip(keys(result), result.sizes.tolist())) == first
    assert len(result.rejected) == 3000 - len(first)


# --- 4. sizes ------------------------------------------------------------------------------------------

def test_file_and_metadata_bounds_at_their_edges() -> None:
    out = RawListingBuilder()
    out.add(b"at.jpg", 4096, meta=b"x" * MAX_META_BYTES)
    out.add(b"over.jpg", 4097)
    out.add(b"meta.jpg", 10, meta=b"x" * (MAX_META_BYTES + 1))
    result = apply_contract(out.finish(ROOT, "manifest"), SourceOptions(max_file_size=4096))
    assert keys(result) == ["at.jpg"]
    assert messages(result) == {
        "over.jpg": "is 4097 bytes; the limit (--max-file-size) is 4096",
        "meta.jpg": f"the sample's metadata is {MAX_META_BYTES + 1} bytes, over the {MAX_META_BYTES} a sample may hold",
    }


def test_a_file_size_past_float_precision_is_compared_exactly() -> None:
    out = RawListingBuilder()
    out.add(b"big.jpg", (1 << 60) + 1)
    out.add(b"ok.jpg", 1 << 60)
    result = apply_contract(out.finish(ROOT, "manifest"), SourceOptions(max_file_size=1 << 60))
    assert messages(result) == {"big.jpg": f"is {(1 << 60) + 1} bytes; the limit (--max-file-size) is {1 << 60}"}


# --- the result when rows are rejected -------------------------------------------------------------------

def test_a_listing_with_rejections_keeps_everything_of_the_rows_kept() -> None:
    out = RawListingBuilder()
    out.add(b"a.jpg", 10, out.text_label("cat"), meta=b'{"m":1}', stamp=11)
    out.add(b"b.jpg", 20, out.text_label("wolf"), meta=b'{"m":2}', stamp=12)
    out.add(b"c.jpg", 30, out.text_label("cat"), meta=b'{"m":3}', stamp=13)
    raw = out.finish(ROOT, "manifest")
    raw.warnings.append("a warning for the user")
    result = contract(raw, classes=("cat",))
    assert (result.kind, result.root, result.classes, result.label_type, result.class_order) == (
        "manifest", ROOT, ("cat",), "str", "given")
    assert keys(result) == ["a.jpg", "c.jpg"] and result.sizes.tolist() == [10, 30]
    assert result.stamps.tolist() == [11, 13] and result.labels.tolist() == [0, 0]
    assert [result.metadata(i) for i in range(2)] == [b'{"m":1}', b'{"m":3}']
    assert result.warnings == ["a warning for the user"] and result.warnings is not raw.warnings


def test_the_empty_source_error_carries_its_place_kind_and_hints() -> None:
    out = RawListingBuilder()
    out.add(b"a.jpg", 10, out.text_label("wolf"))
    with pytest.raises(EmptySourceError) as error:
        contract(out.finish(ROOT, "manifest", empty_what="nothing", empty_hints=("check the class list",)),
                 classes=("cat",))
    assert error.value.path == str(ROOT) and error.value.source_kind == "manifest"  # type: ignore[attr-defined]
    assert error.value.message.endswith("; to fix: check the class list")
    with pytest.raises(EmptySourceError) as error:
        contract(out.finish(ROOT, "manifest", empty_path=SPOOL), classes=("cat",))
    assert error.value.path == str(SPOOL)


# --- archives: members made by hand ---------------------------------------------------------------------

class Archive:
    """An ArchiveListing over real container files (``fields``: ``--field`` strings)."""

    def __init__(self, folder: Path, fields: tuple[str, ...] = ()) -> None:
        self.folder = folder
        self.out = ArchiveListing(None, fields=[parse_field_option(f) for f in fields])
        self.fields = fields

    def container(self, data: bytes, listed_size: int | None = None) -> int:
        """A container holding ``data``; ``listed_size``: the size recorded at listing, if not its own."""
        path = self.folder / f"container{len(self.out.containers)}.bin"
        path.write_bytes(data)
        number = self.out.add_container(str(path))
        if listed_size is not None:
            self.out.stats[number] = (listed_size, self.out.stats[number][1])
        return number

    def add(self, key: str, offset: int, stored: int, expanded: int | None = None, method: int = RAW,
            container: int = 0, region: int | None = None, mask: tuple[int, int] | None = None) -> None:
        """One member; ``mask``: (offset, size) of its ``mask`` image field's member."""
        values, members = (), None
        if self.fields:
            offset_mask, size_mask = mask or (0, 0)
            values = ((key + ".mask.png", size_mask),)
            members = {"mask": (container, offset_mask, size_mask)}
        self.out.add(key, stored if expanded is None else expanded, self.out.name_label("c"), container, offset,
                     stored, method, field_values=values, field_members=members, region=region)

    def finish(self, kind: str = "zip"):  # type: ignore[no-untyped-def]
        return self.out.finish(self.folder, kind)


def bytes_at(size: int, *parts: tuple[int, bytes]) -> bytes:
    data = bytearray(size)
    for offset, part in parts:
        data[offset:offset + len(part)] = part
    return bytes(data)


def test_truncated_member_messages_and_edges(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes(1_000))
    inner = archive.out.add_region(0, 500, 600)
    empty = archive.out.add_region(0, 0, 0)
    archive.add("c/fits.jpg", 900, 100)               # ends at the archive's last byte
    archive.add("c/empty-at-end.jpg", 1_000, 0)       # nothing past the end
    archive.add("c/past.jpg", 950, 100)
    archive.add("c/after.jpg", 1_200, 0)              # starts past the end, holds nothing
    archive.add("c/wild.jpg", (1 << 53) + 1, 10)
    archive.add("c/inner-ok.jpg", 500, 100, region=inner)
    archive.add("c/before-inner.jpg", 450, 20, region=inner)
    archive.add("c/in-empty.jpg", 0, 10, region=empty)
    result = apply_contract(archive.finish("tar"))
    assert keys(result) == ["c/fits.jpg", "c/empty-at-end.jpg", "c/inner-ok.jpg"]
    assert messages(result) == {
        "c/past.jpg": "the member claims bytes 950..1050, past the end of the archive (1000)",
        "c/after.jpg": "the member claims bytes 1200..1200, past the end of the archive (1000)",
        "c/wild.jpg": f"the member claims bytes {(1 << 53) + 1}..{(1 << 53) + 11}, past the end of the archive (1000)",
        "c/before-inner.jpg": "the member claims bytes 450..470, past the end of its class tar (bytes 500..600) (600)",
        "c/in-empty.jpg": "the member claims bytes 0..10, past the end of its class tar (bytes 0..0) (0)",
    }
    assert set(reasons(result).values()) == {"truncated"}


def test_overlaps_between_members(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes(1_000))
    archive.add("c/a.jpg", 0, 100)
    archive.add("c/b.jpg", 200, 100)
    archive.add("c/in-b.jpg", 250, 10)    # inside b, not inside a: every earlier member's reach counts
    archive.add("c/one.jpg", 50, 1)      # one byte inside a
    archive.add("c/nothing.jpg", 60, 0)  # holds no byte: overlaps nothing
    archive.add("c/next.jpg", 300, 10)   # starts where b ends
    result = apply_contract(archive.finish("tar"))
    assert keys(result) == ["c/a.jpg", "c/b.jpg", "c/nothing.jpg", "c/next.jpg"]
    assert messages(result) == {
        "c/in-b.jpg": "its bytes (from offset 250) overlap another member's: a crafted archive (the "
                      "overlapping-member zip bomb)",
        "c/one.jpg": "its bytes (from offset 50) overlap another member's: a crafted archive (the "
                     "overlapping-member zip bomb)",
    }


def test_two_members_that_overlap(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes(1_000))
    archive.add("c/a.jpg", 0, 100)
    archive.add("c/b.jpg", 99, 100)
    assert reasons(apply_contract(archive.finish("tar"))) == {"c/b.jpg": "overlapping-member"}


def test_members_of_different_containers_never_overlap(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes(100))
    archive.container(bytes(100))
    archive.add("c/a.jpg", 0, 100, container=0)   # to the last byte of the first container
    archive.add("c/b.jpg", 0, 50, container=1)
    archive.add("c/c.jpg", 50, 50, container=1)
    archive.add("c/d.jpg", 10, 20, container=1)
    result = apply_contract(archive.finish("tar"))
    assert keys(result) == ["c/a.jpg", "c/b.jpg", "c/c.jpg"] and reasons(result) == {"c/d.jpg": "overlapping-member"}
    assert [int(c) for c in result.members.container] == [0, 1, 1]
    assert result.members.offset.tolist() == [0, 0, 50]


def test_bombs_at_the_edges_of_the_ratio(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes(20_000))
    archive.add("c/at-ratio.jpg", 0, 2_000, 2_000_000, ZIP_DEFLATED)         # exactly 1000x
    archive.add("c/over-ratio.jpg", 3_000, 2_000, 2_000_001, ZIP_DEFLATED)
    archive.add("c/at-floor.jpg", 6_000, 1, 1 << 20, ZIP_DEFLATED)            # 1 MiB: under the floor
    archive.add("c/over-floor.jpg", 7_000, 1, (1 << 20) + 1, ZIP_DEFLATED)
    archive.add("c/modest.jpg", 8_000, 10_000, 3 << 20, ZIP_DEFLATED)        # 300x: compressed, not a bomb
    archive.add("c/raw.jpg", 19_000, 100, 2 << 20, RAW)                       # not compressed: never a bomb
    result = apply_contract(archive.finish(), SourceOptions(max_member_size=1 << 30))
    assert keys(result) == ["c/at-ratio.jpg", "c/at-floor.jpg", "c/modest.jpg", "c/raw.jpg"]
    assert messages(result) == {
        "c/over-ratio.jpg": "the member: 2000 compressed bytes declare 2000001 bytes (over 1000x)",
        "c/over-floor.jpg": "the member: 1 compressed bytes declare 1048577 bytes (over 1000x)",
    }


def test_a_bomb_declaring_more_than_float_precision_is_named_exactly(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes(1_000))
    archive.add("c/bomb.jpg", 0, 100, (1 << 60) + 1, ZIP_DEFLATED)
    archive.add("c/ok.jpg", 500, 100)
    result = apply_contract(archive.finish())
    assert messages(result) == {"c/bomb.jpg": f"the member: 100 compressed bytes declare {(1 << 60) + 1} bytes "
                                              f"(over 1000x)"}


def test_a_member_too_large_for_the_ratio_arithmetic_is_oversize_not_a_bomb(tmp_path: Path) -> None:
    """Members stored in 2**50 bytes or more are left out of the ratio (stored x 1000 would near
    u64); the size bound still holds them. The listed size of the container is what bounds them."""
    archive = Archive(tmp_path)
    archive.container(bytes(10), listed_size=1 << 52)
    archive.add("c/huge.jpg", 0, 1 << 50, 1 << 60, ZIP_DEFLATED)
    archive.add("c/ok.jpg", 1 << 51, 100)
    result = apply_contract(archive.finish())
    assert reasons(result) == {"c/huge.jpg": "oversize-member"} and keys(result) == ["c/ok.jpg"]


def test_member_size_bounds_at_their_edges(tmp_path: Path) -> None:
    limit = 64 << 10
    stored_limit = limit + (limit >> 6) + 65536  # incompressible data stored deflated takes a little more
    archive = Archive(tmp_path)
    archive.container(bytes(1_000_000))
    archive.add("c/at-limit.jpg", 0, limit)
    archive.add("c/over-limit.jpg", 100_000, limit + 1)
    archive.add("c/stored-at.jpg", 200_000, stored_limit, 100, ZIP_DEFLATED)
    archive.add("c/stored-over.jpg", 400_000, stored_limit + 1, 100, ZIP_DEFLATED)
    result = apply_contract(archive.finish(), SourceOptions(max_member_size=limit))
    assert keys(result) == ["c/at-limit.jpg", "c/stored-at.jpg"]
    assert messages(result) == {
        "c/over-limit.jpg": f"{limit + 1} bytes ({limit + 1} stored), over the limit of {limit}",
        "c/stored-over.jpg": f"100 bytes ({stored_limit + 1} stored), over the limit of {limit}",
    }
    assert set(reasons(result).values()) == {"oversize-member"}


def test_an_image_field_member_is_held_to_the_same_bounds(tmp_path: Path) -> None:
    archive = Archive(tmp_path, fields=("mask=image",))
    archive.container(bytes(10_000))
    archive.add("c/ok.jpg", 0, 100, mask=(100, 100))
    archive.add("c/big-mask.jpg", 1_000, 100, mask=(1_100, 1_001))
    archive.add("c/past.jpg", 3_000, 100, mask=(9_950, 100))
    archive.add("c/overlap.jpg", 4_000, 100, mask=(4_050, 100))
    result = apply_contract(archive.finish("webdataset"), SourceOptions(max_member_size=1_000))
    assert keys(result) == ["c/ok.jpg"]
    assert messages(result) == {
        "c/big-mask.jpg": "its 'mask' member is 1001 bytes (1001 stored), over the limit of 1000",
        "c/past.jpg": "its 'mask' member claims bytes 9950..10050, past the end of the archive (10000)",
        "c/overlap.jpg": "its bytes (from offset 4050) overlap another member's: a crafted archive (the "
                         "overlapping-member zip bomb)",
    }
    # the rows kept keep their field members and field values
    assert result.members.fields["mask"].offset.tolist() == [100]
    assert result.fields.image_key("mask", 0) == "c/ok.jpg.mask.png"
    assert result.fields.image_sizes["mask"].tolist() == [100]


def test_an_image_field_member_past_float_precision_is_named_exactly(tmp_path: Path) -> None:
    size = (1 << 60) + 1
    archive = Archive(tmp_path, fields=("mask=image",))
    archive.container(bytes(1_000), listed_size=1 << 62)
    archive.add("c/a.jpg", 0, 100, mask=(1_000, size))
    archive.add("c/b.jpg", 200, 100, mask=(300, 100))
    result = apply_contract(archive.finish("webdataset"))
    assert messages(result) == {"c/a.jpg": f"its 'mask' member is {size} bytes ({size} stored), over the limit of "
                                           f"{1 << 30}"}


def test_an_image_field_member_is_judged_by_its_own_size(tmp_path: Path) -> None:
    """A compressed image field's member next to a main image of over 1000 times its size: the ratio
    is the field member's own (an image field's size is its stored size), not the main image's."""
    archive = Archive(tmp_path, fields=("mask=image",))
    archive.container(bytes(3_000_000))
    archive.add("c/a.jpg", 0, 100, 2_000_000_000, mask=(1_000, 1_200_000))
    raw = archive.finish("webdataset")
    raw.members.fields["mask"].method[:] = ZIP_DEFLATED
    result = apply_contract(raw, SourceOptions(max_member_size=1 << 32))
    assert keys(result) == ["c/a.jpg"] and result.rejected == []


def test_bounds_past_float_precision_are_exact(tmp_path: Path) -> None:
    """Offsets, ends and sizes past 2**53 (a container listed as huge) are compared as integers:
    a float rounds 2**53 + 3 up to the start of a region it lies before."""
    archive = Archive(tmp_path)
    archive.container(bytes(100), listed_size=1 << 55)
    base = 1 << 53
    starts_after = archive.out.add_region(0, base + 4, base + 100)
    ends_before = archive.out.add_region(0, base + 200, base + 202)
    archive.add("c/ok.jpg", 0, 10)
    archive.add("c/before.jpg", base + 3, 10, region=starts_after)   # a byte before its region
    archive.add("c/past.jpg", base + 201, 2, region=ends_before)     # a byte past its region
    archive.add("c/bomb.jpg", 1 << 50, 1 << 45, (1 << 45) * 1000 + 1, ZIP_DEFLATED)  # one byte over 1000x
    stored_limit = base + (base >> 6) + 65536
    archive.add("c/stored.jpg", 1 << 54, stored_limit + 1, 100, ZIP_DEFLATED)  # a byte over the stored bound
    result = apply_contract(archive.finish(), SourceOptions(max_member_size=base))
    assert keys(result) == ["c/ok.jpg"]
    assert reasons(result) == {"c/before.jpg": "truncated", "c/past.jpg": "truncated",
                               "c/bomb.jpg": "decompression-bomb", "c/stored.jpg": "oversize-member"}


# --- the total of a container ---------------------------------------------------------------------------

@pytest.fixture
def no_total_floor(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real floor (1 GiB) lets every small archive through; the rule is seen without it."""
    import packer.sources.contract as module

    monkeypatch.setattr(module, "_TOTAL_FLOOR", 0)


def test_the_total_at_its_edge(tmp_path: Path, no_total_floor: None) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes(1_000))
    archive.add("c/a.jpg", 0, 400, 500_000, ZIP_DEFLATED)
    archive.add("c/b.jpg", 500, 400, 500_000, ZIP_DEFLATED)  # 1,000,000 from 1,000: exactly 1000x
    assert len(apply_contract(archive.finish(), SourceOptions(max_member_size=1 << 30))) == 2
    archive.add("c/c.jpg", 1_000, 0, 1)  # a byte more (at the end, holding nothing)
    with pytest.raises(SourceError) as error:
        apply_contract(archive.finish(), SourceOptions(max_member_size=1 << 30))
    assert error.value.message == ("the archive's members expand to 1000001 bytes from 1000: over 1000 times its "
                                   "size, a decompression bomb")
    assert error.value.path == str(tmp_path / "container0.bin")


def test_the_total_counts_main_and_field_members(tmp_path: Path, no_total_floor: None) -> None:
    """Each image field's member counts with its own size: 100 + 999,500 x 2 main bytes and a
    1,000-byte mask from 2,000 bytes is one byte past 1000x per byte."""
    archive = Archive(tmp_path, fields=("mask=image",))
    archive.container(bytes(2_000))
    archive.add("c/a.jpg", 0, 100, 100, ZIP_DEFLATED, mask=(1_000, 1_000))
    archive.add("c/b.jpg", 200, 100, 999_500, ZIP_DEFLATED)
    archive.add("c/c.jpg", 400, 100, 999_500, ZIP_DEFLATED)
    with pytest.raises(SourceError, match="expand to 2000100 bytes from 2000: over 1000 times"):
        apply_contract(archive.finish("webdataset"), SourceOptions(max_member_size=1 << 30))


def test_the_total_is_per_container(tmp_path: Path, no_total_floor: None) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes(10_000))
    archive.container(bytes(10))
    archive.add("c/a.jpg", 0, 100, 90_000, ZIP_DEFLATED)
    archive.add("c/b.jpg", 1_000, 5_000, 5_000_000, ZIP_DEFLATED)  # 509x the first container, 509,000x the second
    result = apply_contract(archive.finish(), SourceOptions(max_member_size=1 << 30))
    assert keys(result) == ["c/a.jpg", "c/b.jpg"]


def test_a_container_listed_as_huge_bounds_its_total_in_floats(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes(100), listed_size=1 << 60)  # 1000 times it does not fit in an int64
    archive.add("c/a.jpg", 0, 100)
    assert keys(apply_contract(archive.finish())) == ["c/a.jpg"]


# --- 2. key collisions in archives --------------------------------------------------------------------------

def raw_with_hashes(raw, hashes: dict[str, int]):  # type: ignore[no-untyped-def]
    """The listing with chosen key hashes (the order repeats are met in; equal hashes for other keys)."""
    return dataclasses.replace(raw, key_hashes=np.array([hashes[raw.key(i)] for i in range(len(raw))],
                                                        dtype=np.uint64))


def test_a_key_naming_two_different_images_refuses_the_build(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes_at(300, (0, b"A" * 100), (200, b"B" * 100)))
    archive.add("c/a.jpg", 0, 100)
    archive.add("c/a.jpg", 200, 100)  # at the limit, to the container's last byte
    with pytest.raises(SourceError) as error:
        apply_contract(archive.finish("tar"), SourceOptions(max_member_size=100))
    assert error.value.message == (
        "1 key(s) name two different images (a key collision: packer keys samples by name, and one of each pair "
        "would be lost), e.g. 'c/a.jpg' (100 bytes each, different); rename them, or build the parts as separate "
        "datasets")
    assert error.value.path == str(tmp_path)


def test_the_same_bytes_twice_are_a_duplicate(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes_at(300, (0, b"A" * 100), (200, b"A" * 100)))
    archive.add("c/a.jpg", 0, 100)
    archive.add("c/a.jpg", 200, 100)
    result = apply_contract(archive.finish("tar"))
    assert keys(result) == ["c/a.jpg"] and result.members.offset.tolist() == [0]
    assert reasons(result) == {"c/a.jpg": "duplicate-entry"}


def test_a_repeat_is_compared_with_the_first_listed(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes_at(400, (0, b"A" * 100), (100, b"A" * 100), (200, b"B" * 100)))
    archive.add("c/a.jpg", 0, 100)
    archive.add("c/a.jpg", 100, 100)  # the same bytes
    archive.add("c/a.jpg", 200, 100)  # other bytes than the first
    with pytest.raises(SourceError, match="1 key\\(s\\) name two different images"):
        apply_contract(archive.finish("tar"))


def test_keys_sharing_a_hash_are_told_apart(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes_at(400, (0, b"A" * 100), (100, b"B" * 100), (200, b"C" * 100)))
    archive.add("c/a.jpg", 0, 100)
    archive.add("c/b.jpg", 100, 100)
    archive.add("c/b.jpg", 200, 100)
    with pytest.raises(SourceError, match="e.g. 'c/b.jpg' \\(100 bytes each, different\\)"):
        apply_contract(raw_with_hashes(archive.finish("tar"), {"c/a.jpg": 7, "c/b.jpg": 7}))
    # files: the repeat is a duplicate, the other key is packed
    out = RawListingBuilder()
    for key in (b"a.jpg", b"b.jpg", b"b.jpg"):
        out.add(key, 10)
    result = apply_contract(raw_with_hashes(out.finish(ROOT, "manifest"), {"a.jpg": 7, "b.jpg": 7}))
    assert keys(result) == ["a.jpg", "b.jpg"] and [r.key for r in result.rejected] == ["b.jpg"]


def test_collisions_are_counted_and_the_first_three_named(tmp_path: Path) -> None:
    archive = Archive(tmp_path)
    archive.container(bytes_at(1_000, *((n * 100, bytes([65 + n]) * 50) for n in range(10))))
    names = ["c/d.jpg", "c/e.jpg", "c/f.jpg", "c/g.jpg"]
    for number, name in enumerate(names):
        archive.add(name, number * 200, 50)
        archive.add(name, number * 200 + 100, 40 if number == 0 else 50)  # the first pair differs in size
    raw = raw_with_hashes(archive.finish("tar"), {name: number for number, name in enumerate(names)})
    with pytest.raises(SourceError) as error:
        apply_contract(raw)
    assert error.value.message.startswith(
        "4 key(s) name two different images (a key collision: packer keys samples by name, and one of each pair "
        "would be lost), e.g. 'c/d.jpg' (50 and 40 bytes); 'c/e.jpg' (50 bytes each, different); 'c/f.jpg' (50 "
        "bytes each, different); rename them")


def test_members_that_cannot_be_read_are_not_compared(tmp_path: Path) -> None:
    """A repeat is only read when both members lie inside their container as listed and under the
    size bound, and a member that does not read back stays a duplicate."""
    archive = Archive(tmp_path)
    data = bytes_at(1_000, (0, b"A" * 100), (100, b"B" * 101), (300, b"C" * 60), (500, b"D" * 100),
                    (700, b"E" * 100), (800, b"G" * 50), (850, b"H" * 50), (900, b"F" * 100))
    archive.container(data, listed_size=950)
    archive.add("c/big.jpg", 0, 100)
    archive.add("c/big.jpg", 100, 101)                     # over the bound: not read (a duplicate)
    archive.add("c/zip.jpg", 200, 101, 50, ZIP_DEFLATED)   # kept (stored within the slack) but over the bound
    archive.add("c/zip.jpg", 300, 60)
    archive.add("c/noheader.jpg", 400, 50, 100, ZIP_DEFLATED)  # no local header there: does not read back
    archive.add("c/noheader.jpg", 500, 100)
    archive.add("c/grown.jpg", 700, 100)
    archive.add("c/grown.jpg", 900, 100)                   # past the size listed; the file grew since
    hashes = {"c/zip.jpg": 1, "c/big.jpg": 2, "c/noheader.jpg": 3, "c/grown.jpg": 4}
    result = apply_contract(raw_with_hashes(archive.finish(), hashes), SourceOptions(max_member_size=100))
    assert keys(result) == ["c/big.jpg", "c/zip.jpg", "c/noheader.jpg", "c/grown.jpg"]
    assert reasons(result) == {"c/big.jpg": "duplicate-entry", "c/zip.jpg": "duplicate-entry",
                               "c/noheader.jpg": "duplicate-entry", "c/grown.jpg": "duplicate-entry"}
    # and a collision after pairs that are skipped is still found
    archive.add("c/z.jpg", 800, 50)
    archive.add("c/z.jpg", 850, 50)
    with pytest.raises(SourceError, match="'c/z.jpg' \\(50 bytes each, different\\)"):
        apply_contract(raw_with_hashes(archive.finish(), {**hashes, "c/z.jpg": 5}), SourceOptions(max_member_size=100))
