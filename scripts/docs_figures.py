"""The pictures of the documentation site, made from real runs of the ``packer`` command.

    python scripts/docs_figures.py [--out docs/images] [--work docs-figures-work] [--images 400]

Writes (each small enough to commit; rerun after changing what they show):

* ``contact-sheet.png``: ``packer inspect --grid`` of the demo images (``make demo``'s folder).
* ``report.png``: ``packer inspect --html --verify`` of the same dataset, shown by headless
  Chromium (``apt-get install chromium``), cut to its first screen.
* ``throughput-workers.svg``: ``packer bench`` samples/s against DataLoader worker processes
  for pass-through and ``--codec tiled`` JPEGs, random-resized crops to 224. It
  is measured on this machine when the script runs: the title says the date, the core count
  and the image count, and the numbers move with the machine's load.
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import make_sample  # noqa: E402

from packer.inspect.svg import line_chart  # noqa: E402

WORKERS = (1, 2, 3, 4)


def packer(*args: object, cwd: Path) -> str:
    """Run the packer command in ``cwd`` (paths relative to it, as a reader would type them)."""
    command = [sys.executable, "-m", "packer", *map(str, args)]
    print("$ packer " + " ".join(map(str, args)), flush=True)
    return subprocess.run(command, check=True, capture_output=True, text=True, cwd=cwd).stdout


def small_png(source: Path, target: Path, *, width: int | None = None, height: int | None = None,
              colours: int = 256) -> None:
    """Save ``source`` as a palette PNG (optionally resized / cut) to keep the committed file small."""
    from PIL import Image

    image = Image.open(source).convert("RGB")
    if height is not None and image.height > height:
        image = image.crop((0, 0, image.width, height))
    if width is not None and image.width > width:
        image = image.resize((width, round(image.height * width / image.width)), Image.LANCZOS)
    buffer = io.BytesIO()
    image.quantize(colours, dither=Image.Dither.NONE).save(buffer, "PNG", optimize=True)
    target.write_bytes(buffer.getvalue())
    print(f"wrote {target} ({len(buffer.getvalue()):,} bytes)", flush=True)


def screenshot(page: Path, shot: Path, width: int, height: int) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        sys.exit("report.png needs headless Chromium: apt-get install chromium")
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                        "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
                        f"--user-data-dir={profile}", f"--window-size={width},{height}", f"--screenshot={shot}",
                        page.resolve().as_uri()], check=True, capture_output=True, timeout=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images")
    parser.add_argument("--work", type=Path, default=REPO / "docs-figures-work")
    parser.add_argument("--images", type=int, default=400, help="images of the benchmark dataset")
    parser.add_argument("--batches", type=int, default=12, help="batches timed per bench run")
    parser.add_argument("--skip-bench", action="store_true")
    args = parser.parse_args(argv)
    out, work = args.out, args.work
    out.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    # the demo's folder: mixed formats and a few broken files, so the report has rejections to show
    images = work / "images"
    make_sample.make_image_folder(images, classes=4, per_class=24, seed=0, min_size=64, max_size=160,
                                  formats=("jpeg", "jpeg", "jpeg", "png", "webp", "png-rgba", "jpeg-gray"))
    make_sample.add_bad_files(images)
    packer("build", "images", "dataset", "--shard-size", "1M", "--workers", "2", "--quiet", cwd=work)
    packer("inspect", "dataset", "--grid", "sheet.png", "--grid-count", "16", "--grid-columns", "8", cwd=work)
    small_png(work / "sheet.png", out / "contact-sheet.png")
    packer("inspect", "dataset", "--html", "report.html", "--verify", "--grid-count", "16", cwd=work)
    screenshot(work / "report.html", work / "report-full.png", 1000, 1500)
    small_png(work / "report-full.png", out / "report.png", width=800, colours=64)

    if not args.skip_bench:
        bench_images = work / "bench-src"
        make_sample.make_image_folder(bench_images, classes=4, per_class=args.images // 4, seed=1, min_size=300,
                                      max_size=500, formats=("jpeg",), quality=90)
        series: dict[str, list[tuple[float, float]]] = {}
        for codec in ("passthrough", "tiled"):
            target = f"bench-{codec}"
            packer("build", bench_images.name, target, "--codec", codec, "--workers", "2", "--quiet", cwd=work)
            points = []
            for workers in WORKERS:
                result = json.loads(packer("bench", target, "--workers", workers, "--batch-size", "32",
                                           "--batches", args.batches, "--warmup", "3", "--decode", "rrc",
                                           "--json", cwd=work))["bench"]
                points.append((workers, round(result["samples_per_s"])))
                print(f"   {codec}, {workers} worker(s): {result['samples_per_s']:.0f} samples/s", flush=True)
            series[f"{codec} JPEGs"] = points
        today = datetime.date.today().isoformat()
        title = (f"packer bench: random-resized crops to 224, batches of 32 ({args.images} JPEGs of 300-500 px; "
                 f"{os.cpu_count()} cores, {today})")
        svg = line_chart(series, title=title, xlabel="DataLoader worker processes",
                         ylabel="images per second", width=760)
        (out / "throughput-workers.svg").write_text(svg + "\n", encoding="utf-8")
        (out / "throughput-workers.json").write_text(json.dumps({"date": today, "cores": os.cpu_count(),
                                                                "images": args.images, "series": series},
                                                               indent=1, sort_keys=True) + "\n")
        print(f"wrote {out / 'throughput-workers.svg'}: {series}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
