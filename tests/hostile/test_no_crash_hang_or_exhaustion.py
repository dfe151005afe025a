"""Hostile input, second round (issue #13): no input can crash, hang or exhaust a build, a reader
or the CLI.

One section per class of defect. The CLI section drives every verb with mutated argv (types,
ranges, empty strings, paths that are files, folders, FIFOs or missing) and requires an exit
status of 0-3, no traceback and bounded time. Trial counts are printed at the end of the module
for ``scripts/reliability_report.py``.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.writer import build
from packer.writer.plan import BuildOptions
from packer.dataset import open_index
from packer.errors import (EmptySourceError, IndexMismatchError, OptionError, PackerError,
                           SourceError)

REPO = Path(__file__).resolve().parents[2]
TRIALS: dict[str, int] = {}


def _count(label: str, n: int = 1) -> None:
    TRIALS[label] = TRIALS.get(label, 0) + n


@pytest.fixture(scope="module", autouse=True)
def _print_trial_counts() -> Any:
    yield
    print(f"\nhostile input trials: {json.dumps(dict(sorted(TRIALS.items())), sort_keys=True)}")


def strict_json(text: str) -> Any:
    """json.loads that refuses NaN, Infinity and -Infinity (what RFC 8259 allows)."""
    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def png(path: Path, seed: int = 0, size: tuple[int, int] = (12, 16)) -> Path:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    return path


def make_source(root: Path, classes: int = 2, per_class: int = 3) -> Path:
    for c in range(classes):
        for i in range(per_class):
            png(root / f"class{c}" / f"img{i}.png", seed=c * 10 + i)
    return root


def run_cli(argv: list[str], timeout: float = 60) -> tuple[int, str]:
    """``packer ARGV`` in a subprocess: (exit status, stdout + stderr)."""
    done = subprocess.run([sys.executable, "-m", "packer", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    return done.returncode, done.stdout + done.stderr


def run_main(argv: list[str]) -> tuple[int, str, str]:
    """``packer.cli.main(argv)`` in this process: (exit status, stdout, stderr)."""
    from packer.cli import main

    out, err = io.StringIO(), io.StringIO()
    code: Any = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code
        except Exception:  # noqa: BLE001 - reported as a failure with its traceback
            import traceback
            return 99, out.getvalue(), err.getvalue() + traceback.format_exc()
    return (code if isinstance(code, int) else (0 if code is None else 1)), out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def small_dataset(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("hostile-input")
    src = make_source(work / "src")
    build(src, work / "ds", workers=1, progress=False)
    return work / "ds"


def copy_dataset(ds: Path, target: Path) -> Path:
    import shutil
    shutil.copytree(ds, target)
    return target


# --- class 1: header parsers, seen from a build -------------------------------------------------

def _tiff(strip_byte_counts: tuple[int, int, bytes]) -> bytes:
    tag, field_type, value = strip_byte_counts
    entries = [(256, 3, 1, struct.pack("<H", 4)), (257, 3, 1, struct.pack("<H", 4)),
               (258, 3, 1, struct.pack("<H", 8)), (259, 3, 1, struct.pack("<H", 1)),
               (262, 3, 1, struct.pack("<H", 1)), (273, 4, 1, struct.pack("<I", 200)),
               (277, 3, 1, struct.pack("<H", 1)), (278, 3, 1, struct.pack("<H", 4))]
    entries = [e for e in entries if e[0] != tag] + [(tag, field_type, 1 if field_type != 2 else len(value),
                                                       value)]
    entries.sort()
    data_at = 8 + 2 + 12 * len(entries) + 4
    body, extra = b"", b""
    for t, ft, count, raw in entries:
        if len(raw) <= 4:
            body += struct.pack("<HHI", t, ft, count) + raw.ljust(4, b"\0")
        else:
            body += struct.pack("<HHII", t, ft, count, data_at + len(extra))
            extra += raw
    head = b"II*\0" + struct.pack("<I", 8) + struct.pack("<H", len(entries)) + body + b"\0\0\0\0" + extra
    return head.ljust(200, b"\0") + b"\x80" * 16


def test_tiffs_with_hostile_field_types_are_rejected_and_the_build_goes_on(tmp_path):
    """The issue's examples: StripByteCounts as DOUBLE NaN/Inf or RATIONAL, StripOffsets as ASCII."""
    src = make_source(tmp_path / "src")
    cases = {"nan.tif": (279, 12, struct.pack("<d", math.nan)), "inf.tif": (279, 12, struct.pack("<d", math.inf)),
             "rational.tif": (279, 5, struct.pack("<II", 16, 3)), "ascii.tif": (273, 2, b"200\0")}
    for name, field in cases.items():
        (src / "class0" / name).write_bytes(_tiff(field))
    result = build(src, tmp_path / "out", workers=1, progress=False)
    reasons = {r.key: r.reason for r in result.rejected}
    assert reasons == {f"class0/{name}": "decode-failed" for name in cases}
    assert result.sample_count == 6
    # --resume over the same folder meets them again and still finishes
    result = build(src, tmp_path / "out", workers=1, progress=False, overwrite=True, resume=True)
    assert result.sample_count == 6
    _count("class1-build-hostile-tiffs", len(cases))


# --- class 2: bounded, checked reads at pack time ---------------------------------------------------

VICTIM = "class0/img1.png"


def _plan_then_swap(tmp_path: Path, swap: Any, **options: Any) -> Any:
    """Plan (list) the source, swap one file, then pack from the saved plan (--resume).

    60 files, so the resumed build's spot check of 16 listed sizes (spread over the listing)
    does not look at the victim, listing index 1: a swap it would see is refused earlier.
    """
    src = make_source(tmp_path / "src", classes=3, per_class=20)
    out = tmp_path / "out"
    opts = BuildOptions(**options)
    assert build(src, out, opts, workers=1, progress=False, plan_only=True) is None
    swap(src / VICTIM)
    return build(src, out, opts, workers=1, progress=False, resume=True)


