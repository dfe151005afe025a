"""How fast is the tiled transcode alone? MB of input JPEG per CPU-second, one thread.

    python benchmarks/bench_transcode.py [--images 200] [--size-kb 104] [--rounds 3]
                                         [--baseline OLD.so] [--verify] [--differential N]

Times ``packer.codecs._jpegtiles.transcode`` on the same JPEG bytes (``--images`` photo-like
JPEGs of about ``--size-kb`` KiB, 4:2:0, as ``make_sample`` writes them for the build benchmarks),
in ``--rounds`` interleaved rounds (``harness.interleave``). With ``--baseline``, another build of
the extension (a copy of the ``.so`` before a change) is loaded beside this checkout's and timed in
the same run, and the table gives the ratio; ``--verify`` also checks that both write the same
bytes for every image. CPU time is the figure to read on a shared machine.

``--differential N`` (with ``--baseline``) compares the two builds on a varied corpus instead of
timing them: N photo-like JPEGs of random sizes, qualities and chroma subsamplings (4:4:4, 4:2:2,
4:2:0, grey), progressive ones, tiled outputs fed back (restart markers in the input), and for
each, damaged copies (truncated, bytes flipped or set to 0xFF, bytes inserted in the scan and just
before restart markers). Both
builds must return the same bytes or raise the same error message for every input.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

import harness
import make_sample

MAX_PIXELS = 1 << 40


def load_extension(path: Path) -> Any:
    """The ``_jpegtiles`` extension built at ``path`` (a second copy can sit beside the first)."""
    loader = importlib.machinery.ExtensionFileLoader("packer.codecs._jpegtiles", str(path))
    spec = importlib.util.spec_from_file_location("packer.codecs._jpegtiles", path, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def photos(count: int, size_kb: int, seed: int = 0) -> list[bytes]:
    """``count`` distinct photo-like JPEGs of about ``size_kb`` KiB (structured image + noise)."""
    rng = np.random.default_rng(seed)
    return [make_sample._jpeg_near_size(rng, size_kb * 1024, k) for k in range(count)]


def varied_jpegs(count: int, seed: int = 1) -> list[bytes]:
    """Photo-like JPEGs of random size, quality, subsampling and mode (some progressive)."""
    import io

    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for index in range(count):
        width, height = (int(v) for v in rng.integers(1, 700, size=2))
        pixels = make_sample._structured_image(rng, height, width, index)
        pixels = np.clip(pixels + rng.normal(0, rng.uniform(0, 30), pixels.shape), 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels)
        if index % 7 == 0:
            image = image.convert("L")
        buffer = io.BytesIO()
        options = dict(quality=int(rng.integers(5, 101)), subsampling=int(rng.integers(0, 3)),
                       optimize=bool(index % 3 == 0), progressive=bool(index % 11 == 0))
        try:
            image.save(buffer, "JPEG", **options)
        except OSError:  # libjpeg's optimize on some tiny images
            buffer = io.BytesIO()
            image.save(buffer, "JPEG", quality=options["quality"], subsampling=options["subsampling"])
        out.append(buffer.getvalue())
    return out


def damaged(data: bytes, rng: np.random.Generator) -> list[bytes]:
    """Copies of ``data`` cut short or changed in the entropy-coded data (and anywhere)."""
    scan = data.rfind(b"\xff\xda")
    low = scan + 4 if scan > 0 else 2
    copies = [data[:-2], data[:-3], data[:len(data) // 2], data[:low + 10], data + b"\x00",
              data[:-2] + b"\xff\x00\xff\xd9"]
    for _ in range(12):
        position = int(rng.integers(low, len(data)))
        value = int(rng.integers(0, 256)) if rng.random() < 0.6 else 0xFF
        copies.append(data[:position] + bytes([value]) + data[position + 1:])
    for _ in range(4):
        position = int(rng.integers(low, len(data)))
        inserted = bytes(rng.integers(0, 256, size=int(rng.integers(1, 4))).tolist())
        copies.append(data[:position] + inserted + data[position:])
    # Bytes just before a restart marker: whether a reader refuses them depends on how far it had
    # read ahead when the interval ended, which must not change.
    markers = [match.start() for match in re.finditer(rb"\xff[\xd0-\xd7]", data[low:])]
    for index in rng.permutation(len(markers))[:6].tolist():
        position = low + markers[index] - int(rng.integers(0, 2))
        inserted = bytes(rng.integers(0, 255, size=int(rng.integers(1, 9))).tolist())
        copies.append(data[:position] + inserted + data[position:])
    return copies


def outcome(module: Any, data: bytes) -> tuple[str, bytes]:
    try:
        return "ok", module.transcode(data, MAX_PIXELS)
    except ValueError as exc:
        return "error", str(exc).encode()


def differential(old: Any, new: Any, count: int) -> None:
    """Same bytes or the same error from both builds on a varied, partly damaged corpus."""
    rng = np.random.default_rng(7)
    inputs = varied_jpegs(count)
    tiled = [result for kind, result in (outcome(new, data) for data in inputs[:count // 4]) if kind == "ok"]
    inputs += tiled
    compared, kinds = 0, {"ok": 0, "error": 0}
    for data in inputs:
        for candidate in [data] + damaged(data, rng):
            expected, got = outcome(old, candidate), outcome(new, candidate)
            if expected != got:
                raise SystemExit(f"input {compared}: baseline {expected[0]} {expected[1][:80]!r}, "
                                 f"this checkout {got[0]} {got[1][:80]!r}")
            kinds[expected[0]] += 1
            compared += 1
    print(f"differential: {compared} inputs ({len(inputs)} JPEGs and damaged copies), same outcome "
          f"from both builds: {kinds['ok']} transcoded byte-identical, {kinds['error']} the same error")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--size-kb", type=int, default=104)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another build of _jpegtiles*.so to compare with")
    parser.add_argument("--verify", action="store_true", help="check the outputs are byte-identical")
    parser.add_argument("--differential", type=int, metavar="N",
                        help="compare with --baseline on N varied JPEGs and damaged copies instead of timing")
    args = parser.parse_args()

    from packer.codecs import _jpegtiles as current
    if args.differential:
        if not args.baseline:
            parser.error("--differential needs --baseline")
        differential(load_extension(args.baseline), current, args.differential)
        return
    print(f"encoding {args.images} JPEGs of ~{args.size_kb} KB ...", file=sys.stderr, flush=True)
    images = photos(args.images, args.size_kb)
    megabytes = sum(len(image) for image in images) / 1e6
    modules = [("this checkout", current)]
    if args.baseline:
        modules.insert(0, ("baseline " + args.baseline.name, load_extension(args.baseline)))
    if args.verify and len(modules) == 2:
        for index, image in enumerate(images):
            if modules[0][1].transcode(image, MAX_PIXELS) != modules[1][1].transcode(image, MAX_PIXELS):
                raise SystemExit(f"image {index}: the outputs differ")
        print(f"byte-identical on all {len(images)} images", file=sys.stderr)

    def candidate(module: Any):
        def run() -> harness.Stretch:
            def body() -> None:
                for image in images:
                    module.transcode(image, MAX_PIXELS)
            return harness.measure(body, items=megabytes)
        return run

    before = harness.machine_load()
    results = harness.interleave([(name, candidate(module)) for name, module in modules], args.rounds,
                                 unit="MB")
    after = harness.machine_load()
    rows = harness.summarize(results)
    print(f"{len(images)} JPEGs, {megabytes:.1f} MB; {harness.describe_load(before, after)}")
    print(harness.table(rows, unit="MB", columns=[("MB per CPU-s", lambda row: f"{1e3 / row.cpu_ms:.1f}")]))


if __name__ == "__main__":
    main()
