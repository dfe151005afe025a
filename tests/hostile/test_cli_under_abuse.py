"""The CLI under abuse: every verb with mutated argv, Ctrl-C at any moment, outputs onto FIFOs or
inside the source, control characters and line breaks in names, hostile build reports and
manifest fields, planted staging files: an exit status of 0-3 (130 on Ctrl-C), one line of
error and no traceback, strict JSON, bounded time."""

from __future__ import annotations
import json
import os
import signal
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from packer import format as fmt
from packer.dataset import open_index
from packer.errors import EmptySourceError, OptionError, PackerError, SampleKeyError, SourceError
from packer.writer import build
from packer import BuildSettings, LayoutSettings, RunOptions, SourceSettings

from helpers import REPO, copy_dataset, count_trial, noisy_png, noisy_png_classes, run_main, strict_json
from test_crafted_datasets import _set_metadata


# --- class 4 (output side): every --json output is strict JSON ------------------------------------


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
    count_trial("class4-strict-json-outputs", len(runs))


# --- class 5: summaries O(samples) whatever the label values --------------------------------------


@pytest.mark.timeout(120)
def test_huge_integer_labels_summarise_in_bounded_memory(tmp_path):
    images = tmp_path / "images"
    for i in range(4):
        noisy_png(images / f"{i}.png", seed=i)
    manifest = tmp_path / "list.csv"
    labels = [10**12, 2**63 - 1, 0, 7]
    manifest.write_text("path,label\n" + "".join(f"{i}.png,{label}\n" for i, label in enumerate(labels)))
    build(manifest, tmp_path / "out", BuildSettings(source=SourceSettings(root=images)), RunOptions(workers=1))
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
    count_trial("class5-huge-labels")


# --- class 6: informational files are read like untrusted ones ------------------------------------


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
    new = noisy_png_classes(tmp_path / "new", classes=1, per_class=2)
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
    count_trial("class6-hostile-report")


@pytest.mark.parametrize("edit", ["inf", "codec-int", "settings-list", "settings-garbage", "old-options-garbage",
                                  "old-options-list", "history-nan"])
def test_informational_manifest_fields_never_break_append_or_inspect(small_dataset, tmp_path, edit):
    ds = copy_dataset(small_dataset, tmp_path / "ds")
    manifest = json.loads((ds / fmt.MANIFEST_NAME).read_text())
    settings = manifest["build"]["settings"]
    if edit == "inf":
        manifest["build"]["x"] = "INF"
    elif edit == "codec-int":
        settings["codec"] = 5
    elif edit == "settings-list":
        manifest["build"]["settings"] = [1, 2]
    elif edit == "settings-garbage":
        settings["layout"].update(seed="x", shard_size=-1, alignment=3, unknown_field={"a": 1})
        settings["checks"].update(max_pixels=True, validate="nope")
        settings["labels"] = "cat,dog"
        settings["source"].update(kind=7, root=["/"], label_field=None)
    elif edit.startswith("old-options"):  # the flat options packer 0.1 recorded, hand-edited
        del manifest["build"]["settings"]
        manifest["build"]["source_kind"] = "folder"
        manifest["build"]["options"] = [1, 2] if edit == "old-options-list" else {
            "seed": "x", "shard_size": -1, "alignment": 3, "max_pixels": True, "unknown_field": {"a": 1},
            "validate": "nope", "classes": [3]}
    elif edit == "history-nan":
        manifest["history"] = [{"generation": 0, "n": "NAN"}]
    text = json.dumps(manifest).replace('"INF"', "1e400").replace('"NAN"', "-1e999")
    (ds / fmt.MANIFEST_NAME).write_text(text)
    code, out, err = run_main(["inspect", str(ds), "--json"])
    assert code == 0, err
    strict_json(out)
    new = noisy_png_classes(tmp_path / "new", classes=1, per_class=2)
    (new / "class0").rename(new / "class9")
    code, out, err = run_main(["append", str(ds), str(new), "-q", "--workers", "1"])
    assert code == 0, err
    strict_json((ds / fmt.MANIFEST_NAME).read_text())  # the rewritten manifest is strict JSON
    with open_index(ds) as index:
        assert len(index) == 8
    count_trial("class6-informational-manifest-fields")


