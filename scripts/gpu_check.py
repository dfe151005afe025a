"""One-shot GPU check: build synthetic datasets, measure the GPU read/decode paths, run ``pytest -m gpu``.

    python3 scripts/gpu_check.py [--wheels DIR] [--budget 450] [--raw-gb 2] [--jpegs 8000] [--work DIR]
    python3 scripts/gpu_check.py --dry-run       # CPU only, tiny sizes: exercises everything host-side

Made for a machine with an NVIDIA GPU (torch with CUDA, torchvision, cuFile), run from the
repository root (packer need not be installed). ``--wheels DIR`` first installs the wheels in DIR
offline (``pip install --no-deps``): kvikio-cu13, libkvikio-cu13, rapids-logger, simplejpeg.

In one run, each measurement against its baseline in the same run:

1. environment: GPU, torch/torchvision/kvikio versions, ``packer.gpu.gds_status()`` (is
   GPUDirect Storage active, or kvikio's POSIX compatibility mode), the work folder's file system;
2. ``pytest -m gpu`` (the correctness checks of the real CUDA paths);
3. builds a ``raw:size=224x224`` dataset (~``--raw-gb`` GB) and a passthrough JPEG dataset;
4. block reads into device memory, page cache dropped before each (``POSIX_FADV_DONTNEED``):
   kvikio (``KvikioShard``) vs ``pread`` into pinned memory + ``cudaMemcpy``, blocks of 64 KiB to
   64 MiB, 64 MiB in flight;
5. raw-shard batches to the GPU (``GpuRawBatches``, 256 per batch): io=kvikio vs io=host vs the
   CPU path (``device="cpu"``): images/s and GB/s;
6. JPEG batches decoded on the GPU (``GpuJpegBatches``, nvJPEG through torchvision) vs the CPU
   path (simplejpeg via ``packer.decode``, one thread, and one thread per core);
7. nvJPEG on the tiled-JPEG vectors: a tiled JPEG decodes exactly like its source, a cut window
   like the same region.

Partial results are printed as they come; the summary table is printed last and everything is
written to ``$OUT/gpu_check.json`` when ``$OUT`` is set (or ``--json PATH``). Each section runs
only while the time budget (default 450 s) allows, so the script ends in under 8 minutes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from pagecache import evict  # noqa: E402

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
RESULTS: dict[str, Any] = {"sections": {}, "errors": []}
T0 = time.perf_counter()


def log(message: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {message}", flush=True)


def left(budget: float) -> float:
    return budget - (time.perf_counter() - T0)


def section(name: str, budget: float, needs: float) -> Callable[[Callable[[], Any]], Any]:
    """Run a section if ``needs`` seconds remain; record its result or its error, never stop the run."""
    def run(fn: Callable[[], Any]) -> Any:
        if left(budget) < needs:
            log(f"SKIP {name}: {left(budget):.0f}s left, needs ~{needs:.0f}s")
            RESULTS["sections"][name] = {"skipped": f"time budget ({left(budget):.0f}s left)"}
            return None
        log(f"--- {name}")
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - report and go on with the next section
            log(f"FAIL {name}: {type(exc).__name__}: {exc}")
            RESULTS["errors"].append({"section": name, "error": f"{type(exc).__name__}: {exc}",
                                      "traceback": traceback.format_exc()[-4000:]})
            RESULTS["sections"][name] = {"error": f"{type(exc).__name__}: {exc}"}
            return None
        RESULTS["sections"][name] = value
        return value
    return run


def install_wheels(folder: str) -> None:
    wheels = sorted(glob.glob(os.path.join(folder, "*.whl")))
    if not wheels:
        log(f"no wheels in {folder}")
        return
    log(f"installing {len(wheels)} wheels offline: {', '.join(os.path.basename(w) for w in wheels)}")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", *wheels],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        log(f"pip install failed ({proc.returncode}): {proc.stderr[-2000:]}")


def filesystem_of(path: Path) -> str:
    """The mount (device, type) holding ``path``: GDS needs a local ext4/xfs on NVMe, not tmpfs/overlay."""
    real = os.path.realpath(path)
    best = ("?", "?", "")
    try:
        with open("/proc/mounts") as mounts:
            for line in mounts:
                device, mount, kind = line.split()[:3]
                if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best[2]):
                    best = (device, kind, mount)
    except OSError:
        pass
    return f"{best[1]} ({best[0]} on {best[2]})"


def gbps(nbytes: float, seconds: float) -> float | None:
    return round(nbytes / seconds / 1e9, 2) if nbytes and seconds > 0 else None


# --- sections ----------------------------------------------------------------------------------

def environment(work: Path, gpu: bool) -> dict[str, Any]:
    import numpy as np

    from packer.gpu import gds_status

    env: dict[str, Any] = {"python": sys.version.split()[0], "numpy": np.__version__, "cpus": os.cpu_count(),
                           "work": str(work), "filesystem": filesystem_of(work)}
    try:
        import torch
        env["torch"] = torch.__version__
        env["cuda_available"] = bool(torch.cuda.is_available())
        if env["cuda_available"]:
            env["gpu_name"] = torch.cuda.get_device_name(0)
            env["torch_cuda"] = torch.version.cuda
    except ImportError as exc:
        env["torch"] = f"missing: {exc}"
    try:
        import torchvision
        env["torchvision"] = torchvision.__version__
    except ImportError as exc:
        env["torchvision"] = f"missing: {exc}"
    for name in ("simplejpeg", "kvikio", "cupy", "nvidia.dali"):
        try:
            module = __import__(name, fromlist=["__version__"])
            env[name] = getattr(module, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 - kvikio raises RuntimeError when a .so is missing
            env[name] = f"missing: {type(exc).__name__}: {str(exc)[:200]}"
    env["gds_status"] = gds_status()
    for key, value in env.items():
        log(f"{key}: {value}")
    if gpu and not env.get("cuda_available"):
        raise RuntimeError("torch sees no CUDA GPU; rerun with --dry-run for the host-side checks")
    return env


def run_pytest(timeout: float) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider",
               str(REPO / "tests")]
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode("utf-8", "replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return {"rc": "timeout", "seconds": round(time.perf_counter() - start, 1), "tail": out[-3000:]}
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    print("\n".join(lines[-40:]), flush=True)
    summary = next((line for line in reversed(lines) if " passed" in line or " failed" in line
                    or " skipped" in line or "error" in line or "deselected" in line), "")
    return {"rc": proc.returncode, "seconds": round(time.perf_counter() - start, 1), "summary": summary,
            "tail": "\n".join(lines[-60:])}


def build_datasets(work: Path, raw_gb: float, jpegs: int, size: int) -> dict[str, Any]:
    import make_sample

    from packer.build import build
    from packer.dataset import open_dataset
    from packer.build.plan import BuildOptions

    work.mkdir(parents=True, exist_ok=True)
    workers = os.cpu_count() or 4
    info: dict[str, Any] = {}
    sample_bytes = size * size * 3
    raw_count = max(64, int(raw_gb * 1e9 // (sample_bytes + 4096)))
    for name, count, options in (
            ("raw", raw_count, BuildOptions(shard_size=256 * MiB, codec=f"raw:size={size}x{size}")),
            ("jpeg", jpegs, BuildOptions(shard_size=256 * MiB))):
        out = work / f"{name}-ds"
        start = time.perf_counter()
        if not (out / "manifest.json").exists():
            src = work / f"{name}-src"
            if not src.exists():
                # ~110 KB JPEGs (4 distinct images, unique bytes): the raw codec decodes and resizes them.
                make_sample.make_big_folder(src, count, size_kb=110 if name == "jpeg" else 40, seed=1)
            build(src, out, options, workers=workers, overwrite=True, progress=False)
        with open_dataset(out) as ds:
            total = sum(s.size for s in ds.manifest.shards)
            info[name] = {"path": str(out), "samples": len(ds), "shards": len(ds.manifest.shards),
                          "bytes": total, "seconds": round(time.perf_counter() - start, 1)}
        log(f"{name} dataset: {info[name]}")
    return info


def block_reads(raw_path: str, gpu: bool, seconds_each: float, max_bytes: int) -> list[dict[str, Any]]:
    """kvikio into device memory vs pread into pinned memory + cudaMemcpy, cold cache, 64 MiB in flight."""
    import numpy as np

    from packer.dataset import open_dataset

    rows = []
    sizes = [64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
    ds = open_dataset(raw_path, backend="pread")
    paths = [str(Path(raw_path) / s.path) for s in ds.manifest.shards]
    in_flight = 64 * MiB
    threads = min(16, os.cpu_count() or 4)
    torch = None
    kv = None
    if gpu:
        import torch

        from packer.gpu import set_kvikio_threads
        try:
            set_kvikio_threads(threads)
            kv = open_dataset(raw_path, backend="kvikio")
            kv.shard(0)
        except Exception as exc:  # noqa: BLE001 - report the host path alone
            log(f"kvikio unavailable: {type(exc).__name__}: {exc}")
            kv = None
    pool = ThreadPoolExecutor(threads)
    rng = np.random.default_rng(0)
    for block in sizes:
        blocks = [(n, offset) for n, entry in enumerate(ds.manifest.shards)
                  for offset in range(0, entry.size - block + 1, block)]
        order = rng.permutation(len(blocks))
        depth = max(1, in_flight // block)
        row: dict[str, Any] = {"block": block}

        def host_run() -> tuple[int, float]:
            pinned = [torch.empty(depth * block, dtype=torch.uint8, pin_memory=True) if gpu
                      else np.empty(depth * block, dtype=np.uint8) for _ in range(2)]
            arrays = [p.numpy() if gpu else p for p in pinned]
            device = torch.empty(depth * block, dtype=torch.uint8, device="cuda") if gpu else None
            events = [None, None]
            done, start, slot = 0, time.perf_counter(), 0
            for first in range(0, len(order), depth):
                group = order[first:first + depth]
                if events[slot] is not None:
                    events[slot].synchronize()  # the copy out of this pinned buffer has finished
                futures = [pool.submit(ds.shard(blocks[b][0]).read_into, blocks[b][1],
                                       arrays[slot][j * block:(j + 1) * block]) for j, b in enumerate(group)]
                for future in futures:
                    future.result()
                if gpu:
                    device[:len(group) * block].copy_(pinned[slot][:len(group) * block], non_blocking=True)
                    events[slot] = torch.cuda.Event()
                    events[slot].record()
                done += len(group) * block
                slot ^= 1
                if done >= max_bytes or time.perf_counter() - start > seconds_each:
                    break
            if gpu:
                torch.cuda.synchronize()
            return done, time.perf_counter() - start

        def kvikio_run() -> tuple[int, float]:
            device = torch.empty(depth * block + 4096, dtype=torch.uint8, device="cuda")
            pad = (-device.data_ptr()) % 4096
            device = device[pad:pad + depth * block]
            done, start = 0, time.perf_counter()
            for first in range(0, len(order), depth):
                group = order[first:first + depth]
                waits = [kv.shard(blocks[b][0]).start_read(blocks[b][1], device[j * block:(j + 1) * block])
                         for j, b in enumerate(group)]
                for wait in waits:
                    wait()
                done += len(group) * block
                if done >= max_bytes or time.perf_counter() - start > seconds_each:
                    break
            torch.cuda.synchronize()
            return done, time.perf_counter() - start

        runs = [("pread+memcpy" if gpu else "pread", host_run)]
        if kv is not None:
            runs.insert(0, ("kvikio", kvikio_run))
        for name, fn in runs:
            row["cold"] = evict(paths)
            nbytes, seconds = fn()
            row[name] = gbps(nbytes, seconds)
        if "kvikio" in row and row.get("pread+memcpy"):
            row["ratio"] = round(row["kvikio"] / row["pread+memcpy"], 2)
        log(f"block {block // KiB:>6} KiB: {row}")
        rows.append(row)
    pool.shutdown()
    ds.close()
    if kv is not None:
        kv.close()
    return rows


def _time_loader(loader: Any, seconds: float, bytes_per_image: int | None) -> dict[str, Any]:
    """Images/s over the loader's epoch (or ``seconds``), the first batch (warm-up) excluded."""
    import torch

    iterator = iter(loader)
    first = next(iterator)
    images, start = 0, time.perf_counter()
    batches = 0
    for batch, _labels in iterator:
        images += batch.shape[0] if hasattr(batch, "shape") else len(batch)
        batches += 1
        if time.perf_counter() - start > seconds:
            break
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    iterator.close()
    del first
    result = {"images_per_s": round(images / elapsed, 1) if elapsed > 0 else None, "batches": batches,
              "seconds": round(elapsed, 2)}
    if bytes_per_image:
        result["GB_per_s"] = gbps(images * bytes_per_image, elapsed)
    return result


