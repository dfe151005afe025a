"""One-shot GPU check: build synthetic datasets, check and measure packer's GPU paths, fail loudly.

Run it on the GPU machine (the device tool's nvidia-h200: Python 3.12, torch 2.11.0+cu130,
torchvision 0.26, cupy-cuda13x 14.2, cuda-pathfinder, cuda-toolkit and nvidia-cufile already
installed; no kvikio, no simplejpeg, no DALI), from the repository root, in under 8 minutes::

    PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py --wheels .whl --budget 420

with ``timeout_s=480`` and ``carry=[".whl"]``. ``--wheels DIR`` installs every wheel in DIR
offline first (``pip install --no-index --no-deps --target``, then prepended to ``sys.path`` and
``PYTHONPATH`` for the pytest run). Prepare DIR here (``/.whl/`` is git-ignored; about 4.5 MiB,
far under the 64 MiB a run may carry) with exactly these wheels::

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \\
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \\
        -d .whl kvikio-cu13==26.10.0 libkvikio-cu13==26.10.0 rapids-logger==0.3.0 simplejpeg==1.9.0

    kvikio_cu13-26.10.0-cp311-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl      0.7 MB
    libkvikio_cu13-26.10.0-py3-none-manylinux_2_28_x86_64.whl                           3.2 MB
    rapids_logger-0.3.0-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl        0.3 MB
    simplejpeg-1.9.0-cp312-cp312-manylinux2014_x86_64...manylinux_2_28_x86_64.whl       0.4 MB

Why these (from their METADATA, ``Requires-Dist`` without extras): kvikio-cu13 26.10 needs
``libkvikio-cu13==26.10.*``, ``cupy-cuda13x[ctk]>=14.0.1,!=14.1.0``, ``numpy>=2,<3`` and
``packaging`` (all there); libkvikio-cu13 needs ``rapids-logger==0.3.*`` (carried),
``cuda-pathfinder`` (there; it finds libcufile) and ``cuda-toolkit[cufile]==13.*``, i.e.
``nvidia-cufile`` (there). Do not carry cuda-pathfinder or nvidia-cufile: libkvikio's loader
imports ``cuda.pathfinder`` (without it librapids_logger is never loaded and ``import kvikio``
fails), and pathfinder looks for ``libcufile.so.0`` in the interpreter's site-packages
(``nvidia/cu13/lib``), not in a ``--target`` folder. Checked here on 2026-12-03: these three
kvikio wheels plus cuda-pathfinder 1.9.1 import (kvikio 26.10.00, ``gds_status()`` as
documented) once libcufile is found. simplejpeg is packer's own dependency (CPU JPEG decode). If the
machine's torch were a CUDA 12 build, take the ``-cu12`` kvikio pair and ``nvidia-cufile-cu12``
instead. DALI's wheel is far too large to carry: its section says "not run: DALI missing".

What runs, each measurement against its baseline in the same run; every section ends as
``ok``, ``FAIL`` or ``not run: <why>`` in the table, and the exit status is 1 when any section
failed or ran out of time (never a silent pass):

1. environment: GPUs, versions, ``gds_status()`` (what is *known*: requested mode and machine-wide
   GDS availability), the work folder's file system. FAIL on a GPU machine when kvikio does not
   import (the wheels above are missing or broken);
2. ``pytest -m gpu`` over ``tests/``: FAIL when a test fails or is *skipped* on a GPU machine;
3. builds a ``raw:size=224x224`` dataset (~``--raw-gb`` GB) and a passthrough JPEG dataset;
4. block reads into device memory, page cache dropped before each (``POSIX_FADV_DONTNEED``):
   kvikio vs ``pread`` into pinned memory + ``cudaMemcpy``, 64 KiB to 64 MiB, 64 MiB in flight.
   This is the *measured* side of GDS: the table says whether kvikio beat pread + copy;
5. raw-shard batches to the GPU (``GpuRawBatches``): io=kvikio vs io=host vs the CPU path; and
   fixed-width declared fields riding along (``fields=``, a small raw dataset with a float32 and
   a float64[2] field): FAIL when a batch's field tensors differ from the index's values;
   then ``GpuRawBatches(decode=RandomResizedCrop(size, seed=0))``, each batch cropped on the GPU
   (torch's kernel) vs the same loader on the host: FAIL when a batch's GPU crops differ from the
   CPU readers' (``PackedDataset.load_batch``) by more than 1 grey level;
6. JPEG batches (``GpuJpegBatches``) through every GPU decoder present (TorchCodec, nvImageCodec,
   torchvision's nvJPEG: ``packer.gpu.GPU_JPEG_DECODERS``) vs the CPU path: FAIL when one of them
   did not decode every JPEG (``decode_counts``: e.g. a torchvision without nvJPEG falls back to
   the CPU), or when none imports;
7. multi-GPU: one loader per visible GPU, as DDP ranks after ``torch.cuda.set_device(rank)``:
   FAIL when a rank's batches, decodes or allocations land on another GPU ("not run" on one GPU);
8. failure injection: a kvikio read that fails while others are in flight; every started read
   must have been waited for before the error reaches the caller, and a new loader reads right;
9. DALI ``fn.decoders.image(device="mixed")`` with ``iterator_options()`` and ``DROP``: runs only
   where DALI imports, else "not run: DALI missing";
10. nvJPEG on the tiled-JPEG vectors: whether a tiled JPEG decodes exactly like its source (reported);
11. the batched raw crop-resize (``packer.rawcrop.crop_resize_batch``, RandomResizedCrop boxes)
    on CUDA tensors (torch ops) vs the CPU (compiled kernel): images/s at 32 and 224 px; FAIL when
    the two differ by more than 1 grey level anywhere.

``--dry-run`` runs every section host-side (``device="cpu"``, a fake kvikio writing into CPU
tensors, CPU stand-ins for nvJPEG and several GPUs, DALI on the CPU where it is installed) on tiny
datasets; ``tests/gpu/test_gpu_check.py`` runs it in CI. Partial results are printed as they come;
the table is printed last and everything is written to ``$OUT/gpu_check.json`` when ``$OUT`` is
set (or ``--json PATH``). Each section runs only while the time budget (default 420 s) allows.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import time
import traceback
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
sys.path.insert(0, str(REPO / "benchmarks"))
from harness import evict  # noqa: E402  (the benchmarks' page-cache control)

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
RESULTS: dict[str, Any] = {"sections": {}, "errors": [], "not_run": {}}
T0 = time.perf_counter()


class CheckFailed(Exception):
    """A section ran and found packer's GPU path wrong (or not running)."""