# --- class 8: CLI tracebacks and hangs ------------------------------------------------------------


@pytest.fixture(scope="module")
def paths(tmp_path_factory, small_dataset) -> dict[str, str]:
    work = tmp_path_factory.mktemp("argv")
    (work / "file.txt").write_text("not a dataset")
    (work / "folder").mkdir()
    os.mkfifo(work / "fifo")
    src = noisy_png_classes(work / "src", classes=1, per_class=2)
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
    count_trial("class8-mutated-argv", len(cases))


@pytest.mark.timeout(60)
def test_output_onto_a_fifo_with_force_is_refused_not_hung(paths):
    for argv in (["inspect", paths["dataset"], "--sample", "0", "--extract", paths["fifo"], "--force"],
                 ["inspect", paths["dataset"], "--grid", paths["fifo"], "--force", "--grid-count", "2"]):
        code, out, err = run_main(argv)
        assert code == 2 and "not a regular file" in err or "FIFO" in err, (argv, err)
    count_trial("class8-fifo-output", 2)


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
        with pytest.raises(SampleKeyError, match="keys are non-empty strings"):
            index.find("")
    with pytest.raises(OptionError, match="workers"):
        build(paths["src"], tmp_path / "w", BuildSettings(), RunOptions(workers=0))
    count_trial("class8-usage-errors", 9)


def _ctrl_c_reaches_the_child() -> None:
    """``preexec_fn`` of the children these tests interrupt: SIGINT at its default action, as a
    command started from an interactive terminal has it. Started as a background job of a
    non-interactive shell (``make test &``, ``bash -c 'pytest ... & wait'``, some CI runners), the
    suite inherits SIGINT *ignored* (POSIX: an asynchronous list ignores SIGINT and SIGQUIT), its
    children too, and Python then installs no KeyboardInterrupt handler: the Ctrl-C sent below
    would be lost, whatever packer does. packer itself keeps an inherited SIG_IGN (as Python, the
    shells and ``nohup`` do: the shell ignores it on purpose, so that a Ctrl-C meant for the
    script does not stop its background jobs); ``kill`` (SIGTERM) stops such a build."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def ctrl_c_raises():
    """This process takes Ctrl-C as KeyboardInterrupt for the test (Python's default; not so when
    the suite was started with SIGINT ignored, see ``_ctrl_c_reaches_the_child``)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


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
    src = noisy_png_classes(tmp_path / "src", classes=4, per_class=40)
    outcomes = []
    for i, delay in enumerate((0.01, 0.05, 0.1, 0.3, 0.6, 1.0)):  # from just before main() is entered
        argv = ["build", str(src), str(tmp_path / f"out{i}"), "--workers", "2", "--shard-size", "16K"]
        done = subprocess.run([sys.executable, "-c", _INTERRUPT], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(REPO), "DELAY": str(delay),
                                   "ARGV": json.dumps(argv)}, preexec_fn=_ctrl_c_reaches_the_child)
        outcomes.append((delay, done.returncode, done.stderr))
        if done.returncode == 0:
            continue  # finished before the signal: nothing to check
        assert done.returncode == 130, (delay, done.stderr)
        assert "Traceback" not in done.stderr, (delay, done.stderr)
        assert done.stderr.strip().splitlines()[-1].startswith("interrupted"), (delay, done.stderr)
    assert sum(code == 130 for _, code, _ in outcomes) >= 3, outcomes
    count_trial("class8-ctrl-c", len(outcomes))


# --- class 9: outputs that surprise ---------------------------------------------------------------


def test_out_equal_to_or_inside_src_is_refused(tmp_path):
    src = noisy_png_classes(tmp_path / "src")
    for out in (src, src / "class0" / "ds", src / "newclass"):
        with pytest.raises(SourceError, match="source folder"):
            build(src, out, BuildSettings(), RunOptions(workers=1))
    assert not (src / "newclass").exists()
    code, out_text, err = run_main(["build", str(src), str(src / "ds"), "-q"])
    assert code == 2 and "inside the source folder" in err
    count_trial("class9-out-inside-src", 4)