@pytest.mark.timeout(60)
def test_fifo_swapped_in_after_listing_does_not_hang(tmp_path):
    def to_fifo(path: Path) -> None:
        path.unlink()
        os.mkfifo(path)
    result = _plan_then_swap(tmp_path, to_fifo)
    rejected = {r.key: r for r in result.rejected}
    assert rejected[VICTIM].reason == "changed-during-build"
    assert "FIFO" in rejected[VICTIM].message
    assert result.sample_count == 59
    _count("class2-fifo-after-listing")


@pytest.mark.timeout(60)
def test_link_to_dev_zero_swapped_in_after_listing_is_not_read(tmp_path):
    def to_zero(path: Path) -> None:
        path.unlink()
        path.symlink_to("/dev/zero")
    tracemalloc.start()
    try:
        result = _plan_then_swap(tmp_path, to_zero)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rejected = {r.key: r for r in result.rejected}
    assert rejected[VICTIM].reason == "changed-during-build"
    assert "character device" in rejected[VICTIM].message
    assert peak < 64 << 20
    _count("class2-dev-zero-after-listing")


@pytest.mark.timeout(60)
def test_file_that_grows_or_shrinks_after_listing(tmp_path):
    def grow(path: Path) -> None:
        with open(path, "ab") as handle:
            handle.write(b"\0" * 10_000)
    result = _plan_then_swap(tmp_path / "grow", grow)
    assert {r.key: r.reason for r in result.rejected} == {VICTIM: "changed-during-build"}

    def shrink(path: Path) -> None:
        path.write_bytes(path.read_bytes()[:50])
    result = _plan_then_swap(tmp_path / "shrink", shrink)
    assert {r.key: r.reason for r in result.rejected} == {VICTIM: "changed-during-build"}
    _count("class2-size-changed-after-listing", 2)


