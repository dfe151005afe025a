"""What a build records (``BuildSettings``) and how one run of it runs (``RunOptions``).

``BuildSettings`` is everything that decides a dataset's bytes, nested by what it is about:

- ``source`` (``packer.SourceSettings``): the door's kind, detected once from the source's bytes
  (``sources.detect_kind``) and recorded, never guessed again; and the door's options (root,
  label field, image column);
- ``layout`` (``LayoutSettings``): alignment, shard size, shuffle, seed;
- ``codec``: the codec spec (``passthrough``, ``jpeg:quality=90``, ``raw:size=224x224``, ...);
- ``checks`` (``CheckSettings``): validation, the pixel and file-size limits, format normalisation,
  whether exact duplicates are rejected (``--reject-duplicates``);
- ``hash``: the per-sample hashes the build computes and keeps beside the index (``"none"``, or
  ``"perceptual"``: ``--hash perceptual``, the hashes file of formats/SPEC.md §16);
- ``labels`` (``packer.LabelSettings``): the class list and where it came from, the label type,
  the declared fields.

It is frozen, saved whole in the build plan and in the manifest's build record
(``build.settings``, SPEC §6.1), compared whole when a build is resumed, and reused by
``packer append``. It needs no source path: samples written from Python record the kind
``"python"``. ``RunOptions`` is how one run goes (workers, engine, address, part, plan-only,
resume, overwrite, the error policy, progress): never recorded, never compared.

Every field names the CLI option that sets it (``metadata={"option": ...}``), so a message about
a setting names what the user typed (``differences``).

The flat ``BuildOptions`` and ``build()``'s old keywords are converted by ``settings_and_run``,
the one conversion, which warns (``DeprecationWarning``); old saved plans and manifests are read
through ``format.recorded_build_settings`` and ``BuildSettings.from_json``.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Mapping

from .. import format as fmt
from ..errors import FormatError, OptionError, PackerError
from .._internal.imageinfo import DEFAULT_MAX_PIXELS
from ..fields import FieldSpec
from ..sources import APPEND_ORIGIN, SOURCE_KINDS, LabelSettings, SourceSettings

__all__ = ["BuildSettings", "LayoutSettings", "CheckSettings", "RunOptions", "BuildOptions", "SourceSettings",
           "LabelSettings", "parse_part", "settings_and_run", "run_from_legacy", "settings_from_record",
           "labels_for_append", "option_name", "ALIGNMENT_AUTO", "DEFAULT_SHARD_SIZE", "DEFAULT_MAX_FILE_SIZE", "ENGINES", "HASHES"]

#: Default target shard size: large enough for GPUDirect-sized reads and few files, small
#: enough that a damaged or re-built shard is cheap to replace.
DEFAULT_SHARD_SIZE = 512 << 20
#: Default per-file size cap: far above any real photo or scan (a 150 Mpx 16-bit PNG is under
#: 1 GiB), low enough that one sparse or runaway file cannot exhaust a worker's memory.
DEFAULT_MAX_FILE_SIZE = 1 << 30
#: ``RunOptions.engine``: a local process pool, or Ray.
ENGINES = ("local", "ray")
_MAX_SEED = (1 << 64) - 1
#: ``LayoutSettings.alignment``'s default: the writer chooses from the payload sizes (small
#: records get a small alignment, everything else 4 KiB: ``writer.plan.choose_alignment``).
ALIGNMENT_AUTO = "auto"


def _option(name: str, **extra: Any) -> dict[str, Any]:
    return {"option": name, **extra}


def option_name(settings_field: dataclasses.Field) -> str:  # type: ignore[type-arg]
    """The CLI option that sets a settings field (``--shard-size``), or its name when none does."""
    return settings_field.metadata.get("option", settings_field.name)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class LayoutSettings:
    """Where samples go: ``alignment`` (bytes, a power of two; 1 disables padding; ``"auto"``, the
    default: chosen from the payload sizes, formats/SPEC.md §3.4), the target ``shard_size`` in
    bytes, ``shuffle`` (a seeded pack order, on by default) and its ``seed``."""

    alignment: int | str = field(default=ALIGNMENT_AUTO, metadata=_option("--alignment"))
    shard_size: int = field(default=DEFAULT_SHARD_SIZE, metadata=_option("--shard-size"))
    shuffle: bool = field(default=True, metadata=_option("--no-shuffle", given_when=False))
    seed: int = field(default=0, metadata=_option("--seed"))

    def check(self) -> "LayoutSettings":
        """Raises OptionError naming the option (``--alignment``, ``--shard-size``, ...) and what is allowed."""
        if self.alignment != ALIGNMENT_AUTO:
            try:
                fmt.check_alignment(self.alignment)  # the format's rule, one place
            except FormatError as exc:  # "--alignment must be a power of two ..., or 'auto'"
                raise OptionError(f"--{exc.message}, or 'auto'") from None
        auto = self.alignment == ALIGNMENT_AUTO  # chooses at most the shard size: any size of a byte or more
        if not _is_int(self.shard_size) or not (1 if auto else self.alignment) <= self.shard_size < fmt.MAX_FILE_SIZE:
            least = "1 byte" if auto else f"the alignment ({self.alignment} bytes)"
            raise OptionError(f"--shard-size must be at least {least} and below 2^62, got {self.shard_size!r}")
        if not isinstance(self.shuffle, bool):
            raise OptionError(f"shuffle must be True or False (--no-shuffle turns it off), got {self.shuffle!r}")
        if not _is_int(self.seed) or not 0 <= self.seed <= _MAX_SEED:
            raise OptionError(f"--seed must be an integer from 0 to 2^64-1, got {self.seed!r}")
        return self


@dataclass(frozen=True)
class CheckSettings:
    """What every source file must pass: ``validate`` (``"header"``: parse each image's header;
    ``"full"``: also decode it), ``max_pixels`` (the decompression-bomb guard, recorded for the
    readers), ``max_file_size`` (bytes), and ``normalize_formats`` (store images in formats other
    than JPEG, PNG and WEBP as lossless PNG), and ``reject_duplicates`` (a file whose bytes are
    those of a file listed before it, or of a sample already in the dataset for ``append``, is
    rejected as ``duplicate-content`` naming the sample kept: ``writer.dedupe``)."""

    validate: str = field(default="header", metadata=_option("--validate"))
    max_pixels: int = field(default=DEFAULT_MAX_PIXELS, metadata=_option("--max-pixels"))
    max_file_size: int = field(default=DEFAULT_MAX_FILE_SIZE, metadata=_option("--max-file-size"))
    normalize_formats: bool = field(default=False, metadata=_option("--normalize-formats", given_when=True))
    reject_duplicates: bool = field(default=False, metadata=_option("--reject-duplicates", given_when=True))

    def check(self) -> "CheckSettings":
        """Raises OptionError naming the option (``--validate``, ``--max-pixels``, ...) and what is allowed."""
        if self.validate not in ("header", "full"):
            raise OptionError(f"--validate must be 'header' or 'full', got {self.validate!r}")
        if not _is_int(self.max_pixels) or not 1 <= self.max_pixels < fmt.MAX_FILE_SIZE:
            raise OptionError(f"--max-pixels must be a positive number of pixels, got {self.max_pixels!r}")
        if not _is_int(self.max_file_size) or not 1 <= self.max_file_size < fmt.MAX_FILE_SIZE:
            raise OptionError(f"--max-file-size must be between 1 byte and 2^62, got {self.max_file_size!r}")
        if not isinstance(self.normalize_formats, bool):
            raise OptionError(f"--normalize-formats is a flag (True or False), got {self.normalize_formats!r}")
        if not isinstance(self.reject_duplicates, bool):
            raise OptionError(f"--reject-duplicates is a flag (True or False), got {self.reject_duplicates!r}")
        return self


#: ``BuildSettings.hash``: no hashes, or the perceptual hash of every sample (``packer.duplicates``).
HASHES = ("none", "perceptual")
#: Members a record leaves out at their default (``to_json``): added after datasets were recorded
#: without them, so a build that does not use them records exactly what earlier builds did.
_OMITTED_AT_DEFAULT = {"checks": {"reject_duplicates": False}, "": {"hash": "none"}}

_GROUPS = {"source": SourceSettings, "layout": LayoutSettings, "checks": CheckSettings, "labels": LabelSettings}


@dataclass(frozen=True)
class BuildSettings:
    """Everything that decides a build's bytes, nested (see the module docstring); recorded in the
    manifest as ``build.settings``. Build it once and hand it to ``packer.build_dataset``:

        settings = packer.BuildSettings(layout=packer.LayoutSettings(shard_size=256 << 20, seed=1),
                                        labels=packer.LabelSettings(classes=("cat", "dog")))

    Equality compares what decides the bytes: not ``source.root`` (where they are) nor
    ``labels.classes_origin`` (how the list was given).
    """

    source: SourceSettings = SourceSettings()
    layout: LayoutSettings = LayoutSettings()
    codec: str = field(default="passthrough", metadata=_option("--codec"))
    checks: CheckSettings = CheckSettings()
    labels: LabelSettings = LabelSettings()
    hash: str = field(default="none", metadata=_option("--hash"))

    def check(self) -> "BuildSettings":
        """Refuse impossible settings before anything is written (exit code 2, like any usage error).

        Raises:
            OptionError: naming the option and what is allowed.
        """
        from ..codecs import get_codec

        for name, kind in _GROUPS.items():
            if not isinstance(getattr(self, name), kind):
                raise OptionError(f"BuildSettings.{name} must be a packer.{kind.__name__}, got "
                                  f"{type(getattr(self, name)).__name__}")
        if self.source.kind not in SOURCE_KINDS + ("python",):
            raise OptionError(f"--source-kind must be one of {', '.join(SOURCE_KINDS)}, got {self.source.kind!r}")
        for name in ("label_field", "image_column"):  # ("" is a name no column has: no label)
            value = getattr(self.source, name)
            if not isinstance(value, str) and not (value is None and name == "image_column"):
                raise OptionError(f"--{name.replace('_', '-')} must be a column or field name, got {value!r}")
        self.layout.check()
        self.checks.check()
        if not isinstance(self.codec, str):
            raise OptionError(f"--codec must be a codec spec like 'jpeg:quality=90', got {self.codec!r}")
        get_codec(self.codec)  # an unknown codec, option or value is an OptionError naming it
        self.labels.check()
        if self.hash not in HASHES:
            raise OptionError(f"--hash must be one of {', '.join(HASHES)}, got {self.hash!r}")
        return self

    def detected(self, kind: str) -> "BuildSettings":
        """These settings with the source kind as detected (``sources.detect_kind``)."""
        return self if kind == self.source.kind else replace(self, source=replace(self.source, kind=kind))

    def to_json(self) -> dict[str, Any]:
        """The record (``build.settings`` in the manifest, ``settings`` in the saved plan): every
        member written, so the record says what the build did without knowing the defaults; except
        the members added later (``checks.reject_duplicates``, ``hash``), written only when set, so
        a build that does not use them records exactly what earlier builds did (an absent member
        reads as its default)."""
        document = {"source": self.source.to_json(), "layout": asdict(self.layout), "codec": self.codec,
                    "checks": asdict(self.checks), "labels": self.labels.to_json(), "hash": self.hash}
        for group, members in _OMITTED_AT_DEFAULT.items():
            where = document[group] if group else document
            for name, default in members.items():
                if where.get(name) == default:
                    del where[name]
        return document

    @classmethod
    def from_json(cls, document: Mapping[str, Any], *, strict: bool = True,
                  unrecorded_source: SourceSettings | None = None) -> "BuildSettings":
        """Settings from a record (``to_json``'s shape; ``format.recorded_build_settings`` turns the
        flat options of older records into it). A member that is missing takes its default, or for
        the ``source`` group (which older records do not hold) ``unrecorded_source``'s value.

        Args:
            strict: refuse a member of the wrong type or an impossible value (a saved plan). Off,
                such a member falls back as a missing one does (the manifest's record is
                informative: a hand edit must not stop an append).

        Raises:
            OptionError: ``strict`` and a member of the wrong type or value.
        """
        if not isinstance(document, Mapping):
            if strict:
                raise OptionError(f"build settings must be an object, got {type(document).__name__}")
            document = {}
        settings = cls(source=unrecorded_source or SourceSettings())
        for name, kind in _GROUPS.items():
            recorded = document.get(name, {})
            if not isinstance(recorded, Mapping):
                if strict:
                    raise OptionError(f"build settings: {name!r} must be an object, got {recorded!r}")
                continue
            for member in dataclasses.fields(kind):
                if member.name not in recorded:
                    continue
                value = recorded[member.name]
                if not _json_type_fits(member.name, value, member.default):
                    if strict:
                        raise OptionError(f"build settings: {name}.{member.name} is {value!r}")
                    continue
                if member.name in ("classes", "fields") and value is not None:
                    value = tuple(value)
                candidate = replace(settings, **{name: replace(getattr(settings, name), **{member.name: value})})
                settings = _checked(candidate, settings, strict)
        if "codec" in document:
            if isinstance(document["codec"], str):
                settings = _checked(replace(settings, codec=document["codec"]), settings, strict)
            elif strict:
                raise OptionError(f"build settings: codec is {document['codec']!r}")
        if "hash" in document:
            if document["hash"] in HASHES:
                settings = replace(settings, hash=document["hash"])
            elif strict:
                raise OptionError(f"build settings: hash is {document['hash']!r}; expected one of "
                                  f"{', '.join(HASHES)}")
        return settings

    def differences(self, other: "BuildSettings", *, then: str = "saved", now: str = "asked") -> list[str]:
        """What differs from ``other``, one ``--option: saved X, asked Y`` each, named by the option
        the user types (the class list by where it came from: ``--classes-from``)."""
        found = []
        for name in ("source", "layout", "codec", "checks", "labels", "hash"):
            ours, theirs = getattr(self, name), getattr(other, name)
            if name in ("codec", "hash"):
                if ours != theirs:
                    found.append(f"--{name}: {then} {ours!r}, {now} {theirs!r}")
                continue
            for member in dataclasses.fields(ours):
                if not member.compare:
                    continue
                a, b = getattr(ours, member.name), getattr(theirs, member.name)
                if a == b:
                    continue
                option = option_name(member)
                if member.name == "classes":
                    option = _origin_option(other.labels.classes_origin if b is not None else self.labels.classes_origin)
                found.append(f"{option}: {then} {_shown(member, a)}, {now} {_shown(member, b)}")
        return found


def _origin_option(origin: str | None) -> str:
    """The option a class list's origin names (``--classes-from /data/train`` -> ``--classes-from``)."""
    word = (origin or "").split(" ", 1)[0]
    return word if word.startswith("--") else "--classes"


