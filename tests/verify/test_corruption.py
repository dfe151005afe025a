"""Corruption of a built dataset: hundreds of random byte flips, truncations, extensions and zeroed
4 KiB pages in shards, the index and the manifest.

Each trial copies a small built dataset, damages one file once, then (all in this process, so a
segfault, hang or stray exception fails the suite):

* opens it (a typed ``PackerError``, or success);
* reads every sample with checksum verification, with the mmap and the pread backend, one by one
  and as one batch: either exactly the original bytes or a typed error, never other bytes;
* runs ``verify``: not ok whenever any byte of a file the manifest lists changed, every sample
  whose payload bytes changed named as a checksum problem (or lost with a truncated tail), ok
  only when the dataset is intact.
"""

from __future__ import annotations

import json
import random
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from packer import format as fmt
from packer.writer import build
from packer.dataset import open_dataset
from packer.errors import PackerError
from packer.writer.plan import BuildOptions

verify_module = pytest.importorskip("packer.verify")

PAGE = 4096
@pytest.fixture(scope="module")
def outcomes():
    """Trial outcomes of this module, printed at its end (run with -s to see them): one counter per
    module run, passed explicitly, so no state leaks between test sessions or modules."""
    counts: Counter[str] = Counter()
    yield counts
    print("\nreliability/corruption outcomes:", json.dumps(dict(sorted(counts.items()))))


def _make_source(root: Path, seed: int) -> Path:
    """40 images, 0.3-9 KB (PNG and JPEG), in 4 classes."""
    rng = np.random.default_rng(seed)
    for c in range(4):
        folder = root / f"class{c}"
        folder.mkdir(parents=True)
        for i in range(10):
            h, w = (int(v) for v in rng.integers(8, 56, 2))
            pixels = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            if i % 3 == 0:
                Image.fromarray(pixels).save(folder / f"img{i:02d}.jpg", quality=90)
            else:
                Image.fromarray(pixels).save(folder / f"img{i:02d}.png")
    return root


@pytest.fixture(scope="module", params=[4096, 64], ids=["align4096", "align64"])
def base(request, tmp_path_factory) -> dict[str, Any]:
    """A built dataset (40 samples, several shards) and everything the trials compare against."""
    alignment = request.param
    work = tmp_path_factory.mktemp(f"corruption{alignment}")
    src = _make_source(work / "src", seed=alignment)
    shard_size = 64 << 10 if alignment == 4096 else 24 << 10
    out = work / "ds"
    build(src, out, BuildOptions(shard_size=shard_size, alignment=alignment), workers=1, progress=False)
    with open_dataset(out) as ds:
        samples = [ds.read(i) for i in range(len(ds))]
        keys = [ds.key(i) for i in range(len(ds))]
        manifest = ds.manifest
        ix = ds.index
        layout = {entry.path: [(i, int(ix.offset[i]), int(ix.size[i])) for i in range(*ds.shard_range(n))]
                  for n, entry in enumerate(manifest.shards)}
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*")
             if p.is_file() and p.name != ".packer.lock"}
    assert len(manifest.shards) >= 3 and len(samples) == 40
    return {"path": out, "samples": samples, "keys": keys, "layout": layout, "files": files, "manifest": manifest,
            "work": work}


