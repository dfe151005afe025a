"""How good and how fast is duplicate detection? Real photographs, planted copies, the same run.

    python benchmarks/bench_duplicates.py [--per-kind 35] [--rounds 3] [--search 1000000] [--work DIR]
                                          [--wheels DIR] [--json OUT]

The corpus. Photographs are taken from the wheels of scikit-image (its ``skimage/data``
photographs) and scikit-learn (``china.jpg``, ``flower.jpg``), downloaded with ``pip download``
into a temporary folder at run time (``--wheels`` reuses a folder holding them); nothing is
committed. Each photograph is cut into square crops at two scales (40 % and 25 % of its shorter
side, half a crop apart); crops with little structure (grey standard deviation under 28 on a
64x64 thumbnail: sky, black borders) are dropped. The crops are the distinct *base* images,
shuffled with a fixed seed: half go to ``train``, half only to ``val``. Different crops of one
photograph (overlapping by up to half) are the hard negatives: same colours, same textures, not
copies.

Planted copies, in ``val``, of ``--per-kind`` train bases each: ``quality`` (re-encoded at JPEG
quality 40-75), ``resize`` (0.5-0.8x or 1.25-2x), ``crop`` (2-5 % of each side's length cut, split
at random between the two sides), ``jitter`` (brightness and contrast each 5-10 % up or down),
``png`` (converted to PNG), ``flip`` (mirrored), and ``combined`` (resize, crop, brightness and
quality at once; a stress row, outside the headline). ``--exact`` train images are also copied
byte for byte into ``val`` and ``--exact // 2`` repeated inside ``train``. Bases are JPEGs at
quality 90; class folders are the source photographs.

What it prints:

1. quality at the default threshold and the curve over thresholds: recall per kind, precision
   over every train-val pair found, for packer's hash (flips off, and on), its first 64 bits
   alone, ImageHash's pHash on packer's thumbnails, and imagededup's PHash on the files (its
   own decode), the same ground truth for all (the ``flip`` kind counts only for a flip-invariant
   hash, ``combined`` is shown apart); exact duplicates: found, and false;
2. hashing speed per core against a full decode of the same JPEGs (the corpus, and the source
   photographs at full size at quality 90 and 75), interleaved rounds, CPU time;
3. the search over ``--search`` synthetic hashes (random, plus 1 % planted copies within 12
   bits): seconds and peak memory (the child process's own high-water mark), one thread and two,
   flips off and on.

imagededup and ImageHash are optional: run the benchmark with a Python that has them (``pip
install imagededup imagehash``; they pull in torch and scipy) to get their rows.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import harness
import numpy as np
from PIL import Image, ImageEnhance, ImageOps

from packer.decode import decode_image
from packer.duplicates import DEFAULT_THRESHOLD, find_duplicates
from packer.duplicates.phash import FLIP_MASK, grey_pixels, hash_pixels
from packer.writer import build
from packer.writer.plan import BuildOptions

PHOTOGRAPHS = ("astronaut.png", "camera.png", "chelsea.png", "coffee.png", "hubble_deep_field.jpg", "ihc.png",
               "motorcycle_left.png", "retina.jpg", "rocket.jpg", "brick.png", "grass.png", "gravel.png",
               "coins.png", "moon.png", "china.jpg", "flower.jpg")
KINDS = ("quality", "resize", "crop", "jitter", "png", "flip", "combined")
HEADLINE = ("quality", "resize", "crop", "jitter", "png")
THRESHOLDS = (8, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)


# --- photographs and the corpus ---------------------------------------------------------------

def fetch_wheels(folder: Path) -> list[Path]:
    """scikit-image's and scikit-learn's wheels in ``folder`` (downloaded when absent)."""
    wheels = sorted(folder.glob("scikit_image-*.whl")) + sorted(folder.glob("scikit_learn-*.whl"))
    if len(wheels) < 2:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                        "scikit-image", "scikit-learn", "-d", str(folder)], check=True)
        wheels = sorted(folder.glob("scikit_image-*.whl")) + sorted(folder.glob("scikit_learn-*.whl"))
    return wheels


def photographs(wheels: list[Path]) -> dict[str, Image.Image]:
    found = {}
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            for name in archive.namelist():
                base = name.rsplit("/", 1)[-1]
                if base in PHOTOGRAPHS and ("skimage/data/" in name or "sklearn/datasets/images/" in name):
                    found[base] = Image.open(io.BytesIO(archive.read(name))).convert("RGB")
    return dict(sorted(found.items()))


def base_crops(photos: dict[str, Image.Image], min_std: float = 28.0) -> list[tuple[str, tuple[int, int, int], Image.Image]]:
    crops = []
    for name, image in photos.items():
        width, height = image.size
        for fraction in (0.4, 0.25):
            side = int(min(width, height) * fraction)
            step = side // 2
            for y in range(0, height - side + 1, step):
                for x in range(0, width - side + 1, step):
                    crop = image.crop((x, y, x + side, y + side))
                    grey = np.asarray(crop.convert("L").resize((64, 64)), dtype=np.float32)
                    if grey.std() >= min_std:
                        crops.append((name, (x, y, side), crop))
    return crops


def jpeg(image: Image.Image, quality: int = 90) -> bytes:
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue()


def variant(image: Image.Image, kind: str, rng: np.random.Generator) -> tuple[bytes, str]:
    """A planted copy of ``image``: (bytes, file suffix)."""
    width, height = image.size
    if kind == "quality":
        return jpeg(image, int(rng.integers(40, 76))), "jpg"
    if kind == "resize":
        factor = float(rng.uniform(0.5, 0.8) if rng.random() < 0.5 else rng.uniform(1.25, 2.0))
        return jpeg(image.resize((max(8, round(width * factor)), max(8, round(height * factor))),
                                 Image.Resampling.LANCZOS)), "jpg"
    if kind == "crop":
        cut = rng.uniform(0.02, 0.05)
        dx, dy = int(width * cut), int(height * cut)
        ox, oy = int(rng.integers(0, dx + 1)), int(rng.integers(0, dy + 1))
        return jpeg(image.crop((ox, oy, width - (dx - ox), height - (dy - oy)))), "jpg"
    if kind == "jitter":
        brightness = 1 + float(rng.choice([-1, 1])) * rng.uniform(0.05, 0.10)
        contrast = 1 + float(rng.choice([-1, 1])) * rng.uniform(0.05, 0.10)
        return jpeg(ImageEnhance.Contrast(ImageEnhance.Brightness(image).enhance(brightness)).enhance(contrast)), "jpg"
    if kind == "png":
        out = io.BytesIO()
        image.save(out, "PNG")
        return out.getvalue(), "png"
    if kind == "flip":
        return jpeg(ImageOps.mirror(image)), "jpg"
    factor = rng.uniform(0.5, 2.0)
    copy = image.resize((max(8, round(width * factor)), max(8, round(height * factor))), Image.Resampling.LANCZOS)
    w2, h2 = copy.size
    cut = rng.uniform(0.02, 0.05)
    dx, dy = int(w2 * cut), int(h2 * cut)
    copy = copy.crop((dx // 2, dy // 2, w2 - (dx - dx // 2), h2 - (dy - dy // 2)))
    copy = ImageEnhance.Brightness(copy).enhance(1 + rng.uniform(-0.1, 0.1))
    return jpeg(copy, int(rng.integers(40, 76))), "jpg"


def make_corpus(work: Path, photos: dict[str, Image.Image], per_kind: int, exact: int, seed: int = 0) -> dict[str, Any]:
    """Write train/ and val/ folders; return the ground truth: planted (train key, val key, kind)."""
    rng = np.random.default_rng(seed)
    crops = base_crops(photos)
    order = rng.permutation(len(crops))
    half = len(order) // 2
    train_ids, val_ids = order[:half].tolist(), order[half:].tolist()
    truth: dict[str, Any] = {"planted": [], "exact": [], "bases": len(crops), "photos": len(photos)}
    keys = {}
    for split, ids in (("train", train_ids), ("val", val_ids)):
        for number in ids:
            photo, (x, y, side), crop = crops[number]
            key = f"{Path(photo).stem}/{split}-{number:04d}-{x}-{y}-{side}.jpg"
            (work / split / key).parent.mkdir(parents=True, exist_ok=True)
            (work / split / key).write_bytes(jpeg(crop))
            keys[(split, number)] = key
    # planted copies and byte-identical copies come from different bases: a copy of a base that also
    # has a planted variant would make a true pair the ground truth does not list
    shuffled = rng.permutation(train_ids).tolist()
    chosen = iter(shuffled)
    for kind in KINDS:
        for _ in range(per_kind):
            number = next(chosen)
            photo = crops[number][0]
            data, suffix = variant(crops[number][2], kind, rng)
            key = f"{Path(photo).stem}/planted-{kind}-{number:04d}.{suffix}"
            (work / "val" / key).write_bytes(data)
            truth["planted"].append((keys[("train", number)], key, kind))
    for k, number in enumerate(shuffled[len(KINDS) * per_kind:][:exact + exact // 2]):
        source = work / "train" / keys[("train", number)]
        split = "val" if k < exact else "train"
        key = f"{Path(crops[number][0]).stem}/exact-{k:03d}.jpg"
        (work / split / key).write_bytes(source.read_bytes())
        truth["exact"].append((keys[("train", number)], key, split))
    return truth


# --- quality -----------------------------------------------------------------------------------

def curve(found: dict[tuple[str, str], int], truth: dict[str, Any], kinds: tuple[str, ...],
          ignore: tuple[str, ...], thresholds: tuple[int, ...]) -> list[dict[str, Any]]:
    """Recall per kind and precision over ``found`` ((train key, val key) -> distance) per threshold.

    Pairs of ``ignore`` kinds count neither as hits nor as false pairs; byte-identical copies are
    left out (they are exact duplicates, counted apart)."""
    planted = {(a, b): kind for a, b, kind in truth["planted"]}
    exact = {(a, b) for a, b, split in truth["exact"] if split == "val"}
    rows = []
    for threshold in thresholds:
        hits = {kind: 0 for kind in kinds}
        false = 0
        for pair, distance in found.items():
            if distance > threshold or pair in exact:
                continue
            kind = planted.get(pair)
            if kind in hits:
                hits[kind] += 1
            elif kind is None:
                false += 1
        totals = {kind: sum(1 for k in planted.values() if k == kind) for kind in kinds}
        counted = [k for k in kinds if k not in ignore and k != "combined"]
        tp = sum(hits[k] for k in counted)
        positives = sum(totals[k] for k in counted)
        rows.append({"threshold": threshold, "recall": tp / max(positives, 1), "precision": tp / max(tp + false, 1),
                     "false_pairs": false, "true_pairs": tp,
                     "by_kind": {k: hits[k] / max(totals[k], 1) for k in kinds if k not in ignore}})
    return rows


def packer_pairs(train: Path, val: Path, flips: bool, threshold: int = 40) -> tuple[dict[tuple[str, str], int], Any]:
    report = find_duplicates(train, [val], threshold=threshold, flips=flips, workers=1)
    found = {}
    for group in report.groups:
        for a, b, distance, _ in group.pairs:
            first, second = report.describe(group.members[a]), report.describe(group.members[b])
            if first["dataset"] == "val":
                first, second = second, first
            if first["dataset"] == "train" and second["dataset"] == "val":
                found[(first["key"], second["key"])] = min(distance, found.get((first["key"], second["key"]), 999))
    return found, report


def file_hashes(folder: Path, hasher: Any) -> dict[str, np.ndarray]:
    return {path.relative_to(folder).as_posix(): hasher(path.read_bytes())
            for path in sorted(folder.rglob("*")) if path.is_file()}


def brute(train: dict[str, np.ndarray], val: dict[str, np.ndarray], threshold: int, mirror: np.ndarray | None = None
          ) -> dict[tuple[str, str], int]:
    tk, vk = list(train), list(val)
    a, b = np.array([train[k] for k in tk]), np.array([val[k] for k in vk])
    distance = np.bitwise_count(a[:, None, :] ^ b[None, :, :]).sum(axis=-1)
    if mirror is not None:
        distance = np.minimum(distance, np.bitwise_count(a[:, None, :] ^ (b ^ mirror)[None, :, :]).sum(axis=-1))
    rows, cols = np.nonzero(distance <= threshold)
    return {(tk[r], vk[c]): int(distance[r, c]) for r, c in zip(rows.tolist(), cols.tolist())}


def imagehash_on_thumbnails(data: bytes) -> np.ndarray:
    import imagehash  # optional

    value = imagehash.phash(Image.fromarray(grey_pixels(data)))
    return np.array([int(str(value), 16)], dtype=np.uint64)


def imagededup_hashes(folder: Path) -> dict[str, np.ndarray]:
    from imagededup.methods import PHash  # optional

    encoder = PHash(verbose=False)
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            code = encoder.encode_image(image_file=str(path))
            out[path.relative_to(folder).as_posix()] = np.array([int(code, 16)], dtype=np.uint64)
    return out


def quality(work: Path, truth: dict[str, Any]) -> dict[str, Any]:
    train_ds, val_ds = work / "ds" / "train", work / "ds" / "val"
    results: dict[str, Any] = {}
    no_flip = ("flip",)
    found, report = packer_pairs(train_ds, val_ds, flips=False)
    results["packer dct-sign-128"] = curve(found, truth, KINDS, no_flip, THRESHOLDS)
    found_flips, _ = packer_pairs(train_ds, val_ds, flips=True)
    results["packer dct-sign-128, flips on"] = curve(found_flips, truth, KINDS, (), THRESHOLDS)
    exact_found = {frozenset((report.describe(g.members[0])["key"], report.describe(m)["key"]))
                   for g in report.groups if g.kind == "exact" for m in g.members[1:]}
    planted_exact = {frozenset((a, b)) for a, b, _ in truth["exact"]}
    results["exact"] = {"planted": len(planted_exact), "found": len(planted_exact & exact_found),
                        "false": len(exact_found - planted_exact)}

    def ours(data: bytes) -> np.ndarray:
        return hash_pixels(grey_pixels(data))[0]

    train_h, val_h = file_hashes(work / "train", ours), file_hashes(work / "val", ours)
    first64 = {k: v[:1] for k, v in train_h.items()}, {k: v[:1] for k, v in val_h.items()}
    results["packer first 64 bits"] = curve(brute(*first64, 32), truth, KINDS, no_flip, tuple(t // 2 for t in THRESHOLDS))
    try:
        train_i, val_i = (file_hashes(work / split, imagehash_on_thumbnails) for split in ("train", "val"))
        results["ImageHash phash on packer's thumbnails"] = curve(brute(train_i, val_i, 32), truth, KINDS, no_flip,
                                                                  tuple(t // 2 for t in THRESHOLDS))
    except ImportError:
        print("ImageHash is not installed here: its row is skipped (pip install imagehash)", file=sys.stderr)
    try:
        train_d, val_d = imagededup_hashes(work / "train"), imagededup_hashes(work / "val")
        results["imagededup PHash"] = curve(brute(train_d, val_d, 32), truth, KINDS, no_flip,
                                            tuple(t // 2 for t in THRESHOLDS))
    except ImportError:
        print("imagededup is not installed here: its row is skipped (pip install imagededup)", file=sys.stderr)
    planted = {(a, b) for a, b, _ in truth["planted"]} | {(a, b) for a, b, _ in truth["exact"]}
    results["false pairs at the default threshold"] = sorted(
        [a, b, d] for (a, b), d in found.items() if d <= DEFAULT_THRESHOLD and (a, b) not in planted)
    return results


def print_quality(results: dict[str, Any], default: int) -> None:
    exact = results["exact"]
    print(f"\nexact duplicates: {exact['found']} of {exact['planted']} found, {exact['false']} false")
    print("\nnear duplicates (train x val pairs; recall over quality, resize, crop, jitter, png [+ flip when on];"
          " combined apart)")
    for name, rows in results.items():
        if name == "exact" or name.startswith("false pairs"):
            continue
        print(f"\n{name}")
        kinds = list(rows[0]["by_kind"])
        print(f"  {'t':>4} {'recall':>7} {'precision':>9} {'false':>6}  " + " ".join(f"{k[:8]:>8}" for k in kinds))
        for row in rows:
            mark = " <- default" if name.startswith("packer dct") and row["threshold"] == default else ""
            print(f"  {row['threshold']:>4} {row['recall']:>7.3f} {row['precision']:>9.3f} {row['false_pairs']:>6}  "
                  + " ".join(f"{row['by_kind'][k]:>8.2f}" for k in kinds) + mark)


# --- speed -------------------------------------------------------------------------------------

def speed(work: Path, photos: dict[str, Image.Image], rounds: int) -> dict[str, Any]:
    corpus = [p.read_bytes() for p in sorted((work / "train").rglob("*.jpg"))]
    out = {}
    for name, images, quality in (("corpus crops", corpus, 90),
                                  ("photographs, full size", [jpeg(image) for image in photos.values()] * 8, 90),
                                  ("photographs, full size", [jpeg(image, 75) for image in photos.values()] * 8, 75)):
        name = f"{name}, quality {quality}"
        sizes = np.array([Image.open(io.BytesIO(d)).size for d in images])
        print(f"\nhashing vs a full decode, {name}: {len(images)} JPEGs, median {int(np.median(sizes[:, 0]))}x"
              f"{int(np.median(sizes[:, 1]))} px, one thread")

        def full() -> int:
            for data in images:
                decode_image(data, 1)
            return len(images)

        def hashing() -> int:
            for data in images:
                hash_pixels(grey_pixels(data, 1))
            return len(images)

        candidates = [("full decode (packer.decode, RGB)", lambda: harness.measure(full)),
                      ("perceptual hash (1/8 DCT-scaled grey)", lambda: harness.measure(hashing))]
        try:
            from imagededup.methods import PHash

            encoder = PHash(verbose=False)
            folder = Path(tempfile.mkdtemp(dir=work))
            for k, data in enumerate(images):
                (folder / f"{k}.jpg").write_bytes(data)
            files = sorted(folder.iterdir())

            def imagededup() -> int:
                for path in files:
                    encoder.encode_image(image_file=str(path))
                return len(files)

            candidates.append(("imagededup PHash.encode_image (file)", lambda: harness.measure(imagededup)))
        except ImportError:
            pass
        results = harness.interleave(candidates, rounds)
        rows = harness.summarize(results, "full decode (packer.decode, RGB)")
        print(harness.table(rows, unit="images"))
        out[name] = {row.name: {"images_per_s": row.rate, "cpu_ms": row.cpu_ms, "cpu_ratio": 1 / row.cpu_ratio}
                     for row in rows}
    return out


# --- the search --------------------------------------------------------------------------------

SEARCH_CHILD = """
import json, sys, time
import numpy as np
from packer.duplicates.search import near_pairs
count, threshold, flips, workers = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", int(sys.argv[4])
rng = np.random.default_rng(7)
hashes = rng.integers(0, 2**64, size=(count, 2), dtype=np.uint64, endpoint=False)
planted = count // 100
source, target = rng.choice(count, size=(2, planted), replace=False)
copies = hashes[source].copy()
for row in range(planted):
    for bit in rng.choice(128, int(rng.integers(0, 13)), replace=False):
        copies[row, bit // 64] ^= np.uint64(1) << np.uint64(bit % 64)
hashes[target] = copies
wall, cpu = time.perf_counter(), time.process_time()
pairs = near_pairs(hashes, threshold, flips=flips, workers=workers)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
want = {(min(a, b), max(a, b)) for a, b in zip(source.tolist(), target.tolist())}
got = set(zip(pairs.first.tolist(), pairs.second.tolist()))
# VmHWM, not getrusage's ru_maxrss: the latter keeps the forking parent's size from before exec
with open("/proc/self/status") as status:
    peak = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
print(json.dumps({"seconds": wall, "cpu_seconds": cpu, "pairs": len(pairs), "planted_found": len(want & got),
                  "planted": len(want), "peak_rss_mib": peak}))
"""


def search(count: int, threshold: int) -> dict[str, Any]:
    out = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(harness.REPO), os.environ.get("PYTHONPATH", "")])}
    for flips, workers in ((False, 1), (False, 2), (True, 2)):
        done = subprocess.run([sys.executable, "-c", SEARCH_CHILD, str(count), str(threshold), "1" if flips else "0",
                               str(workers)], capture_output=True, text=True, check=True, env=env)
        result = json.loads(done.stdout)
        out[f"flips {'on' if flips else 'off'}, {workers} thread(s)"] = result
        print(f"search, {count:,} random hashes + 1 % planted copies within 12 bits, threshold {threshold}, "
              f"flips {'on' if flips else 'off'}, {workers} thread(s): {result['seconds']:.1f} s wall, "
              f"{result['cpu_seconds']:.1f} s CPU, peak {result['peak_rss_mib']:.0f} MiB (the whole process), "
              f"{result['pairs']:,} pairs, {result['planted_found']:,} of {result['planted']:,} planted found")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-kind", type=int, default=35, help="planted copies of each kind")
    parser.add_argument("--exact", type=int, default=20, help="byte-identical copies planted in val")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--search", type=int, default=1_000_000, help="synthetic hashes searched (0: skip)")
    parser.add_argument("--work", type=Path, default=None, help="folder for the corpus (default: a temp folder)")
    parser.add_argument("--wheels", type=Path, default=None, help="folder holding (or receiving) the two wheels")
    parser.add_argument("--json", type=Path, default=None, help="write every number to this file")
    parser.add_argument("--skip", nargs="*", default=(), choices=("quality", "speed", "search"))
    args = parser.parse_args(argv)
    before = harness.machine_load()
    with tempfile.TemporaryDirectory(prefix="packer-bench-dups-") as tmp:
        work = args.work or Path(tmp)
        wheels = fetch_wheels(args.wheels or Path(tmp) / "wheels")
        photos = photographs(wheels)
        results: dict[str, Any] = {"photographs": sorted(photos)}
        if not (work / "ds" / "val").exists():
            truth = make_corpus(work, photos, args.per_kind, args.exact)
            (work / "truth.json").write_text(json.dumps(truth))
            for split in ("train", "val"):
                build(work / split, work / "ds" / split, BuildOptions(shard_size=64 << 20, seed=1), workers=1,
                      progress=False)
        truth = json.loads((work / "truth.json").read_text())
        results["corpus"] = {"photographs": truth["photos"], "bases": truth["bases"], "planted": len(truth["planted"]),
                             "exact": len(truth["exact"])}
        print(f"corpus: {truth['photos']} photographs, {truth['bases']} distinct crops (half train, half val only), "
              f"{len(truth['planted'])} planted copies in val ({args.per_kind} per kind), {len(truth['exact'])} "
              f"byte-identical copies")
        if "quality" not in args.skip:
            results["quality"] = quality(work, truth)
            print_quality(results["quality"], DEFAULT_THRESHOLD)
        if "speed" not in args.skip:
            results["speed"] = speed(work, photos, args.rounds)
        if "search" not in args.skip and args.search:
            print()
            results["search"] = search(args.search, DEFAULT_THRESHOLD)
    print(f"\n{harness.describe_load(before, harness.machine_load())}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
