"""``packer.Writer``: write a dataset sample by sample from Python, with ``packer build``'s guarantees.

    with packer.Writer("out/train", classes=["cat", "dog"]) as writer:
        for image, label in samples:
            writer.write(image, label)

The shape MosaicML's ``MDSWriter`` and WebDataset's ``ShardWriter`` users know; underneath it is a
build. ``write`` appends the sample's bytes to a spool in OUT's staging folder and its row to
flat arrays (``sources/python.py``); when the ``with`` block ends without an exception the spool
is listed like any source and goes through the source contract, the seeded shuffle plan, the
per-file checks and codec, and the commit with the manifest last (``spooled.commit_listing``).
An exception or Ctrl-C inside the block removes the staging folder and leaves no dataset; a
SIGKILL leaves a staging folder and no manifest (nothing opens), removed by the next build or
Writer into OUT. What it costs: every sample's bytes are written twice (once to the spool, once
to its shard); the benchmark (``benchmarks/bench_writers.py``) measures it.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from ..errors import BuildError, OptionError
from ..sources.python import PYTHON_KIND, SampleSpool, SampleValueError, python_listing, written_label
from .commit import BuildResult
from .samples import image_bytes, json_values, sample_parts
from .settings import BuildSettings, RunOptions
from .spooled import UNSET, open_output, print_summary, python_settings

__all__ = ["Writer"]

#: Keys the Writer gives: the number of the ``write`` call, zero-padded (sorted like the writes).
_KEY_WIDTH = 9


class Writer:
    """Writes a dataset sample by sample (a context manager); see the module docstring.

    Args:
        out: the output folder, or a dataset URL (``s3://bucket/ds``: packed in the node cache,
            uploaded through the same path as ``packer build``, the manifest last).
        classes: the class list (label ``i`` is ``classes[i]``; a ``str`` label must be one of
            them); None: the names written, sorted, or integer labels as written.
        fields: declared fields (``"boxes=float32[N,4]"``, ``packer.fields.FieldSpec`` or
            declaration dicts); their values are ``write``'s keyword arguments.
        codec: the codec spec (``"passthrough"``, ``"raw:size=32x32"``, ``"jpeg:quality=90"``):
            decoded images are stored as lossless PNG with ``passthrough``, or made into the
            codec's payload at packing.
        shard_size, alignment, shuffle, seed: the layout (``packer.LayoutSettings``); with
            ``shuffle`` (the default) samples are placed in a seeded order, so data written class
            by class does not come back as class-pure blocks.
        on_error: ``"skip"`` (a bad sample is a rejection in the build report) or ``"fail"``
            (it raises: at ``write`` for a value that is not a sample, at the end for bytes that
            are not an image).
        label_type: how labels are read (``packer.LabelSettings.label_type``).
        settings, run: a whole ``packer.BuildSettings`` / ``packer.RunOptions`` (the keywords
            above are shorthands for their members; giving one both ways with different values
            is refused).
        workers, engine, overwrite, progress, remote: ``packer.RunOptions`` members: packing
            processes, ``"local"`` or ``"ray"``, replace a dataset in OUT, a progress bar and a
            summary on stderr, ``packer.remote.RemoteOptions`` for a URL.

    Attributes:
        result: the ``BuildResult`` once the block has ended (None before, or after a failure).

    Raises:
        OptionError, OutputExistsError, BuildLockedError: when the ``with`` block is entered.
    """

    def __init__(self, out: Any, *, classes: Sequence[str] | None = None, fields: Sequence[Any] | None = None,
                 codec: str = UNSET, shard_size: int = UNSET, alignment: int = UNSET, shuffle: bool = UNSET,
                 seed: int = UNSET, on_error: str = UNSET, label_type: str = UNSET,
                 settings: BuildSettings | None = None, run: RunOptions | None = None, **run_keywords: Any) -> None:
        layout = {name: value for name, value in (("shard_size", shard_size), ("alignment", alignment),
                                                  ("shuffle", shuffle), ("seed", seed)) if value is not UNSET}
        if on_error is not UNSET:
            run_keywords["on_error"] = on_error
        self.settings, self.run = python_settings(settings, run, call="packer.Writer", classes=classes, fields=fields,
                                                  codec=codec, label_type=label_type, **layout, **run_keywords)
        if self.run.split or self.run.resume:
            raise OptionError("packer.Writer: part, plan_only and resume are not for a Writer (its samples live "
                              "only in the process that writes them); write again, or use packer.pack(resume=True)")
        self.out = out
        self.result: BuildResult | None = None
        specs = self.settings.labels.field_specs
        self._specs = specs
        self._reencoded = self.settings.codec.split(":", 1)[0] != "passthrough"
        self._output: Any = None
        self._spool: SampleSpool | None = None
        self._count = 0
        self._given: dict[int, str] = {}  # xxh3 of a key given to write() -> that key (given keys only)

    # --- the block ---
    def __enter__(self) -> "Writer":
        if self._output is not None:
            raise OptionError("packer.Writer: this writer is already open (one with block per Writer)")
        self._output = open_output(self.out, self.run, call="packer.Writer")
        try:
            self._spool = SampleSpool(self._output.spool_dir / f"writer-{os.getpid()}.spool",
                                      image_fields=[s.name for s in self._specs if s.kind == "image"],
                                      value_fields=any(s.kind != "image" for s in self._specs))
        except BaseException:
            self._output.close(failed=True)
            self._output = None
            raise
        return self

    def __exit__(self, kind: Any, error: Any, trace: Any) -> None:
        if self._output is None:
            return
        output, spool = self._output, self._spool
        self._output = self._spool = None
        if kind is not None:  # an exception or Ctrl-C in the block: no dataset, no staging left
            if spool is not None:
                spool.abort()
            output.close(failed=True)
            return
        try:
            rows = spool.close()  # type: ignore[union-attr]
            self.result = output.commit(lambda: python_listing([rows], output.spool_dir, specs=self._specs,
                                                               empty_what="nothing was written"),
                                        self.settings, source="python:Writer")
        except BaseException:
            output.close(failed=True)
            raise
        output.close(failed=False)
        if self.run.progress:
            print_summary(self.result, self.out, what="packer.Writer")

    def close(self) -> BuildResult | None:
        """End writing without a ``with`` block: list, pack and commit (``__exit__`` without an
        exception). Returns the ``BuildResult``."""
        self.__exit__(None, None, None)
        return self.result

    def abort(self) -> None:
        """End writing without a dataset (``__exit__`` with an exception): the staging folder goes."""
        self.__exit__(KeyboardInterrupt, None, None)

    @property
    def samples_written(self) -> int:
        """The number of ``write`` calls so far."""
        return self._count

    # --- one sample ---
    def write(self, image: Any, label: Any = None, key: str | None = None, **fields: Any) -> str:
        """Spool one sample; returns its key.

        Args:
            image: encoded image bytes, a PIL image, a uint8 HxWxC numpy array or CxHxW tensor;
                or a whole sample (a dict ``{"image", "label", "key", **fields}`` or an
                ``(image, target)`` pair) when nothing else is given.
            label: an ``int``, a class name or None (no label).
            key: the sample's key (default: the number of this write, zero-padded to 9 digits);
                keys must be unique.
            fields: the declared fields' values (numbers, lists, numpy arrays, tensors, text; an
                image field's image).

        Raises:
            OptionError: outside the ``with`` block, or a key given twice (naming it).
            BuildError: ``on_error="fail"`` and the value is not a sample (a bad label, an
                image that is not bytes or pixels, a field that is not declared).
        """
        spool = self._spool
        if spool is None:
            raise OptionError("packer.Writer.write: the writer is not open (write inside `with packer.Writer(...) "
                              "as writer:`)")
        if label is None and key is None and not fields and isinstance(image, (dict, tuple)):
            parts = sample_parts(image) if not isinstance(image, tuple) or len(image) == 2 else None
            if parts is not None:
                image, label, key, fields = parts.image, parts.label, parts.key, parts.fields
        number = self._count
        self._count += 1
        key = self._key(number, key)
        try:
            data = image_bytes(image, reencoded=self._reencoded)
            written = written_label(label)
            values, images = json_values(fields, self._specs) if (fields or self._specs) else (b"", {})
        except SampleValueError as exc:
            if self.run.on_error == "fail":
                raise BuildError(f"{exc.reason}: {exc.message} (on_error='fail')", path=key) from None
            spool.reject(key, exc.reason, exc.message)
            return key
        spool.add(key, data, written, values, images)
        return key

    def _key(self, number: int, given: str | None) -> str:
        """The sample's key: the one given (unique), or the write's number."""
        import xxhash

        if given is None:
            key = f"{number:0{_KEY_WIDTH}d}"
            if self._given and self._given.get(xxhash.xxh3_64_intdigest(key.encode())) == key:
                raise OptionError(f"packer.Writer.write: key {key!r}, the number of this write, was given to an "
                                  f"earlier write; give every sample a key, or none")
            return key
        if not isinstance(given, str) or not given:
            raise OptionError(f"packer.Writer.write: a key is non-empty text, got {given!r}")
        digest = xxhash.xxh3_64_intdigest(given.encode("utf-8", "surrogatepass"))
        if self._given.get(digest) == given or (given.isdigit() and len(given) >= _KEY_WIDTH
                                                 and int(given) < number and f"{int(given):0{_KEY_WIDTH}d}" == given):
            raise OptionError(f"packer.Writer.write: key {given!r} was already written; keys must be unique")
        self._given[digest] = given
        return given

    def __repr__(self) -> str:
        state = "open" if self._spool is not None else "closed"
        return f"packer.Writer({str(self.out)!r}, {state}, {self._count} written, kind={PYTHON_KIND!r})"