@pytest.mark.timeout(120)
def test_sparse_multi_gigabyte_file_is_rejected_without_reading_it(tmp_path):
    src = make_source(tmp_path / "src")
    sparse = src / "class0" / "huge.jpg"
    with open(sparse, "wb") as handle:
        handle.write(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00")
        handle.truncate(3 << 30)  # 3 GiB, almost no blocks on disk
    tracemalloc.start()
    try:
        result = build(src, tmp_path / "out", workers=1, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    rejected = {r.key: r for r in result.rejected}
    assert rejected["class0/huge.jpg"].reason == "file-too-large"
    assert str(BuildOptions().max_file_size) in rejected["class0/huge.jpg"].message
    assert peak < 64 << 20
    _count("class2-sparse-3GiB")


def test_max_file_size_is_an_option_recorded_in_the_manifest(tmp_path):
    src = make_source(tmp_path / "src")
    big = png(src / "class0" / "big.png", size=(64, 64))
    limit = big.stat().st_size - 1
    code, output = run_cli(["build", str(src), str(tmp_path / "out"), "-q", "--workers", "1",
                            "--max-file-size", str(limit)])
    assert code == 0, output
    with open_index(tmp_path / "out") as index:
        assert index.manifest.build["options"]["max_file_size"] == limit
        keys = set(index.keys())
    assert "class0/big.png" not in keys and len(keys) == 6
    report = (tmp_path / "out" / fmt.REPORT_NAME).read_text()
    assert '"file-too-large"' in report
    for bad in ("0", "-5", "abc", "1e99G", "nan"):
        code, output = run_cli(["build", str(src), str(tmp_path / "bad"), "--max-file-size", bad])
        assert code == 2 and "--max-file-size" in output and "Traceback" not in output, (bad, output)
    with pytest.raises(OptionError, match="max-file-size"):
        BuildOptions(max_file_size=0).check()
    _count("class2-max-file-size-cli", 6)


# --- class 3: recursion on attacker-controlled depth -------------------------------------------------

@pytest.mark.timeout(120)
def test_class_folder_1200_levels_deep_builds(tmp_path):
    src = make_source(tmp_path / "src")
    deep = src / "class1"
    parts = ["d"] * 1200
    fd = os.open(deep, os.O_RDONLY)
    for _ in parts:  # os.makedirs itself recurses per level
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY, dir_fd=fd)
        os.close(fd)
        fd = child
    buffer = io.BytesIO()
    Image.new("RGB", (5, 4), (1, 2, 3)).save(buffer, "PNG")
    image = os.open("deep.png", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
    os.write(image, buffer.getvalue())
    os.close(image)
    os.close(fd)
    try:
        result = build(src, tmp_path / "out", workers=1, progress=False)
        with open_index(tmp_path / "out") as index:
            keys = list(index.keys())
        assert "class1/" + "/".join(parts) + "/deep.png" in keys
        assert result.sample_count == 7
    finally:  # pytest's own cleanup (shutil.rmtree) recurses per level too; rm does not
        subprocess.run(["rm", "-rf", str(deep / "d")], check=True)
    _count("class3-deep-folder-1200")


def _set_metadata(ds: Path, meta: bytes) -> None:
    manifest = json.loads((ds / fmt.MANIFEST_NAME).read_text())
    data = (ds / manifest["index"]["path"]).read_bytes()
    rows, columns = fmt.parse_column_file(data, fmt.INDEX_MAGIC)
    columns = {name: np.array(column) for name, column in columns.items()}
    columns["meta"] = np.frombuffer(meta * rows, dtype=np.uint8).copy()
    columns["meta_offsets"] = np.arange(rows + 1, dtype=np.uint64) * len(meta)
    encoded = b"".join(bytes(p) for p in fmt.encode_column_file(fmt.INDEX_MAGIC, rows, columns))
    (ds / manifest["index"]["path"]).unlink()
    digest = fmt.checksum(encoded)
    name = fmt.index_file_name(digest)
    (ds / name).write_bytes(encoded)
    manifest["index"] = {"path": name, "size": len(encoded), "checksum": fmt.checksum_hex(digest)}
    (ds / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))


@pytest.mark.parametrize("depth", [65, 5_000, 100_000])
def test_deeply_nested_metadata_is_a_typed_error(small_dataset, tmp_path, depth):
    ds = copy_dataset(small_dataset, tmp_path / "ds")
    _set_metadata(ds, b"[" * depth + b"]" * depth)
    with open_index(ds) as index:
        with pytest.raises(IndexMismatchError, match="nested"):
            index.metadata(0)
    code, out, err = run_main(["inspect", str(ds), "--sample", "0"])
    assert code == 1 and "nested" in err and "Traceback" not in err + out
    _count("class3-deep-metadata")


def test_metadata_within_the_depth_cap_and_brackets_in_strings(small_dataset, tmp_path):
    ds = copy_dataset(small_dataset, tmp_path / "ds")
    _set_metadata(ds, b'{"a": "' + b"[" * 500 + b'", "b": ' + b"[" * 10 + b"]" * 10 + b"}")
    with open_index(ds) as index:
        assert index.metadata(0)["a"] == "[" * 500
    _count("class3-metadata-within-cap")


# --- class 4 (output side): every --json output is strict JSON ----------------------------------------

def test_every_json_output_is_strict_json(small_dataset, tmp_path):
    ds = copy_dataset(small_dataset, tmp_path / "ds")
    _set_metadata(ds, b'{"score": NaN, "big": 1e400, "neg": -Infinity}')
    manifest_text = (ds / fmt.MANIFEST_NAME).read_text()
    manifest = json.loads(manifest_text)
    manifest["build"]["x"] = "PLACEHOLDER"
    text = json.dumps(manifest).replace('"PLACEHOLDER"', "1e400")
    (ds / fmt.MANIFEST_NAME).write_text(text)
    runs = [["inspect", str(ds), "--json"], ["inspect", str(ds), "--json", "--sample", "0"],
            ["verify", str(ds), "--json", "-q"], ["inspect", str(tmp_path / "missing"), "--json"],
            ["verify", str(tmp_path), "--json", "-q"]]
    for argv in runs:
        code, out, err = run_main(argv)
        assert code in (0, 1, 2, 3), (argv, code, err)
        document = strict_json(out)
        assert isinstance(document, dict) and "format_version" in document
    sample = strict_json(run_main(["inspect", str(ds), "--json", "--sample", "0"])[1])["sample"]
    assert sample["metadata"] == {"score": None, "big": None, "neg": None}
    _count("class4-strict-json-outputs", len(runs))


# --- class 5: summaries O(samples) whatever the label values ------------------------------------------

@pytest.mark.timeout(120)
def test_huge_integer_labels_summarise_in_bounded_memory(tmp_path):
    images = tmp_path / "images"
    for i in range(4):
        png(images / f"{i}.png", seed=i)
    manifest = tmp_path / "list.csv"
    labels = [10**12, 2**63 - 1, 0, 7]
    manifest.write_text("path,label\n" + "".join(f"{i}.png,{label}\n" for i, label in enumerate(labels)))
    build(manifest, tmp_path / "out", root=images, workers=1, progress=False)
    tracemalloc.start()
    try:
        from packer.inspect.summary import format_summary, summarize
        summary = summarize(tmp_path / "out")
        format_summary(summary)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert summary["labels"] == {str(label): 1 for label in labels}
    assert peak < 64 << 20
    code, out, err = run_main(["inspect", str(tmp_path / "out")])
    assert code == 0 and "4 distinct integer labels" in out, err
    _count("class5-huge-labels")


# --- class 6: informational files are read like untrusted ones ---------------------------------------

def _report_variants(ds: Path) -> dict[str, Any]:
    report = ds / fmt.REPORT_NAME
    good = report.read_bytes()

    def fifo() -> None:
        report.unlink()
        os.mkfifo(report)

    def dev_zero() -> None:
        report.unlink()
        report.symlink_to("/dev/zero")

    def garbage() -> None:
        report.write_bytes(good + b'\xff\xfe{"type": "rejected"}\n[1,2]\n"rejected"\n'
                           b'{"type": "rejected", "key": 5, "reason": [], "message": null}\n'
                           + b"[" * 50_000 + b'"rejected"' + b"]" * 50_000 + b"\n"
                           + b'{"type": "rejected", "key": "k", "reason": "r", "message": "m"}\n')

    def folder() -> None:
        report.unlink()
        report.mkdir()

    return {"fifo": fifo, "dev-zero": dev_zero, "garbage": garbage, "folder": folder}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", ["fifo", "dev-zero", "garbage", "folder"])
def test_hostile_build_report_never_hangs_or_breaks_inspect_and_append(small_dataset, tmp_path, variant):
    ds = copy_dataset(small_dataset, tmp_path / "ds")
    _report_variants(ds)[variant]()
    code, out, err = run_main(["inspect", str(ds), "--json"])
    assert code == 0, err
    rejected = strict_json(out)["rejected"]
    if variant == "garbage":  # only the two rejection objects count; fields shown as text
        assert rejected["count"] == 2 and [e["key"] for e in rejected["first"]] == ["5", "k"]
    code, out, err = run_main(["inspect", str(ds)])
    assert code == 0 and "Traceback" not in err, err
    new = make_source(tmp_path / "new", classes=1, per_class=2)
    (new / "class0").rename(new / "class9")
    code, out, err = run_main(["append", str(ds), str(new), "-q", "--workers", "1"])
    if variant == "folder":  # refused before the commit point: nothing changed
        assert code == 3 and "not a regular file" in err and "Traceback" not in err, err
        with open_index(ds) as index:
            assert len(index) == 6
    else:
        assert code == 0, err
        with open_index(ds) as index:
            assert len(index) == 8
    _count("class6-hostile-report")


@pytest.mark.parametrize("edit", ["inf", "codec-int", "options-list", "options-garbage", "history-nan"])
def test_informational_manifest_fields_never_break_append_or_inspect(small_dataset, tmp_path, edit):
    ds = copy_dataset(small_dataset, tmp_path / "ds")
    manifest = json.loads((ds / fmt.MANIFEST_NAME).read_text())
    if edit == "inf":
        manifest["build"]["x"] = "INF"
    elif edit == "codec-int":
        manifest["build"]["options"]["codec"] = 5
    elif edit == "options-list":
        manifest["build"]["options"] = [1, 2]
    elif edit == "options-garbage":
        manifest["build"]["options"].update(seed="x", shard_size=-1, alignment=3, max_pixels=True,
                                            unknown_field={"a": 1}, validate="nope")
    elif edit == "history-nan":
        manifest["history"] = [{"generation": 0, "n": "NAN"}]
    text = json.dumps(manifest).replace('"INF"', "1e400").replace('"NAN"', "-1e999")
    (ds / fmt.MANIFEST_NAME).write_text(text)
    code, out, err = run_main(["inspect", str(ds), "--json"])
    assert code == 0, err
    strict_json(out)
    new = make_source(tmp_path / "new", classes=1, per_class=2)
    (new / "class0").rename(new / "class9")
    code, out, err = run_main(["append", str(ds), str(new), "-q", "--workers", "1"])
    assert code == 0, err
    strict_json((ds / fmt.MANIFEST_NAME).read_text())  # the rewritten manifest is strict JSON
    with open_index(ds) as index:
        assert len(index) == 8
    _count("class6-informational-manifest-fields")


# --- class 8: CLI tracebacks and hangs ----------------------------------------------------------------

@pytest.fixture(scope="module")
def paths(tmp_path_factory, small_dataset) -> dict[str, str]:
    work = tmp_path_factory.mktemp("argv")
    (work / "file.txt").write_text("not a dataset")
    (work / "folder").mkdir()
    os.mkfifo(work / "fifo")
    src = make_source(work / "src", classes=1, per_class=2)
    return {"file": str(work / "file.txt"), "folder": str(work / "folder"), "fifo": str(work / "fifo"),
            "missing": str(work / "missing" / "x"), "empty": "", "dataset": str(small_dataset),
            "src": str(src), "work": str(work)}


NUMBERS = ["-1", "0", "-3", "abc", "", "1e9", "99999999999999999999999", "nan", "0x10", " 1 "]
#: verb -> (positional kinds, options that take a value, flags)
VERBS: dict[str, tuple[list[str], list[str], list[str]]] = {
    "build": (["src", "out"], ["--workers", "--seed", "--alignment", "--shard-size", "--max-pixels",
                              "--max-file-size", "--part", "--quality", "--max-size", "--codec", "--size",
                              "--validate", "--root"], ["--resume", "--plan-only", "--finish", "--overwrite"]),
    "inspect": (["dataset"], ["--sample", "--grid-count", "--grid-columns", "--seed", "--extract", "--grid"],
                ["--force", "--json"]),
    "verify": (["dataset"], ["--workers"], ["--decode", "--json"]),
    "append": (["dataset", "src"], ["--workers", "--seed", "--root"], ["--json"]),
    "bench": (["dataset"], ["--batch-size", "--workers", "--size", "--batches", "--warmup", "--target-rate",
                            "--seed", "--order", "--backend"], ["--json"]),
}


def _argv_cases(paths: dict[str, str], tmp: Path) -> list[list[str]]:
    cases: list[list[str]] = []
    kinds = ["file", "folder", "fifo", "missing", "empty", "dataset"]
    for verb, (positionals, options, flags) in VERBS.items():
        def base(out: str | None = None) -> list[str]:
            args = []
            for kind in positionals:
                if kind == "out":
                    args.append(out or str(tmp / f"out-{len(cases)}"))
                else:
                    args.append(paths[kind])
            return args
        extra = ["-q"] if verb in ("build", "verify", "append") else []
        bench_fast = ["--batches", "1", "--warmup", "0", "--decode", "none", "--loader", "simple",
                      "--batch-size", "2"] if verb == "bench" else []
        for position in range(len(positionals)):
            for kind in kinds:
                args = base()
                args[position] = paths[kind] if kind != "missing" else str(tmp / f"missing-{len(cases)}")
                cases.append([verb, *args, *extra, *bench_fast])
        for option in options:
            values = NUMBERS + [paths["file"], paths["folder"], paths["fifo"], paths["missing"]]
            for value in values:
                cases.append([verb, *base(), option, value, *extra, *bench_fast])
            cases.append([verb, *base(), option])  # the value missing
        for flag in flags:
            cases.append([verb, *base(), flag, *extra, *bench_fast])
    cases += [["inspect", paths["dataset"], "--sample", "0", "--extract", paths["fifo"], "--force"],
              ["inspect", paths["dataset"], "--grid", paths["fifo"], "--force", "--grid-count", "2"],
              ["inspect", paths["dataset"], "--sample", "0", "--extract", paths["folder"], "--force"],
              ["inspect", paths["dataset"], "--sample", ""], ["inspect", paths["dataset"], "--sample", "\udcff"],
              ["inspect", paths["dataset"], "--sample", "-99999999999999999999"],
              ["append", paths["file"], paths["src"]], ["append", paths["dataset"], paths["dataset"]],
              ["build", paths["src"], paths["src"]], ["build", paths["src"], paths["src"] + "/class0/out"],
              ["nosuchverb"], [], ["--version"], ["build", "--help"], ["build", "--no-such-option"]]
    return cases


@pytest.mark.timeout(600)
def test_every_verb_with_mutated_argv_exits_0_to_3_without_traceback(paths, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)  # an empty path must never mean "here": nothing may appear in cwd
    cases = _argv_cases(paths, tmp_path)
    failures = []
    for argv in cases:
        code, out, err = run_main(argv)
        text = out + err
        if code not in (0, 1, 2, 3) or "Traceback" in text:
            failures.append((argv, code, text[-800:]))
    assert not failures, failures[:5]
    assert len(cases) > 300
    # Only files named by a value (``--grid -1`` writes ./-1); no dataset built into "" == ".".
    assert set(os.listdir(cwd)) <= set(NUMBERS), sorted(os.listdir(cwd))
    _count("class8-mutated-argv", len(cases))


@pytest.mark.timeout(60)
def test_output_onto_a_fifo_with_force_is_refused_not_hung(paths):
    for argv in (["inspect", paths["dataset"], "--sample", "0", "--extract", paths["fifo"], "--force"],
                 ["inspect", paths["dataset"], "--grid", paths["fifo"], "--force", "--grid-count", "2"]):
        code, out, err = run_main(argv)
        assert code == 2 and "not a regular file" in err or "FIFO" in err, (argv, err)
    _count("class8-fifo-output", 2)


def test_bad_values_are_usage_errors_naming_the_option(paths, tmp_path):
    for argv, option in ((["build", paths["src"], str(tmp_path / "o"), "--seed", "-1"], "--seed"),
                         (["build", paths["src"], str(tmp_path / "o"), "--workers", "0"], "--workers"),
                         (["build", paths["src"], str(tmp_path / "o"), "--workers", "-3"], "--workers"),
                         (["append", paths["dataset"], paths["src"], "--workers", "0"], "--workers"),
                         (["verify", paths["dataset"], "--workers", "0"], "--workers"),
                         (["append", paths["file"], paths["src"]], "DATASET")):
        code, out, err = run_main(argv)
        assert code == 2 and option in err, (argv, err)
    code, out, err = run_main(["inspect", paths["dataset"], "--sample", ""])
    assert code == 2 and "--sample" in err
    with open_index(paths["dataset"]) as index:
        with pytest.raises(KeyError):
            index.find("")
    with pytest.raises(OptionError, match="workers"):
        build(paths["src"], tmp_path / "w", workers=0, progress=False)
    _count("class8-usage-errors", 9)


_INTERRUPT = """
import json, os, signal, sys, threading
sys.argv = ["packer"]
from packer.cli import main
delay = float(os.environ["DELAY"])
argv = json.loads(os.environ["ARGV"])
try:
    threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT)).start()
except KeyboardInterrupt:  # a loaded machine: the signal came while the timer thread started
    sys.exit(0)            # before packer ran, so there is nothing of packer's to check
main(argv)
"""


@pytest.mark.timeout(300)
def test_ctrl_c_at_any_moment_prints_one_line_and_exits_130(tmp_path):
    src = make_source(tmp_path / "src", classes=4, per_class=40)
    outcomes = []
    for i, delay in enumerate((0.01, 0.05, 0.1, 0.3, 0.6, 1.0)):  # from just before main() is entered
        argv = ["build", str(src), str(tmp_path / f"out{i}"), "--workers", "2", "--shard-size", "16K"]
        done = subprocess.run([sys.executable, "-c", _INTERRUPT], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(REPO), "DELAY": str(delay),
                                   "ARGV": json.dumps(argv)})
        outcomes.append((delay, done.returncode, done.stderr))
        if done.returncode == 0:
            continue  # finished before the signal: nothing to check
        assert done.returncode == 130, (delay, done.stderr)
        assert "Traceback" not in done.stderr, (delay, done.stderr)
        assert done.stderr.strip().splitlines()[-1].startswith("interrupted"), (delay, done.stderr)
    assert sum(code == 130 for _, code, _ in outcomes) >= 3, outcomes
    _count("class8-ctrl-c", len(outcomes))


