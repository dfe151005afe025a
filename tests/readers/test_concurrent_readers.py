"""Readers under load: many processes and DataLoader workers on one dataset, read-only file systems
and permissions, and readers running while another process replaces the dataset (--overwrite).

The replacement guarantee: a reader that opened one version reads that version's bytes, or gets
``DatasetChangedError``; it never gets bytes of the new version through the old index.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.writer import build
from packer.dataset import open_dataset
from packer.errors import DatasetChangedError
from packer.writer.plan import BuildOptions

REPO = Path(__file__).resolve().parents[2]
OPTIONS = BuildOptions(shard_size=24 << 10)
FORK = multiprocessing.get_context("fork")


def make_source(root: Path, seed: int, *, classes: int = 3, per_class: int = 16) -> Path:
    rng = np.random.default_rng(seed)
    for c in range(classes):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(per_class):
            h, w = (int(v) for v in rng.integers(8, 40, 2))
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(folder / f"{i:03d}.png")
    return root


def samples_by_key(path: Path) -> dict[str, bytes]:
    with open_dataset(path, verify_checksums=True) as ds:
        return {ds.key(i): ds.read(i) for i in range(len(ds))}


@pytest.fixture(scope="module")
def versions(tmp_path_factory) -> dict[str, Any]:
    """Two versions of one dataset (same keys, different pixels), built side by side."""
    base = tmp_path_factory.mktemp("readers")
    make_source(base / "src_a", seed=1)
    make_source(base / "src_b", seed=2)
    for name in ("a", "b"):
        build(base / f"src_{name}", base / f"ref_{name}", OPTIONS, workers=1, progress=False)
    refs = {name: samples_by_key(base / f"ref_{name}") for name in ("a", "b")}
    assert refs["a"].keys() == refs["b"].keys() and all(refs["a"][k] != refs["b"][k] for k in refs["a"])
    manifests = {(base / f"ref_{name}" / fmt.MANIFEST_NAME).read_bytes(): name for name in ("a", "b")}
    return {"base": base, "refs": refs, "manifests": manifests}


# --- many readers --------------------------------------------------------------------------------------

def _digest_all(path: str, backend: str, seed: int) -> list[tuple[str, int]]:
    ds = open_dataset(path, backend=backend, verify_checksums=True)
    order = list(range(len(ds)))
    random.Random(seed).shuffle(order)
    found = [(ds.key(i), fmt.checksum(ds.read(i))) for i in order]
    batch = ds.read_batch(order[: len(order) // 2])
    found += [(ds.key(i), fmt.checksum(bytes(batch[j]))) for j, i in enumerate(order[: len(order) // 2])]
    ds.close()
    return sorted(found)


def _digest_pickled(ds: Any, seed: int) -> list[tuple[str, int]]:
    order = list(range(len(ds)))
    random.Random(seed).shuffle(order)
    return sorted((ds.key(i), fmt.checksum(ds.read(i))) for i in order)


def test_eight_reader_processes_read_identical_bytes(versions):
    path = versions["base"] / "ref_a"
    reference = samples_by_key(path)
    with FORK.Pool(8) as pool:
        results = pool.starmap(_digest_all, [(str(path), ("mmap", "pread")[i % 2], i) for i in range(8)])
        shared = open_dataset(path, verify_checksums=True)  # pickled to each worker: manifest bytes only
        pickled = pool.starmap(_digest_pickled, [(shared, i) for i in range(8)])
        shared.close()
    want = sorted((k, fmt.checksum(v)) for k, v in reference.items())
    for result in results:
        assert len(result) == len(reference) + len(reference) // 2
        assert set(result) == set(want)
    assert all(result == want for result in pickled)


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
def test_dataloader_workers_read_identical_bytes(versions):
    torch = pytest.importorskip("torch")
    path = versions["base"] / "ref_b"
    reference = samples_by_key(path)

    class Bytes(torch.utils.data.Dataset):
        def __init__(self, root: Path) -> None:
            self.ds = open_dataset(root, verify_checksums=True)

        def __len__(self) -> int:
            return len(self.ds)

        def __getitem__(self, i: int) -> tuple[str, Any]:
            return self.ds.key(i), torch.from_numpy(np.frombuffer(self.ds.read(i), dtype=np.uint8).copy())

    loader = torch.utils.data.DataLoader(Bytes(path), batch_size=None, shuffle=True, num_workers=4,
                                         multiprocessing_context="fork", persistent_workers=False,
                                         generator=torch.Generator().manual_seed(0))
    seen = {}
    for _ in range(2):  # two epochs
        for key, tensor in loader:
            data = tensor.numpy().tobytes()
            assert data == reference[key], key
            seen[key] = seen.get(key, 0) + 1
    assert seen == {key: 2 for key in reference}


# --- read-only datasets ----------------------------------------------------------------------------------

_READ_ALL = """
import sys
from packer.dataset import open_dataset
from packer import format as fmt
for backend in ("mmap", "pread"):
    with open_dataset(sys.argv[1], backend=backend, verify_checksums=True) as ds:
        digest = sorted((ds.key(i), fmt.checksum(ds.read(i))) for i in range(len(ds)))
        ds.read_batch(list(range(len(ds))))