def _shown(member: dataclasses.Field, value: Any) -> str:  # type: ignore[type-arg]
    if "given_when" in member.metadata and isinstance(value, bool):
        return "given" if value == member.metadata["given_when"] else "not given"
    if isinstance(value, tuple) and member.name == "classes":
        return f"{len(value)} names {list(value)[:5]!r}"[:120]
    text = repr(list(value) if isinstance(value, tuple) else value)
    return text if len(text) <= 120 else text[:117] + "..."


def _json_type_fits(name: str, value: Any, default: Any) -> bool:
    if name == "alignment":  # a number of bytes, or "auto" (recorded as asked; the manifest has the result)
        return value == ALIGNMENT_AUTO or _is_int(value)
    if name in ("root", "image_column", "classes_origin"):
        return value is None or isinstance(value, str)
    if name == "classes":
        return value is None or (isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value))
    if name == "fields":
        return isinstance(value, (list, tuple)) and all(isinstance(v, (dict, str, FieldSpec)) for v in value)
    return type(value) is type(default)


def _checked(candidate: BuildSettings, previous: BuildSettings, strict: bool) -> BuildSettings:
    """``candidate`` if its changed group checks out; else refused (``strict``) or ``previous``."""
    try:
        for name, kind in _GROUPS.items():
            if getattr(candidate, name) is not getattr(previous, name) and name != "source":
                getattr(candidate, name).check()
        if candidate.codec != previous.codec:
            from ..codecs import get_codec

            get_codec(candidate.codec)
    except PackerError:
        if strict:
            raise
        return previous
    return candidate