# --- class 9: outputs that surprise --------------------------------------------------------------------

def test_out_equal_to_or_inside_src_is_refused(tmp_path):
    src = make_source(tmp_path / "src")
    for out in (src, src / "class0" / "ds", src / "newclass"):
        with pytest.raises(SourceError, match="source folder"):
            build(src, out, workers=1, progress=False)
    assert not (src / "newclass").exists()
    code, out_text, err = run_main(["build", str(src), str(src / "ds"), "-q"])
    assert code == 2 and "inside the source folder" in err
    _count("class9-out-inside-src", 4)


def test_every_file_rejected_writes_the_report_and_cleans_up(tmp_path):
    src = tmp_path / "src"
    for i in range(3):
        (src / "c").mkdir(parents=True, exist_ok=True)
        (src / "c" / f"{i}.jpg").write_bytes(b"not an image %d" % i)
    out = tmp_path / "out"
    with pytest.raises(EmptySourceError, match="every one of the 3 (listed )?source files was rejected"):
        build(src, out, workers=1, progress=False)
    lines = [json.loads(line) for line in (out / fmt.REPORT_NAME).read_text().splitlines()]
    assert lines[0]["type"] == "summary" and lines[0]["packed"] == 0
    assert sorted(line["key"] for line in lines[1:]) == ["c/0.jpg", "c/1.jpg", "c/2.jpg"]
    assert not (out / ".packer-build").exists()
    code, _, err = run_main(["inspect", str(out)])
    assert code == 1 and "--resume" not in err and "packed nothing" in err
    code, _, err = run_main(["build", str(src), str(tmp_path / "out2"), "-q"])
    assert code == 2 and "rejected" in err and "build-report.jsonl" in err
    _count("class9-all-rejected", 2)


