#!/usr/bin/env python3
"""Mutation testing of the modules that hold the data, with mutmut, scoped and cached per module.

Usage (from the repository root; ``make mutate`` runs the default groups)::

    python scripts/mutate.py                      # every group below, then the table
    python scripts/mutate.py order atomic         # some groups
    python scripts/mutate.py --retest order       # re-run the survivors (after adding tests)
    python scripts/mutate.py --report             # the table from the cached results only
    python scripts/mutate.py --list               # the groups, their modules and test files

Each group mutates only its module(s) and runs only its test files: mutmut collects, per test,
which functions it calls, and runs each mutant against just those tests, in forked children
(no interpreter start per mutant). Results are cached in ``.mutate/<group>/mutants/`` (git
ignores it): a second run only tests mutants of functions whose source changed. Survivors are
written to ``.mutate/<group>/survivors.txt`` with their diffs (``mutmut show``).

The kill rate counts a mutant as killed when a test failed (or timed out) with it, and leaves
out the mutants listed in ``scripts/mutate_equivalent.txt``: changes that cannot alter behaviour,
each with its reason. Mutants that no selected test reaches ("no tests") count as survivors.

Why mutmut (3.x) and not cosmic-ray: cosmic-ray starts the test command once per mutant (about
two seconds of interpreter, numpy and pytest start-up each here, times thousands of mutants on a
2-core machine), mutmut forks an already-initialised pytest and picks the tests per mutated
function, which makes a module of 700 mutants take about a minute.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / ".mutate"
EQUIVALENT_FILE = REPO / "scripts" / "mutate_equivalent.txt"

#: Tests every group runs: the unit tests of every data module (the tests written to kill mutants
#: live beside the behaviour they check, and a mutant of one module is also caught by another
#: module's tests that reach it: dataset tests kill format mutants), and the commit-order checks.
#: From the two slow end-to-end files only the tests written for mutants, by node id.
COMMON_TESTS = (
    "tests/order/test_order.py", "tests/format/test_format.py", "tests/format/test_fields.py",
    "tests/format/test_vectors.py", "tests/writer/test_durability_order.py", "tests/writer/test_commit.py",
    "tests/writer/test_plan.py", "tests/images/test_imageinfo.py", "tests/verify/test_verify.py",
    "tests/verify/test_verify_fields.py", "tests/readers/test_dataset.py", "tests/codecs/test_tiles.py",
    "tests/torch/test_orders_and_state.py",
    "tests/writer/test_interrupted_builds.py::test_resume_repacks_a_finished_shard_whose_file_was_truncated",
    "tests/writer/test_interrupted_builds.py::test_a_record_of_a_truncated_shard_is_redone_by_pack",
    "tests/writer/test_split_builds_and_append.py::test_append_refuses_a_source_with_declared_fields",
)


@dataclass(frozen=True)
class Group:
    """Modules mutated together and the test files that guard them."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]
    #: ``pytest -k`` words of slow tests left out (they start CLI subprocesses, which would not
    #: import the mutated copy, or take seconds each: every surviving mutant would pay for them).
    skip: tuple[str, ...] = ()
    #: ``fnmatch`` patterns of the mutant names in scope (default: every mutant of the modules):
    #: a module of which only some functions hold the data (the torch sampler state) is scoped
    #: to those functions; the others are neither run nor counted.
    only: tuple[str, ...] = ()
    #: Whether COMMON_TESTS join the group's tests: not for modules the data modules' unit tests
    #: never call, where they would only lengthen the first (stats) run, or, for a function every
    #: open calls (``is_url``), make each of its mutants run the dataset suite.
    common: bool = True

    def in_scope(self, name: str) -> bool:
        return not self.only or any(fnmatch.fnmatch(name, pattern) for pattern in self.only)


#: The sampler/reader state of packer/torch/: orders, rank split, positions, state dicts (the
#: decoding and collation around them belong to the readers, not to the resumable state).
_TORCH_STATE = tuple(f"packer.torch.{name}__mutmut_*" for name in (
    "iterable.x__worker_share", "samplers.xǁPackedSamplerǁ*", "samplers.xǁPackedBatchSamplerǁ*",
    "loader.xǁPackedDataLoaderǁ*", "loader.x__deal", "iterable.xǁ_SharedPositionǁ*",
    "iterable.xǁPackedIterableDatasetǁ__init__", "iterable.xǁPackedIterableDatasetǁ__getstate__",
    "iterable.xǁPackedIterableDatasetǁ__len__", "iterable.xǁPackedIterableDatasetǁstate_dict",
    "iterable.xǁPackedIterableDatasetǁload_state_dict", "iterable.xǁPackedIterableDatasetǁ__iter__"))