# --- how one run runs -----------------------------------------------------------------------------

def parse_part(text: str) -> tuple[int, int]:
    """Parse ``"K/N"`` (0-based K) into (K, N).

    Raises:
        OptionError: not two integers with 0 <= K < N.
    """
    try:
        k_text, n_text = text.split("/")
        k, n = int(k_text), int(n_text)
    except ValueError:
        raise OptionError(f"--part must look like K/N (e.g. 0/4), got {text!r}") from None
    if not (n >= 1 and 0 <= k < n):
        raise OptionError(f"--part {text}: need 0 <= K < N")
    return k, n


@dataclass(frozen=True)
class RunOptions:
    """How one run of a build goes; nothing here changes the output bytes, nothing is recorded.

    Attributes:
        workers: processes packing shards (None: the available cores). Output is identical for any value.
        engine: ``"local"`` (a process pool) or ``"ray"``.
        address: the Ray cluster address for ``engine="ray"`` (None: a local one).
        part: ``(K, N)`` (or ``"K/N"``): pack only part K of N, then run ``finish``.
        plan_only: list the source and save the plan (for the parts to share), then stop.
        resume: continue an interrupted build with the same settings, reusing finished shards
            (on a finished dataset built from this source with these settings: nothing to do).
        overwrite: replace an existing dataset (it stays readable until the new manifest lands).
        on_error: ``"skip"`` (reject and report bad files) or ``"fail"`` (stop at the first).
        progress: show a tqdm bar on stderr (the CLI's default; library calls only log).
        remote: ``packer.remote.RemoteOptions`` for an output URL (None: from the environment).
    """

    workers: int | None = None
    engine: str = "local"
    address: str | None = None
    part: tuple[int, int] | None = None
    plan_only: bool = False
    resume: bool = False
    overwrite: bool = False
    on_error: str = "skip"
    progress: bool = False
    remote: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.part, str):
            object.__setattr__(self, "part", parse_part(self.part))
        elif isinstance(self.part, list):
            object.__setattr__(self, "part", tuple(self.part))

    @property
    def split(self) -> bool:
        """One step of a split build (``--part`` or ``--plan-only``): it shares OUT with the others."""
        return self.part is not None or self.plan_only

    def check(self) -> "RunOptions":
        """Raises OptionError naming the option (``--workers``, ``--on-error``, ...) and what is allowed."""
        if self.workers is not None and (not _is_int(self.workers) or self.workers < 1):
            raise OptionError(f"--workers must be a positive number of processes, got {self.workers!r}")
        if self.engine not in ENGINES:
            raise OptionError(f"unknown engine {self.engine!r} (use 'local' or 'ray')")
        if self.on_error not in ("skip", "fail"):
            raise OptionError(f"--on-error must be 'skip' or 'fail', got {self.on_error!r}")
        if self.part is not None:
            if (not isinstance(self.part, tuple) or len(self.part) != 2 or not all(_is_int(x) for x in self.part)
                    or not 0 <= self.part[0] < self.part[1]):
                raise OptionError(f"--part must be K/N with 0 <= K < N, got {self.part!r}")
        for name in ("plan_only", "resume", "overwrite", "progress"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(f"--{name.replace('_', '-')} is a flag (True or False), got {getattr(self, name)!r}")
        return self


# --- the old spelling: flat BuildOptions and build()'s keywords (deprecated) ----------------------

@dataclass(frozen=True)
class BuildOptions:
    """Deprecated: the flat options of packer 0.1 (use ``packer.BuildSettings``). Still accepted by
    ``packer.build_dataset`` for one release, with a ``DeprecationWarning``."""

    alignment: int | str = ALIGNMENT_AUTO
    shard_size: int = DEFAULT_SHARD_SIZE
    shuffle: bool = True
    seed: int = 0
    codec: str = "passthrough"
    validate: str = "header"
    max_pixels: int = DEFAULT_MAX_PIXELS
    classes: tuple[str, ...] | None = None
    label_type: str = "auto"
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    normalize_formats: bool = False
    fields: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        labels = LabelSettings(classes=self.classes, fields=self.fields)  # normalised there, once
        object.__setattr__(self, "classes", labels.classes)
        object.__setattr__(self, "fields", labels.fields)

    def to_settings(self, source: SourceSettings = SourceSettings()) -> BuildSettings:
        """The same build as ``BuildSettings`` (every flat name moved to its group; nothing checked)."""
        nested = fmt.regroup_build_options(asdict(self))
        settings = BuildSettings(source=source)
        return replace(settings, codec=self.codec, **{
            name: replace(getattr(settings, name), **nested[name]) for name in ("layout", "checks", "labels")})

    def to_json(self) -> dict[str, Any]:
        """The flat options as packer 0.1 recorded them (options at their default left out)."""
        document = asdict(self)
        for name, default in (("classes", None), ("label_type", "auto"), ("normalize_formats", False), ("fields", ())):
            if document[name] == default:
                del document[name]
        if "classes" in document:
            document["classes"] = list(document["classes"])
        if "fields" in document:
            document["fields"] = [dict(item) for item in document["fields"]]
        return document

    @property
    def field_specs(self) -> tuple[FieldSpec, ...]:
        return self.to_settings().labels.field_specs

    def check(self) -> "BuildOptions":
        self.to_settings().check()
        return self


#: ``build()``'s old keywords: where each goes now.
_RUN_KEYWORDS = ("workers", "overwrite", "resume", "on_error", "part", "plan_only", "engine", "address", "progress",
                 "remote")
_SOURCE_KEYWORDS = {"root": "root", "source_kind": "kind", "label_field": "label_field", "image_column": "image_column"}


def settings_and_run(settings: Any, run: Any, legacy: dict[str, Any], *,
                     call: str = "packer.build_dataset") -> tuple[BuildSettings, RunOptions]:
    """The one conversion from the old spelling (a flat ``BuildOptions``, ``options=``, and the
    keywords ``workers=``, ``root=``, ``source_kind=``, ...) to ``(BuildSettings, RunOptions)``,
    with a ``DeprecationWarning`` naming the new spelling of what was used.

    Raises:
        OptionError: an unknown keyword, an old keyword beside the new value it belongs to, or a
            ``settings``/``run`` of another type.
    """
    legacy = dict(legacy)
    options = legacy.pop("options", None)
    if isinstance(settings, BuildOptions):
        if options is not None:
            raise OptionError(f"{call}: give the settings once (a BuildOptions positionally and options=)")
        options, settings = settings, None
    unknown = sorted(set(legacy) - set(_RUN_KEYWORDS) - set(_SOURCE_KEYWORDS))
    if unknown:
        raise OptionError(f"{call}() got an unexpected keyword argument {unknown[0]!r} (settings go in "
                          f"settings=packer.BuildSettings(...), how the run goes in run=packer.RunOptions(...))")
    used = []
    if options is not None:
        if not isinstance(options, BuildOptions):
            raise OptionError(f"{call}: options= takes a BuildOptions, got {type(options).__name__}")
        if settings is not None:
            raise OptionError(f"{call}: give settings= or the deprecated BuildOptions, not both")
        used.append("BuildOptions(...) -> settings=packer.BuildSettings(layout=..., checks=..., labels=...)")
    source_keys = {key: legacy.pop(key) for key in list(legacy) if key in _SOURCE_KEYWORDS}
    if source_keys:
        if settings is not None:
            raise OptionError(f"{call}: {', '.join(f'{k}=' for k in source_keys)} belong to "
                              f"settings.source (packer.SourceSettings); give them there")
        used.append(f"{', '.join(f'{k}=' for k in source_keys)} -> settings=packer.BuildSettings(source="
                    f"packer.SourceSettings({', '.join(f'{_SOURCE_KEYWORDS[k]}=' for k in source_keys)}))")
    if legacy:
        used.append(f"{', '.join(f'{k}=' for k in legacy)} -> run=packer.RunOptions("
                    f"{', '.join(f'{k}=' for k in legacy)})")
    if used:
        warnings.warn(f"{call}: the old spelling is deprecated and will be removed in the next release; "
                      f"{'; '.join(used)}", DeprecationWarning, stacklevel=3)
    if settings is None:
        source = SourceSettings(**{_SOURCE_KEYWORDS[k]: v for k, v in source_keys.items()})
        settings = options.to_settings(source) if options is not None else BuildSettings(source=source)
    if not isinstance(settings, BuildSettings):
        raise OptionError(f"{call}: settings must be a packer.BuildSettings, got {type(settings).__name__}")
    return settings, run_from_legacy(run, legacy, call=call)


def run_from_legacy(run: Any, legacy: dict[str, Any], *, call: str) -> RunOptions:
    """``run``, or RunOptions from the old keywords in ``legacy`` (the caller warned)."""
    if legacy:
        if run is not None:
            raise OptionError(f"{call}: {', '.join(f'{k}=' for k in legacy)} belong to run (packer.RunOptions); "
                              f"give them there")
        run = RunOptions(**legacy)
    if run is None:
        return RunOptions()
    if not isinstance(run, RunOptions):
        raise OptionError(f"{call}: run must be a packer.RunOptions, got {type(run).__name__}")
    return run


def settings_from_record(build: Any, *, alignment: int | None = None, codec: Any = None,
                         unrecorded_source: SourceSettings | None = None) -> BuildSettings | None:
    """The settings a manifest's (informative) build record holds, member by member: a member
    missing, of the wrong type or impossible (a hand edit, another writer) takes its default, or
    for the source ``unrecorded_source``'s (older records hold no door options). The normative
    ``alignment`` and ``codec`` entries of the manifest win over the record's. None when the record
    holds no settings at all (``format.recorded_build_settings``)."""
    nested = fmt.recorded_build_settings(build)
    if nested is None:
        return None
    settings = BuildSettings.from_json(nested, strict=False, unrecorded_source=unrecorded_source)
    if alignment is not None:
        settings = _checked(replace(settings, layout=replace(settings.layout, alignment=alignment)), settings, False)
    name = codec.get("name") if isinstance(codec, Mapping) else None
    if isinstance(name, str) and name != settings.codec.split(":")[0]:
        settings = _checked(replace(settings, codec=name), settings, False)
    return settings


def labels_for_append(settings: BuildSettings, classes: tuple[str, ...]) -> LabelSettings:
    """The label settings ``packer append`` lists a new source with: the dataset's class list as the
    given list (named as the dataset's own in messages)."""
    return replace(settings.labels, classes=tuple(classes), classes_origin=APPEND_ORIGIN)

