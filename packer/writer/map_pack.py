"""``packer.pack``: map a function over inputs in worker processes and pack what it returns (the
counterpart of LitData's ``optimize``), with ``packer build``'s guarantees.

    def load(path):
        image = Image.open(path).convert("RGB")
        image.thumbnail((256, 256))
        return {"image": image, "label": path.split("/")[-2]}

    packer.pack(paths, "out/train", load, workers=8, codec="jpeg:quality=90")

The inputs are cut into chunks (``chunk_size`` inputs each, fixed by the number of inputs, never
by the number of workers); each chunk runs in a worker of the build's engines (the local process
pool, or Ray tasks with ``engine="ray"``: ``engines/``) and spools its samples to a spool of its
own (``sources/python.py``), writing its rows file last: the chunk's done marker. When every
chunk is done, the chunks are listed in input order and the dataset is made as a build makes it
(``spooled.commit_listing``: source contract, seeded plan, checks and codec, manifest last), so
the output bytes are the same whatever ``workers``, ``engine`` or ``part``.

* ``fn(input)`` returns a sample (see ``samples.py``), a list of samples, or None (skip); without
  ``fn`` each input is a sample. An input whose ``fn`` raises is a rejection (``fn-error``)
  naming the input, the exception and its last frame; the run goes on (``on_error="fail"``:
  it stops).
* Keys: the input's number, zero-padded to 9 digits (``"000000017"``), with ``-J`` for the J-th
  of several samples from one input; a sample dict's ``"key"`` wins (a repeat is a
  ``duplicate-entry``).
* ``resume=True`` after a kill (or an error) reuses every chunk with a rows file and the saved
  plan and finished shards; ``part=(K, N)`` runs chunks ``K, K+N, ...`` only (any scheduler: a job
  array), and a last ``pack(..., resume=True)`` packs the dataset from every part's chunks.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import format as fmt
from ..errors import BuildError, OptionError
from ..fields import FieldSpec
from .._internal.progress import BuildProgress
from ..sources.python import ROWS_SUFFIX, SPOOL_SUFFIX, SampleSpool, SampleValueError, SpoolRows, python_listing, \
    written_label
from .commit import BuildResult
from .samples import MapSource, describe_exception, describe_input, image_bytes, json_values, map_source, \
    sample_parts
from .settings import BuildSettings, RunOptions, parse_part
from .spooled import UNSET, open_output, print_summary, python_settings

__all__ = ["pack", "default_chunk_size"]

#: A pack is cut into at most about this many chunks: each is a spool file that the packing
#: workers keep open while they read it (and a unit of resumption).
_MAX_CHUNKS = 256
_MIN_CHUNK = 64
_JOB = "pack.json"
_KEY_WIDTH = 9


def default_chunk_size(count: int) -> int:
    """Inputs per chunk: at least 64, and at most ``_MAX_CHUNKS`` chunks."""
    return max(_MIN_CHUNK, math.ceil(count / _MAX_CHUNKS))


@dataclass
class _MapState:
    """What every chunk task needs (inherited by forked workers, or put once in Ray's store)."""

    source: MapSource
    spool_dir: str
    chunk_size: int
    specs: tuple[FieldSpec, ...]
    reencoded: bool
    fail: bool

    @property
    def fn(self) -> Any:
        return self.source.fn


def _chunk_paths(spool_dir: Path, chunk: int) -> tuple[Path, Path]:
    stem = f"chunk-{chunk:06d}"
    return spool_dir / f"{stem}{SPOOL_SUFFIX}", spool_dir / f"{stem}{ROWS_SUFFIX}"


def _map_chunk(state: _MapState, chunk: int, progress: Callable[[int, int], None]) -> int:
    """Run one chunk: read its inputs, call ``fn``, spool the samples, then write the rows file."""
    spool_path, rows_path = _chunk_paths(Path(state.spool_dir), chunk)
    source = state.source
    start = chunk * state.chunk_size
    end = min(source.count, start + state.chunk_size)
    spool = SampleSpool(spool_path, image_fields=[s.name for s in state.specs if s.kind == "image"],
                        value_fields=any(s.kind != "image" for s in state.specs))
    try:
        pending = pending_bytes = 0
        for index, value in source.read(start, end):
            before = spool.position
            _map_one(state, spool, index, value)
            pending += 1
            pending_bytes += spool.position - before
            if pending >= 16:
                progress(pending, pending_bytes)
                pending = pending_bytes = 0
        rows = spool.close(inputs=(start, end))
        rows.save(rows_path)
        if pending:
            progress(pending, pending_bytes)
    except BaseException:
        spool.abort()
        spool_path.unlink(missing_ok=True)
        raise
    return chunk


def _map_one(state: _MapState, spool: SampleSpool, index: int, value: Any) -> None:
    key = f"{index:0{_KEY_WIDTH}d}"
    try:
        if isinstance(value, _ReadFailed):
            raise value.error
        result = value if state.fn is None else state.fn(value)
    except Exception as exc:  # noqa: BLE001 - one input's failure is its rejection, never the run's
        what = "reading the input" if isinstance(value, _ReadFailed) else "fn"
        shown = f"input {index}" if isinstance(value, _ReadFailed) else f"input {index}: {describe_input(value)}"
        message = f"{what} raised {describe_exception(exc)} on {shown}"
        if state.fail:
            raise BuildError(f"fn-error: {message} (on_error='fail')") from None
        spool.reject(key, "fn-error", message)
        return
    if result is None:
        return
    samples = result if isinstance(result, list) else [result]
    for number, sample in enumerate(samples):
        sample_key = key if not isinstance(result, list) else f"{key}-{number}"
        try:
            parts = sample_parts(sample)
            sample_key = parts.key if parts.key else sample_key
            data = image_bytes(parts.image, reencoded=state.reencoded)
            label = written_label(parts.label)
            values, images = json_values(parts.fields, state.specs) if (parts.fields or state.specs) else (b"", {})
        except SampleValueError as exc:
            if state.fail:
                raise BuildError(f"{exc.reason}: {exc.message} (input {index}; on_error='fail')",
                                 path=sample_key) from None
            spool.reject(sample_key, exc.reason, f"{exc.message} (input {index})")
            continue
        spool.add(sample_key, data, label, values, images)


class _ReadFailed:
    """An input that could not be read (``inputs[i]`` raised): a rejection, not the run's end."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _reader(source: MapSource) -> MapSource:
    """``source`` with its inputs read one by one, a failure to read one kept as ``_ReadFailed``."""
    inner = source.read

    def read(_: Any, start: int, end: int) -> Any:
        if source.reader is None:
            for i in range(start, end):
                try:
                    yield i, source.inputs[i]
                except Exception as exc:  # noqa: BLE001 - e.g. a Dataset whose file is damaged
                    yield i, _ReadFailed(exc)
            return
        yield from inner(start, end)

    return replace(source, reader=read)


def pack(inputs: Any, out: Any, fn: Callable[[Any], Any] | None = None, *, workers: int | None = UNSET,
         engine: str = UNSET, resume: bool = False, part: tuple[int, int] | str | None = None,
         classes: Sequence[str] | None = None, fields: Sequence[Any] | None = None, codec: str = UNSET,
         shard_size: int = UNSET, alignment: int = UNSET, shuffle: bool = UNSET, seed: int = UNSET,
         on_error: str = UNSET, label_type: str = UNSET, chunk_size: int | None = None,
         settings: BuildSettings | None = None, run: RunOptions | None = None, **run_keywords: Any
         ) -> BuildResult | None:
    """Map ``fn`` over ``inputs`` in worker processes and pack the samples into a dataset at ``out``
    (see the module docstring).

    Args:
        inputs: a sized sequence (file names, URLs, row ids, a list of samples), a torch
            map-style ``Dataset`` (``(image, label)`` or dict samples; ``.classes`` is the class
            list) or a Hugging Face ``datasets.Dataset`` (encoded images kept, ``ClassLabel``
            names as the class list, other columns as fields).
        out: the output folder, or a dataset URL (packed in the node cache, uploaded, manifest last).
        fn: one input -> a sample, a list of samples, or None. Defined anywhere (a lambda, in
            ``__main__``): the local engine forks its workers, Ray sends it by value.
        workers: processes (None: the available cores); the output does not depend on it.
        engine: ``"local"`` or ``"ray"``.
        resume: continue an interrupted pack: finished chunks, the saved plan and finished
            shards are reused. (The inputs and ``fn`` must be the same; they are not compared.)
        part: ``(K, N)`` or ``"K/N"``: map only chunks ``K, K+N, ...`` and stop; then
            ``pack(..., resume=True)`` packs the dataset from every part's chunks.
        classes, fields, codec, shard_size, alignment, shuffle, seed, on_error, label_type,
        settings, run, **run_keywords: as ``packer.Writer`` takes them.
        chunk_size: inputs per chunk (default ``default_chunk_size``).

    Returns:
        The ``BuildResult`` (None for a ``part``).

    Raises:
        OptionError: bad options, inputs without a length, a resumed pack whose inputs count,
            chunking or settings differ.
        OutputExistsError, BuildLockedError, EmptySourceError, BuildError.
    """
    keywords = {name: value for name, value in (("shard_size", shard_size), ("alignment", alignment),
                                                ("shuffle", shuffle), ("seed", seed), ("workers", workers),
                                                ("engine", engine), ("on_error", on_error)) if value is not UNSET}
    settings, run = python_settings(settings, run, call="packer.pack", classes=classes, fields=fields, codec=codec,
                                    label_type=label_type, **keywords, **run_keywords)
    if isinstance(part, str):
        part = parse_part(part)
    run = replace(run, resume=resume or run.resume, part=part if part is not None else run.part).check()
    if run.plan_only:
        raise OptionError("packer.pack: plan_only is not for pack (use part=(K, N) for the map, then resume=True)")
    source = _reader(map_source(inputs, fn))
    if source.fields and not settings.labels.fields:  # a Dataset object's fields, found in its first sample
        settings = replace(settings, labels=replace(settings.labels, fields=source.fields)).check()
    count = source.count
    size = default_chunk_size(count) if chunk_size is None else chunk_size
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise OptionError(f"packer.pack: chunk_size must be a positive number of inputs, got {chunk_size!r}")
    chunks = max(1, math.ceil(count / size))
    done_already = _finished(out, settings, run)
    if done_already is not None:
        return done_already
    output = open_output(out, run, call="packer.pack", keep=run.resume or run.part is not None,
                         shared=run.part is not None)
    ray_started = False
    try:
        _check_job(output.spool_dir, count, size, settings, source, keep=run.resume or run.part is not None)
        mine = [k for k in range(chunks) if run.part is None or k % run.part[1] == run.part[0]]
        todo = [k for k in mine if SpoolRows.load(_chunk_paths(output.spool_dir, k)[1]) is None]
        specs = settings.labels.field_specs
        state = _MapState(source, str(output.spool_dir), size, specs,
                          reencoded=settings.codec.split(":", 1)[0] != "passthrough", fail=run.on_error == "fail")
        if run.engine == "ray":
            ray_started = _start_ray(run)
        _map(state, todo, mine, count, size, run)
        if run.part is not None:
            output.close(failed=False)
            return None
        rows = []
        for chunk in range(chunks):
            found = SpoolRows.load(_chunk_paths(output.spool_dir, chunk)[1])
            if found is None:
                raise BuildError(f"chunk {chunk} of {chunks} (inputs {chunk * size} to "
                                 f"{min(count, (chunk + 1) * size) - 1}) is not mapped yet; run its part, or pack "
                                 f"with resume=True", path=output.spool_dir)
            rows.append(found)
        result = output.commit(lambda: python_listing(rows, output.spool_dir, specs=specs,
                                                      declared_classes=source.declared_classes,
                                                      declared_numbering=bool(source.declared_classes),
                                                      empty_what="fn produced no sample" if fn is not None
                                                      else "the inputs hold no sample"),
                               settings, source="python:pack", reuse_plan=run.resume)
    except BaseException:
        output.close(failed=True, keep_staging=True)  # the chunks stay for resume=True (as a build's staging does)
        raise
    finally:
        if ray_started:
            import ray

            ray.shutdown()
    output.close(failed=False)
    if run.progress:
        print_summary(result, out, what="packer.pack")
    return result


def _map(state: _MapState, todo: list[int], mine: list[int], count: int, size: int, run: RunOptions) -> None:
    """Run the chunks left to do with the engine, one progress bar over this run's inputs."""
    total = sum(min(count, (k + 1) * size) - k * size for k in mine)
    with BuildProgress(total, 0, enabled=run.progress, desc="mapping", unit=" input") as bar:
        bar.update(total - sum(min(count, (k + 1) * size) - k * size for k in todo), 0)
        if not todo:
            return
        if run.engine == "ray":
            from .engines.ray_engine import map_with_ray

            map_with_ray(_map_chunk, todo, state=state, address=run.address, progress=bar.update)
        else:
            from .engines.local import map_local

            map_local(_map_chunk, todo, state=state, workers=run.workers, progress=bar.update)


def _start_ray(run: RunOptions) -> bool:
    """One Ray session for both steps (the map, then the shards), started here if none is."""
    from .engines.ray_engine import require_ray

    ray = require_ray()
    if ray.is_initialized():
        return False
    ray.init(address=run.address, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return True


def _check_job(spool_dir: Path, count: int, size: int, settings: BuildSettings, source: MapSource, *,
               keep: bool) -> None:
    """Record what the chunks are made of; a resumed or parted pack must be the same job.

    Raises:
        OptionError: the inputs' count, the chunk size, the class names or the settings differ.
    """
    job = {"version": 1, "inputs": count, "chunk_size": size, "settings": settings.to_json(),
           "declared_classes": list(source.declared_classes), "kind": source.kind}
    path = spool_dir / _JOB
    if keep and path.is_file():
        try:
            saved = json.loads(path.read_text("utf-8"))
        except (OSError, ValueError):
            saved = None
        if isinstance(saved, dict) and saved != job:
            differ = [name for name in ("inputs", "chunk_size", "declared_classes", "kind") if saved.get(name) != job[name]]
            if saved.get("settings") != job["settings"]:
                try:
                    then = BuildSettings.from_json(saved["settings"])
                    differ += then.differences(settings)
                except Exception:  # noqa: BLE001 - an unreadable record: say so
                    differ.append("settings")
            raise OptionError(f"packer.pack: the unfinished pack here was made with other inputs or options "
                              f"({'; '.join(map(str, differ))}); give the same ones with resume=True, or pack "
                              f"without resume to start over", path=spool_dir)
        if saved == job:
            return
    path.write_text(json.dumps(job, sort_keys=True), "utf-8")


def _finished(out: Any, settings: BuildSettings, run: RunOptions) -> BuildResult | None:
    """``resume=True`` on a finished pack (a requeued job after success): its result, nothing
    rewritten, when it was packed from Python with these settings.

    Raises:
        BuildError: the dataset there was built otherwise.
    """
    from ..location import parse_location
    from .staging import STAGING_DIR

    if not run.resume or run.part is not None or run.overwrite:
        return None
    location = parse_location(out, what="OUT")
    if location.url is not None:
        return None
    path = location.local_path()
    if not (path / fmt.MANIFEST_NAME).is_file() or (path / STAGING_DIR).exists():
        return None
    from ..dataset import open_index

    with open_index(path) as index:
        info = index.manifest.build if isinstance(index.manifest.build, dict) else {}
        recorded = fmt.recorded_build_settings(info)
        try:
            built = BuildSettings.from_json(recorded) if recorded is not None else None
        except Exception:  # noqa: BLE001 - unreadable record
            built = None
        if built is None or built.source.kind != "python" or built != settings:
            differ = "; ".join(built.differences(settings, then="built", now="asked")) if built is not None else \
                "its build settings are not recorded"
            raise BuildError(f"resume=True: a finished dataset is here, built otherwise ({differ or 'another door'}); "
                             f"pass overwrite=True to replace it", path=path)
        shards = index.manifest.shards
        return BuildResult(path=path, sample_count=len(index), shard_count=len(shards), rejected=[],
                           payload_bytes=int(index.sizes.sum()),
                           total_bytes=sum(s.size for s in shards) + index.manifest.index.size,
                           summary=dict(info), classes=tuple(index.classes), already_complete=True,
                           source_verified=False)
