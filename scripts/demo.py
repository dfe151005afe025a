"""The end-to-end demo behind ``make demo``: sample images -> build -> inspect -> verify -> DataLoader batch
-> the same images with ``--codec tiled`` (random crops identical).

    python scripts/demo.py [--out demo-out]

Every step runs the real ``packer`` command line (as a user would), then loads one batch
through a PyTorch DataLoader with worker processes. The sample folder mixes formats and modes
and contains a few bad files, so the build report has something to say.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_sample  # noqa: E402


def run(*args: str) -> None:
    command = [sys.executable, "-m", "packer", *args]
    print(f"\n$ packer {' '.join(args)}", flush=True)
    completed = subprocess.run(command)
    if completed.returncode != 0:
        sys.exit(f"demo step failed with exit code {completed.returncode}: packer {' '.join(args)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("demo-out"))
    args = parser.parse_args(argv)
    out: Path = args.out
    shutil.rmtree(out, ignore_errors=True)
    images, dataset = out / "images", out / "dataset"
    make_sample.make_image_folder(images, classes=4, per_class=24, seed=0, min_size=64, max_size=160,
                                  formats=("jpeg", "jpeg", "jpeg", "png", "webp", "png-rgba", "jpeg-gray"))
    bad = make_sample.add_bad_files(images)
    print(f"wrote a sample image folder at {images} (4 classes x 24 images, plus {len(bad)} bad files)")

    run("build", str(images), str(dataset), "--shard-size", "1M", "--workers", "2")
    run("inspect", str(dataset))
    run("inspect", str(dataset), "--sample", "0")
    run("inspect", str(dataset), "--grid", str(out / "contact-sheet.png"))
    run("verify", str(dataset))

    print("\n$ python: one batch through a DataLoader with 2 worker processes", flush=True)
    try:
        import torch
        from torch.utils.data import DataLoader
    except ImportError:
        print("torch is not installed: pip install 'packer-shards[torch]' to load batches")
        return 0
    from packer.torch import PackedDataset
    from packer.transforms import CenterCrop

    data = PackedDataset(dataset, decode=CenterCrop(size=64, resize=72))
    loader = DataLoader(data, batch_size=16, shuffle=True, num_workers=2, pin_memory=torch.cuda.is_available(),
                        persistent_workers=True)
    images_batch, labels = next(iter(loader))
    print(f"batch: images {tuple(images_batch.shape)} {images_batch.dtype}, labels {labels.tolist()}")
    print(f"classes: {data.classes}")

    from packer.codecs.tiles import transcoder_available
    if transcoder_available():
        # The same images with the tiled codec: lossless, so random crops decode identically.
        tiled = out / "dataset-tiled"
        run("build", str(images), str(tiled), "--codec", "tiled", "--shard-size", "1M", "--workers", "2")
        import numpy as np

        from packer.transforms import RandomResizedCrop
        crop = RandomResizedCrop(48)
        plain_ds, tiled_ds = PackedDataset(dataset, decode=crop), PackedDataset(tiled, decode=crop)
        same = 0
        for i in range(len(plain_ds)):
            j = tiled_ds.dataset.find(plain_ds.dataset.key(i))
            fmt = int(plain_ds.dataset.index.image_format[i])
            a = crop(plain_ds.dataset.get(i), fmt, np.random.default_rng(i))
            b = crop(tiled_ds.dataset.get(j), fmt, np.random.default_rng(i))
            same += bool(np.array_equal(a, b))
        print(f"random crops identical between {dataset.name} and {tiled.name}: {same} of {len(plain_ds)}")
        if same != len(plain_ds):
            sys.exit("demo step failed: the tiled dataset decoded differently")
    print(f"\ndone: dataset in {dataset}, contact sheet in {out / 'contact-sheet.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