print(len(digest), hash(tuple(digest)))
"""


def test_read_only_permissions(versions):
    """Files 0444 and folders 0555, read by an unprivileged user (root would ignore the bits)."""
    work = Path(tempfile.mkdtemp(prefix="packer-ro-"))
    try:
        work.chmod(0o755)
        target = work / "ds"
        shutil.copytree(versions["base"] / "ref_a", target)
        (target / ".packer.lock").unlink(missing_ok=True)
        for path in sorted(target.rglob("*"), reverse=True) + [target]:
            path.chmod(0o555 if path.is_dir() else 0o444)
        command = [sys.executable, "-c", _READ_ALL, str(target)]
        if os.geteuid() == 0:
            if shutil.which("setpriv") is None:
                pytest.skip("needs setpriv to drop root")
            command = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *command]
        done = subprocess.run(command, cwd=REPO, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout.split()[0] == str(len(versions["refs"]["a"])).encode()
    finally:
        for path in [work, *work.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        shutil.rmtree(work, ignore_errors=True)


def test_read_only_file_system(versions, tmp_path):
    """A read-only bind mount (root only; skipped where mounting is not allowed)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount")
    target = tmp_path / "ds"
    shutil.copytree(versions["base"] / "ref_a", target)
    done = subprocess.run(["mount", "--bind", str(target), str(target)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {done.stderr.decode().strip()}")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True, capture_output=True)
        with pytest.raises(OSError):
            (target / "probe").write_bytes(b"")
        done = subprocess.run([sys.executable, "-c", _READ_ALL, str(target)], cwd=REPO, capture_output=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr.decode()
        assert samples_by_key(target) == versions["refs"]["a"]
        from packer.verify import verify
        assert verify(target, workers=1, progress=False).ok
    finally:
        subprocess.run(["umount", "-l", str(target)], check=False)


# --- reading while the dataset is replaced ---------------------------------------------------------------

def test_open_reader_keeps_its_version_across_a_rebuild(versions, tmp_path):
    """Deterministic: a reader that opened version A keeps reading A from the shards it has open,
    and gets DatasetChangedError for the ones it had not opened yet (they are gone), never B."""
    out = tmp_path / "ds"
    shutil.copytree(versions["base"] / "ref_a", out)
    refs = versions["refs"]
    for backend in ("mmap", "pread"):
        build(versions["base"] / "src_a", out, OPTIONS, workers=1, progress=False, overwrite=True)
        reader = open_dataset(out, backend=backend, verify_checksums=True)
        first, end = reader.shard_range(0)
        for i in range(first, end):
            assert reader.read(i) == refs["a"][reader.key(i)]  # shard 0 now open
        build(versions["base"] / "src_b", out, OPTIONS, workers=1, progress=False, overwrite=True)
        changed = 0
        for i in range(len(reader)):
            try:
                data = reader.read(i)
            except DatasetChangedError:
                changed += 1
                continue
            assert data == refs["a"][reader.key(i)], f"sample {i}: new bytes through the old index"
        assert changed == len(reader) - (end - first)
        with pytest.raises(DatasetChangedError):
            pickle.loads(pickle.dumps(reader))  # a DataLoader worker started now
        reader.close()
        assert samples_by_key(out) == refs["b"]


def _reader_loop(path: str, backend: str, manifests: dict[bytes, str], refs: dict[str, dict[str, bytes]],
                 stop: Any, results: Any, seed: int) -> None:
    rng = random.Random(seed)
    counts = {"opens": 0, "samples": 0, "changed": 0, "a": 0, "b": 0}
    try:
        while not stop.is_set():
            try:
                ds = open_dataset(path, backend=backend, verify_checksums=True)
            except DatasetChangedError:
                counts["changed"] += 1
                continue
            counts["opens"] += 1
            version = manifests[ds._manifest_bytes]
            counts[version] += 1
            order = list(range(len(ds)))
            rng.shuffle(order)
            try:
                for i in order:
                    data = ds.read(i)
                    if data != refs[version][ds.key(i)]:
                        raise AssertionError(f"sample {i} ({ds.key(i)}): bytes of another version")
                    counts["samples"] += 1
                    if rng.random() < 0.02:
                        time.sleep(0.002)  # let a rebuild land in the middle of a pass
            except DatasetChangedError:
                counts["changed"] += 1
            finally:
                ds.close()
        results.put(("ok", counts))
    except BaseException as exc:  # noqa: BLE001 - report anything to the parent
        results.put(("error", f"{type(exc).__name__}: {exc}"))


def test_readers_during_overwrite_rebuilds_never_mix_versions(versions, tmp_path):
    """Four reader processes loop over the dataset (checksums on, mmap and pread) while this process
    rebuilds it with --overwrite, alternating two versions, many times."""
    out = tmp_path / "ds"
    shutil.copytree(versions["base"] / "ref_a", out)
    stop, results = FORK.Event(), FORK.Queue()
    readers = [FORK.Process(target=_reader_loop, args=(str(out), ("mmap", "pread")[i % 2], versions["manifests"],
                                                       versions["refs"], stop, results, i)) for i in range(4)]
    for reader in readers:
        reader.start()
    rebuilds = 0
    try:
        time.sleep(0.3)
        for rebuild in range(10):
            source = versions["base"] / ("src_b" if rebuild % 2 == 0 else "src_a")
            build(source, out, OPTIONS, workers=1, progress=False, overwrite=True)
            rebuilds += 1
            time.sleep(0.15)
    finally:
        stop.set()
        outcomes = [results.get(timeout=60) for _ in readers]
        for reader in readers:
            reader.join(timeout=30)
    errors = [detail for status, detail in outcomes if status != "ok"]
    assert errors == []
    totals: dict[str, int] = {}
    for _, counts in outcomes:
        for name, value in counts.items():
            totals[name] = totals.get(name, 0) + value
    print(f"\nreaders during {rebuilds} overwrite rebuilds: {json.dumps(totals, sort_keys=True)}")
    assert totals["samples"] > 0 and totals["a"] > 0 and totals["b"] > 0
    assert samples_by_key(out) == versions["refs"]["a"]  # the last rebuild was A
