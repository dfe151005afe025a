"""Build the C transcoder with AddressSanitizer + UBSan and run a mutation campaign against it.

    python scripts/sanitize_jpegtiles.py [--trials 30000] [--seed 0]

Compiles ``packer/codecs/_jpegtiles.c`` with ``-fsanitize=address,undefined,float-cast-overflow
-fno-sanitize-recover=undefined`` into a temporary folder, then runs, in a child process with
``libasan`` preloaded, ``transcode`` and ``window`` on mutated JPEGs: byte flips, truncations,
extensions, segment-length and Huffman-count changes of several baseline JPEGs (4:2:0, 4:4:4,
gray, restart intervals, EXIF), and ``window`` on mutated tiled JPEGs with random (also NaN,
infinite and huge) boxes, from read-only and writable buffers. Any sanitizer report aborts the
child. Prints the trial counts and exits 0 only if the child finished cleanly.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = r"""
import importlib.util, io, math, random, struct, sys
import numpy as np
from PIL import Image

spec = importlib.util.spec_from_file_location("packer.codecs._jpegtiles", sys.argv[1])
tiles = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tiles)
trials, seed = int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed)

def jpeg(size, **options):
    array = np.random.default_rng(rng.randrange(1 << 30)).integers(0, 256, (*size, 3), dtype=np.uint8)
    image = Image.fromarray(array)
    if options.pop("gray", False):
        image = image.convert("L")
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", **options)
    return buffer.getvalue()

bases = [jpeg((48, 64), quality=80), jpeg((33, 47), subsampling=0), jpeg((40, 56), gray=True),
         jpeg((64, 96), restart_marker_blocks=2), jpeg((17, 23), subsampling=2, quality=50)]
tiled = [tiles.transcode(b, 10**8) for b in bases]

def segments(data):
    out, pos = [], 2
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        length = struct.unpack(">H", data[pos + 2:pos + 4])[0]
        out.append(pos)
        if data[pos + 1] == 0xDA:
            break
        pos += 2 + length
    return out

def mutate(data):
    data = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0:
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif kind == 1:
        del data[rng.randrange(len(data)):]
    elif kind == 2:
        data += bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    elif kind == 3:
        starts = segments(bytes(data))
        if starts:
            at = rng.choice(starts)
            data[at + 2:at + 4] = struct.pack(">H", rng.choice([0, 1, 2, 3, 0xFFFF, rng.randrange(65536)]))
    elif kind == 4:
        at = bytes(data).find(b"\xff\xc4")
        if at >= 0 and at + 21 < len(data):
            data[at + 5 + rng.randrange(16)] = rng.choice([0, 1, 2, 255, rng.randrange(256)])
    else:
        at = rng.randrange(len(data))
        data[at:at] = b"\xff" + bytes([rng.choice([0xD0, 0xD9, 0xDA, 0xC4, 0xDD, 0x00, 0xFF])])
    return bytes(data)

counts = {"transcode": 0, "window": 0, "accepted": 0}
boxes = [lambda: (rng.uniform(-50, 150), rng.uniform(-50, 150), rng.uniform(-50, 150), rng.uniform(-50, 150)),
         lambda: (math.nan, 0.0, 8.0, 8.0), lambda: (0.0, 0.0, math.inf, 1e300),
         lambda: (rng.uniform(-1e18, 1e18), 0.0, rng.uniform(-1e18, 1e18), 4.0)]
for trial in range(trials):
    if trial % 2 == 0:
        data = mutate(rng.choice(bases))
        buffer = bytearray(data) if trial % 4 == 0 else data
        try:
            tiles.transcode(buffer, rng.choice([10**8, 100, 1]))
            counts["accepted"] += 1
        except ValueError:
            pass
        counts["transcode"] += 1
    else:
        data = mutate(rng.choice(tiled))
        buffer = bytearray(data) if trial % 4 == 1 else data
        try:
            tiles.window(buffer, *rng.choice(boxes)(), rng.choice([0, 8, 16, -1, 1 << 40]))
        except (ValueError, OverflowError):
            pass
        counts["window"] += 1
print("sanitized mutation run:", counts, flush=True)
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=30_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="packer-asan-") as work:
        return _run(Path(work) / "_jpegtiles_asan.so", args.trials, args.seed)


def _run(library: Path, trials: int, seed: int) -> int:
    include = sysconfig.get_paths()["include"]
    # float-cast-overflow is not part of -fsanitize=undefined in GCC: (long)floor(NaN) needs it.
    flags = ["-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer",
             "-g", "-O1", "-std=c99", "-Wall", "-Wextra", "-shared", "-fPIC"]
    subprocess.run(["gcc", *flags, f"-I{include}", str(REPO / "packer/codecs/_jpegtiles.c"), "-o", str(library),
                    "-lm"], check=True)
    asan = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True,
                          check=True).stdout.strip()
    env = {**os.environ, "LD_PRELOAD": asan, "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
           "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(library), str(trials), str(seed)],
                          env=env, capture_output=True, text=True)
    print(done.stdout.strip())
    findings = [line for line in done.stderr.splitlines() if "Sanitizer" in line or "runtime error" in line]
    if done.returncode or findings:
        print(done.stderr[-6000:], file=sys.stderr)
        print(f"FAILED: exit {done.returncode}, {len(findings)} sanitizer line(s)")
        return 1
    print(f"OK: {trials} trials under AddressSanitizer + UBSan, no finding")
    return 0


if __name__ == "__main__":
    sys.exit(main())
