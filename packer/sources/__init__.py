"""Sources: every kind of input ``packer build`` takes, and the one contract they all go through.

**The contract** (``contract.py``). A *door* is a function ``(source, DoorOptions) -> RawListing``
(``listing.py``): it only lists. Every entry with its label as written (a class name, an
integer, text that is one or the other, or none), the class names the source itself declares
(empty class folders, a ``ClassLabel`` list), where an archive member lives and the byte range
it must stay inside, field values, and the entries it could not list, each with a reason. A door
never receives the class list, ``--label-type``, the unlabeled rule or the size limits:
``list_source(source, SourceOptions)`` hands the door its ``DoorOptions`` (the recorded
``SourceSettings`` with the declared fields) and applies every rule (``LabelSettings``)
to what comes back, in one place (``apply_contract``): declared names unique, duplicates, member
bounds and overlaps, decompression bombs, per-sample size limits, the label type, the class list
(given, extended by ``append``, the source's own, or derived and sorted), unlabeled samples, and
the empty-source error. The ``SourceListing`` it returns (numbered labels, the class list, the
rejections for the report) is all the writer sees.

**The doors**: ``folder`` (ImageFolder, with side files under ``--field``), ``manifest`` (CSV,
TSV, JSONL), ``tar`` (plain or compressed, tar of class tars, concatenated parts), ``zip``,
``webdataset`` (a tar of samples, a folder of shards, a brace pattern), ``parquet``
(HuggingFace), ``coco`` (detection annotations). ``detect.list_raw`` recognises a source by its
bytes and calls its door. A new door is one module returning a ``RawListing`` built with
``RawListingBuilder`` (or ``archive_listing.ArchiveListing`` for an archive), added to ``list_raw``;
``tests/sources/test_every_door_matrix.py`` then holds it to the folder path's promises.
"""

from __future__ import annotations

from .contract import APPEND_ORIGIN, LabelSettings, SourceOptions, apply_contract, field_declaration, list_source
from .detect import SOURCE_KINDS, detect_kind, list_raw, source_root
from .labels import LABEL_TYPES, check_label_type
from .listing import (
    RECORDED_KINDS,
    REJECTION_REASONS,
    DoorOptions,
    RawListing,
    RawListingBuilder,
    Rejection,
    SourceListing,
    SourceSettings,
    empty_source_error,
    file_stamp,
    rejection_summary,
    select_rows,
)

__all__ = ["SourceOptions", "SourceSettings", "LabelSettings", "APPEND_ORIGIN", "list_source", "apply_contract",
           "field_declaration", "DoorOptions", "RawListing", "RawListingBuilder", "SOURCE_KINDS", "RECORDED_KINDS",
           "detect_kind", "source_root", "list_raw", "LABEL_TYPES", "REJECTION_REASONS", "Rejection", "SourceListing",
           "check_label_type", "empty_source_error", "file_stamp", "rejection_summary", "select_rows"]
