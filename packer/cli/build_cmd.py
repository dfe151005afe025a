"""``packer build SRC OUT``: pack an image folder or a manifest into a dataset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
import numpy as np

from . import cli, configure_logging, echo, emit_json, run_command
from .options import (ALIGNMENT, SIZE, json_option, max_file_size_option, max_pixels_option, location_type, path_type, quiet_option, verbose_option, root_option,
                      seed_option, workers_option)
from ..writer.settings import DEFAULT_MAX_FILE_SIZE
from .._internal.imageinfo import DEFAULT_MAX_PIXELS
from .. import format as fmt


def describe_labels(summary: dict, class_count: int, class_order: str | None = None) -> str:
    """The summary line that says how labels were assigned (the --label-type auto rule applied)
    and what the other splits need, given how the class names were numbered (``class_order``:
    ``BuildResult.class_order``; None when unknown)."""
    settings = fmt.recorded_build_settings(summary) or {}
    labels = settings.get("labels") if isinstance(settings.get("labels"), dict) else {}
    source = settings.get("source") if isinstance(settings.get("source"), dict) else {}
    kind = source.get("kind")
    asked = labels.get("label_type", "auto")
    checksum = summary.get("classes_checksum")
    origin = labels.get("classes_origin") if isinstance(labels.get("classes_origin"), str) else "--classes"
    fixed = f" from the given class list ({origin.split(' ', 1)[0]})" if labels.get("classes") else ""
    if kind == "coco":
        return "labels: none (-1); the objects' categories are the 'labels' field (0..C-1 by ascending COCO id)"
    if summary.get("label_type") == "none":
        targets = "; the declared fields are the targets" if labels.get("fields") else ""
        return f"labels: none (no sample has a label: every sample's label is -1{targets})"
    if summary.get("label_type") == "int" and not class_count:
        why = " (auto: every label is a plain integer)" if asked == "auto" else ""
        where = {"webdataset": "the .cls/.json members", "parquet": "the label column", "hf": "the label column"}.get(
            kind, "the manifest")
        return f"labels: integers as written in {where}{why}"
    if class_order == "source" and not fixed:
        # a ClassLabel numbers its names: kept in its order, and every split declaring it agrees
        others = ("the other splits of its DatasetDict declare the same names (checked), so they need no "
                  "--classes-from" if kind == "hf" else
                  "splits whose files declare the same ClassLabel names get the same labels (--classes-from "
                  "this dataset checks that they do)")
        return (f"labels: {class_count} classes from the source's ClassLabel names, in their order, class-list "
                f"checksum {checksum}; {others}")
    if class_order == "splits" and not fixed:
        return (f"labels: {class_count} classes from the label strings of every split of the DatasetDict, sorted, "
                f"class-list checksum {checksum}; the other splits are numbered the same way, so they need no "
                f"--classes-from")
    named = "folder names" if kind == "folder" else "label strings, sorted"
    why = " (auto: labels are not all integers)" if asked == "auto" and kind == "manifest" else ""
    return (f"labels: {class_count} classes{fixed or ' from ' + named}{why}, class-list checksum {checksum}; "
            f"build other splits with --classes-from this dataset")


#: Padding and headers above this share of a dataset's bytes make a build with an explicit
#: --alignment suggest the default (32x32 raw pixels at 4096: 25 %; 2 KB PNGs passed through: about half).
PADDING_ADVICE_SHARE = 0.2
#: ... and only when the padding is worth a thought (a sample-sized dataset's kilobytes are not):
#: 50,000 raw 32x32 samples pad 51 MB.
PADDING_ADVICE_MIN_BYTES = 8 << 20


def alignment_advice(result: Any) -> str | None:
    """Advice for small records built with an explicit ``--alignment``: the share of the dataset's
    bytes spent on padding and what ``--alignment auto`` (the default) would store; None when the
    padding is small, or the alignment was chosen by ``auto`` (which avoids it).

    The reader costs quoted are those of ``benchmarks/bench_alignment.py`` (docs/guides/small-images.md):
    the same CPU per sample within a few per cent at 64 as at 4096 for mmap reads, batched raw
    crops and O_DIRECT reads, which read runs of small records as whole 4 KiB page blocks.
    """
    settings = fmt.recorded_build_settings(result.summary) or {}
    layout = settings.get("layout") if isinstance(settings.get("layout"), dict) else {}
    alignment = layout.get("alignment")
    samples = result.sample_count
    if not isinstance(alignment, int) or alignment <= 64 or not samples or not result.total_bytes:
        return None
    spent = result.total_bytes - result.payload_bytes
    share = spent / result.total_bytes
    if share <= PADDING_ADVICE_SHARE or spent < PADDING_ADVICE_MIN_BYTES:
        return None
    from ..writer.plan import choose_alignment  # what auto would take, for this average record

    average = max(1, round(result.payload_bytes / samples))
    auto = choose_alignment(np.full(1, average, dtype=np.uint64), 1 << 62)
    smaller = (result.payload_bytes + samples * (auto // 2)
               + result.shard_count * fmt.shard_data_offset(auto))
    return (f"alignment: padding and headers are {share:.0%} of the {result.total_bytes / 1e6:,.1f} MB on disk "
            f"(every sample starts on a {alignment:,}-byte boundary; a sample holds "
            f"{result.payload_bytes / samples:,.0f} bytes on average). Without --alignment (the default, auto) "
            f"these samples would be packed at {auto} bytes and take about {smaller / 1e6:,.1f} MB; readers "
            f"read them at the same CPU cost per sample (mmap, batched raw crops, and O_DIRECT or GPUDirect "
            f"Storage, which read runs of small records as whole 4 KiB page blocks: formats/SPEC.md §3.4)")


@cli.command("build")
@click.argument("source", type=path_type())
@click.argument("out", type=location_type())
@root_option("Folder that manifest paths (and a COCO file's image file_name) are relative to (default: the "
             "manifest's folder).")
@click.option("--shard-size", default="512M", show_default=True, type=SIZE,
              help="Target shard size (e.g. 256M, 1G).")
@click.option("--alignment", default="auto", show_default=True, type=ALIGNMENT,
              help="Payload alignment in bytes: a power of two (1 disables padding), or 'auto': 4096 unless "
                   "the samples are small records, then 64, 8 or 1 (formats/SPEC.md §3.4).")
@seed_option()
@click.option("--no-shuffle", is_flag=True, help="Keep the sorted source order in the shards.")
@click.option("--codec", default="passthrough", show_default=True,
              help="How payloads are stored: passthrough (source bytes), tiled (JPEGs losslessly "
                   "re-tiled for fast random crops), jpeg (re-encoded) or raw (decoded pixels); "
                   "options as NAME:key=value,... or with the flags below.")
@click.option("--max-size", type=click.IntRange(min=1), default=None,
              help="jpeg: shrink so the --resize-side side is at most this many pixels.")
@click.option("--quality", type=click.IntRange(1, 100), default=None, help="jpeg: JPEG quality 1-100 (default 90).")
@click.option("--resize-side", type=click.Choice(["longer", "shorter"]), default=None,
              help="jpeg: which side --max-size bounds (default longer).")
@click.option("--size", "raw_size", default=None,
              help="raw: stored size as HEIGHTxWIDTH in pixels (e.g. 224x160 is 224 high, 160 wide; height "
                   "first, like numpy shapes and torchvision sizes, and like inspect prints sizes): the "
                   "largest centred box with that aspect ratio, resampled once to that size (Lanczos; "
                   "raw:size=HxW,resample=bilinear|bicubic|box|nearest to change).")
@click.option("--validate", type=click.Choice(["header", "full"]), default="header", show_default=True,
              help="header: parse each image's header; full: also decode every image.")
@max_pixels_option(default=DEFAULT_MAX_PIXELS,
                   help="Reject images with more pixels than this (decompression-bomb guard); recorded "
                        "in the manifest, and decoding readers refuse larger images by default.")
@max_file_size_option(default=DEFAULT_MAX_FILE_SIZE)
@workers_option()
@click.option("--on-error", type=click.Choice(["skip", "fail"]), default="skip", show_default=True,
              help="skip: reject bad files with a reason and go on; fail: stop at the first.")
@click.option("--overwrite", is_flag=True, help="Replace an existing dataset in OUT.")
@click.option("--resume", is_flag=True, help="Continue an interrupted build with the same options.")
@click.option("--part", default=None, help="Pack only part K/N of the plan (0-based K); then run --finish.")
@click.option("--plan-only", is_flag=True, help="List SOURCE and save the shard plan for --part runs, then stop.")
@click.option("--finish", "finish_only", is_flag=True, help="Combine the finished parts into the dataset.")
@click.option("--engine", type=click.Choice(["local", "ray"]), default="local", show_default=True)
@click.option("--source-kind", default="auto", show_default=True,
              type=click.Choice(["auto", "folder", "manifest", "tar", "zip", "webdataset", "parquet", "coco", "hf"]),
              help="What SOURCE is; auto recognises archives by their bytes, a COCO annotation JSON by its "
                   "images/annotations/categories, a Hugging Face save_to_disk folder by its state.json.")
@click.option("--label-field", default="label", show_default=True,
              help="WebDataset: the .json member's field holding the label (a .cls member wins); "
                   "Parquet, Hugging Face: the label column.")
@click.option("--normalize-formats", is_flag=True,
              help="Convert images in formats other than JPEG, PNG and WEBP (TGA, PPM, TIFF, BMP, GIF, ...) to "
                   "lossless PNG at build, so every loader can decode them; counted in the summary.")
@click.option("--hash", "hash_kind", type=click.Choice(["none", "perceptual"]), default="none", show_default=True,
              help="perceptual: hash every image as it is packed (a 128-bit DCT hash of a small grey "
                   "thumbnail) and keep the hashes beside the index, so `packer inspect --duplicates` finds "
                   "near-duplicates without decoding again; append hashes new samples, verify checks them.")
@click.option("--reject-duplicates", is_flag=True,
              help="Reject a file whose bytes are those of a file listed before it (duplicate-content, naming "
                   "the one kept); recorded, so `packer append` also rejects copies of samples already in "
                   "the dataset.")
@click.option("--image-column", default=None,
              help="Parquet, Hugging Face: the image column (default: found by its type).")
@click.option("--address", default=None, help="Ray cluster address for --engine ray (default: a local one).")
@click.option("--classes", "classes_spec", default=None,
              help="Fix the class list (label i = i-th name): a file (one name per line, or a .json list) "
                   "or names like a,b,c. Folders/labels not in it are rejected (unknown-class); a listed "
                   "class without files keeps its label with 0 samples. Use one list for every split.")
@click.option("--classes-from", "classes_from", type=location_type(), default=None,
              help="Use the class list of an existing dataset (e.g. the train split when building val).")
@click.option("--label-type", type=click.Choice(["auto", "int", "str"]), default="auto", show_default=True,
              help="How labels written as text are read, for every kind of source (CSV cells, WebDataset "
                   ".cls/.json, Parquet strings): int (plain ASCII integers), str (class names), auto "
                   "(integers when every label is one, class names when none is; a mix is an error).")
@click.option("--field", "field_specs", multiple=True, metavar="NAME=TYPE[@SOURCE]",
              help="Declare a per-sample field (repeatable): TYPE is a dtype (float32), a shaped array "
                   "(float32[4], float32[N,4] for a variable count), classes (multi-label), text or image "
                   "(a second image: mask, depth). Values come from the manifest column/member SOURCE "
                   "(default NAME); in an image folder or a WebDataset, from the sample's member with "
                   "suffix SOURCE (mask=image@mask.png, caption=text@txt) or its .json member's key SOURCE. "
                   "A COCO source declares its own. See README, 'Samples with more than a label'.")
@click.option("--fields", "fields_file", type=path_type(), default=None,
              help="A JSON schema file: a list of field declarations (or --field strings).")
@quiet_option()
@verbose_option()
@json_option("Print the build summary as JSON on stdout.")
def build_command(source: Path, out: Path, root: Path | None, shard_size: int, alignment: int | str, seed: int,
                  no_shuffle: bool, codec: str, validate: str, max_pixels: int, workers: int | None,
                  on_error: str, overwrite: bool, resume: bool, part: str | None, plan_only: bool,
                  finish_only: bool,
                  engine: str, address: str | None, source_kind: str, label_field: str,
                  image_column: str | None, normalize_formats: bool, quiet: bool,
                  as_json: bool, max_size: int | None, quality: int | None, resize_side: str | None,
                  raw_size: str | None, classes_spec: str | None, classes_from: Path | None, label_type: str,
                  verbose: bool, max_file_size: int, field_specs: tuple[str, ...] = (),
                  fields_file: Path | None = None, hash_kind: str = "none", reject_duplicates: bool = False) -> None:
    """Pack SOURCE into the dataset folder OUT.

    SOURCE is an ImageFolder-layout folder, a .csv/.jsonl manifest, a tar (plain, .gz, .bz2, .xz,
    .zst) of class/file members or of class tars, a zip, or WebDataset shards (a tar, a folder of
    tars, or a brace pattern like 'train-{000000..000099}.tar'), or Parquet files (a HuggingFace
    dataset: a file or a folder of them), or a COCO-style annotation JSON (instances_train2017.json
    with --root train2017/: boxes as XYXY pixels, labels, iscrowd, area, image_id fields). With
    --field, an image folder's or a WebDataset's files sharing a name up to the first dot are one
    sample (cat/1.jpg, cat/1.mask.png, cat/1.json). Build every split of one dataset with one class list
    (`--classes-from TRAIN_OUT` for val), or a class missing from one split shifts every label
    after it.
    """
    from ..writer.run import build, finish
    from ..writer.settings import BuildSettings, CheckSettings, LayoutSettings, RunOptions, parse_part
    from ..sources import LabelSettings, SourceSettings
    from ..classes import classes_of
    from ..codecs import merge_codec_options
    from ..errors import OptionError

    configure_logging(quiet=quiet, verbose=verbose)

    def label_settings() -> LabelSettings:
        from ..fields import check_declarations, parse_field_option, parse_fields_schema
        from .._internal.files import read_user_json

        if classes_spec is not None and classes_from is not None:
            raise OptionError("give --classes or --classes-from, not both")
        classes, origin = None, "--classes"
        if classes_spec is not None:
            classes = classes_spec  # read once, by LabelSettings (a file of names, or names like a,b,c)
        elif classes_from is not None:
            classes, origin = classes_of(classes_from), f"--classes-from {classes_from}"
            if not classes:
                raise OptionError(f"--classes-from {classes_from}: that dataset has integer labels and no "
                                  f"class names")
        declared = [parse_field_option(text) for text in field_specs]
        if fields_file is not None:  # bounded, a regular file, its depth checked before parsing
            schema = read_user_json(fields_file, what="--fields")
            declared += list(parse_fields_schema(schema, where=f"--fields {fields_file}"))
        check_declarations(declared)
        return LabelSettings(classes=classes, classes_origin=origin, label_type=label_type, fields=tuple(declared))

    def codec_spec() -> str:
        try:
            return merge_codec_options(codec, {"max_size": max_size, "quality": quality, "side": resize_side,
                                               "size": raw_size})
        except OptionError as exc:
            raise OptionError(f"{exc.message} (--codec {codec}; --max-size, --quality and --resize-side are "
                              f"jpeg options, --size is a raw option)") from None

    def body() -> int:
        # The two values this command builds once and hands down: what the build records, and
        # how this run goes. Every message about a setting names the option typed here.
        labels = label_settings()
        settings = BuildSettings(
            source=SourceSettings(kind=source_kind, root=root, label_field=label_field, image_column=image_column),
            layout=LayoutSettings(alignment=alignment, shard_size=shard_size, shuffle=not no_shuffle, seed=seed),
            codec=codec_spec(),
            checks=CheckSettings(validate=validate, max_pixels=max_pixels, max_file_size=max_file_size,
                                 normalize_formats=normalize_formats, reject_duplicates=reject_duplicates),
            labels=labels, hash=hash_kind)
        run = RunOptions(workers=workers, engine=engine, address=address, part=parse_part(part) if part else None,
                         plan_only=plan_only, resume=resume, overwrite=overwrite, on_error=on_error,
                         progress=not quiet)
        if finish_only:
            result = finish(out, source, root, overwrite=overwrite)
        else:
            result = build(source, out, settings, run)
        if result is None:
            done = "plan saved" if plan_only else f"part {part} packed"
            echo(f"{done} in {out}; run the parts (`--part K/N`), then `packer build {source} {out} "
                       f"--finish`", err=True)
            if as_json:
                emit_json({"ok": True, "part": part, "plan_only": plan_only})
            return 0
        if result.already_complete:
            checked = "" if result.source_verified else " (options checked; this dataset records no source probes)"
            click.echo(f"{out} is already complete: {result.sample_count} samples in {result.shard_count} shard(s), "
                       f"built from this source with these options{checked}; nothing to do", err=True)
            if as_json:
                emit_json({"ok": True, "path": str(out), "already_complete": True, "samples": result.sample_count,
                           "shards": result.shard_count})
            return 0
        reasons: dict[str, int] = {}
        for r in result.rejected:
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
        echo(f"packed {result.sample_count} samples into {result.shard_count} shard(s) in {out} "
                   f"({result.payload_bytes / 1e6:.1f} MB payload, {result.total_bytes / 1e6:.1f} MB on disk"
                   f"{f', {result.seconds:.1f} s' if result.seconds else ''})", err=True)
        click.echo(describe_labels(result.summary, len(result.classes), result.class_order), err=True)
        # The summary's warnings were logged (to stderr) when the source was listed, before packing:
        # not printed again here (they are in --json and the manifest's build record).
        notes = result.summary.get("codec_notes", {})
        if notes:
            echo("codec: " + ", ".join(f"{n} {note}" for note, n in notes.items()), err=True)
        advice = alignment_advice(result)
        if advice is not None:
            echo(advice, err=True)
        if result.rejected:
            summary = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
            echo(f"rejected {len(result.rejected)} file(s): {summary}; see {out / fmt.REPORT_NAME}", err=True)
        if as_json:
            emit_json({"ok": True, "path": str(out), "samples": result.sample_count, "shards": result.shard_count,
                       "payload_bytes": result.payload_bytes, "total_bytes": result.total_bytes,
                       "rejected": len(result.rejected), "rejected_by_reason": reasons,
                       "codec_notes": notes, "classes": len(result.classes),
                       "classes_checksum": result.summary.get("classes_checksum"),
                       "label_type": result.summary.get("label_type"),
                       "warnings": result.summary.get("warnings", [])})
        return 0

    if finish_only or plan_only:
        again = "run the same command again"
    elif part:
        again = f"run the same --part {part} command again (its finished shards are kept)"
    else:
        again = "run the same command with --resume to continue (finished shards are kept)"
    run_command(body, as_json=as_json, interrupted=f"interrupted; {again}")