class NotRun(Exception):
    """A section cannot run here, for a stated reason that is not a failure (no second GPU, no DALI)."""


def log(message: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {message}", flush=True)


def left(budget: float) -> float:
    return budget - (time.perf_counter() - T0)


def section(name: str, budget: float, needs: float) -> Callable[[Callable[[], Any]], Any]:
    """Run a section if ``needs`` seconds remain; record its result, its failure or why it did not run."""
    def run(fn: Callable[[], Any]) -> Any:
        if left(budget) < needs:
            why = f"time budget ({left(budget):.0f}s left, needs ~{needs:.0f}s)"
            log(f"FAIL {name}: not run: {why}")
            RESULTS["errors"].append({"section": name, "error": f"not run: {why}"})
            RESULTS["sections"][name] = {"status": "fail", "error": f"not run: {why}"}
            return None
        log(f"--- {name}")
        try:
            value = fn()
        except NotRun as exc:
            log(f"NOT RUN {name}: {exc}")
            RESULTS["not_run"][name] = str(exc)
            RESULTS["sections"][name] = {"status": "not run", "why": str(exc)}
            return None
        except Exception as exc:  # noqa: BLE001 - report and go on with the next section
            log(f"FAIL {name}: {type(exc).__name__}: {exc}")
            RESULTS["errors"].append({"section": name, "error": f"{type(exc).__name__}: {exc}",
                                      "traceback": traceback.format_exc()[-4000:]})
            RESULTS["sections"][name] = {"status": "fail", "error": f"{type(exc).__name__}: {exc}"}
            return None
        RESULTS["sections"][name] = {"status": "ok", "result": value}
        return value
    return run


def result_of(name: str) -> Any:
    return (RESULTS["sections"].get(name) or {}).get("result")


def install_wheels(folder: str) -> None:
    """Install the wheels in ``folder`` offline into a private target put first on the path."""
    wheels = sorted(glob.glob(os.path.join(folder, "*.whl")))
    if not wheels:
        log(f"no wheels in {folder}")
        return
    target = "/tmp/packer-gpu-site"
    log(f"installing {len(wheels)} wheels offline into {target}: {', '.join(os.path.basename(w) for w in wheels)}")
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile",
                           "--no-cache-dir", "--upgrade", "--quiet", "--target", target, *wheels],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        log(f"pip install failed ({proc.returncode}): {proc.stderr[-2000:]}")
        return
    sys.path.insert(0, target)
    os.environ["PYTHONPATH"] = os.pathsep.join([target, os.environ.get("PYTHONPATH", "")])


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


def device_name(gpu: bool) -> str:
    return "cuda" if gpu else "cpu"


# --- dry-run stand-ins -------------------------------------------------------------------------

def install_fake_kvikio() -> None:
    """Dry run: a kvikio whose CuFile reads with pread into CPU torch tensors standing in for device memory."""
    import numpy as np
    import torch

    from packer.backends import kvikio as backend

    class Future:
        def __init__(self, nbytes: int) -> None:
            self.nbytes = nbytes

        def get(self) -> int:
            return self.nbytes

        def done(self) -> bool:
            return True

    class CuFile:
        def __init__(self, path: str, flags: str = "r") -> None:
            self.fd = os.open(path, os.O_RDONLY)

        def fileno(self) -> int:
            return self.fd

        def pread(self, buf: Any, size: int, file_offset: int, task_size: int | None = None) -> Future:
            data = os.pread(self.fd, size, file_offset)
            buf.numpy()[:len(data)] = np.frombuffer(data, np.uint8)
            return Future(len(data))

        def close(self) -> None:
            os.close(self.fd)

    settings = {"compat_mode": "ON", "num_threads": 1, "task_size": 4 << 20}
    defaults = types.SimpleNamespace(get=settings.get, set=settings.__setitem__,
                                     is_compat_mode_preferred=lambda: True)
    fake = types.SimpleNamespace(__version__="fake (dry run)", CuFile=CuFile, defaults=defaults)
    backend.import_kvikio = lambda: fake
    backend.cuda_driver_status = lambda: (True, "dry run: no GPU, a fake kvikio")
    backend.is_cuda_buffer = lambda out: isinstance(out, torch.Tensor)
    backend.cuda_nbytes = lambda out: out.numel() * out.element_size()


class CpuJpegDecoder:
    """Dry run: stands in for nvJPEG (a ``GpuJpegDecoder`` decoding with packer.decode on the CPU)."""

    name = "packer.decode (dry-run stand-in for nvJPEG)"

    def __call__(self, inputs: Any, device: Any) -> list[Any]:
        import torch

        from packer.decode import decode_image

        return [torch.from_numpy(decode_image(bytes(t.numpy()))).permute(2, 0, 1).contiguous().to(device)
                for t in inputs]


# --- verdicts (pure functions: tests/gpu/test_gpu_check.py checks them) -------------------------------