def test_control_characters_in_names_are_escaped_on_output(tmp_path):
    src = tmp_path / "src"
    evil = "a\x1b]0;owned\x07\x1b[2J\u202eb.png"
    png(src / "cls\x1b[31m" / evil)
    (src / "cls\x1b[31m" / "bad\x1b[1m.png").write_bytes(b"junk")
    build(src, tmp_path / "out", workers=1, progress=False)
    for argv in (["inspect", str(tmp_path / "out"), "--sample", "0"], ["inspect", str(tmp_path / "out")]):
        code, out, err = run_main(argv)
        assert code == 0, err
        assert "\x1b" not in out + err and "\u202e" not in out + err and "\x07" not in out + err
        assert "\\x1b" in out
    code, out, err = run_main(["inspect", str(tmp_path / "out"), "--json", "--sample", "0"])
    assert "\x1b" not in out and "\u202e" not in out
    assert strict_json(out)["sample"]["key"] == f"cls\x1b[31m/{evil}"  # the JSON value is exact
    _count("class9-escaped-names", 3)


def test_bytes_of_files_outside_the_source_are_never_quoted(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    src = make_source(tmp_path / "src")
    (src / "class0" / "passwd.jpg").symlink_to(secret)
    (src / "class0" / "inside.jpg").write_bytes(b"hello inside bytes")
    result = build(src, tmp_path / "out", workers=1, progress=False)
    messages = {r.key: r.message for r in result.rejected}
    assert "root:x" not in messages["class0/passwd.jpg"] and "outside the source" in messages["class0/passwd.jpg"]
    assert "hello inside" in messages["class0/inside.jpg"]  # inside the source: still helpful
    assert b"root:x" not in (tmp_path / "out" / fmt.REPORT_NAME).read_bytes()
    _count("class9-outside-bytes-not-quoted")


def test_library_errors_never_leak_from_cli_for_bad_paths(paths):
    code, out, err = run_main(["build", paths["fifo"], paths["work"] + "/o"])
    assert code == 2 and "Traceback" not in err
    with pytest.raises(PackerError):
        open_index(paths["fifo"])


# --- class 7: readers enforce the SPEC ------------------------------------------------------------------

def _edit_manifest(ds: Path, edit: Any) -> None:
    manifest = json.loads((ds / fmt.MANIFEST_NAME).read_text())
    edit(manifest)
    (ds / fmt.MANIFEST_NAME).write_text(json.dumps(manifest))


def test_unknown_codec_is_refused_by_every_decoding_reader(small_dataset, tmp_path):
    from packer.codecs import check_decodable
    from packer.errors import DecodeError

    ds = copy_dataset(small_dataset, tmp_path / "ds")
    _edit_manifest(ds, lambda m: m.update(codec={"name": "zstd-future", "level": 3}))
    code, out, err = run_main(["verify", str(ds), "-q"])
    assert code == 0, out + err  # checksums only: the codec does not matter (SPEC 6 MAY)
    code, out, err = run_main(["verify", str(ds), "-q", "--decode"])
    assert code == 1 and "zstd-future" in out and "not one this packer can decode" in out, out + err
    code, out, err = run_main(["inspect", str(ds), "--grid", str(tmp_path / "g.png"), "--grid-count", "2"])
    assert code == 1 and "zstd-future" in err and not (tmp_path / "g.png").exists(), err
    code, out, err = run_main(["inspect", str(ds), "--sample", "0", "--extract", str(tmp_path / "x.bin")])
    assert code == 0, err  # stored bytes only: allowed
    for entry in ({"name": "zstd-future"}, {"name": 5}, {}, "raw",
                  {"name": "raw", "layout": "CHW", "dtype": "uint8"}, {"name": "raw", "layout": "HWC", "dtype": "f4"}):
        with pytest.raises(DecodeError):
            check_decodable(entry)
    check_decodable({"name": "raw", "layout": "HWC", "dtype": "uint8", "height": 2, "width": 2})
    _count("class7-unknown-codec", 10)


def test_max_pixels_is_recorded_and_honoured_by_readers(tmp_path, monkeypatch):
    from packer import decode as decode_module
    from packer.codecs import dataset_max_pixels
    from packer.imageinfo import DEFAULT_MAX_PIXELS
    from packer.verify import verify

    src = make_source(tmp_path / "src")
    build(src, tmp_path / "default", workers=1, progress=False)
    with open_index(tmp_path / "default") as index:
        assert index.manifest.max_pixels is None and "limits" not in index.manifest.raw
        assert dataset_max_pixels(index.manifest) == DEFAULT_MAX_PIXELS
    build(src, tmp_path / "big", BuildOptions(max_pixels=300_000_000), workers=1, progress=False)
    with open_index(tmp_path / "big") as index:
        assert index.manifest.raw["limits"] == {"max_pixels": 300_000_000}
        assert dataset_max_pixels(index.manifest) == 300_000_000
        assert dataset_max_pixels(index.manifest, 5) == 5
    seen: list[int] = []
    real = decode_module.decode_image

    def spy(data: Any, image_format: int, **kwargs: Any) -> Any:
        seen.append(kwargs["max_pixels"])
        return real(data, image_format, **kwargs)

    monkeypatch.setattr(decode_module, "decode_image", spy)
    assert verify(tmp_path / "big", decode=True, workers=1, progress=False).ok
    assert seen and set(seen) == {300_000_000}
    monkeypatch.setattr(decode_module, "decode_image", real)
    code, out, err = run_main(["verify", str(tmp_path / "big"), "--decode", "-q", "--workers", "1",
                               "--max-pixels", "10"])
    assert code == 1 and "max_pixels" in out, out  # the override is applied
    # append keeps the recorded limit
    new = make_source(tmp_path / "new", classes=1, per_class=1)
    (new / "class0").rename(new / "class7")
    code, out, err = run_main(["append", str(tmp_path / "big"), str(new), "-q", "--workers", "1"])
    assert code == 0, err
    with open_index(tmp_path / "big") as index:
        assert index.manifest.max_pixels == 300_000_000
    _count("class7-max-pixels", 4)


def test_pillow_global_limit_never_decides(monkeypatch):
    """WEBP (checked by Pillow's own plugin at open) follows max_pixels like every format."""
    from PIL import Image as PILImage

    from packer.decode import decode_image
    from packer.imageinfo import probe_image

    buffer = io.BytesIO()
    PILImage.fromarray(np.zeros((40, 50, 3), dtype=np.uint8)).save(buffer, "WEBP", lossless=True)
    data = buffer.getvalue()
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 100)  # Pillow refuses over 200 px now
    info = probe_image(data, max_pixels=10_000)
    assert (info.width, info.height) == (50, 40)
    assert decode_image(data, info.image_format, max_pixels=10_000).shape == (40, 50, 3)
    assert PILImage.MAX_IMAGE_PIXELS == 100  # restored
    with pytest.raises(PackerError):
        probe_image(data, max_pixels=1_000)
    _count("class7-pillow-limit", 3)


