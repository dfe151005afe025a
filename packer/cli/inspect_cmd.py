"""``packer inspect DATASET``: the summary, one sample (``--sample``, ``--extract``), a contact sheet, an HTML
report, duplicates and leaks (``--duplicates``)."""

from __future__ import annotations

import errno
import io
import json
import os
import stat
from pathlib import Path
from typing import Any

import click

from . import EXIT_DAMAGED, EXIT_OK, cli, echo, emit_json, run_command, terminal_safe
from .options import json_option, max_pixels_option, location_type, path_type, seed_option
from ..errors import OutputExistsError, PackerError
from ..location import Location

__all__ = ["inspect_command", "write_new_file", "resolve_sample"]


def write_new_file(path: Path, data: bytes | memoryview, *, force: bool) -> None:
    """Write ``data`` to exactly ``path``, never anywhere else.

    Without ``force`` an existing file (or symlink, even a dangling one) is refused (``O_EXCL``);
    with ``force`` a regular file is truncated and rewritten, but a symlink is still refused
    (``O_NOFOLLOW``), so the bytes never land outside the path given. A FIFO, device or socket
    is refused too, even with ``force``: it is opened with ``O_NONBLOCK`` (a FIFO without a
    reader would otherwise block forever) and checked with ``fstat`` before a byte is written.

    Raises:
        OutputExistsError: ``path`` exists (without ``force``), is a symlink or a folder (exit 2).
        PackerError: the file cannot be written (exit 3).
    """
    flags = (os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_NONBLOCK", 0))
    if not force:
        flags |= os.O_EXCL
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        raise OutputExistsError("already exists; pass --force to overwrite it", path=path) from None
    except IsADirectoryError:
        raise OutputExistsError("is a folder; give a file name", path=path) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OutputExistsError("is a symbolic link; refusing to write through it", path=path) from None
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise OutputExistsError("is a FIFO, not a regular file; give a file name", path=path) from None
        raise PackerError(f"cannot write: {exc.strerror}", path=path) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OutputExistsError("is not a regular file (a FIFO, device or socket); give a file name",
                                    path=path)
        os.set_blocking(fd, True)
        if force:
            os.ftruncate(fd, 0)  # only now that it is known to be a regular file
    except BaseException:
        os.close(fd)
        raise
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    except OSError as exc:
        raise PackerError(f"cannot write: {exc.strerror}", path=path) from None


def resolve_sample(index: Any, text: str) -> int:
    """A sample number from ``--sample``: an integer (negative counts from the end) or a key.

    Raises:
        click.BadParameter: out of range, or no sample has that key (exit 2).
    """
    count = len(index)
    try:
        number = int(text)
    except ValueError:
        try:
            return index.find(text)
        except KeyError:
            raise click.BadParameter(f"no sample has the key {text!r}", param_hint="--sample") from None
    if not -count <= number < count:
        raise click.BadParameter(f"sample {number} is out of range: the dataset holds {count} samples",
                                 param_hint="--sample")
    return number % count


def _format_sample(info: dict[str, Any], field_classes: dict[str, tuple[str, ...]] | None = None) -> str:
    """The ``--sample`` text; ``field_classes``: the names of a field's ids (class sets, per-box labels)."""
    rows = [
        ("sample", f"{info['index']}"),
        ("key", info["key"]),
        ("class", f"{info['class']} (label {info['label']})" if info["class"] is not None else str(info["label"])),
        ("shard", f"{info['shard']} ({info['shard_path']})"),
        ("offset", f"{info['offset']}"),
        ("size", f"{info['size']} bytes"),
        ("checksum", info["checksum"]),
        ("image", f"{info['image_format']} {info['height']}x{info['width']} (HxW), {info['channels']} channel(s)"),
        ("metadata", json.dumps(info["metadata"], sort_keys=True, ensure_ascii=False) if info["metadata"] else "none"),
    ]
    if "source_name" in info:
        rows.insert(2, ("name", f"{info['source_name']} (the original bytes; the key escapes them)"))
    for name, value in (info.get("fields") or {}).items():
        rows.append((name, _field_text(value, (field_classes or {}).get(name, ()))))
    # One value per line: a key or class name holding a newline must not forge a line.
    return "\n".join(f"{name:<9}  {terminal_safe(value, keep_newlines=False)}" for name, value in rows)


#: Characters of a field value shown by ``--sample`` (``--json`` has all of it).
_FIELD_SHOWN = 200


def _field_text(value: Any, classes: tuple[str, ...] = ()) -> str:
    """A field's value of ``sample_info`` on one line: an image field's table entry, a caption
    quoted, numbers as JSON, ids with their class names (``[0, 2] = ["cat", "owl"]``); cut at
    ``_FIELD_SHOWN`` characters."""
    if isinstance(value, dict) and "error" in value:  # a damaged value: what is wrong, its bytes escaped
        text = f"unreadable ({value['error']}): {json.dumps(value.get('escaped', ''), ensure_ascii=True)}"
    elif classes and isinstance(value, list) and all(isinstance(v, int) for v in value):
        names = [classes[v] if 0 <= v < len(classes) else f"<no class {v}>" for v in value]
        text = f"{json.dumps(value)} = {json.dumps(names, ensure_ascii=False)}"
    elif isinstance(value, dict):  # an image field: where its payload is and what it holds
        text = (f"{value['format']} {value['height']}x{value['width']} (HxW), {value['channels']} channel(s), "
                f"{value['size']} bytes at {value['offset']} of {value['shard_path']}")
    elif isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = json.dumps(value)
    return text if len(text) <= _FIELD_SHOWN else text[:_FIELD_SHOWN] + " ..."


def _overlay(text: str | None) -> str | None:
    """``--boxes``/``--mask``: a field name, ``auto`` (the default) or ``none``."""
    if text is None or text == "auto":
        return "auto"
    return None if text == "none" else text


@cli.command("inspect")
@click.argument("dataset", type=location_type(exists=True, dataset_folder=True))
@json_option()
@click.option("--sample", "sample", metavar="INDEX_OR_KEY", default=None,
              help="Show one sample: its number (negative counts from the end) or its key.")
@click.option("--extract", type=path_type(dir_okay=False), default=None, metavar="FILE",
              help="With --sample: write the sample's stored bytes to exactly FILE.")
@click.option("--grid", type=path_type(dir_okay=False), default=None, metavar="OUT.png",
              help="Write a contact sheet of sample thumbnails to OUT.png.")
@click.option("--grid-count", default=64, show_default=True, type=click.IntRange(min=1),
              help="Samples on the contact sheet (drawn at random with --seed).")
@click.option("--grid-columns", default=8, show_default=True, type=click.IntRange(min=1),
              help="Thumbnails per row.")
@seed_option(help="Seed of the contact sheet's pick.")
@max_pixels_option(default=None, help="With --grid: refuse images with more pixels than this (default: the "
                   "limit the dataset was built with).")
@click.option("--boxes", "boxes", metavar="FIELD", default=None,
              help="With --grid: outline this [N,4] field's boxes on the thumbnails ('none': no boxes; "
                   "default: the one float [N,4] field named like box/bbox, if there is exactly one).")
@click.option("--mask", "mask", metavar="FIELD", default=None,
              help="With --grid: overlay this image field, a colour per value, 0 clear ('none': no mask; "
                   "default: the one image field named like mask/seg, if there is exactly one).")
@click.option("--box-format", type=click.Choice(["xyxy", "xywh", "cxcywh"]), default="xyxy", show_default=True,
              help="With --grid: how the boxes' 4 numbers are spelt (xywh: COCO; cxcywh: YOLO).")
@click.option("--box-normalized", is_flag=True,
              help="With --grid: box coordinates are fractions of the image's size, not pixels.")
@click.option("--html", "html", type=path_type(dir_okay=False), default=None, metavar="REPORT.html",
              help="Write a self-contained HTML report (plots, rejected files, contact sheet, verify status).")
@click.option("--verify", "run_verify", is_flag=True,
              help="With --html: run packer verify and show its verdict in the report (exit 1 if damaged).")
@click.option("--force", is_flag=True, help="Overwrite an existing --extract, --grid or --html file.")
@click.option("--duplicates", "duplicates", is_flag=True,
              help="Find exact and near-duplicate images, within DATASET and across it and each --against "
                   "dataset (leaks). Exit 1 when a sample has a copy in another dataset. Hashes are kept beside "
                   "the index (a URL's in the node cache) for the next run.")
@click.option("--against", "against", type=location_type(exists=True, dataset_folder=True), multiple=True,
              metavar="OTHER",
              help="With --duplicates: another dataset (folder or URL) to check DATASET against, e.g. the "
                   "validation split; repeat for several.")
@click.option("--threshold", "threshold", type=click.IntRange(0, 128), default=None, metavar="BITS",
              help="With --duplicates: near-duplicates differ in at most BITS of the 128 hash bits "
                   "(default 20).")
@click.option("--flips", "flips", is_flag=True,
              help="With --duplicates: a horizontally mirrored copy counts as a near-duplicate (for data "
                   "trained with flip augmentation).")
def inspect_command(dataset: Location, as_json: bool, sample: str | None, extract: Path | None, grid: Path | None,
                    grid_count: int, grid_columns: int, seed: int, force: bool, max_pixels: int | None,
                    boxes: str | None, mask: str | None, box_format: str, box_normalized: bool,
                    html: Path | None, run_verify: bool, duplicates: bool = False, against: tuple = (),
                    threshold: int | None = None, flips: bool = False) -> None:
    """Summarise DATASET: samples, classes, sizes, rejected files.

    Shards, bytes, build options, image sizes, declared fields (their table and statistics) and
    rejected files, from the manifest and the index: never reads
    the shards unless asked for sample bytes. The contact sheet (--grid) outlines boxes and
    overlays masks of declared fields.

    --html writes all of it, with plots and a contact sheet, as one page that needs no network
    (add --verify to check every checksum too)."""
    if extract is not None and sample is None:
        raise click.UsageError("--extract needs --sample to say which sample to write")
    if run_verify and html is None:
        raise click.UsageError("--verify adds the verify status to the HTML report: it needs --html "
                               "(or run packer verify DATASET)")
    if grid is None and html is None and (boxes is not None or mask is not None or box_normalized
                                          or box_format != "xyxy"):
        raise click.UsageError("--boxes, --mask, --box-format and --box-normalized draw on the contact sheet: "
                               "they need --grid or --html")
    if not duplicates and (against or threshold is not None or flips):
        raise click.UsageError("--against, --threshold and --flips set up the duplicates search: they need "
                               "--duplicates")

    def body() -> int:
        document: dict[str, Any] = {"ok": True}
        code = EXIT_OK
        found = None
        if duplicates and html is not None and not force and (html.exists() or html.is_symlink()):
            raise OutputExistsError("already exists; pass --force to overwrite it", path=html)  # before the search
        if duplicates:
            found, code = _duplicates(dataset, against, threshold, flips, as_json, document)
            document["ok"] = code == EXIT_OK
        if sample is None and grid is None and html is None and not duplicates:
            from ..inspect.summary import format_summary, summarize

            summary = summarize(dataset)
            if as_json:
                document.update(summary)
            else:
                echo(format_summary(summary))
        if sample is not None:
            _sample(dataset, sample, extract, force, as_json, document)
        overlays = {"boxes": _overlay(boxes), "mask": _overlay(mask), "box_format": box_format,
                    "box_normalized": box_normalized}
        if grid is not None:
            _grid(dataset, grid, grid_count, grid_columns, seed, force, as_json, document, max_pixels, overlays)
        if html is not None:
            code = max(code, _html(dataset, html, run_verify, grid_count, grid_columns, seed, force, document,
                                   max_pixels, overlays, found))
            document["ok"] = code == EXIT_OK
        if as_json:
            emit_json(document)
        return code

    run_command(body, as_json=as_json)


def _sample(dataset: Location, text: str, extract: Path | None, force: bool, as_json: bool,
            document: dict[str, Any]) -> None:
    from ..dataset import open_dataset, open_index
    from ..format import verify_checksum

    if extract is None:
        with open_index(dataset) as index:
            info = index.sample_info(resolve_sample(index, text))
            field_classes = {spec.name: spec.classes for spec in index.fields if spec.classes}
    else:
        with open_dataset(dataset) as ds:
            number = resolve_sample(ds, text)
            info = ds.sample_info(number)
            field_classes = {spec.name: spec.classes for spec in ds.fields if spec.classes}
            data = ds.read(number)
            # Never hand out damaged bytes silently: `packer verify` reports the damage in full.
            verify_checksum(data, int(ds.index.checksum[number]), path=info["shard_path"], sample=number,
                            offset=info["offset"])
        write_new_file(extract, data, force=force)
        document["extracted"] = {"path": str(extract), "bytes": len(data)}
        echo(f"wrote the {len(data)} bytes of sample {number} ({info['key']}) to {extract}", err=True)
    if info["metadata"].get("escaped_name"):  # the key escapes a name that is not UTF-8 (packer._internal.names)
        from .._internal.names import unescape_key

        info["source_name"] = unescape_key(info["key"]).decode("utf-8", "backslashreplace")
    document["sample"] = info
    if not as_json:
        echo(_format_sample(info, field_classes))


def _grid(dataset: Location, out: Path, count: int, columns: int, seed: int, force: bool, as_json: bool,
          document: dict[str, Any], max_pixels: int | None = None, overlays: dict[str, Any] | None = None) -> None:
    from ..dataset import open_dataset
    from ..inspect.grid import contact_sheet

    if not force and (out.exists() or out.is_symlink()):  # fail before decoding anything
        raise OutputExistsError("already exists; pass --force to overwrite it", path=out)
    if out.is_symlink() or (out.exists() and not out.is_file()):  # write_new_file refuses these too
        raise OutputExistsError("is not a regular file (a symlink, folder, FIFO or device); give a file name",
                                path=out)
    png = io.BytesIO()
    with open_dataset(dataset) as ds:
        result = contact_sheet(ds, png, count=count, columns=columns, seed=seed, max_pixels=max_pixels,
                               **(overlays or {}))
    write_new_file(out, png.getbuffer(), force=force)
    result["path"] = str(out)
    document["grid"] = result
    failed = f"; {len(result['failed'])} could not be shown (marked !): {result['failed']}" if result["failed"] else ""
    drawn = "".join([f"; {result['boxes_drawn']} box(es) of field {result['boxes']!r} outlined"
                     if result["boxes"] else "",
                     f"; masks of field {result['mask']!r} overlaid" if result["mask"] else "",
                     f" ({len(result['mask_failed'])} could not be: {result['mask_failed']})"
                     if result["mask_failed"] else ""])
    echo(f"wrote a {result['height']}x{result['width']} (HxW) contact sheet of {len(result['samples'])} "
               f"samples to {out}{failed}{drawn}", err=True)


def _duplicates(dataset: Location, against: tuple, threshold: int | None, flips: bool, as_json: bool,
                document: dict[str, Any]) -> tuple[dict[str, Any], int]:
    """Run the duplicates search; exit 1 when a sample of one dataset has a copy in another."""
    from ..duplicates import DEFAULT_THRESHOLD, find_duplicates

    report = find_duplicates(dataset, list(against), threshold=DEFAULT_THRESHOLD if threshold is None else threshold,
                             flips=flips, progress=not as_json)
    found = report.to_json()
    document["duplicates"] = found
    if not as_json:
        echo(report.format_text())
    return found, EXIT_DAMAGED if found["counts"]["leaks"]["groups"] else EXIT_OK


def _html(dataset: Location, out: Path, run_verify: bool, count: int, columns: int, seed: int, force: bool,
          document: dict[str, Any], max_pixels: int | None, overlays: dict[str, Any],
          duplicates: dict[str, Any] | None = None) -> int:
    """Write the HTML report; with ``run_verify``, verify first and return exit 1 when damaged."""
    from ..dataset import open_dataset, open_index
    from ..errors import DecodeError
    from ..inspect.grid import contact_sheet
    from ..inspect.report_html import REJECTED_READ, render_html, report_arrays
    from ..inspect.summary import summarize

    if not force and (out.exists() or out.is_symlink()):  # fail before any work
        raise OutputExistsError("already exists; pass --force to overwrite it", path=out)
    summary = summarize(dataset, rejected_shown=REJECTED_READ)
    with open_index(dataset) as index:
        arrays = report_arrays(index)
    verify_json = None
    if run_verify:
        from ..verify import verify

        verify_json = verify(dataset, max_pixels=max_pixels).to_json()
    sheet_png = sheet = sheet_error = None
    if summary["samples"]:
        png = io.BytesIO()
        try:
            with open_dataset(dataset) as ds:
                sheet = contact_sheet(ds, png, count=count, columns=columns, seed=seed, max_pixels=max_pixels,
                                      **overlays)
            sheet_png = png.getvalue()
        except DecodeError as exc:  # a codec this packer cannot decode: the rest of the report still helps
            sheet_error = str(exc)
    section = None
    if duplicates is not None:
        from ..inspect.duplicates import duplicates_section, pair_thumbnails

        section = duplicates_section(duplicates, pair_thumbnails(duplicates))
    page = render_html(summary, arrays, sheet_png=sheet_png, sheet=sheet, sheet_error=sheet_error,
                       verify=verify_json, duplicates=section).encode("utf-8")
    write_new_file(out, page, force=force)
    document["html"] = {"path": str(out), "bytes": len(page), "verified": verify_json is not None,
                        "verify_ok": None if verify_json is None else verify_json["ok"]}
    verdict = ("verify did not run" if verify_json is None
               else "verify: OK" if verify_json["ok"] else "verify: DAMAGED")
    echo(f"wrote a {len(page):,}-byte report of {summary['samples']:,} samples to {out} ({verdict})", err=True)
    return EXIT_OK if verify_json is None or verify_json["ok"] else EXIT_DAMAGED
