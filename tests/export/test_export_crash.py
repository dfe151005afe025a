"""A killed export leaves the old target or nothing, never a part (issue 25, item 3).

Each case runs an export in a child process that SIGKILLs itself at one step of the safe writer
(``packer.export.safewrite.checkpoint``: stage created, the n-th file written, before publishing,
OUT moved aside, published), over an OUT holding an earlier export. Then OUT must be exactly the
old export, exactly the new one, or (between the two renames of the fallback without
``renameat2``) absent; and the next export must succeed and leave nothing beside OUT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from packer.export import export
from packer.writer import build
from packer.writer.plan import BuildOptions

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import os, signal, sys
from packer.export import safewrite
from packer.export import export
point, nth, mode, target, dataset, out = sys.argv[1:]
seen = 0
def checkpoint(name):
    global seen
    if name == point:
        seen += 1
        if seen == int(nth):
            os.kill(os.getpid(), signal.SIGKILL)
safewrite.checkpoint = checkpoint
if mode == "fallback":  # a kernel or file system without renameat2: two renames
    safewrite._renameat2 = lambda *args: False
export(dataset, out, to=target, overwrite=True)
"""


def snapshot(path: Path) -> dict[str, bytes] | None:
    """Every file under ``path`` (a tar: its members), or None when it does not exist."""
    if not os.path.lexists(path):
        return None
    if path.is_file():
        with tarfile.open(path) as archive:
            return {m.name: archive.extractfile(m).read() for m in archive.getmembers() if m.isfile()}
    out = {}
    for item in sorted(path.rglob("*")):
        if item.is_file():
            data = item.read_bytes()
            if item.suffix == ".tar":
                with tarfile.open(item) as archive:
                    for member in archive.getmembers():
                        out[f"{item.name}:{member.name}"] = archive.extractfile(member).read()
            else:
                out[str(item.relative_to(path))] = data
    return out


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("crash")
    rng = np.random.default_rng(3)
    for cls in ("cat", "dog"):
        (root / "src" / cls).mkdir(parents=True)
        for i in range(4):
            Image.fromarray(rng.integers(0, 255, (5, 6, 3), dtype=np.uint8)).save(root / "src" / cls / f"{i}.png")
    build(root / "src", root / "ds", BuildOptions(shard_size=16 << 10), workers=1, progress=False)
    return root / "ds"


CASES = [
    ("folder", "stage-created", 1, "exchange"),
    ("folder", "file-written", 3, "exchange"),
    ("folder", "before-publish", 1, "exchange"),
    ("folder", "published", 1, "exchange"),
    ("folder", "moved-aside", 1, "fallback"),
    ("folder", "published", 1, "fallback"),
    ("tar", "file-written", 2, "exchange"),
    ("tar", "before-publish", 1, "exchange"),
    ("webdataset", "file-written", 5, "exchange"),
    ("webdataset", "before-publish", 1, "fallback"),
]


