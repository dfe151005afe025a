"""Smoke test of an *installed* packer (a wheel or an sdist in a fresh virtualenv), as a user meets it.

    python smoke_installed.py --extensions yes|no [--torch] [--workdir DIR]

Run it with the virtualenv's interpreter from a folder outside the checkout (``check_dist.py``
and cibuildwheel's test command do), so ``import packer`` can only find the installed copy. It
checks the metadata (name, version, licence, ``py.typed``), the three ways to start the CLI
(``packer``, ``packer-shards``, ``python -m packer``), then builds a tiny dataset, verifies,
inspects (text, JSON and ``--html``), exports it back, and, with ``--torch``, loads one
DataLoader batch with a worker process and one batched raw crop.

``--extensions yes``: both C extensions must import and ``--codec tiled`` must build and verify.
``--extensions no`` (an sdist installed without a C compiler): neither may import, everything
above must still work, and ``--codec tiled`` must fail with exit 3 and a message naming the
missing ``packer.codecs._jpegtiles``. Exit 0 when every check passed; the first failure ends it.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def check(condition: bool, what: str) -> None:
    if not condition:
        sys.exit(f"smoke test FAILED: {what}")
    print(f"  ok  {what}", flush=True)


def run(*args: str, expect: int = 0, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=600, **kwargs)
    if done.returncode != expect:
        sys.exit(f"smoke test FAILED: {' '.join(args)} exited {done.returncode} (expected {expect}):\n"
                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


def make_images(root: Path) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 256, (40 + i, 48 + 2 * i, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / label / f"{i:02d}.{'png' if i % 3 == 0 else 'jpg'}", quality=90)
    (root / "dog" / "broken.jpg").write_bytes(b"not an image")


def metadata_checks() -> None:
    import packer

    location = Path(packer.__file__).resolve()
    check("site-packages" in location.parts, f"packer is imported from the installation ({location.parent})")
    meta = importlib.metadata.metadata("packer-shards")
    check(meta["Name"] == "packer-shards" and meta["Version"] == packer.__version__,
          f"distribution packer-shards {meta['Version']} == packer.__version__")
    check(meta.get("License-Expression") == "Apache-2.0", "License-Expression: Apache-2.0")
    files = {str(f) for f in importlib.metadata.files("packer-shards") or []}
    check(any(f.endswith("licenses/LICENSE") or f.endswith("/LICENSE") for f in files), "LICENSE is installed")
    check("packer/py.typed" in files, "packer/py.typed is installed")
    check(not any(f.startswith(("tests/", "scripts/", "docs/")) for f in files), "no tests/scripts/docs installed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--extensions", choices=("yes", "no"), required=True)
    parser.add_argument("--torch", action="store_true", help="also load batches through torch (must be installed)")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="packer-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    os.chdir(work)
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    print(f"smoke test of the installed packer in {work} (python {sys.version.split()[0]})", flush=True)

    metadata_checks()
    import packer

    for command in (["packer"], ["packer-shards"], [sys.executable, "-m", "packer"]):
        out = run(*command, "--version", env=env).stdout.strip()
        check(out == f"packer, version {packer.__version__}", f"{' '.join(command[-2:])} --version: {out}")

    for module in ("packer.codecs._jpegtiles", "packer._rawresample"):
        try:
            importlib.import_module(module)
            built = True
        except ImportError:
            built = False
        check(built == (args.extensions == "yes"), f"{module} {'imports' if built else 'is absent'}")

    make_images(work / "src")
    built = json.loads(run("packer", "build", "src", "out", "--workers", "2", "--json", env=env).stdout)
    check(built["samples"] == 24 and built["rejected"] == 1, "packer build: 24 packed, 1 rejected")
    check("OK:" in run("packer", "verify", "out", env=env).stdout, "packer verify: OK")
    summary = json.loads(run("packer", "inspect", "out", "--json", env=env).stdout)
    check(summary["samples"] == 24 and [c["name"] for c in summary["classes"]] == ["cat", "dog"],
          "packer inspect --json: 24 samples, classes cat and dog")
    run("packer", "inspect", "out", "--html", "report.html", "--verify", env=env)
    check("Verify ran: OK" in Path("report.html").read_text("utf-8"), "packer inspect --html --verify")
    run("packer", "export", "out", "back", env=env)
    check(len(list(Path("back").rglob("*.*"))) == 24, "packer export: 24 files back")
    # the photographs the guides are followed with come with the wheel
    run("packer", "sample-data", "data", env=env)
    photos = json.loads(run("packer", "build", "data/imagenet/train", "photos", "--json", env=env).stdout)
    check(photos["samples"] == 64 and photos["classes"] == 4, "packer sample-data: 64 photographs in 4 classes")

    if args.extensions == "yes":
        run("packer", "build", "src", "tiled", "--codec", "tiled", "--workers", "2", env=env)
        check("OK:" in run("packer", "verify", "tiled", "--decode", env=env).stdout, "--codec tiled builds and verifies")
    else:
        refused = run("packer", "build", "src", "tiled", "--codec", "tiled", env=env, expect=3)
        message = refused.stderr
        check("packer.codecs._jpegtiles" in message and "C compiler" in message and "packer-shards" in message,
              f"--codec tiled refused (exit 3): {message.strip().splitlines()[-1][:160]}")
        check(not Path("tiled", "manifest.json").exists(), "the refused build left no dataset")

    if args.torch:
        import torch
        from torch.utils.data import DataLoader

        from packer import ReadOrder
        from packer.torch import PackedBatchSampler, PackedDataset
        from packer.transforms import CenterCrop, RandomResizedCrop

        data = PackedDataset("out", decode=CenterCrop(size=32, resize=36))
        images, labels = next(iter(DataLoader(data, batch_size=8, shuffle=True, num_workers=1)))
        check(tuple(images.shape) == (8, 3, 32, 32) and images.dtype == torch.uint8 and labels.shape == (8,),
              f"DataLoader batch with a worker process: {tuple(images.shape)} {images.dtype}")
        run("packer", "build", "src", "raw", "--codec", "raw", "--size", "32x32", env=env)
        raw = PackedDataset("raw", decode=RandomResizedCrop(24, seed=0), layout="HWC")
        sampler = PackedBatchSampler(raw, batch_size=8, order=ReadOrder("random", seed=0))
        images, labels = next(iter(DataLoader(raw, batch_sampler=sampler, num_workers=0)))
        check(tuple(images.shape) == (8, 24, 24, 3), "batched raw crop (compiled kernel or torch's ops)")
    print("smoke test passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
