"""Building datasets: ``packer build`` and ``packer append``.

The build is split in steps that any scheduler can run (see ``--part`` and ``--finish``):

1. **plan** (``plan``, one process): detect the source's kind once and list the source
   (``packer.sources``), compute the shard plan, save it to ``OUT/.packer-build/plan.pkp``. The plan
   is a pure function of the listing and the build settings (``settings``: ``BuildSettings``, what
   is recorded; ``RunOptions``, how this run goes).
2. **pack shards** (``pack``; any number of processes, machines or Ray tasks, see ``engines``):
   each planned shard is packed by one task that reads its files, checks them (``imageinfo``),
   encodes them (``codecs``), writes a temporary file, fsyncs it and renames it to its
   content-addressed name in ``OUT/shards/``, then writes a shard record (``records``).
3. **finish** (``commit``, one process): check every planned shard has a record from this plan,
   concatenate the records into the index, write the build report, then write ``manifest.json``
   last with ``os.replace`` (``atomic``) and fsync the folder. Only now does the folder open as a
   dataset.

``run`` strings the steps together; ``staging`` owns the working folder and the lock; ``append``
adds a generation of new shards to a dataset. A build killed at any moment leaves either the
previous dataset or nothing that opens; ``--resume`` reuses the plan and every finished record.
"""

from __future__ import annotations

from .commit import BuildResult
from .run import build, finish
from .settings import BuildOptions, BuildSettings, CheckSettings, LayoutSettings, RunOptions

# ``append`` stays in its module (``packer.writer.append.append``, or ``packer.append_dataset``):
# re-exporting it here would shadow the module of the same name. ``BuildOptions`` is the
# deprecated flat spelling of ``BuildSettings``.
__all__ = ["build", "finish", "BuildSettings", "LayoutSettings", "CheckSettings", "RunOptions", "BuildOptions",
           "BuildResult"]
