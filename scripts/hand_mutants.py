#!/usr/bin/env python3
"""Re-run the hand-written mutation round kept in ``tests/mutants/*.toml`` and print kill rates by area.

Usage (from the repository root; see ``tests/mutants/README.md`` for the record format)::

    python scripts/hand_mutants.py --check          # every record's original text is found exactly once
    python scripts/hand_mutants.py                  # every mutant against the tests its record names
    python scripts/hand_mutants.py export torch     # the mutants of some areas, or some ids
    python scripts/hand_mutants.py --all-tests      # every mutant against the whole suite (slow)
    python scripts/hand_mutants.py --list           # the records, one line each

Each mutant is applied by its text, not by line number, so a record survives edits elsewhere in
the file and a moved file needs only its ``file`` updated; a record whose original text is not
found exactly once is refused (nothing is run for it). The file is restored (bytes and mtime)
after each run, also on Ctrl-C, and the run's bytecode is never cached (``PYTHONDONTWRITEBYTECODE``:
a same-size edit within one second could otherwise be served from a stale ``.pyc``).

A mutant is *killed* when pytest fails (exit status 1, 2 or 3, or it runs past ``--timeout``:
a hang is a failure a user sees); *survived* when every selected test passed; an exit status
of 4 or 5 (bad arguments, no tests collected) is an error in the record. Records with an
``equivalent`` reason are not run and not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "tests" / "mutants"
REQUIRED = ("id", "file", "original", "mutated", "user_sees", "tests")


@dataclass
class Mutant:
    """One record of ``tests/mutants/<area>.toml``."""

    id: str
    area: str
    file: str
    original: str
    mutated: str
    user_sees: str
    tests: list[str]
    equivalent: str = ""
    source: str = ""  # the .toml file it came from
    problems: list[str] = field(default_factory=list)


def load(folder: Path = RECORDS) -> list[Mutant]:
    """Every record, in file then record order; a malformed record raises SystemExit naming it."""
    mutants: list[Mutant] = []
    seen: set[str] = set()
    for path in sorted(folder.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        for number, record in enumerate(data.get("mutant", []), 1):
            where = f"{path.relative_to(REPO)} record {number}"
            missing = [k for k in REQUIRED if not record.get(k)]
            unknown = set(record) - set(REQUIRED) - {"equivalent"}
            if missing or unknown:
                raise SystemExit(f"{where}: missing {missing}, unknown {sorted(unknown)}")
            if record["id"] in seen:
                raise SystemExit(f"{where}: id {record['id']!r} is used twice")
            if record["original"] == record["mutated"]:
                raise SystemExit(f"{where}: the mutated text is the original")
            seen.add(record["id"])
            mutants.append(Mutant(area=path.stem, source=str(path.relative_to(REPO)), **record))
    return mutants


def check(mutant: Mutant) -> list[str]:
    """Why ``mutant`` cannot be applied ([] when it can)."""
    target = REPO / mutant.file
    if not target.is_file():
        return [f"{mutant.id}: {mutant.file} does not exist (moved? update the record's file)"]
    count = target.read_text(encoding="utf-8").count(mutant.original)
    if count != 1:
        return [f"{mutant.id}: its original text is found {count} times in {mutant.file}, not exactly once "
                f"(the code changed: rewrite the record from the module as it is now)"]
    missing = [t for t in mutant.tests if not (REPO / t.split("::")[0]).exists()]
    return [f"{mutant.id}: test path {t} does not exist" for t in missing]


def _drop_bytecode(path: Path) -> None:
    import importlib.util

    for optimization in ("", 1, 2):
        cached = Path(importlib.util.cache_from_source(str(path), optimization=optimization))
        cached.unlink(missing_ok=True)


def run_one(mutant: Mutant, tests: list[str], timeout: float) -> tuple[str, float, str]:
    """Apply, run ``tests``, restore. Returns (verdict, seconds, the last lines of pytest's output)."""
    target = REPO / mutant.file
    original_bytes = target.read_bytes()
    stat = target.stat()
    text = original_bytes.decode("utf-8")
    started = time.monotonic()
    try:
        target.write_bytes(text.replace(mutant.original, mutant.mutated, 1).encode("utf-8"))
        _drop_bytecode(target)
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PACKER_HAND_MUTANT": mutant.id}
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                                   "-p", "no:randomly", *tests], cwd=REPO, env=env, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return "killed", time.monotonic() - started, f"timed out after {timeout:.0f} s"
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        verdict = {0: "survived", 1: "killed", 2: "killed", 3: "killed"}.get(done.returncode, "error")
        return verdict, time.monotonic() - started, tail
    finally:
        target.write_bytes(original_bytes)
        os.utime(target, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        _drop_bytecode(target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("select", nargs="*", help="areas or mutant ids (default: all)")
    parser.add_argument("--check", action="store_true", help="only check that every record applies")
    parser.add_argument("--list", action="store_true", help="list the records")
    parser.add_argument("--all-tests", action="store_true", help="run the whole suite against each mutant")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per mutant (a hang counts as killed)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    args = parser.parse_args(argv)

    mutants = load()
    if args.select:
        chosen = [m for m in mutants if m.area in args.select or m.id in args.select]
        unknown = set(args.select) - {m.area for m in mutants} - {m.id for m in mutants}
        if unknown:
            raise SystemExit(f"no area or mutant named {', '.join(sorted(unknown))}")
        mutants = chosen
    problems = [p for m in mutants for p in check(m)]
    if args.list:
        for m in mutants:
            print(f"{m.id:44} {m.file:34} {'equivalent: ' + m.equivalent if m.equivalent else m.user_sees}")
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 2
    if args.check or args.list:
        areas = sorted({m.area for m in mutants})
        print(f"{len(mutants)} hand-written mutants in {len(areas)} areas apply cleanly "
              f"({sum(bool(m.equivalent) for m in mutants)} recorded as equivalent)")
        return 0

    results: list[dict[str, object]] = []
    for m in mutants:
        if m.equivalent:
            results.append({"id": m.id, "area": m.area, "verdict": "equivalent", "seconds": 0.0})
            continue
        tests = ["tests"] if args.all_tests else m.tests
        verdict, seconds, tail = run_one(m, tests, args.timeout)
        results.append({"id": m.id, "area": m.area, "verdict": verdict, "seconds": round(seconds, 1)})
        print(f"{verdict:9} {m.id} ({seconds:.0f} s)" + (f"\n    {m.user_sees}\n    {tail}" if verdict != "killed"
                                                           else ""), flush=True)
    print()
    print("| area | mutants | equivalent | killed | survived | errors | kill rate |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    areas = sorted({str(r["area"]) for r in results})
    for area in areas + ["all"]:
        rows = [r for r in results if area in ("all", r["area"])]
        count = {v: sum(r["verdict"] == v for r in rows) for v in ("equivalent", "killed", "survived", "error")}
        judged = count["killed"] + count["survived"]
        rate = f"{100.0 * count['killed'] / judged:.0f} %" if judged else "-"
        name = "**all**" if area == "all" else area
        print(f"| {name} | {len(rows)} | {count['equivalent']} | {count['killed']} | {count['survived']} | "
              f"{count['error']} | {rate} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 1 if any(r["verdict"] in ("survived", "error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
