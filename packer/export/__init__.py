"""``packer export``: a dataset's samples back out as a folder, a tar or WebDataset shards.

A user is never locked in: the stored bytes of a ``passthrough`` build are the source files,
written back verbatim. Which round trips (export, then build the export) give back which parts
of the dataset is stated in ``docs/guides/export.md`` and checked by
``tests/export/test_round_trip_matrix.py``, row by row.

The parts (one module each):

* ``select``: which samples (``--classes``, ``--samples START:STOP``, ``--keys FILE``; a listed
  key the dataset lacks is an error, the keys file is read bounded and regular-file only).
* ``plan``: where each sample goes, the one naming rule of every target, and the checks made
  on every name before the first byte is written: safe names, unique paths and keys, one label
  per class folder, and that a build reads the entries back as they are (its own side-file
  rule run on them). A sample failing one is refused (``UnsafeExportError``, nothing written)
  or, with ``skip_unsafe``, skipped, counted per reason and listed.
* ``safewrite``: the one safe writer: a stage beside OUT under an unpredictable name, every file
  created relative to an open folder descriptor with no symlink followed, published atomically
  (a killed export leaves the old OUT or nothing), ``--overwrite`` replacing OUT as a whole,
  never writing into it.
* ``folder``, ``tar``, ``webdataset``: the targets.

Names. A sample's path is its key when the key's first folder is the sample's class (a folder
build: ``cat/001.jpg``), else ``<class>/<key>`` (a manifest's ``images/0001.jpg`` labelled
``dog`` goes to ``dog/images/0001.jpg``, so a folder build of the export gives the same labels).
The class is its class name, or its integer label; a sample without a label (-1) keeps a key
that has a folder, and goes under ``unlabeled/`` otherwise. WebDataset members are named by the
key as it is (``.cls`` holds the label). A key packed under the escaped form of a name that was
not UTF-8 (``packer._internal.names``) is written under the original bytes.

Declared fields (``formats/SPEC.md`` §14) come out as the side files a build reads back
(``sources/sidefiles.py``), named after the field's *source*: for an image ``cat/001.jpg`` (key
``cat/001``), an image field with source ``mask`` as ``cat/001.mask.<ext>`` (``mask.png`` as
``cat/001.mask.png``), a value field with source ``txt`` as the text member ``cat/001.txt``,
one ending in ``.json`` as that member, every other in the ``cat/001.json`` object under its
source. ``packer build OUT NEW --field ...`` with the same declarations rebuilds the fields.
"""

from __future__ import annotations

from ..errors import UnsafeExportError
from .plan import SKIP_REASONS, name_problem
from .run import EXPORT_TARGETS, ExportResult, export
from .select import read_keys_file, select_samples

__all__ = ["EXPORT_TARGETS", "ExportResult", "export", "select_samples", "read_keys_file", "SKIP_REASONS",
           "UnsafeExportError", "name_problem"]