def pytest_verdict(summary: str, rc: Any, gpu: bool) -> str:
    """``"ok"``, or why the ``pytest -m gpu`` run fails the check (a skip counts on a GPU machine)."""
    if rc == "timeout":
        return "pytest -m gpu timed out"
    skipped = re.search(r"(\d+) skipped", summary)
    if gpu and skipped and int(skipped.group(1)) > 0:
        return f"{skipped.group(1)} gpu test(s) skipped on a GPU machine (see the -rs lines above): {summary}"
    if rc not in (0, "0"):
        return f"pytest exited {rc}: {summary}"
    if gpu and not re.search(r"(\d+) passed", summary):
        return f"no gpu test passed: {summary}"
    return "ok"


def nvjpeg_verdict(counts: dict[str, int]) -> str:
    """``"ok"`` when the GPU decoder decoded every JPEG, else why not."""
    if counts.get("gpu", 0) == 0:
        return f"nvJPEG decoded nothing (decode_counts={counts})"
    if counts.get("cpu_fallback", 0):
        return f"nvJPEG refused {counts['cpu_fallback']} JPEG(s), decoded on the CPU instead (decode_counts={counts})"
    return "ok"


def gds_verdict(status: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """What the block reads say about GDS: measured kvikio vs pread + copy at 4 MiB blocks and up."""
    big = [row for row in rows if row.get("block", 0) >= 4 * MiB and row.get("ratio")]
    if not big:
        return "not measured (no kvikio block reads)"
    ratio = min(row["ratio"] for row in big)
    known = ("GDS possible here" if status.get("gds_possible")
             else f"GDS not possible here (requested {status.get('requested_mode')}, "
                  f"gds_available={status.get('gds_available')})")
    if ratio >= 1.15:
        return f"{known}; kvikio {ratio:.2f}x pread+copy at >=4 MiB: consistent with GDS"
    return f"{known}; kvikio {ratio:.2f}x pread+copy at >=4 MiB: no GDS advantage measured (compat mode, or storage-bound)"


# --- sections ----------------------------------------------------------------------------------

def environment(work: Path, gpu: bool) -> dict[str, Any]:
    import numpy as np

    from packer.backends.kvikio import import_kvikio
    from packer.errors import MissingDependencyError
    from packer.gpu import gds_status

    env: dict[str, Any] = {"python": sys.version.split()[0], "numpy": np.__version__, "cpus": os.cpu_count(),
                           "work": str(work), "filesystem": filesystem_of(work)}
    try:
        import torch
        env["torch"] = torch.__version__
        env["cuda_available"] = bool(torch.cuda.is_available())
        if env["cuda_available"]:
            env["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
            env["torch_cuda"] = torch.version.cuda
    except ImportError as exc:
        env["torch"] = f"missing: {exc}"
    for name in ("torchvision", "simplejpeg", "cupy", "nvidia.dali"):
        try:
            module = __import__(name, fromlist=["__version__"])
            env[name] = getattr(module, "__version__", "?")
        except Exception as exc:  # noqa: BLE001 - a .so missing raises OSError/RuntimeError
            env[name] = f"missing: {type(exc).__name__}: {str(exc)[:200]}"
    try:
        env["kvikio"] = getattr(import_kvikio(), "__version__", "?")
    except MissingDependencyError as exc:
        env["kvikio"] = f"missing: {exc.message[:300]}"
    env["gds_status"] = gds_status()
    for key, value in env.items():
        log(f"{key}: {value}")
    if gpu and not env.get("cuda_available"):
        raise CheckFailed("torch sees no CUDA GPU; rerun with --dry-run for the host-side checks")
    if str(env["kvikio"]).startswith("missing"):
        raise CheckFailed(f"kvikio does not import, so the kvikio paths cannot be checked: {env['kvikio']} "
                          f"(carry the wheels listed in this script's docstring and pass --wheels)")
    return env


def run_pytest(timeout: float, gpu: bool) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    # A dry run checks the mechanism on the GPU tests' own module; a GPU run takes every gpu test.
    where = str(REPO / "tests") if gpu else str(REPO / "tests" / "gpu" / "test_gpu.py")
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-rs", "-p", "no:cacheprovider", where]
    start = time.perf_counter()
    try:
        proc = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        rc: Any = proc.returncode
        lines = (proc.stdout + proc.stderr).strip().splitlines()
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode("utf-8", "replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        rc, lines = "timeout", out.strip().splitlines()
    print("\n".join(lines[-40:]), flush=True)
    summary = next((line for line in reversed(lines) if re.search(r"\d+ (passed|failed|skipped|error)", line)), "")
    result = {"rc": rc, "seconds": round(time.perf_counter() - start, 1), "summary": summary.strip("= "),
              "skips": [line for line in lines if line.startswith("SKIPPED")][:20]}
    verdict = pytest_verdict(summary, rc, gpu)
    if verdict != "ok":
        raise CheckFailed(verdict)
    return result


def build_datasets(work: Path, raw_gb: float, jpegs: int, size: int) -> dict[str, Any]:
    import make_sample

    from packer.writer import build
    from packer.writer.plan import BuildOptions
    from packer.dataset import open_dataset

    work.mkdir(parents=True, exist_ok=True)
    workers = os.cpu_count() or 4
    info: dict[str, Any] = {}
    sample_bytes = size * size * 3
    raw_count = max(64, int(raw_gb * 1e9 // (sample_bytes + 4096)))
    for name, count, options in (
            ("raw", raw_count, BuildOptions(shard_size=256 * MiB, codec=f"raw:size={size}x{size}")),
            ("jpeg", jpegs, BuildOptions(shard_size=256 * MiB))):
        out = work / f"{name}-{size}-ds"
        start = time.perf_counter()
        if not (out / "manifest.json").exists():
            src = work / f"{name}-src-{count}"
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


def block_reads(raw_path: str, gpu: bool, seconds_each: float, max_bytes: int) -> dict[str, Any]:
    """kvikio into device memory vs pread into pinned memory + cudaMemcpy, cold cache, 64 MiB in flight."""
    import numpy as np
    import torch

    from packer.dataset import open_dataset
    from packer.gpu import gds_status, set_kvikio_threads

    rows = []
    sizes = [64 * KiB, 256 * KiB, 1 * MiB, 4 * MiB, 16 * MiB, 64 * MiB]
    ds = open_dataset(raw_path, backend="pread")
    paths = [str(Path(raw_path) / s.path) for s in ds.manifest.shards]
    in_flight = 64 * MiB if gpu else 4 * MiB
    threads = min(16, os.cpu_count() or 4)
    device = device_name(gpu)
    set_kvikio_threads(threads)
    kv = open_dataset(raw_path, backend="kvikio")
    kv.shard(0)
    pool = ThreadPoolExecutor(threads)
    rng = np.random.default_rng(0)
    for block in sizes:
        blocks = [(n, offset) for n, entry in enumerate(ds.manifest.shards)
                  for offset in range(0, entry.size - block + 1, block)]
        if not blocks:
            continue
        order = rng.permutation(len(blocks))
        depth = max(1, in_flight // block)
        row: dict[str, Any] = {"block": block}

        def host_run() -> tuple[int, float]:
            pinned = [torch.empty(depth * block, dtype=torch.uint8, pin_memory=gpu) for _ in range(2)]
            arrays = [p.numpy() for p in pinned]
            target = torch.empty(depth * block, dtype=torch.uint8, device=device)
            events: list[Any] = [None, None]
            done, start, slot = 0, time.perf_counter(), 0
            for first in range(0, len(order), depth):
                group = order[first:first + depth]
                if events[slot] is not None:
                    events[slot].synchronize()  # the copy out of this pinned buffer has finished
                futures = [pool.submit(ds.shard(blocks[b][0]).read_into, blocks[b][1],
                                       arrays[slot][j * block:(j + 1) * block]) for j, b in enumerate(group)]
                for future in futures:
                    future.result()
                target[:len(group) * block].copy_(pinned[slot][:len(group) * block], non_blocking=gpu)
                if gpu:
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
            target = torch.empty(depth * block + 4096, dtype=torch.uint8, device=device)
            pad = (-target.data_ptr()) % 4096
            target = target[pad:pad + depth * block]
            done, start = 0, time.perf_counter()
            for first in range(0, len(order), depth):
                group = order[first:first + depth]
                waits = [kv.shard(blocks[b][0]).start_read(blocks[b][1], target[j * block:(j + 1) * block])
                         for j, b in enumerate(group)]
                for wait in waits:
                    wait()
                done += len(group) * block
                if done >= max_bytes or time.perf_counter() - start > seconds_each:
                    break
            if gpu:
                torch.cuda.synchronize()
            return done, time.perf_counter() - start

        for name, fn in (("kvikio", kvikio_run), ("pread+memcpy", host_run)):
            row["cold"] = evict(paths)
            nbytes, seconds = fn()
            row[name] = gbps(nbytes, seconds)
        if row.get("kvikio") and row.get("pread+memcpy"):
            row["ratio"] = round(row["kvikio"] / row["pread+memcpy"], 2)
        log(f"block {block // KiB:>6} KiB: {row}")
        rows.append(row)
    pool.shutdown()
    ds.close()
    kv.close()
    status = gds_status()
    return {"rows": rows, "gds_status": status, "verdict": gds_verdict(status, rows)}


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
    result = {"images_per_s": round(images / elapsed, 1) if elapsed > 0 and images else None, "batches": batches,
              "seconds": round(elapsed, 2)}
    if bytes_per_image:
        result["GB_per_s"] = gbps(images * bytes_per_image, elapsed)
    return result


def raw_batches(raw_path: str, gpu: bool, seconds_each: float, batch_size: int) -> list[dict[str, Any]]:
    from packer.dataset import open_dataset
    from packer import ReadOrder
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
        with GpuRawBatches(raw_path, batch_size, order=ReadOrder("block", seed=0), **kwargs) as loader:
            row["cold"] = evict(paths)
            row.update(_time_loader(loader, seconds_each, per_image))
        log(f"raw batches {row}")
        rows.append(row)
    rows.append(raw_fields_check(Path(raw_path).parent / "raw-fields-ds", gpu, batch_size))
    return rows


def raw_fields_check(out: Path, gpu: bool, batch_size: int) -> dict[str, Any]:
    """``GpuRawBatches(fields=...)``: fixed-width fields gathered from the index land on the device
    with their batch; every value is compared with the index."""
    import numpy as np
    from PIL import Image

    from packer.writer import build
    from packer.writer.plan import BuildOptions
    from packer.dataset import open_dataset
    from packer import ReadOrder
    from packer.gpu import GpuRawBatches

    count = 64
    if not (out / "manifest.json").exists():
        src = out.parent / "raw-fields-src"
        src.mkdir(parents=True, exist_ok=True)
        rows = []
        for i in range(count):
            Image.fromarray(np.full((32, 32, 3), i * 3, np.uint8)).save(src / f"{i}.png")
            rows.append({"path": f"{i}.png", "score": i / 4, "xy": [i, -i]})
        (src / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), "utf-8")
        build(src / "rows.jsonl", out, BuildOptions(fields=("score=float32", "xy=float64[2]"),
                                                    codec="raw:size=32x32", shard_size=64 << 10),
              workers=1, overwrite=True, progress=False)
    names = ("image", "index", "score", "xy")
    checked = 0
    with open_dataset(out) as ds, GpuRawBatches(out, min(batch_size, 16), fields=names, device=device_name(gpu),
                                                order=ReadOrder("block", seed=1)) as loader:
        score, xy = ds.field_array("score"), ds.field_array("xy")
        for batch in loader:
            if gpu and batch["score"].device.type != "cuda":
                raise CheckFailed(f"fields= tensors are on {batch['score'].device}, not the GPU")
            index = batch["index"].cpu().numpy()
            if not (np.array_equal(batch["score"].cpu().numpy(), score[index])
                    and np.array_equal(batch["xy"].cpu().numpy(), xy[index])):
                raise CheckFailed("GpuRawBatches(fields=...) tensors differ from the index's values")
            checked += len(index)
    if checked != count:
        raise CheckFailed(f"GpuRawBatches(fields=...) gave {checked} samples, expected {count}")
    log(f"raw batches: fields=(score, xy) on the device match the index for {checked} samples")
    return {"variant": f"fields= check: {checked} samples match", "images_per_s": None}


def raw_batch_crops(raw_path: str, gpu: bool, seconds_each: float, batch_size: int) -> dict[str, Any]:
    """``GpuRawBatches(decode=RandomResizedCrop)``: each batch cropped on the device (torch's kernel),
    timed against the same loader on the host; FAIL when the device's crops of a batch differ from
    the CPU readers' (``PackedDataset.load_batch``, the compiled kernel) by more than 1 level."""
    from packer.dataset import open_dataset
    from packer import ReadOrder
    from packer.gpu import GpuRawBatches
    from packer.torch import PackedDataset
    from packer.transforms import RandomResizedCrop

    with open_dataset(raw_path) as ds:
        side = int(ds.manifest.codec["height"])

    def crop() -> Any:
        return RandomResizedCrop(side, seed=0)

    variants = [("cpu (host, torch kernel)", {"device": "cpu"})]
    if gpu:
        variants.insert(0, ("cuda io=host, crop on the GPU", {"device": "cuda", "io": "host"}))
    rows = []
    for name, kwargs in variants:
        with GpuRawBatches(raw_path, batch_size, order=ReadOrder("random", seed=0), decode=crop(), **kwargs) as loader:
            row = {"variant": name, **_time_loader(loader, seconds_each, None)}
        log(f"raw batch crops {row}")
        rows.append(row)
    with GpuRawBatches(raw_path, batch_size, order=ReadOrder("random", seed=0), decode=crop(),
                       device=device_name(gpu), double_buffer=False) as loader:
        plan = loader.plan()
        iterator = iter(loader)
        images, _ = next(iterator)
        iterator.close()
        indices = loader.batch_indices(plan, 0, loader.epoch)
    dataset = PackedDataset(raw_path, decode=crop(), layout="HWC")
    reference, _ = dataset.load_batch(indices)
    dataset.close()
    if str(images.device).split(":")[0] != ("cuda" if gpu else "cpu") or tuple(images.shape[1:]) != (side, side, 3):
        raise CheckFailed(f"raw batch crops: got {tuple(images.shape)} on {images.device}")
    diff = int((images.cpu().int() - reference.int()).abs().max())
    if diff > 1:
        raise CheckFailed(f"raw batch crops: the device's crops differ from the CPU readers' by {diff} levels "
                          f"(expected <= 1)")
    return {"rows": rows, "max_diff_vs_cpu_readers": diff, "size": side}


def jpeg_decode(jpeg_path: str, gpu: bool, seconds_each: float, batch_size: int) -> dict[str, Any]:
    import warnings

    from packer.dataset import open_dataset
    from packer.decode import decode_image
    from packer.errors import MissingDependencyError
    from packer import ReadOrder
    from packer.gpu import GPU_JPEG_DECODERS, GpuJpegBatches, gpu_jpeg_decoder

    rows = []
    # Every GPU decoder present (TorchCodec, nvImageCodec, torchvision's nvJPEG), the "auto" choice
    # first; in a dry run a CPU stand-in with the same plumbing, and which decoders import here.
    present, missing = [], {}
    for decoder_name in GPU_JPEG_DECODERS:
        try:
            gpu_jpeg_decoder(decoder_name)
            present.append(decoder_name)
        except MissingDependencyError as exc:
            missing[decoder_name] = str(exc)
    log(f"jpeg decoders present: {present or 'none'}; missing: {sorted(missing)}")
    if gpu:
        variants = [(f"cuda nvJPEG via {decoder_name}", {"device": "cuda", "gpu_decoder": decoder_name})
                    for decoder_name in present]
        if not variants:
            raise CheckFailed(f"no GPU JPEG decoder imports: {missing}")
    else:
        variants = [("dry run: GPU decoder stand-in", {"device": "cpu", "gpu_decoder": CpuJpegDecoder()})]
    variants.append(("cpu simplejpeg, 1 thread (GpuJpegBatches device=cpu)", {"device": "cpu"}))
    counts: dict[str, int] = {}
    verdicts: dict[str, str] = {}
    for n, (name, kwargs) in enumerate(variants):
        row: dict[str, Any] = {"variant": name}
        with warnings.catch_warnings():
            warnings.simplefilter("default")  # a GpuFallbackWarning is printed (once), never hidden
            with GpuJpegBatches(jpeg_path, batch_size, order=ReadOrder("random", seed=0), **kwargs) as loader:
                row.update(_time_loader(loader, seconds_each, None))
                row["decode_counts"] = dict(loader.decode_counts)
        if n == 0:
            counts = row["decode_counts"]
        if n < len(variants) - 1:
            verdicts[name] = nvjpeg_verdict(row["decode_counts"])
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
    failed = {name: verdict for name, verdict in verdicts.items() if verdict != "ok"}
    if failed:
        raise CheckFailed("; ".join(f"{name}: {verdict}" for name, verdict in failed.items()))
    return {"rows": rows, "gpu_decode_counts": counts, "decoders_present": present, "decoders_missing": missing}


def multi_gpu(raw_path: str, jpeg_path: str, gpu: bool, batch_size: int) -> dict[str, Any]:
    """One loader per GPU as DDP ranks do it (``set_device(rank)`` first): everything stays on its GPU."""
    import torch

    from packer.dataset import open_dataset
    from packer import ReadOrder
    from packer.gpu import GpuJpegBatches, GpuRawBatches

    count = torch.cuda.device_count() if gpu else 2
    if gpu and count < 2:
        raise NotRun(f"{count} GPU visible (the 2-GPU check needs at least 2)")
    out: dict[str, Any] = {"devices": count, "ranks": []}
    seen: list[int] = []
    for rank in range(count):
        if gpu:
            torch.cuda.set_device(rank)
            before = [torch.cuda.memory_allocated(i) for i in range(count)]
        with GpuRawBatches(raw_path, batch_size, order=ReadOrder("block", rank=rank, world_size=count),
                           device=device_name(gpu)) as loader:
            want = torch.device("cuda", rank) if gpu else torch.device("cpu")
            if loader.device != want:
                raise CheckFailed(f"rank {rank}: loader.device is {loader.device}, expected {want}")
            for k, (images, labels) in enumerate(loader):
                if images.device != want or labels.device != want:
                    raise CheckFailed(f"rank {rank}: batch {k} on {images.device}/{labels.device}, expected {want}")
                if k == 2:
                    break
            seen += [int(i) for i in loader.plan().indices]
            if gpu:
                torch.cuda.synchronize(rank)
                after = [torch.cuda.memory_allocated(i) for i in range(count)]
                grew = [i for i in range(count) if i != rank and after[i] > before[i]]
                if grew:
                    raise CheckFailed(f"rank {rank}: memory was allocated on cuda:{grew} ({before} -> {after})")
        decoder = {} if gpu else {"gpu_decoder": CpuJpegDecoder()}
        with GpuJpegBatches(jpeg_path, max(2, batch_size // 4),
                            order=ReadOrder("random", rank=rank, world_size=count), device=device_name(gpu),
                            **decoder) as jpegs:
            images, _ = next(iter(jpegs))
            wrong = {str(image.device) for image in images if image.device != want}
            if wrong:
                raise CheckFailed(f"rank {rank}: decoded JPEGs on {sorted(wrong)}, expected {want}")
        out["ranks"].append({"rank": rank, "device": str(want)})
        log(f"multi-gpu rank {rank}: batches and decodes on {want}")
    with open_dataset(raw_path) as ds:
        if sorted(set(seen)) != list(range(len(ds))):
            raise CheckFailed("the ranks' shares do not cover the epoch")
    return out


def failure_injection(raw_path: str, gpu: bool, batch_size: int) -> dict[str, Any]:
    """A kvikio read fails while two are in flight: both are waited for before the error arrives."""
    import torch

    from packer.backends import kvikio as backend
    from packer.dataset import Dataset
    from packer.errors import GpuPathError
    from packer import ReadOrder
    from packer.gpu import GpuRawBatches

    original = backend.KvikioShard.start_read
    state = {"started": 0, "waited": 0}

    def start_read(self: Any, offset: int, out: Any) -> Callable[[], None]:
        state["started"] += 1
        if state["started"] == 3:
            raise GpuPathError("injected failure on the third read", path=self.path, offset=offset)
        wait = original(self, offset, out)

        def counted() -> None:
            state["waited"] += 1
            wait()
        return counted

    def kvikio_loader() -> Any:
        if gpu:
            return GpuRawBatches(raw_path, batch_size, order=ReadOrder("random", seed=5), device="cuda", io="kvikio")
        # Dry run: the io="kvikio" read path over the fake kvikio, CPU tensors standing in for device memory.
        loader = GpuRawBatches(raw_path, batch_size, order=ReadOrder("random", seed=5), device="cpu")
        loader._reader.close()
        loader._reader = Dataset(raw_path, backend="kvikio")
        loader.io = "kvikio"
        return loader

    backend.KvikioShard.start_read = start_read
    try:
        with kvikio_loader() as loader:
            try:
                next(iter(loader))
            except GpuPathError as exc:
                if "injected" not in str(exc):
                    raise
            else:
                raise CheckFailed("the injected read failure did not reach the caller")
            if state["waited"] != state["started"] - 1:
                raise CheckFailed(f"{state['started'] - 1} reads were in flight at the failure but only "
                                  f"{state['waited']} were waited for")
    finally:
        backend.KvikioShard.start_read = original
    # The staging buffer and files were released with no read in flight: a new loader reads right.
    with kvikio_loader() as loader, GpuRawBatches(raw_path, batch_size, order=ReadOrder("random", seed=5),
                                                  device="cpu") as host:
        (images, _), (expected, _) = next(iter(loader)), next(iter(host))
        if not torch.equal(images.cpu(), expected):
            raise CheckFailed("the batch read after the failure differs from the host path's")
    log(f"failure injection: {state}")
    return state


def dali_mixed(jpeg_path: str, gpu: bool, batch_size: int) -> dict[str, Any]:
    """DALI decoding packer's bytes (device="mixed" on a GPU), the iterator honouring DROP."""
    try:
        from nvidia.dali import fn, pipeline_def, types as dali_types
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
    except Exception as exc:  # noqa: BLE001 - not installed, or its .so cannot load
        raise NotRun(f"DALI missing ({type(exc).__name__}: {str(exc)[:120]})") from None
    import warnings

    from packer import ReadOrder
    from packer.dali import PackedSampleSource

    source = PackedSampleSource(jpeg_path, batch_size, order=ReadOrder("random", seed=0, drop_last=True),
                                return_index=True)

    @pipeline_def(batch_size=batch_size, num_threads=2, device_id=0 if gpu else None, seed=0)
    def pipeline() -> Any:
        jpegs, labels, index = fn.external_source(source=source, num_outputs=3, batch=False,
                                                  dtype=[dali_types.UINT8, dali_types.INT64, dali_types.INT64])
        images = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=dali_types.RGB)
        images = fn.resize(images, resize_x=64, resize_y=64)
        return images, labels, index

    pipe = pipeline()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # DALI warns that size is set by hand: expected without a reader
        loader = DALIGenericIterator(pipe, ["images", "labels", "index"], auto_reset=True,
                                     last_batch_policy=LastBatchPolicy.DROP, **source.iterator_options())
    batches, start = 0, time.perf_counter()
    for batch in loader:
        images = batch[0]["images"]
        if gpu and not images.is_cuda:
            raise CheckFailed(f"DALI mixed decode returned {images.device} tensors")
        batches += 1
    elapsed = time.perf_counter() - start
    expected = source.shard_size() // batch_size
    if batches != expected:
        raise CheckFailed(f"DALI iterator yielded {batches} batches, expected {expected} (DROP)")
    result = {"batches": batches, "images_per_s": round(batches * batch_size / elapsed, 1) if elapsed else None,
              "decoder": "mixed" if gpu else "cpu"}
    log(f"dali {result}")
    return result


def tiled_nvjpeg(gpu: bool) -> dict[str, Any]:
    """nvJPEG on tiled JPEGs (formats/vectors/tiled): a tiled JPEG must decode exactly like its
    source, and a cut window like the same region of the full decode (restart markers are
    standard JPEG; this checks that nvJPEG agrees). Uses the pure-Python window cutter, so it
    needs no compiled extension. A dry run decodes with packer.decode instead."""
    import numpy as np

    from packer.codecs.tiles import read_layout, window_jpeg

    folder = REPO / "formats" / "vectors" / "tiled"
    if gpu:
        import torch
        from torchvision.io import decode_jpeg

        def decode(data: bytes) -> np.ndarray:
            tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            return decode_jpeg(tensor, device="cuda").permute(1, 2, 0).cpu().numpy()
    else:
        from packer.decode import decode_image

        def decode(data: bytes) -> np.ndarray:
            return decode_image(data)

    out: dict[str, Any] = {}
    for source_path in sorted(folder.glob("*.source.jpg")):
        name = source_path.name.removesuffix(".source.jpg")
        source = source_path.read_bytes()
        tiled = (folder / f"{name}.tiled.jpg").read_bytes()
        full, whole = decode(source), decode(tiled)
        layout = read_layout(tiled)
        data, x, y = window_jpeg(tiled, layout, 0, max(1, layout.columns - 1), 0, layout.rows)
        part = decode(bytes(data))
        region = full[y:y + part.shape[0], x:x + part.shape[1]].astype(int)
        inner = np.abs(part.astype(int) - region)[:, :-2]  # away from the cut edge
        out[name] = {"tiled_equals_source": bool(np.array_equal(full, whole)),
                     "window_max_diff_inside": int(inner.max()) if inner.size else None}
    # Reported, not judged: nvJPEG's hardware and CUDA back ends may round differently.
    log(f"tiled JPEGs {out}")
    return out


def table() -> str:
    sections = RESULTS["sections"]
    lines = ["", "=" * 78, "packer GPU check" + ("  (DRY RUN: host paths, stand-ins for the GPU)"
                                                if RESULTS.get("dry_run") else "")]
    env = result_of("environment") or {}
    status = env.get("gds_status") or {}
    lines.append(f"GPUs: {env.get('gpus', '-')}   torch {env.get('torch', '-')}   torchvision "
                 f"{env.get('torchvision', '-')}   kvikio {env.get('kvikio', '-')}")
    lines.append(f"known: requested mode {status.get('requested_mode')}   compat preferred "
                 f"{status.get('compat_mode_preferred')}   gds_available {status.get('gds_available')}   "
                 f"gds_possible {status.get('gds_possible')}   fs: {env.get('filesystem', '-')}")
    reads = result_of("block reads") or {}
    if reads.get("rows"):
        lines.append(f"measured: {reads.get('verdict')}")
        lines.append("")
        lines.append(f"{'block reads (cold)':<22}{'kvikio GB/s':>14}{'pread+memcpy GB/s':>20}{'ratio':>8}")
        for row in reads["rows"]:
            lines.append(f"{str(row['block'] // KiB) + ' KiB':<22}{str(row.get('kvikio', '-')):>14}"
                         f"{str(row.get('pread+memcpy')):>20}{str(row.get('ratio', '-')):>8}")
    raw = result_of("raw batches") or []
    crops = (result_of("raw batch crops") or {}).get("rows") or []
    jpeg = (result_of("jpeg decode") or {}).get("rows") or []
    for title, rows in (("raw batches -> device", raw), ("raw batches + RandomResizedCrop", crops),
                        ("JPEG decode", jpeg)):
        if rows:
            lines.append("")
            lines.append(f"{title:<48}{'images/s':>12}{'GB/s':>8}")
            base = next((r.get("images_per_s") for r in rows if str(r.get("variant", "")).startswith("cpu")
                         and r.get("images_per_s")), None)
            for row in rows:
                rate = row.get("images_per_s")
                ratio = f"  x{rate / base:.1f} vs cpu" if rate and base else ""
                lines.append(f"{row['variant'][:48]:<48}{str(rate)[:12]:>12}{str(row.get('GB_per_s', '')):>8}{ratio}")
    lines.append("")
    lines.append(f"{'section':<24}status")
    for name, entry in sections.items():
        state = entry.get("status")
        text = {"ok": "ok", "fail": f"FAIL: {entry.get('error', '')}", "not run": f"not run: {entry.get('why')}"}
        lines.append(f"{name:<24}{text.get(state, state)}"[:200])
    verdict = "FAILED" if RESULTS["errors"] else "passed"
    lines.append(f"check {verdict}; total {time.perf_counter() - T0:.0f}s")
    lines.append("=" * 78)
    return "\n".join(lines)


def raw_crop(gpu: bool, seconds_each: float) -> dict[str, Any]:
    """Batched RandomResizedCrop of raw pixels: CUDA (torch ops) vs CPU (compiled kernel if built)."""
    import numpy as np
    import torch

    from packer.rawcrop import RRC_DRAWS, crop_resize_batch, random_resized_crop_boxes, sample_uniforms

    rows = []
    for side, count in ((32, 512), (224, 128)):
        images = np.random.default_rng(0).integers(0, 256, size=(count, side, side, 3), dtype=np.uint8)
        boxes, flips = random_resized_crop_boxes(sample_uniforms(0, 0, np.arange(count), RRC_DRAWS), side, side)
        variants = [("cpu", torch.from_numpy(images))]
        if gpu:
            variants.insert(0, ("cuda", torch.from_numpy(images).cuda()))
        outputs = {}
        for name, source in variants:
            crop_resize_batch(source, boxes, (side, side), flips=flips)  # warm-up
            done, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds_each / 2:
                outputs[name] = crop_resize_batch(source, boxes, (side, side), flips=flips)
                done += count
            if name == "cuda":
                torch.cuda.synchronize()
            rows.append({"variant": f"{name} {side}px", "images_per_s": round(done / (time.perf_counter() - start), 1)})
        if "cuda" in outputs:
            diff = int((outputs["cuda"].cpu().int() - outputs["cpu"].int()).abs().max())
            rows[-2]["max_diff_vs_cpu"] = diff
            if diff > 1:
                raise CheckFailed(f"raw crop at {side}px: CUDA and CPU differ by {diff} levels (expected <= 1)")
        log(f"raw crop {rows[-len(variants):]}")
    return {"rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="no GPU: host paths and stand-ins, tiny sizes")
    parser.add_argument("--wheels", help="install the wheels in this folder first (offline, --no-deps)")
    parser.add_argument("--budget", type=float, default=None, help="seconds for the whole run (default 420)")
    parser.add_argument("--raw-gb", type=float, default=None, help="size of the raw dataset (default 2)")
    parser.add_argument("--jpegs", type=int, default=None, help="JPEG dataset size (default 6000)")
    parser.add_argument("--work", type=Path, default=None, help="where datasets are built (local disk)")
    parser.add_argument("--json", type=Path, default=None, help="result file (default $OUT/gpu_check.json)")
    parser.add_argument("--no-pytest", action="store_true", help="skip pytest -m gpu (counts as not run)")
    args = parser.parse_args(argv)
    RESULTS.update({"sections": {}, "errors": [], "not_run": {}})
    dry = args.dry_run
    gpu = not dry
    budget = args.budget or (120.0 if dry else 420.0)
    raw_gb = args.raw_gb if args.raw_gb is not None else (0.002 if dry else 2.0)
    jpegs = args.jpegs if args.jpegs is not None else (40 if dry else 6000)
    size = 32 if dry else 224
    # /var/tmp: disk-backed on most systems (/tmp is often tmpfs, where neither GDS nor O_DIRECT applies).
    work = args.work or Path("/var/tmp/packer-gpu-check")
    seconds_each = 0.2 if dry else 4.0
    batch_size = 8 if dry else 256
    RESULTS["dry_run"] = dry
    RESULTS["args"] = {"budget": budget, "raw_gb": raw_gb, "jpegs": jpegs, "work": str(work)}
    if args.wheels:
        install_wheels(args.wheels)
    if dry:
        install_fake_kvikio()

    section("environment", budget, 0)(lambda: environment(work, gpu))
    if args.no_pytest:
        RESULTS["sections"]["pytest -m gpu"] = {"status": "not run", "why": "--no-pytest"}
    else:
        section("pytest -m gpu", budget, 60 if gpu else 5)(
            lambda: run_pytest(timeout=min(200.0, left(budget) - 30), gpu=gpu))
    datasets = section("datasets", budget, 60 if gpu else 3)(lambda: build_datasets(work, raw_gb, jpegs, size))
    if datasets:
        raw, jpeg = datasets["raw"]["path"], datasets["jpeg"]["path"]
        section("block reads", budget, 30 if gpu else 2)(
            lambda: block_reads(raw, gpu, seconds_each=seconds_each / 2, max_bytes=(1 * GiB if gpu else 16 * MiB)))
        section("raw batches", budget, 20 if gpu else 2)(lambda: raw_batches(raw, gpu, seconds_each, batch_size))
        section("raw batch crops", budget, 20 if gpu else 2)(
            lambda: raw_batch_crops(raw, gpu, seconds_each, batch_size))
        section("jpeg decode", budget, 20 if gpu else 2)(lambda: jpeg_decode(jpeg, gpu, seconds_each, batch_size))
        section("multi-gpu", budget, 15 if gpu else 2)(lambda: multi_gpu(raw, jpeg, gpu, batch_size))
        section("failure injection", budget, 10 if gpu else 2)(lambda: failure_injection(raw, gpu, batch_size))
        section("dali mixed", budget, 15 if gpu else 3)(lambda: dali_mixed(jpeg, gpu, batch_size))
    section("tiled nvjpeg", budget, 5 if gpu else 1)(lambda: tiled_nvjpeg(gpu))
    section("raw crop", budget, 10 if gpu else 2)(lambda: raw_crop(gpu, seconds_each))
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