@pytest.mark.parametrize("target, point, nth, mode", CASES, ids=[f"{c[0]}-{c[1]}{c[2]}-{c[3]}" for c in CASES])
def test_a_killed_export_leaves_the_old_target_or_nothing(dataset: Path, tmp_path: Path, target: str, point: str,
                                                         nth: int, mode: str) -> None:
    out = tmp_path / ("out.tar" if target == "tar" else "out")
    export(dataset, out, to=target, classes=["dog"], samples_per_shard=2)
    old = snapshot(out)
    export(dataset, tmp_path / ("new.tar" if target == "tar" else "new"), to=target)
    new = snapshot(tmp_path / ("new.tar" if target == "tar" else "new"))
    assert old != new
    child = subprocess.run([sys.executable, "-c", CHILD, point, str(nth), mode, target, str(dataset), str(out)],
                           cwd=REPO, capture_output=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr.decode()[-2000:]
    after = snapshot(out)
    if point == "moved-aside":
        assert after is None  # between the two renames: nothing, never a part
    elif point == "published":
        assert after == new
    else:
        assert after == old
    leftovers = [name for name in os.listdir(tmp_path) if ".packer-export-" in name]
    assert point != "before-publish" or leftovers  # the stage of the killed export is still there ...
    export(dataset, out, to=target, overwrite=True)
    assert snapshot(out) == new
    assert [name for name in os.listdir(tmp_path) if ".packer-export-" in name] == []  # ... and removed now


RACER = r"""
import os, sys, time
from pathlib import Path
from packer.errors import OutputExistsError
from packer.export import safewrite
from packer.export import export
target, dataset, out, cls, overwrite, gate, mode = sys.argv[1:]
if mode == "fallback":  # a kernel or file system without renameat2
    safewrite._renameat2 = lambda *args: False
def checkpoint(name):
    if name == "before-publish":  # both exports staged before either publishes
        Path(gate, f"{os.getpid()}").touch()
        deadline = time.monotonic() + 60
        while len(os.listdir(gate)) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
safewrite.checkpoint = checkpoint
try:
    export(dataset, out, to=target, classes=[cls], overwrite=overwrite == "1")
except OutputExistsError as exc:
    print("refused:", exc.message)
    sys.exit(17)
"""


@pytest.mark.parametrize("mode", ["exchange", "fallback"])
@pytest.mark.parametrize("target", ["folder", "tar"])
@pytest.mark.parametrize("overwrite", [False, True])
def test_two_exports_publishing_into_one_out_at_once_leave_one_whole_export(dataset: Path, tmp_path: Path,
                                                                            target: str, overwrite: bool,
                                                                            mode: str) -> None:
    """Two processes export other classes to one OUT, both staged before either publishes: OUT is
    exactly one of the two exports, never a mix; without --overwrite the second is refused by name;
    no stage is left behind (issue 41: concurrent publishers)."""
    name = "out.tar" if target == "tar" else "out"
    wholes = {}
    for cls in ("cat", "dog"):
        export(dataset, tmp_path / f"{cls}-{name}", to=target, classes=[cls])
        wholes[cls] = snapshot(tmp_path / f"{cls}-{name}")
    out, gate = tmp_path / "race" / name, tmp_path / "gate"
    out.parent.mkdir()
    gate.mkdir()
    racers = [subprocess.Popen([sys.executable, "-c", RACER, target, str(dataset), str(out), cls,
                                "1" if overwrite else "0", str(gate), mode], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for cls in ("cat", "dog")]
    results = [(racer.wait(timeout=120), racer.stdout.read(), racer.stderr.read()) for racer in racers]
    codes = sorted(code for code, _, _ in results)
    if overwrite:
        assert codes == [0, 0], results
    else:
        assert codes == [0, 17], results
        assert any(text.startswith("refused: the export target appeared while this export ran (another export "
                                   "wrote it); it was left as it is: pass --overwrite to replace it")
                   for _, text, _ in results), results
    assert snapshot(out) in (wholes["cat"], wholes["dog"])
    assert sorted(p.name for p in out.parent.iterdir()) == [name]  # no stage or moved-aside OUT left


@pytest.mark.parametrize("target", ["folder", "tar"])
def test_an_out_that_appears_before_publishing_is_left_and_named(dataset: Path, tmp_path: Path, target: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """In process (the promise inventory's view of the race above): OUT is written by someone else
    after the check at the start; without --overwrite it is left as it is and named."""
    from packer.errors import OutputExistsError
    from packer.export import safewrite

    out = tmp_path / ("out.tar" if target == "tar" else "out")

    def someone_else(point: str) -> None:
        if point == "before-publish":
            if target == "tar":
                out.write_bytes(b"theirs")
            else:
                (out / "theirs").mkdir(parents=True)

    monkeypatch.setattr(safewrite, "checkpoint", someone_else)
    with pytest.raises(OutputExistsError) as caught:
        export(dataset, out, to=target)
    assert caught.value.message == ("the export target appeared while this export ran (another export wrote it); "
                                    "it was left as it is: pass --overwrite to replace it")
    assert caught.value.path == str(out)
    assert (out.read_bytes() == b"theirs") if target == "tar" else sorted(p.name for p in out.iterdir()) == ["theirs"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