def raw_batches(raw_path: str, gpu: bool, seconds_each: float, batch_size: int) -> list[dict[str, Any]]:
    from packer.dataset import open_dataset
    from packer.gpu import GpuRawBatches

    with open_dataset(raw_path) as ds:
        paths = [str(Path(raw_path) / s.path) for s in ds.manifest.shards]
        codec = ds.manifest.codec
        per_image = codec["height"] * codec["width"] * codec["channels"]
    variants = [("cpu (host pread -> CPU tensor)", {"device": "cpu"})]
    if gpu:
        variants = [("cuda io=kvikio", {"device": "cuda", "io": "kvikio"}),
                    ("cuda io=host (pinned + copy)", {"device": "cuda", "io": "host"})] + variants
    rows = []
    for name, kwargs in variants:
        row: dict[str, Any] = {"variant": name}
        try:
            with GpuRawBatches(raw_path, batch_size, order="block", seed=0, **kwargs) as loader:
                row["cold"] = evict(paths)
                row.update(_time_loader(loader, seconds_each, per_image))
        except Exception as exc:  # noqa: BLE001 - e.g. kvikio missing: report and go on
            row["error"] = f"{type(exc).__name__}: {exc}"
        log(f"raw batches {row}")
        rows.append(row)
    return rows


def jpeg_decode(jpeg_path: str, gpu: bool, seconds_each: float, batch_size: int) -> list[dict[str, Any]]:
    from packer.dataset import open_dataset
    from packer.decode import decode_image
    from packer.gpu import GpuJpegBatches

    rows = []
    variants = [("cpu simplejpeg, 1 thread (GpuJpegBatches device=cpu)", {"device": "cpu"})]
    if gpu:
        variants.insert(0, ("cuda nvJPEG (torchvision, batched)", {"device": "cuda"}))
    for name, kwargs in variants:
        row: dict[str, Any] = {"variant": name}
        try:
            with GpuJpegBatches(jpeg_path, batch_size, seed=0, **kwargs) as loader:
                row.update(_time_loader(loader, seconds_each, None))
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"
        log(f"jpeg {row}")
        rows.append(row)
    # The CPU path with every core: simplejpeg releases the GIL while decoding.
    threads = os.cpu_count() or 4
    with open_dataset(jpeg_path) as ds:
        payloads = [ds.read(i) for i in range(min(len(ds), 2000))]
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(decode_image, payloads[:threads]))
        count, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds_each:
            list(pool.map(decode_image, payloads))
            count += len(payloads)
        elapsed = time.perf_counter() - start
    row = {"variant": f"cpu simplejpeg, {threads} threads", "images_per_s": round(count / elapsed, 1),
           "seconds": round(elapsed, 2)}
    log(f"jpeg {row}")
    rows.append(row)
    return rows


