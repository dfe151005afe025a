"""Small records (formats/SPEC.md §3.4): ``--alignment auto`` chooses the alignment from the payload
sizes, records it as asked, and every writer and every split or resumed build chooses the same."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import packer
from packer import format as fmt
from packer.errors import OptionError
from packer.writer import build
from packer.writer.plan import MAX_PADDING_SHARE, SMALL_RECORD_ALIGNMENTS, choose_alignment
from packer.writer.settings import BuildSettings, LayoutSettings, RunOptions

from helpers import png_bytes, run_main


def _payload_and_disk(out: Path) -> tuple[int, int]:
    manifest = json.loads((out / "manifest.json").read_bytes())
    with packer.open_index(out) as index:
        payload = int(index.index.size.sum())
    return payload, sum(entry["size"] for entry in manifest["shards"])


# --- the rule ------------------------------------------------------------------------------------

def test_the_rule_keeps_pages_for_photos_and_packs_small_records() -> None:
    big = 1 << 30
    assert choose_alignment(np.full(50, 104_000) + np.arange(50), big) == 4096     # ~2 % padding
    assert choose_alignment(np.full(50, 3072), big) == 64                          # 32x32 raw: 0 %
    assert choose_alignment(np.full(50, 2140) + np.arange(50), big) == 64          # 2 KB PNGs
    assert choose_alignment(np.full(50, 300) + np.arange(50), big) == 8            # a few hundred bytes
    assert choose_alignment(np.full(50, 13), big) == 1                             # tiny, odd sizes
    assert choose_alignment(np.zeros(0, dtype=np.uint64), big) == 4096             # nothing to pad
    assert choose_alignment(np.full(10, 8192), 2048) == 64                         # never above the shard size


def test_the_rule_is_the_padding_share_at_its_boundary() -> None:
    """The largest candidate whose summed padding is at most 1/16 of the payload: exactly 1/16
    keeps it, one byte more of padding drops to the next candidate."""
    assert MAX_PADDING_SHARE == 1 / 16 and SMALL_RECORD_ALIGNMENTS == (4096, 64, 8, 1)
    # 4096 + 16 x 3840 = 65,536 payload bytes; 16 x 256 = 4,096 of padding at 4096: exactly 1/16
    sizes = np.array([4096] + [3840] * 16, dtype=np.uint64)
    assert choose_alignment(sizes, 1 << 30) == 4096
    sizes[1] -= 1  # 4,097 bytes of padding for 65,535: over 1/16; 64 pads one byte
    assert choose_alignment(sizes, 1 << 30) == 64
    assert choose_alignment(np.array([48], dtype=np.uint64), 1 << 30) == 8       # 16 of 48 at 64; none at 8
    assert choose_alignment(np.array([240, 16, 256, 256, 256, 256], dtype=np.uint64), 1 << 30) == 64  # 64 of 1280
    assert choose_alignment(np.array([240, 16, 256, 256, 256], dtype=np.uint64), 1 << 30) == 64  # 64 of 1024: 1/16
    assert choose_alignment(np.array([240, 16, 256, 256], dtype=np.uint64), 1 << 30) == 8  # 64 of 768: over
    assert choose_alignment(np.array([4095], dtype=np.uint64), 4095) == 64  # 4096 > the shard size: not a candidate


# --- builds ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_pngs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("small-pngs")
    for k in range(40):
        folder = root / ("a" if k % 2 else "b")
        folder.mkdir(exist_ok=True)
        (folder / f"{k:03d}.png").write_bytes(png_bytes(k, (16 + k % 5, 20)))  # ~1-1.3 KB of noise
    return root


@pytest.fixture(scope="module")
def photo_pngs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("photo-pngs")
    for k in range(6):
        folder = root / ("a" if k % 2 else "b")
        folder.mkdir(exist_ok=True)
        (folder / f"photo-{k:03d}.png").write_bytes(png_bytes(k, (120, 120 + k)))  # ~43 KB of noise each
    return root


def test_auto_is_the_default_and_packs_small_files_within_15_percent(small_pngs: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    build(small_pngs, out, BuildSettings(), RunOptions(workers=1))
    manifest = json.loads((out / "manifest.json").read_bytes())
    assert manifest["alignment"] == 64
    assert manifest["build"]["settings"]["layout"]["alignment"] == "auto"  # as asked; the result is above
    payload, disk = _payload_and_disk(out)
    assert disk <= 1.15 * payload, (disk, payload)
    with packer.open_dataset(out) as ds:
        assert all(int(o) % 64 == 0 for o in ds.index.offset)
        assert packer.verify_dataset(out).ok


def test_auto_keeps_4096_for_photo_sized_files_and_an_explicit_value_wins(photo_pngs: Path, small_pngs: Path,
                                                                         tmp_path: Path) -> None:
    build(photo_pngs, tmp_path / "photos", BuildSettings(), RunOptions(workers=1))
    assert json.loads((tmp_path / "photos" / "manifest.json").read_bytes())["alignment"] == 4096
    build(small_pngs, tmp_path / "paged", BuildSettings(layout=LayoutSettings(alignment=4096)), RunOptions(workers=1))
    manifest = json.loads((tmp_path / "paged" / "manifest.json").read_bytes())
    assert manifest["alignment"] == 4096 and manifest["build"]["settings"]["layout"]["alignment"] == 4096


def test_raw_32x32_gets_64_and_no_padding(small_pngs: Path, tmp_path: Path) -> None:
    out = tmp_path / "raw"
    build(small_pngs, out, BuildSettings(codec="raw:size=32x32"), RunOptions(workers=1))
    payload, disk = _payload_and_disk(out)
    manifest = json.loads((out / "manifest.json").read_bytes())
    assert manifest["alignment"] == 64
    shards = len(manifest["shards"])
    assert disk == payload + shards * fmt.shard_data_offset(64)  # 3,072-byte samples: no padding at all


def test_auto_is_deterministic_and_a_finished_build_resumes_as_a_no_op(small_pngs: Path, tmp_path: Path) -> None:
    for name in ("one", "two"):
        assert run_main(["build", str(small_pngs), str(tmp_path / name), "--workers", "1", "--quiet"])[0] == 0
    files = sorted(p.relative_to(tmp_path / "one") for p in (tmp_path / "one").rglob("*") if p.is_file())
    for relative in files:
        if relative.name != "build-report.jsonl":
            assert (tmp_path / "one" / relative).read_bytes() == (tmp_path / "two" / relative).read_bytes(), relative
    code, out, err = run_main(["build", str(small_pngs), str(tmp_path / "one"), "--resume", "--workers", "1"])
    assert code == 0, out + err


def test_a_split_build_chooses_once(small_pngs: Path, tmp_path: Path) -> None:
    out = tmp_path / "split"
    shard_size = "16K"
    for part in ("0/2", "1/2"):
        code, stdout, stderr = run_main(["build", str(small_pngs), str(out), "--part", part, "--shard-size",
                                         shard_size, "--workers", "1", "--quiet"])
        assert code == 0, stdout + stderr
    code, stdout, stderr = run_main(["build", str(small_pngs), str(out), "--finish", "--shard-size", shard_size,
                                     "--quiet"])
    assert code == 0, stdout + stderr
    whole = tmp_path / "whole"
    assert run_main(["build", str(small_pngs), str(whole), "--shard-size", shard_size, "--workers", "1",
                     "--quiet"])[0] == 0
    assert json.loads((out / "manifest.json").read_bytes())["alignment"] == 64
    assert (json.loads((out / "manifest.json").read_bytes())["shards"]
            == json.loads((whole / "manifest.json").read_bytes())["shards"])


def test_resume_asking_another_alignment_is_refused_naming_it(small_pngs: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    assert run_main(["build", str(small_pngs), str(out), "--plan-only", "--quiet"])[0] == 0
    code, stdout, stderr = run_main(["build", str(small_pngs), str(out), "--resume", "--alignment", "64"])
    assert code != 0
    assert "--alignment: saved 'auto', asked 64" in stdout + stderr


def test_python_writers_default_to_auto(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    with packer.Writer(tmp_path / "w", codec="raw:size=16x16") as writer:
        for k in range(20):
            writer.write(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8), label=k % 2)
    manifest = json.loads((tmp_path / "w" / "manifest.json").read_bytes())
    assert manifest["alignment"] == 64  # 768-byte samples: 4096 would be 81 % padding
    with packer.open_dataset(tmp_path / "w") as ds:
        assert len(ds) == 20 and all(int(s) == 768 for s in ds.index.size)


def test_append_keeps_the_datasets_alignment(small_pngs: Path, photo_pngs: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    build(small_pngs, out, BuildSettings(), RunOptions(workers=1))
    code, stdout, stderr = run_main(["append", str(out), str(photo_pngs), "--quiet"])
    assert code == 0, stdout + stderr
    manifest = json.loads((out / "manifest.json").read_bytes())
    assert manifest["alignment"] == 64 and manifest["sample_count"] == 46
    assert packer.verify_dataset(out).ok


@pytest.mark.parametrize("value, message", [
    ("3", "--alignment must be a power of two"), ("0", "out of range"), ("fast", "neither 'auto' nor a number")])
def test_a_bad_alignment_is_a_usage_error_naming_the_option(small_pngs: Path, tmp_path: Path, value: str,
                                                            message: str) -> None:
    code, stdout, stderr = run_main(["build", str(small_pngs), str(tmp_path / "ds"), "--alignment", value])
    assert code == 2, stdout + stderr
    assert message in stdout + stderr and not (tmp_path / "ds" / "manifest.json").exists()


def test_alignment_accepts_auto_and_sizes(small_pngs: Path, tmp_path: Path) -> None:
    for value, expected in (("AUTO", 64), ("4K", 4096), ("512", 512)):
        out = tmp_path / value
        code, stdout, stderr = run_main(["build", str(small_pngs), str(out), "--alignment", value, "--quiet"])
        assert code == 0, stdout + stderr
        assert json.loads((out / "manifest.json").read_bytes())["alignment"] == expected


def test_settings_refuse_what_is_neither_auto_nor_a_power_of_two() -> None:
    with pytest.raises(OptionError, match=r"--alignment must be a power of two .*, or 'auto'"):
        LayoutSettings(alignment=48).check()
    with pytest.raises(OptionError, match="--alignment"):
        LayoutSettings(alignment="automatic").check()
    assert LayoutSettings().alignment == "auto" and LayoutSettings().check().alignment == "auto"
    assert BuildSettings.from_json({"layout": {"alignment": "auto"}}).layout.alignment == "auto"
    assert BuildSettings.from_json({"layout": {"alignment": 512}}).layout.alignment == 512
    with pytest.raises(OptionError, match="layout.alignment"):
        BuildSettings.from_json({"layout": {"alignment": "big"}})


def test_an_alignment_equal_to_the_shard_size_is_a_candidate() -> None:
    assert choose_alignment(np.full(3, 64, dtype=np.uint64), 64) == 64
    assert choose_alignment(np.full(3, 4096, dtype=np.uint64), 4096) == 4096
    assert choose_alignment(np.full(3, 4096, dtype=np.uint64), 4095) == 64


def _rewrite_plan_header(plan_path: Path, change) -> None:
    """Re-encode a saved plan with its JSON header changed (an older packer's plan, or a damaged one)."""
    rows, columns = fmt.parse_column_file(plan_path.read_bytes(), fmt.PLAN_MAGIC, kind="plan")
    header = json.loads(columns["header"].tobytes())
    change(header)
    columns = {name: np.array(array) for name, array in columns.items()}
    columns["header"] = np.frombuffer(json.dumps(header, sort_keys=True).encode(), dtype=np.uint8)
    plan_path.write_bytes(b"".join(bytes(piece) for piece in fmt.encode_column_file(fmt.PLAN_MAGIC, rows, columns)))


def test_a_plan_saved_before_auto_takes_the_alignment_of_its_settings(small_pngs: Path, tmp_path: Path) -> None:
    from packer.writer.plan import load_plan
    from packer.writer.staging import PLAN_NAME, STAGING_DIR

    out = tmp_path / "ds"
    assert run_main(["build", str(small_pngs), str(out), "--plan-only", "--alignment", "512", "--quiet"])[0] == 0
    plan_path = out / STAGING_DIR / PLAN_NAME
    _rewrite_plan_header(plan_path, lambda header: header.pop("alignment"))  # what packer wrote before "auto"
    assert load_plan(plan_path, small_pngs).alignment == 512
    _rewrite_plan_header(plan_path, lambda header: header.update(alignment=48))
    with pytest.raises(packer.BuildError) as caught:
        load_plan(plan_path, small_pngs)
    assert caught.value.message.startswith(f"the saved build plan is damaged ({plan_path}: alignment must be a "
                                           f"power of two between 1 and 16777216, got 48); delete")