_SLOW_BUILD = ("sigkill_cli_from_outside", "concurrent_cli_builds", "listing_reports_progress_every",
               "disk_full_real_tmpfs")

#: In priority order (the ones that decide what bytes land on disk first). Each group runs the
#: unit tests of its module, not the whole reliability suite: every test that reaches a mutated
#: function runs again in a fresh fork, module fixtures (small builds) included, so test files
#: that build many datasets (test_hostile, test_reliability_*, test_dataloader) would make one
#: module take hours here. They still run in `make test`.
GROUPS = (
    Group("format", ("packer/format.py",), ("tests/format/test_format.py", "tests/format/test_vectors.py",
                                            "tests/format/test_fields.py")),
    Group("order", ("packer/order.py",), ("tests/order/test_order.py", "tests/order/test_position.py",
                                          "tests/order/test_read_order.py", "tests/order/test_state_bounds.py")),
    Group("atomic", ("packer/_internal/atomic.py",), ("tests/writer/test_interrupted_builds.py",), skip=_SLOW_BUILD),
    Group("records", ("packer/writer/records.py", "packer/writer/commit.py"),
          ("tests/writer/test_build.py", "tests/sources/test_fields_from_sources.py", "tests/writer/test_commit.py"),
          skip=_SLOW_BUILD),
    Group("plan", ("packer/writer/plan.py",),
          ("tests/writer/test_build.py", "tests/sources/test_fields_from_sources.py", "tests/writer/test_plan.py",
           "tests/writer/test_small_records.py"),
          skip=_SLOW_BUILD),
    Group("imageinfo", ("packer/_internal/imageinfo.py",), ("tests/images/test_imageinfo.py",)),
    Group("verify", ("packer/verify.py",),
          ("tests/verify/test_verify.py", "tests/verify/test_verify_fields.py")),
    Group("dataset", ("packer/dataset.py",),
          ("tests/readers/test_backends.py", "tests/format/test_format.py", "tests/format/test_vectors.py",
           "tests/format/test_fields.py", "tests/readers/test_dataset.py"), skip=("vectors_regenerate",)),
    Group("tiles", ("packer/codecs/tiles.py",), ("tests/codecs/test_tiles.py",)),
    Group("torch", ("packer/torch/samplers.py", "packer/torch/loader.py", "packer/torch/iterable.py"),
          ("tests/torch/test_torch.py", "tests/torch/test_resume.py", "tests/torch/test_torch_fields.py",
           "tests/torch/test_orders_and_state.py", "tests/torch/test_order_spellings.py",
           "tests/torch/test_sampler_batch_size.py", "tests/torch/test_loader_threads.py"), only=_TORCH_STATE),
    # issue 41: the policies round 2 and 3 added (the source contract, export's naming and safe
    # writes, Lightning's positions)
    Group("contract", ("packer/sources/contract.py",),
          ("tests/sources/test_source_contract.py", "tests/sources/test_source_refusals.py",
           "tests/sources/test_class_lists.py", "tests/sources/test_manifest_rows.py",
           "tests/sources/test_contract_rules.py"), skip=_SLOW_BUILD),
    Group("export", ("packer/export/plan.py", "packer/export/safewrite.py"),
          ("tests/export/test_export.py", "tests/export/test_export_options.py", "tests/export/test_export_hostile.py",
           "tests/export/test_export_side_files.py")),
    Group("lightning", ("packer/lightning.py",), ("tests/integrations/test_lightning.py",)),
    # object storage (issue 41): the policies (url parsing, options, extents, the cache's eviction)
    # and the I/O around them (the retry classification, generation deletes, the reader's cache).
    # In-process tests against fakes (conftest.MemoryTransport); the loopback S3 server starts in a
    # forked mutant's own session only for the few files that use it.
    Group("remote-policy", ("packer/remote/url.py", "packer/remote/options.py", "packer/remote/extents.py",
                            "packer/remote/cache.py"),
          ("tests/remote/test_remote_urls.py", "tests/remote/test_remote_extents.py", "tests/remote/test_remote_refusals.py",
           "tests/remote/test_remote_properties.py"), common=False),
    Group("remote-store", ("packer/remote/store.py",),
          ("tests/remote/test_remote_store.py", "tests/remote/test_remote_retry_table.py",
           "tests/remote/test_remote_refusals.py", "tests/remote/test_remote_properties.py"), common=False),
    Group("remote-upload", ("packer/remote/upload.py",),
          ("tests/remote/test_remote_upload.py", "tests/remote/test_remote_properties.py",
           "tests/remote/test_remote_lock_object.py"), common=False),
    Group("remote-reader", ("packer/remote/reader.py",),
          ("tests/remote/test_remote_reader.py", "tests/remote/test_remote_properties.py"), common=False),
)
GROUPS_BY_NAME = {g.name: g for g in GROUPS}