def test_every_file_rejected_writes_the_report_and_cleans_up(tmp_path):
    src = tmp_path / "src"
    for i in range(3):
        (src / "c").mkdir(parents=True, exist_ok=True)
        (src / "c" / f"{i}.jpg").write_bytes(b"not an image %d" % i)
    out = tmp_path / "out"
    with pytest.raises(EmptySourceError, match="every one of the 3 (listed )?source files was rejected"):
        build(src, out, BuildSettings(), RunOptions(workers=1))
    lines = [json.loads(line) for line in (out / fmt.REPORT_NAME).read_text().splitlines()]
    assert lines[0]["type"] == "summary" and lines[0]["packed"] == 0
    assert sorted(line["key"] for line in lines[1:]) == ["c/0.jpg", "c/1.jpg", "c/2.jpg"]
    assert not (out / ".packer-build").exists()
    code, _, err = run_main(["inspect", str(out)])
    assert code == 1 and "--resume" not in err and "packed nothing" in err
    code, _, err = run_main(["build", str(src), str(tmp_path / "out2"), "-q"])
    assert code == 2 and "rejected" in err and "build-report.jsonl" in err
    count_trial("class9-all-rejected", 2)


def test_control_characters_in_names_are_escaped_on_output(tmp_path):
    src = tmp_path / "src"
    evil = "a\x1b]0;owned\x07\x1b[2J\u202eb.png"
    noisy_png(src / "cls\x1b[31m" / evil)
    (src / "cls\x1b[31m" / "bad\x1b[1m.png").write_bytes(b"junk")
    build(src, tmp_path / "out", BuildSettings(), RunOptions(workers=1))
    for argv in (["inspect", str(tmp_path / "out"), "--sample", "0"], ["inspect", str(tmp_path / "out")]):
        code, out, err = run_main(argv)
        assert code == 0, err
        assert "\x1b" not in out + err and "\u202e" not in out + err and "\x07" not in out + err
        assert "\\x1b" in out
    code, out, err = run_main(["inspect", str(tmp_path / "out"), "--json", "--sample", "0"])
    assert "\x1b" not in out and "\u202e" not in out
    assert strict_json(out)["sample"]["key"] == f"cls\x1b[31m/{evil}"  # the JSON value is exact
    count_trial("class9-escaped-names", 3)


