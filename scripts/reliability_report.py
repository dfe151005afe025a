"""Run the reliability and security suites and print their trial counts and outcomes.

    python scripts/reliability_report.py [--json]

Runs ``tests/writer/test_interrupted_builds.py``, ``test_corruption.py``, the hostile-input tests
(``tests/hostile/`` and the ones that moved beside the module whose rule they check: decompression
bombs, decoder limits, the C extension's, the package scan), ``test_header_fuzzing.py``,
``test_messy_folder.py``, ``test_concurrent_readers.py`` and the source doors' suites
(``test_every_door_holds.py``: issue 25's examples; ``test_every_door_matrix.py``: every door
against the folder path; ``test_fuzz_sources.py``: a bounded structure-aware fuzzing run; object
storage's seeded fault runs and remote-server fuzzer, ``tests/remote/test_remote_fault_runs.py`` and
``test_remote_fuzz.py``) with
pytest (``-s``, so each suite's
summary line is printed), then prints those summary lines, the pass/fail counts and the wall time.
Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUITES = ["tests/writer/test_interrupted_builds.py", "tests/verify/test_corruption.py", "tests/hostile",
          "tests/images/test_decompression_bombs.py", "tests/readers/test_decoder_limits.py",
          "tests/project/test_no_pickle_eval_or_shell.py",
          "tests/images/test_decode.py::test_animated_multiframe_and_exotic_modes_follow_the_rule",
          "tests/codecs/test_tiles.py::test_window_refuses_nan_infinite_and_huge_boxes",
          "tests/codecs/test_tiles.py::test_writable_buffers_give_the_same_bytes_as_read_only_ones",
          "tests/codecs/test_tiles.py::test_huffman_table_with_an_all_ones_code_is_refused_like_libjpeg",
          "tests/images/test_header_fuzzing.py", "tests/sources/test_messy_folder.py",
          "tests/readers/test_concurrent_readers.py",
          "tests/sources/test_every_door_holds.py", "tests/sources/test_every_door_matrix.py",
          "tests/sources/test_fuzz_sources.py", "tests/remote/test_remote_fault_runs.py", "tests/remote/test_remote_fuzz.py"]
#: Lines the suites print: "<label>: <JSON object>" or "<label>: <text>".
_SUMMARY = re.compile(r"^(reliability/build trials|reliability/corruption outcomes|messy folder|remote fault runs|"
                      r"hostile input trials|header fuzzing trials|source fuzzing|door matrix|"
                      r"readers during \d+ overwrite rebuilds): (.*)$")
_RESULT = re.compile(r"^=*\s*(.*\d+ (?:passed|failed).*?)\s*=*$")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="Print one JSON document instead of text.")
    args = parser.parse_args(argv)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", *SUITES, "-s", "-q", "-p", "no:cacheprovider", "-rfEx"],
                          cwd=REPO, capture_output=True, text=True)
    seconds = time.monotonic() - started
    summaries: dict[str, object] = {}
    result = ""
    for line in done.stdout.splitlines():
        match = _SUMMARY.match(line.strip())
        if match:
            label, body = match.groups()
            try:
                summaries[label] = json.loads(body)
            except ValueError:
                summaries[label] = body
        elif _RESULT.match(line.strip()):
            result = _RESULT.match(line.strip()).group(1)  # type: ignore[union-attr]
    if args.json:
        print(json.dumps({"exit_code": done.returncode, "result": result, "seconds": round(seconds, 1),
                          "summaries": summaries}, indent=2, sort_keys=True))
    else:
        for label, body in summaries.items():
            print(f"{label}:")
            if isinstance(body, dict):
                for key, value in sorted(body.items()):
                    print(f"  {key:60s} {value}")
            else:
                print(f"  {body}")
        print(f"pytest: {result or 'no result line'} (exit {done.returncode}, {seconds:.1f} s)")
        if done.returncode:
            print(done.stdout[-6000:], file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