# --- class 10: refusals that cost too much -----------------------------------------------------------

def _many_shards_manifest(shards: int, sample_count: int, bad_entry: int | None = None) -> bytes:
    entries = [{"path": f"shards/shard-{i:05d}-{i:016x}.pks", "size": 4096, "sample_count": 1,
                "checksum": f"{i:016x}"} for i in range(shards)]
    if bad_entry is not None:
        entries[bad_entry]["path"] = "../../etc/passwd"
    manifest = {"format": "packer-dataset", "format_version": 1, "checksum_algorithm": "xxh3_64",
                "alignment": 4096, "sample_count": sample_count, "codec": {"name": "passthrough"},
                "classes": [], "index": {"path": "index-0000000000000000.pki", "size": 10, "checksum": "0" * 16},
                "shards": entries}
    return json.dumps(manifest).encode()


def test_huge_shard_lists_are_refused_before_any_entry_is_checked():
    from packer.errors import ManifestError

    # The count check runs before the entries: a bad path at entry 7 is never reached.
    with pytest.raises(ManifestError, match="differs from the sum"):
        fmt.parse_manifest(_many_shards_manifest(50_000, 10**9, bad_entry=7))
    with pytest.raises(ManifestError, match="every shard holds at least one sample"):
        fmt.parse_manifest(_many_shards_manifest(50_000, 10, bad_entry=7))
    with pytest.raises(PackerError, match="not a valid dataset path"):  # the counts agree: R19 names it
        fmt.parse_manifest(_many_shards_manifest(50_000, 50_000, bad_entry=7))
    manifest = fmt.parse_manifest(_many_shards_manifest(50_000, 50_000))
    assert len(manifest.shards) == 50_000 and manifest.shards[-1].number == 49_999
    assert manifest.shards[3] == fmt.ShardEntry(path="shards/shard-00003-0000000000000003.pks", size=4096,
                                                checksum=3, sample_count=1)
    _count("class10-cheap-refusals", 4)