def test_bytes_of_files_outside_the_source_are_never_quoted(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n")
    src = noisy_png_classes(tmp_path / "src")
    (src / "class0" / "passwd.jpg").symlink_to(secret)
    (src / "class0" / "inside.jpg").write_bytes(b"hello inside bytes")
    result = build(src, tmp_path / "out", BuildSettings(), RunOptions(workers=1))
    messages = {r.key: r.message for r in result.rejected}
    assert "root:x" not in messages["class0/passwd.jpg"] and "outside the source" in messages["class0/passwd.jpg"]
    assert "hello inside" in messages["class0/inside.jpg"]  # inside the source: still helpful
    assert b"root:x" not in (tmp_path / "out" / fmt.REPORT_NAME).read_bytes()
    count_trial("class9-outside-bytes-not-quoted")


def test_library_errors_never_leak_from_cli_for_bad_paths(paths):
    code, out, err = run_main(["build", paths["fifo"], paths["work"] + "/o"])
    assert code == 2 and "Traceback" not in err
    with pytest.raises(PackerError):
        open_index(paths["fifo"])


# --- class 11: the C extension --------------------------------------------------------------------


def test_names_with_line_breaks_cannot_forge_output_lines(tmp_path):
    src = tmp_path / "src"
    noisy_png(src / "cls" / "a\nsample    99\nkey       fake.png")
    (src / "cls" / "bad\nrejected   0 file(s)").write_bytes(b"junk")
    build(src, tmp_path / "out", BuildSettings(), RunOptions(workers=1))
    code, out, err = run_main(["inspect", str(tmp_path / "out"), "--sample", "0"])
    assert code == 0, err
    assert len(out.strip().splitlines()) == 9 and "sample    99" not in out.splitlines()
    code, out, err = run_main(["inspect", str(tmp_path / "out")])
    assert code == 0 and not any(line.startswith("rejected   0") for line in out.splitlines()), out
    count_trial("class9-line-breaks-in-names", 2)


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

    src = noisy_png_classes(tmp_path / "src", classes=4, per_class=30)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    startup = time.monotonic() - started
    outcomes = []
    for i, extra in enumerate((0.0, 0.05, 0.15, 0.3, 0.6)):
        process = subprocess.Popen([sys.executable, "-m", "packer", "build", str(src), str(tmp_path / f"o{i}"),
                                    "--workers", "2", "--shard-size", "16K"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, start_new_session=True, env=env,
                                   preexec_fn=_ctrl_c_reaches_the_child)
        time.sleep(2 * startup + extra)
        os.killpg(process.pid, signal.SIGINT)
        out, err = process.communicate(timeout=120)
        if "Fatal Python error: init_import_site" in err:
            # On a loaded machine the child may still be in Python's own startup (its ``site``
            # import) after twice the startup measured above: not packer's code, nothing to cover.
            continue
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
    count_trial("class8-ctrl-c-process-group", len(outcomes))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("planted", ["plan-fifo", "record-fifo", "record-garbage", "record-bad-path"])
def test_staging_files_planted_or_damaged_never_hang_resume(tmp_path, planted):
    src = noisy_png_classes(tmp_path / "src")
    out = tmp_path / "out"
    assert build(src, out, BuildSettings(), RunOptions(workers=1, plan_only=True)) is None
    staging = out / ".packer-build"
    if planted == "plan-fifo":
        (staging / "plan.pkp").unlink()
        os.mkfifo(staging / "plan.pkp")
        with pytest.raises(PackerError, match="plan"):
            build(src, out, BuildSettings(), RunOptions(workers=1, resume=True))
        return count_trial("staging-planted")
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
    result = build(src, out, BuildSettings(), RunOptions(workers=1, resume=True))
    assert result.sample_count == 6
    count_trial("staging-planted")


def test_ctrl_c_while_the_workers_fork_stops_the_build(tmp_path, monkeypatch, ctrl_c_raises):
    """A Ctrl-C taken by another thread while the pool forks is handled by Python in the main
    thread wherever it is, e.g. inside an at-fork hook, which reports and swallows the
    KeyboardInterrupt ("Exception ignored in _releaseLock"): the build then ran to the end. The
    signal is recorded during the fork and raised after it, so the build stops."""
    from concurrent.futures import ProcessPoolExecutor

    src = noisy_png_classes(tmp_path / "src", classes=2, per_class=8)
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
        build(src, tmp_path / "out", BuildSettings(layout=LayoutSettings(shard_size=16 << 10)), RunOptions(workers=2))
    assert calls and not (tmp_path / "out" / "manifest.json").exists()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is restored
    monkeypatch.undo()
    build(src, tmp_path / "out", BuildSettings(layout=LayoutSettings(shard_size=16 << 10)), RunOptions(workers=2, resume=True))
    assert (tmp_path / "out" / "manifest.json").exists()


def test_an_ignored_ctrl_c_stays_ignored_while_the_workers_fork(tmp_path, monkeypatch):
    """A build started with SIGINT ignored (a background job of a script: `packer build ... &`)
    keeps it ignored, the fork of its workers included: a SIGINT sent then is not recorded and
    raised as a Ctrl-C, and the disposition is still SIG_IGN afterwards."""
    from concurrent.futures import ProcessPoolExecutor

    src = noisy_png_classes(tmp_path / "src", classes=2, per_class=8)
    real_submit = ProcessPoolExecutor.submit
    calls = []

    def submit_with_a_sigint(pool, *args, **kwargs):
        if not calls:
            os.kill(os.getpid(), signal.SIGINT)
        calls.append(args)
        return real_submit(pool, *args, **kwargs)

    monkeypatch.setattr(ProcessPoolExecutor, "submit", submit_with_a_sigint)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        result = build(src, tmp_path / "out", BuildSettings(layout=LayoutSettings(shard_size=16 << 10)),
                       RunOptions(workers=2))
        assert calls and result.sample_count == 16
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