KILLED = {1, 3, 24, 36, -24, 152, 255, -9, -11}  # failed, pytest error, timeouts, crashes
SURVIVED = {0}
NO_TESTS = {5, 33}


def load_equivalent() -> dict[str, str]:
    """``mutant name -> reason`` from scripts/mutate_equivalent.txt (``name  # reason`` lines)."""
    equivalent: dict[str, str] = {}
    if EQUIVALENT_FILE.exists():
        for line in EQUIVALENT_FILE.read_text(encoding="utf-8").splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, reason = line.partition("#")
            equivalent[name.strip()] = reason.strip()
    return equivalent


def test_selection(group: Group) -> list[str]:
    """The group's test files and COMMON_TESTS, each once (a node id only when its file is not listed)."""
    tests = [t for t in dict.fromkeys(group.tests + (COMMON_TESTS if group.common else ())) if (REPO / t.split("::")[0]).exists()]
    files = {t for t in tests if "::" not in t}
    return [t for t in tests if t.split("::")[0] not in files or "::" not in t]


def group_dir(group: Group) -> Path:
    return WORK / group.name


def prepare(group: Group) -> Path:
    """Lay out ``.mutate/<group>/``: links to the sources and tests, and mutmut's setup.cfg."""
    folder = group_dir(group)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("packer", "tests", "pyproject.toml"):
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(REPO / name)
    # The tests find the spec's vectors and scripts/ next to tests/ (mutmut runs them in mutants/);
    # formats/ holds a deliberately dangling symlink that mutmut's copy would trip on, so link it.
    (folder / "mutants").mkdir(exist_ok=True)
    for name in ("formats", "scripts"):
        link = folder / "mutants" / name
        if not link.is_symlink():
            link.symlink_to(REPO / name)
    tests = test_selection(group)
    lines = ["[mutmut]", "source_paths =", "    packer/", "only_mutate ="]
    lines += [f"    {m}" for m in group.modules]
    lines += ["pytest_add_cli_args_test_selection ="] + [f"    {t}" for t in tests]
    lines += ["pytest_add_cli_args =", "    -p", "    no:cacheprovider", "    -q"]
    if group.skip:
        lines += ["    -k", "    " + " and ".join(f"not {word}" for word in group.skip)]
    config = "\n".join(lines) + "\n"
    cfg = folder / "setup.cfg"
    if not cfg.exists() or cfg.read_text() != config:
        cfg.write_text(config)
    return folder


def results(group: Group) -> dict[str, dict[str, int | None]]:
    """``module -> {mutant name: exit code}`` from mutmut's cache of this group."""
    found: dict[str, dict[str, int | None]] = {}
    for module in group.modules:
        meta = group_dir(group) / "mutants" / (module + ".meta")
        if meta.exists():
            codes = json.loads(meta.read_text())["exit_code_by_key"]
            found[module] = {name: code for name, code in codes.items() if group.in_scope(name)}
    return found


def mutmut_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the mutated copy in mutants/ must be the packer that imports
    env["PACKER_REQUIRE_EXTENSION"] = "1"
    return env


def mutmut_command() -> list[str]:
    local = Path(sys.executable).with_name("mutmut")
    return [str(local)] if local.exists() else ["mutmut"]


def run_group(group: Group, *, children: int, retest: bool, log: Path) -> float:
    """Run (or continue) mutmut on one group; returns the seconds it took."""
    folder = prepare(group)
    command = mutmut_command() + ["run", "--max-children", str(children)]
    if group.only and not retest:
        command += list(group.only)
    if retest:
        equivalent = load_equivalent()  # listed with a reason: rerunning them only costs time
        survivors = [name for codes in results(group).values() for name, code in codes.items()
                     if (code in SURVIVED or code in NO_TESTS) and name not in equivalent]
        if not survivors:
            print(f"[{group.name}] no survivors to retest")
            return 0.0
        command += survivors
    started = time.monotonic()
    print(f"[{group.name}] mutating {', '.join(group.modules)} (log: {log.relative_to(REPO)})", flush=True)
    with open(log, "w") as handle:
        status = subprocess.run(command, cwd=folder, env=mutmut_env(), stdout=handle, stderr=subprocess.STDOUT)
    seconds = time.monotonic() - started
    if status.returncode != 0:
        tail = log.read_text(errors="replace").replace("\r", "\n").splitlines()[-15:]
        print(f"[{group.name}] mutmut exited {status.returncode}:\n  " + "\n  ".join(tail))
    write_survivors(group)
    return seconds