# --- class 11: the C extension ---------------------------------------------------------------------------

def _jpeg(seed: int = 0, size: tuple[int, int] = (48, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (*size, 3), dtype=np.uint8)).save(
        buffer, "JPEG", quality=85)
    return buffer.getvalue()


def test_jpegs_with_data_after_the_image_are_kept_whole_with_a_note():
    from packer.codecs import get_codec
    from packer.imageinfo import probe_image

    codec = get_codec("tiled")
    mpo = io.BytesIO()
    first = Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8))
    first.save(mpo, "MPO", save_all=True, append_images=[Image.fromarray(np.full((32, 32, 3), 200, np.uint8))])
    cases = {"mpo": mpo.getvalue(), "appended": _jpeg() + b"appended video bytes" * 10, "padding": _jpeg() + b"\0" * 3}
    for label, data in cases.items():
        info = probe_image(data)
        payload, _ = codec.encode(data, info)
        assert payload is data, label  # nothing dropped
        assert codec.note(data, payload, info) == "kept: data after the image", label
    plain = _jpeg()
    payload, info = codec.encode(plain, probe_image(plain))
    assert payload is not plain and codec.note(plain, payload, info) == "tiled"
    _count("class11-data-after-the-image", 4)


def test_window_refuses_nan_infinite_and_huge_boxes():
    from packer.codecs import _jpegtiles
    from packer.codecs.tiles import transcode

    tiled = transcode(_jpeg(1, (64, 96)), max_pixels=10**8)
    assert _jpegtiles.window(tiled, 0.0, 0.0, 16.0, 16.0, 8) is not None
    for box in ((math.nan, 0.0, 8.0, 8.0), (0.0, 0.0, math.inf, 8.0), (-math.inf, 0.0, 8.0, 8.0),
                (0.0, 0.0, 8.0, 1e300), (-1e300, 0.0, 8.0, 8.0)):
        with pytest.raises(ValueError, match="finite"):
            _jpegtiles.window(tiled, *box, 8)
    with pytest.raises(ValueError):
        _jpegtiles.window(tiled, 0.0, 0.0, 8.0, 8.0, -1)
    _count("class11-window-box", 6)


def test_writable_buffers_give_the_same_bytes_as_read_only_ones():
    from packer.codecs import _jpegtiles
    from packer.codecs.tiles import transcode

    source = _jpeg(2, (64, 96))
    tiled = transcode(source, max_pixels=10**8)
    assert transcode(bytearray(source), max_pixels=10**8) == tiled
    assert transcode(np.frombuffer(source, dtype=np.uint8).copy(), max_pixels=10**8) == tiled
    expected = _jpegtiles.window(tiled, 16.0, 8.0, 40.0, 30.0, 8)
    assert _jpegtiles.window(bytearray(tiled), 16.0, 8.0, 40.0, 30.0, 8) == expected
    _count("class11-writable-buffers", 3)


def test_huffman_table_with_an_all_ones_code_is_refused_like_libjpeg():
    from packer.codecs.tiles import transcode

    source = _jpeg(3)
    position = source.index(b"\xff\xc4")
    length = struct.unpack(">H", source[position + 2:position + 4])[0]
    # One DC table (class 0, id 0) with two 1-bit codes: "0" and "1", the second all ones.
    table = bytes([0x00]) + bytes([2] + [0] * 15) + bytes([0, 1])
    bad = source[:position] + b"\xff\xc4" + struct.pack(">H", 2 + len(table)) + table + source[position + 2 + length:]
    with pytest.raises(ValueError, match="Huffman table has too many codes"):
        transcode(bad, max_pixels=10**8)
    # Pillow (libjpeg-turbo) refuses the table too.
    with pytest.raises(Exception):
        Image.open(io.BytesIO(bad)).load()
    _count("class11-all-ones-huffman", 1)


@pytest.mark.timeout(30)
def test_json_depth_scan_is_linear_on_unterminated_strings():
    """The nesting pre-check runs on hostile bytes: it must not be quadratic (a regex rescanning)."""
    assert fmt.json_nesting_depth(b'{"a": "[[[", "b": [[1]]}') == 3
    assert fmt.json_nesting_depth(b'"\\"[[[" [') == 1
    hostile = b'"' + b'\\"' * 500_000 + b"[" * 10
    assert fmt.json_nesting_depth(hostile) == 0  # one unterminated string to the end
    hostile = b'"x' * 1_000_000
    assert fmt.json_nesting_depth(hostile) == 0
    _count("class3-depth-scan-linear", 2)


def test_names_with_line_breaks_cannot_forge_output_lines(tmp_path):
    src = tmp_path / "src"
    png(src / "cls" / "a\nsample    99\nkey       fake.png")
    (src / "cls" / "bad\nrejected   0 file(s)").write_bytes(b"junk")
    build(src, tmp_path / "out", workers=1, progress=False)
    code, out, err = run_main(["inspect", str(tmp_path / "out"), "--sample", "0"])
    assert code == 0, err
    assert len(out.strip().splitlines()) == 9 and "sample    99" not in out.splitlines()
    code, out, err = run_main(["inspect", str(tmp_path / "out")])
    assert code == 0 and not any(line.startswith("rejected   0") for line in out.splitlines()), out
    _count("class9-line-breaks-in-names", 2)