def tiled_nvjpeg(gpu: bool) -> dict[str, Any]:
    """nvJPEG on tiled JPEGs (formats/vectors/tiled): a tiled JPEG must decode exactly like its
    source, and a cut window like the same region of the full decode (restart markers are
    standard JPEG; this checks that nvJPEG agrees). Uses the pure-Python window cutter, so it
    needs no compiled extension."""
    import numpy as np

    from packer.codecs.tiles import read_layout, window_jpeg

    folder = REPO / "formats" / "vectors" / "tiled"
    if not gpu:
        return {"skipped": "no GPU"}
    import torch
    from torchvision.io import decode_jpeg

    def nv(data: bytes) -> np.ndarray:
        tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        return decode_jpeg(tensor, device="cuda").permute(1, 2, 0).cpu().numpy()

    out: dict[str, Any] = {}
    for source_path in sorted(folder.glob("*.source.jpg")):
        name = source_path.name.removesuffix(".source.jpg")
        source = source_path.read_bytes()
        tiled = (folder / f"{name}.tiled.jpg").read_bytes()
        full, whole = nv(source), nv(tiled)
        layout = read_layout(tiled)
        data, x, y = window_jpeg(tiled, layout, 0, max(1, layout.columns - 1), 0, layout.rows)
        part = nv(bytes(data))
        region = full[y:y + part.shape[0], x:x + part.shape[1]].astype(int)
        inner = np.abs(part.astype(int) - region)[:, :-2]  # away from the cut edge
        out[name] = {"tiled_equals_source": bool(np.array_equal(full, whole)),
                     "window_max_diff_inside": int(inner.max()) if inner.size else None}
    log(f"tiled nvJPEG {out}")
    return out