def write_survivors(group: Group) -> None:
    equivalent = load_equivalent()
    names = [name for codes in results(group).values() for name, code in sorted(codes.items())
             if (code in SURVIVED or code in NO_TESTS) and name not in equivalent]
    # One interpreter for all the diffs (``mutmut show`` per name costs a second each).
    shown = subprocess.run([sys.executable, "-c", _SHOW_DIFFS], cwd=group_dir(group), env=mutmut_env(),
                           input="\n".join(names), capture_output=True, text=True)
    (group_dir(group) / "survivors.txt").write_text(shown.stdout if shown.returncode == 0 else shown.stderr)


_SHOW_DIFFS = """
import sys
from mutmut.__main__ import find_mutant, get_diff_for_mutant
for name in sys.stdin.read().split():
    print("# " + name)
    print(get_diff_for_mutant(name, path=find_mutant(name).path))
"""


def table(groups: list[Group]) -> int:
    """Print the per-module kill rates and the survivors; returns how many survivors are left."""
    equivalent = load_equivalent()
    rows, left = [], 0
    used_equivalent: set[str] = set()
    killed_equivalent: list[str] = []
    for group in groups:
        for module, codes in results(group).items():
            counted = {n: c for n, c in codes.items() if n not in equivalent}
            used_equivalent |= set(codes) & set(equivalent)
            killed_equivalent += [n for n, c in codes.items() if n in equivalent and c in KILLED]
            killed = sum(c in KILLED for c in counted.values())
            survived = [n for n, c in counted.items() if c in SURVIVED]
            untested = [n for n, c in counted.items() if c in NO_TESTS]
            unchecked = sum(c is None for c in counted.values())
            judged = len(counted) - unchecked
            rate = 100.0 * killed / judged if judged else 0.0
            rows.append((module, len(codes), len(codes) - len(counted), killed, len(survived), len(untested),
                         unchecked, rate))
            left += len(survived) + len(untested)
            for name in survived + untested:
                print(f"  survived{' (no test reaches it)' if name in untested else ''}: {name}")
    print()
    print("| module | mutants | equivalent | killed | survived | no tests | not run | kill rate |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for module, total, eq, killed, survived, untested, unchecked, rate in rows:
        print(f"| {module} | {total} | {eq} | {killed} | {survived} | {untested} | {unchecked} | {rate:.1f} % |")
    stale = sorted(set(n for n in equivalent if any(n.startswith(m.replace("/", ".")[:-3] + ".")
                                                    for g in groups for m in g.modules)) - used_equivalent)
    for name in stale:
        print(f"warning: {name} is listed as equivalent but is no longer a mutant (source changed?)")
    # Names are numbered within their function: an edit above a listed mutant renumbers it, and
    # the entry then names another mutant. A test that kills an "equivalent" mutant shows it.
    for name in sorted(killed_equivalent):
        print(f"warning: {name} is listed as equivalent but a test kills it (renumbered by an edit? "
              f"check its diff with `mutmut show` in .mutate/<group>/)")
    print("\nkill rate = killed / (mutants - equivalent - not run); survivors' diffs: .mutate/<group>/survivors.txt")
    return left


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", nargs="*", help=f"groups to run (default: all): {', '.join(GROUPS_BY_NAME)}")
    parser.add_argument("--children", type=int, default=2, help="parallel mutant runs (default 2: this machine's cores)")
    parser.add_argument("--retest", action="store_true", help="re-run the cached survivors only")
    parser.add_argument("--report", action="store_true", help="print the table from the cache; run nothing")
    parser.add_argument("--list", action="store_true", help="print the groups and exit")
    parser.add_argument("--clean", action="store_true", help="delete the cache of the chosen groups first")
    args = parser.parse_args(argv)
    unknown = [g for g in args.groups if g not in GROUPS_BY_NAME]
    if unknown:
        parser.error(f"unknown group(s) {unknown}; choose from {', '.join(GROUPS_BY_NAME)}")
    groups = [GROUPS_BY_NAME[g] for g in args.groups] if args.groups else list(GROUPS)
    if args.list:
        for group in groups:
            print(f"{group.name}: {', '.join(group.modules)}  <-  {', '.join(test_selection(group))}")
            if group.only:
                print(f"  only the mutants named {', '.join(group.only)}")
        return 0
    if not args.report:
        if shutil.which(mutmut_command()[0]) is None:
            print("mutmut is not installed: pip install -e '.[mutate]'", file=sys.stderr)
            return 3
        WORK.mkdir(exist_ok=True)
        for group in groups:
            if args.clean:
                shutil.rmtree(group_dir(group), ignore_errors=True)
            seconds = run_group(group, children=args.children, retest=args.retest,
                                log=WORK / f"{group.name}.log")
            print(f"[{group.name}] {seconds:.0f} s", flush=True)
    table(groups)
    return 0


if __name__ == "__main__":
    sys.exit(main())