def _mutate(data: bytes, kind: str, rng: random.Random, *, focus: int) -> tuple[bytes, str]:
    """One mutation of ``data``; ``focus`` bytes at the start get a third of the flips."""
    size = len(data)
    if kind == "flip":
        position = rng.randrange(min(focus, size)) if rng.random() < 1 / 3 else rng.randrange(size)
        mutated = bytearray(data)
        mutated[position] ^= rng.randrange(1, 256)
        return bytes(mutated), f"flip@{position}"
    if kind == "truncate":
        length = rng.choice([0, rng.randrange(size), size - 1, rng.randrange(0, size, PAGE) if size > PAGE else 1])
        return data[:length], f"truncate@{length}"
    if kind == "extend":
        extra = rng.choice([1, rng.randrange(1, 64), PAGE, rng.randrange(1, 3 * PAGE)])
        filler = bytes(extra) if rng.random() < 0.5 else bytes(rng.randrange(256) for _ in range(extra))
        return data + filler, f"extend+{extra}"
    if kind == "zero-page":
        pages = [p for p in range((size + PAGE - 1) // PAGE) if any(data[p * PAGE:(p + 1) * PAGE])]
        page = rng.choice(pages or [0])  # a page that holds something, so the trial changes bytes
        start, end = page * PAGE, min(size, (page + 1) * PAGE)
        return data[:start] + bytes(end - start) + data[end:], f"zero-page@{start}"
    raise AssertionError(kind)


def _payload_damage(base: dict[str, Any], shard_path: str, old: bytes, new: bytes) -> tuple[set[int], set[int]]:
    """(samples whose payload bytes differ but are all present, samples cut off by truncation)."""
    changed, lost = set(), set()
    for sample, offset, size in base["layout"][shard_path]:
        if offset + size > len(new):
            lost.add(sample)
        elif new[offset:offset + size] != old[offset:offset + size]:
            changed.add(sample)
    return changed, lost


def _read_everything(path: Path, samples: list[bytes], backend: str) -> str:
    """Open and read every sample with verification; returns an outcome label."""
    try:
        ds = open_dataset(path, backend=backend, verify_checksums=True)
    except PackerError as exc:
        return f"open-refused:{type(exc).__name__}"
    refused = 0
    try:
        for i in range(len(ds)):
            try:
                data = ds.read(i)
            except PackerError:
                refused += 1
                continue
            assert data == samples[i], f"sample {i}: read returned damaged bytes without an error"
        try:
            batch = ds.read_batch(np.arange(len(ds)))
        except PackerError:
            refused += 1
        else:
            for i in range(len(ds)):
                assert bytes(batch[i]) == samples[i], f"sample {i}: read_batch returned damaged bytes"
    finally:
        ds.close()
    return "read-refused-some" if refused else "read-all-correct"


def _run_trial(base: dict[str, Any], trial_dir: Path, target: str, kind: str, rng: random.Random,
               outcomes: Counter[str]) -> None:
    if trial_dir.exists():
        shutil.rmtree(trial_dir)
    shutil.copytree(base["path"], trial_dir)
    old = base["files"][target]
    focus = 4096 if target.startswith("shards/") else (64 + 64 * 13 if target.endswith(".pki") else len(old))
    new, description = _mutate(old, kind, rng, focus=focus)
    (trial_dir / target).write_bytes(new)
    label = f"{target.split('/')[0].split('-')[0]}:{kind}"
    where = f"{target} {description}"

    # 1-2. open and read, with both backends
    for backend in ("mmap", "pread"):
        read_outcome = _read_everything(trial_dir, base["samples"], backend)
    outcomes[f"{label}:{read_outcome.split(':')[0]}"] += 1

    # 3. verify
    report = verify_module.verify(trial_dir, workers=1, progress=False)
    assert isinstance(report, verify_module.VerifyReport)
    if new == old:
        assert report.ok, f"{where}: verify reports damage in an unchanged dataset: {report.problems}"
        outcomes[f"{label}:no-op"] += 1
        return
    if target == fmt.MANIFEST_NAME and report.ok:
        # The manifest is the root of trust and has no checksum of its own: a change verify cannot
        # see must leave every structural field (and so every byte read) as it was.
        reread = fmt.parse_manifest(new)
        original = base["manifest"]
        assert (reread.alignment, reread.sample_count, reread.index, reread.shards) == (
            original.alignment, original.sample_count, original.index, original.shards), where
        fields = sorted(k for k in set(reread.raw) | set(original.raw) if reread.raw.get(k) != original.raw.get(k))
        outcomes[f"{label}:undetected-informational:{','.join(fields) or 'whitespace'}"] += 1
        return
    assert not report.ok, f"{where}: verify missed the damage"
    if target.startswith("shards/"):
        changed, lost = _payload_damage(base, target, old, new)
        checksum_named = {p.sample for p in report.problems if p.kind == "checksum"}
        assert changed <= checksum_named, f"{where}: damaged samples {changed - checksum_named} not named"
        damaged = set(report.damaged_samples)
        assert lost <= damaged, f"{where}: lost samples {lost - damaged} not named"
        assert checksum_named <= changed, f"{where}: intact samples {checksum_named - changed} called damaged"
        if changed or lost:
            keys = {p.key for p in report.problems if p.kind == "checksum"}
            assert all(keys), f"{where}: a damaged sample is named without its key"
            outcomes[f"{label}:samples-named"] += 1
        else:
            outcomes[f"{label}:non-payload-detected"] += 1
    else:
        outcomes[f"{label}:detected"] += 1
    outcomes["verify-exit-1"] += 1


TRIALS_PER_KIND = {"shard": 28, "index": 12, "manifest": 12}  # x 4 mutation kinds x 2 alignments = 416


@pytest.mark.parametrize("kind", ["flip", "truncate", "extend", "zero-page"])
def test_random_corruption_trials(base, kind, outcomes):
    rng = random.Random(f"corruption-{kind}-{base['manifest'].alignment}")
    shards = sorted(name for name in base["files"] if name.startswith("shards/"))
    index = next(name for name in base["files"] if name.endswith(".pki"))
    trial_dir = base["work"] / f"trial-{kind}"
    trials = 0
    for file_kind, count in TRIALS_PER_KIND.items():
        for _ in range(count):
            target = (rng.choice(shards) if file_kind == "shard" else index if file_kind == "index"
                      else fmt.MANIFEST_NAME)
            _run_trial(base, trial_dir, target, kind, rng, outcomes)
            trials += 1
    outcomes["trials"] += trials
    shutil.rmtree(trial_dir, ignore_errors=True)


def test_every_page_of_a_shard_zeroed_and_truncated(base, outcomes):
    """Deterministic sweep: zero each 4 KiB page of the first shard, and cut it at each page."""
    shard = sorted(name for name in base["files"] if name.startswith("shards/"))[0]
    data = base["files"][shard]
    trial_dir = base["work"] / "trial-sweep"
    trials = 0
    for start in range(0, len(data), PAGE):
        for description, new in (("zero", data[:start] + bytes(min(PAGE, len(data) - start)) + data[start + PAGE:]),
                                 ("cut", data[:start])):
            if trial_dir.exists():
                shutil.rmtree(trial_dir)
            shutil.copytree(base["path"], trial_dir)
            (trial_dir / shard).write_bytes(new)
            _read_everything(trial_dir, base["samples"], "mmap")
            report = verify_module.verify(trial_dir, workers=1, progress=False)
            assert report.ok == (new == data), f"{description}@{start}"
            changed, lost = _payload_damage(base, shard, data, new)
            assert changed | lost <= set(report.damaged_samples), f"{description}@{start}"
            trials += 1
    outcomes["sweep-trials"] += trials
    shutil.rmtree(trial_dir, ignore_errors=True)


def test_missing_files(base, outcomes):
    """A deleted shard or index, or a dataset without its manifest: typed errors, verify names the
    lost samples."""
    trial_dir = base["work"] / "trial-missing"
    for name in base["files"]:
        if name == fmt.REPORT_NAME:
            continue
        if trial_dir.exists():
            shutil.rmtree(trial_dir)
        shutil.copytree(base["path"], trial_dir)
        (trial_dir / name).unlink()
        _read_everything(trial_dir, base["samples"], "mmap")
        report = verify_module.verify(trial_dir, workers=1, progress=False)
        assert not report.ok, name
        if name.startswith("shards/"):
            lost = {sample for sample, _, _ in base["layout"][name]}
            assert lost <= set(report.damaged_samples), name
        outcomes["missing-file-trials"] += 1
    shutil.rmtree(trial_dir, ignore_errors=True)


def test_build_report_is_informative_only(base, tmp_path):
    """Damaging build-report.jsonl changes nothing a reader or verify depends on."""
    trial_dir = tmp_path / "ds"
    shutil.copytree(base["path"], trial_dir)
    (trial_dir / fmt.REPORT_NAME).write_bytes(b"\xff garbage")
    assert _read_everything(trial_dir, base["samples"], "mmap") == "read-all-correct"
    assert verify_module.verify(trial_dir, workers=1, progress=False).ok


def test_verify_cli_exit_codes_and_names(base, tmp_path, outcomes):
    """Through the real CLI: exit 0 when intact; exit 1 naming the damaged sample and its key after
    a payload flip, and after a structural flip in the index."""
    import subprocess
    import sys
    repo = Path(__file__).resolve().parents[2]

    def run(path: Path) -> tuple[int, dict[str, Any]]:
        done = subprocess.run([sys.executable, "-m", "packer", "verify", str(path), "--json", "-q", "--workers", "1"],
                              cwd=repo, capture_output=True, timeout=120)
        assert "Traceback" not in done.stderr.decode(), done.stderr.decode()
        return done.returncode, json.loads(done.stdout)

    intact = tmp_path / "intact"
    shutil.copytree(base["path"], intact)
    code, document = run(intact)
    assert code == 0 and document["ok"] is True
    shard = sorted(name for name in base["files"] if name.startswith("shards/"))[1]
    sample, offset, size = base["layout"][shard][1]
    payload = tmp_path / "payload"
    shutil.copytree(base["path"], payload)
    data = bytearray(base["files"][shard])
    data[offset + size // 2] ^= 0x40
    (payload / shard).write_bytes(bytes(data))
    code, document = run(payload)
    named = [p for p in document["problems"] if p["kind"] == "checksum"]
    assert code == 1 and document["ok"] is False
    assert [(p["sample"], p["key"]) for p in named] == [(sample, base["keys"][sample])]
    index = next(name for name in base["files"] if name.endswith(".pki"))
    structure = tmp_path / "structure"
    shutil.copytree(base["path"], structure)
    data = bytearray(base["files"][index])
    data[30] ^= 1
    (structure / index).write_bytes(bytes(data))
    code, document = run(structure)
    assert code == 1 and document["problems"][0]["kind"] == "structure"
    outcomes["verify-cli-trials"] += 3