def table() -> str:
    sections = RESULTS["sections"]
    lines = ["", "=" * 78, "packer GPU check" + ("  (DRY RUN: host paths only)" if RESULTS.get("dry_run") else "")]
    env = sections.get("environment") or {}
    status = env.get("gds_status") or {}
    lines.append(f"GPU: {env.get('gpu_name', '-')}   torch {env.get('torch', '-')}   torchvision "
                 f"{env.get('torchvision', '-')}   kvikio {status.get('kvikio_version') or env.get('kvikio', '-')}")
    lines.append(f"GDS active: {status.get('gds_active')}   compat_mode: {status.get('compat_mode')} "
                 f"(preferred: {status.get('compat_mode_preferred')})   gds_available: "
                 f"{status.get('gds_available')}   fs: {env.get('filesystem', '-')}")
    tests = sections.get("pytest -m gpu") or {}
    lines.append(f"pytest -m gpu: rc={tests.get('rc')}  {tests.get('summary', tests.get('skipped', ''))}")
    reads = sections.get("block reads") or []
    if isinstance(reads, list) and reads:
        lines.append("")
        lines.append(f"{'block reads (cold)':<22}{'kvikio GB/s':>14}{'pread+memcpy GB/s':>20}{'ratio':>8}")
        for row in reads:
            host = row.get("pread+memcpy", row.get("pread"))
            lines.append(f"{str(row['block'] // KiB) + ' KiB':<22}{str(row.get('kvikio', '-')):>14}"
                         f"{str(host):>20}{str(row.get('ratio', '-')):>8}")
    for title, key in (("raw batches -> device", "raw batches"), ("JPEG decode", "jpeg decode")):
        rows = sections.get(key) or []
        if isinstance(rows, list) and rows:
            lines.append("")
            lines.append(f"{title:<48}{'images/s':>12}{'GB/s':>8}")
            base = next((r.get("images_per_s") for r in rows if str(r.get("variant", "")).startswith("cpu")
                         and r.get("images_per_s")), None)
            for row in rows:
                rate = row.get("images_per_s")
                ratio = f"  x{rate / base:.1f} vs cpu" if rate and base else ""
                lines.append(f"{row['variant'][:48]:<48}{str(rate if rate else row.get('error', '-'))[:40]:>12}"
                             f"{str(row.get('GB_per_s', '')):>8}{ratio}")
    tiled = sections.get("tiled nvjpeg") or {}
    if tiled:
        lines.append("")
        lines.append(f"tiled JPEGs on nvJPEG: {tiled}")
    if RESULTS["errors"]:
        lines.append("")
        lines.extend(f"ERROR in {e['section']}: {e['error']}" for e in RESULTS["errors"])
    lines.append(f"total {time.perf_counter() - T0:.0f}s")
    lines.append("=" * 78)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="no GPU: host paths only, tiny sizes")
    parser.add_argument("--wheels", help="install the wheels in this folder first (offline, --no-deps)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default 450)")
    parser.add_argument("--raw-gb", type=float, default=None, help="size of the raw dataset (default 2)")
    parser.add_argument("--jpegs", type=int, default=None, help="JPEG dataset size (default 6000)")
    parser.add_argument("--work", type=Path, default=None, help="where datasets are built (local disk)")
    parser.add_argument("--json", type=Path, default=None, help="result file (default $OUT/gpu_check.json)")
    parser.add_argument("--no-pytest", action="store_true", help="skip pytest -m gpu")
    args = parser.parse_args(argv)
    dry = args.dry_run
    budget = args.budget or (120.0 if dry else 450.0)
    raw_gb = args.raw_gb if args.raw_gb is not None else (0.03 if dry else 2.0)
    jpegs = args.jpegs if args.jpegs is not None else (200 if dry else 6000)
    # /var/tmp: disk-backed on most systems (/tmp is often tmpfs, where neither GDS nor O_DIRECT applies).
    work = args.work or Path("/var/tmp/packer-gpu-check")
    seconds_each = 1.0 if dry else 4.0
    batch_size = 32 if dry else 256
    RESULTS["dry_run"] = dry
    RESULTS["args"] = {"budget": budget, "raw_gb": raw_gb, "jpegs": jpegs, "work": str(work)}
    if args.wheels:
        install_wheels(args.wheels)
    gpu = not dry

    section("environment", budget, 0)(lambda: environment(work, gpu))
    if not args.no_pytest:
        section("pytest -m gpu", budget, 60)(lambda: run_pytest(timeout=min(180.0, left(budget) - 30)))
    datasets = section("datasets", budget, 60 if not dry else 5)(lambda: build_datasets(work, raw_gb, jpegs, 224))
    if datasets:
        raw, jpeg = datasets["raw"]["path"], datasets["jpeg"]["path"]
        section("block reads", budget, 30 if not dry else 2)(
            lambda: block_reads(raw, gpu, seconds_each=seconds_each / 2, max_bytes=(1 * GiB if gpu else 64 * MiB)))
        section("raw batches", budget, 20 if not dry else 2)(
            lambda: raw_batches(raw, gpu, seconds_each, batch_size))
        section("jpeg decode", budget, 20 if not dry else 2)(
            lambda: jpeg_decode(jpeg, gpu, seconds_each, batch_size))
    section("tiled nvjpeg", budget, 5)(lambda: tiled_nvjpeg(gpu))
    text = table()
    print(text, flush=True)
    RESULTS["table"] = text
    RESULTS["seconds"] = round(time.perf_counter() - T0, 1)
    target = args.json or (Path(os.environ["OUT"]) / "gpu_check.json" if os.environ.get("OUT") else None)
    if target is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(RESULTS, indent=2, sort_keys=True, default=str) + "\n")
        log(f"wrote {target}")
    return 1 if RESULTS["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