def _without_unraisable_reports(err: str) -> str:
    """``err`` without the interpreter's "Exception ignored in ..." blocks (up to the next blank-free
    line that is not indented or part of the traceback). A block can start mid-line, after a
    progress bar's carriage-return output."""
    kept, skipping = [], False
    for line in err.splitlines():
        if "Exception ignored in" in line:
            before = line.split("Exception ignored in")[0]
            if before.strip():
                kept.append(before)
            skipping = True
            continue
        if skipping and (line.startswith((" ", "Traceback", "KeyboardInterrupt")) or not line.strip()):
            continue
        skipping = False
        kept.append(line)
    return "\n".join(kept)


@pytest.mark.timeout(300)
def test_ctrl_c_to_the_process_group_of_a_real_build(tmp_path):
    """Ctrl-C in a terminal reaches the build and its workers: one line, exit 130, no traceback
    from any process. Delays start after the interpreter's own startup (measured here: Python's
    ``site`` import is not packer's and cannot be covered), then cover import, listing, packing."""
    import time

    src = make_source(tmp_path / "src", classes=4, per_class=30)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    startup = time.monotonic() - started
    outcomes = []
    for i, extra in enumerate((0.0, 0.05, 0.15, 0.3, 0.6)):
        process = subprocess.Popen([sys.executable, "-m", "packer", "build", str(src), str(tmp_path / f"o{i}"),
                                    "--workers", "2", "--shard-size", "16K"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
        time.sleep(2 * startup + extra)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=120)
        outcomes.append(process.returncode)
        # Python itself may report a Ctrl-C that lands inside an import-lock callback as
        # "Exception ignored in ..." (an unraisable error, printed by the interpreter; nothing can
        # catch it). Only that report is tolerated; any other traceback fails.
        assert "Traceback" not in _without_unraisable_reports(err), (extra, err)
        finished = (tmp_path / f"o{i}" / "manifest.json").exists() and "packed " in err
        # Exit 130, or ended by SIGINT itself (-2: a Ctrl-C that lands while the interpreter is
        # starting up or shutting down takes the signal's default action). A shell reports both
        # as status 130; what the user sees must be the same: one line, no traceback.
        assert process.returncode in (0, 130, -signal.SIGINT), (extra, process.returncode, err)
        if process.returncode != 0 and not finished:
            assert all(line.startswith("interrupted") for line in err.strip().splitlines()[-1:]), (extra, err)
    assert sum(code in (130, -signal.SIGINT) for code in outcomes) >= 2, outcomes
    _count("class8-ctrl-c-process-group", len(outcomes))


def test_same_size_rewrite_after_listing_is_detected(tmp_path):
    def rewrite(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[-20] ^= 0xFF  # same size, other content
        path.write_bytes(bytes(data))
        stat = path.stat()
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    result = _plan_then_swap(tmp_path, rewrite)
    assert {r.key: r.reason for r in result.rejected} == {VICTIM: "changed-during-build"}
    assert "modification time" in {r.key: r.message for r in result.rejected}[VICTIM]
    _count("class2-same-size-rewrite")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("planted", ["plan-fifo", "record-fifo", "record-garbage", "record-bad-path"])
def test_staging_files_planted_or_damaged_never_hang_resume(tmp_path, planted):
    src = make_source(tmp_path / "src")
    out = tmp_path / "out"
    assert build(src, out, workers=1, progress=False, plan_only=True) is None
    staging = out / ".packer-build"
    if planted == "plan-fifo":
        (staging / "plan.pkp").unlink()
        os.mkfifo(staging / "plan.pkp")
        with pytest.raises(PackerError, match="plan"):
            build(src, out, workers=1, progress=False, resume=True)
        return _count("staging-planted")
    records = staging / "done"
    records.mkdir(exist_ok=True)
    record = records / "shard-00000.pkr"
    if planted == "record-fifo":
        os.mkfifo(record)
    elif planted == "record-garbage":
        record.write_bytes(b"PKPLAN\0\0" + b"\xff" * 200)
    else:
        from packer.writer.plan import load_plan
        from packer.writer.records import read_record, write_record
        plan = load_plan(staging / "plan.pkp", src)
        write_record(record, {"plan": fmt.checksum_hex(plan.fingerprint), "sample_count": 1, "rejected": [],
                              "path": "../../../etc/passwd", "size": 1}, {name: [0] for name in
                              ("source", "offset", "size", "checksum", "width", "height", "channels",
                               "image_format")})
        assert plan.fingerprint != 0  # the record carries the right plan: only its path is wrong
        assert read_record(record, plan.fingerprint, out) is None
    result = build(src, out, workers=1, progress=False, resume=True)
    assert result.sample_count == 6
    _count("staging-planted")


def test_ctrl_c_while_the_workers_fork_stops_the_build(tmp_path, monkeypatch):
    """A Ctrl-C taken by another thread while the pool forks is handled by Python in the main
    thread wherever it is, e.g. inside an at-fork hook, which reports and swallows the
    KeyboardInterrupt ("Exception ignored in _releaseLock"): the build then ran to the end. The
    signal is recorded during the fork and raised after it, so the build stops."""
    from concurrent.futures import ProcessPoolExecutor

    src = make_source(tmp_path / "src", classes=2, per_class=8)
    real_submit = ProcessPoolExecutor.submit
    calls = []

    def submit_taking_a_ctrl_c(pool, *args, **kwargs):
        if not calls:  # Python runs the SIGINT handler here, in a context that swallows errors
            try:
                signal.getsignal(signal.SIGINT)(signal.SIGINT, None)
            except KeyboardInterrupt:
                pass
        calls.append(args)
        return real_submit(pool, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", submit_taking_a_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        build(src, tmp_path / "out", BuildOptions(shard_size=16 << 10), workers=2, progress=False)
    assert calls and not (tmp_path / "out" / "manifest.json").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is restored
    monkeypatch.undo()
    build(src, tmp_path / "out", BuildOptions(shard_size=16 << 10), workers=2, progress=False, resume=True)
    assert (tmp_path / "out" / "manifest.json").exists()
