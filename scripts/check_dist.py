"""Check what would be uploaded: build the sdist and wheel, check them, install each in a fresh virtualenv.

    python scripts/check_dist.py [--out dist-check] [--torch-spec torch==2.13.0] [--no-cibuildwheel]

``make dist-check`` runs it (and CI, after ``make test``). The steps, each failing the run:

1. ``python -m build``: the sdist, then the wheel built *from the sdist* (so a file missing from
   the sdist breaks the wheel here, not on a user's machine).
2. ``twine check --strict`` on both, and the archives' contents: the licence, ``py.typed``, both
   C extensions in the wheel; the C sources, ``setup.py``, README, CHANGELOG and LICENSE in the
   sdist; no tests or scripts in the wheel.
3. A fresh virtualenv with the built **wheel** (not the checkout) and ``--torch-spec``:
   ``smoke_installed.py --extensions yes --torch`` (build, verify, inspect, export, tiled codec,
   one DataLoader batch), run from a folder outside the checkout.
4. A fresh virtualenv with the **sdist** installed without a C compiler (``CC=false``: the
   extensions are optional, so the compile fails and setuptools skips them):
   ``smoke_installed.py --extensions no --torch`` (everything works; ``--codec tiled`` is
   refused naming ``packer.codecs._jpegtiles``). Steps 3 and 4 run side by side.
5. ``cibuildwheel --print-build-identifiers`` for Linux, macOS and Windows: the
   ``[tool.cibuildwheel]`` configuration parses and selects the wheels the release workflow
   builds (only Linux wheels can be built on this machine; the others are built by the workflow).

Prints the time of each step. Packages come from the configured index (pip's cache makes a
second run faster).
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOKE = REPO / "scripts" / "smoke_installed.py"
#: What cibuildwheel must select per platform (a subset is enough: the identifiers it prints).
EXPECTED_BUILDS = {
    "linux": ("cp310-manylinux_x86_64", "cp313-manylinux_x86_64", "cp310-manylinux_aarch64"),
    "macos": ("cp310-macosx_x86_64", "cp310-macosx_arm64", "cp313-macosx_arm64"),
    "windows": ("cp310-win_amd64", "cp313-win_amd64"),
}


def step(title: str) -> float:
    print(f"\n== {title}", flush=True)
    return time.monotonic()


def done(started: float, timings: dict[str, float], title: str) -> None:
    timings[title] = time.monotonic() - started
    print(f"   ({timings[title]:.1f} s)", flush=True)


def run(*args: object, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    command = [str(a) for a in args]
    print("$ " + " ".join(command), flush=True)
    proc = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"check_dist FAILED: {' '.join(command)} exited {proc.returncode}\n"
                 f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc.stdout


def fail(message: str) -> None:
    sys.exit(f"check_dist FAILED: {message}")


def check_archives(wheel: Path, sdist: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for wanted in ("packer/__init__.py", "packer/py.typed", "packer/codecs/_jpegtiles", "packer/_rawresample",
                   "packer/sampledata/photos/PHOTOS.md", "packer/sampledata/photos/cat.jpg"):
        if not any(name.startswith(wanted) for name in names):
            fail(f"{wheel.name} lacks {wanted}")
    if not any(name.endswith(".dist-info/licenses/LICENSE") for name in names):
        fail(f"{wheel.name} lacks its LICENSE")
    if any(name.startswith(("tests/", "scripts/", "docs/")) for name in names):
        fail(f"{wheel.name} ships tests, scripts or docs")
    root = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as archive:
        members = {name.removeprefix(root + "/") for name in archive.getnames()}
    for wanted in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "packer/py.typed",
                   "packer/codecs/_jpegtiles.c", "packer/_rawresample.c", "formats/SPEC.md",
                   "packer/sampledata/photos/PHOTOS.md", "packer/sampledata/photos/galaxy.jpg"):
        if wanted not in members:
            fail(f"{sdist.name} lacks {wanted}")
    print(f"   {wheel.name}: {len(names)} files; {sdist.name}: {len(members)} members", flush=True)


def install_and_smoke(out: Path, name: str, install: list[object], extensions: str,
                      env: dict[str, str] | None = None) -> str:
    """A fresh virtualenv ``out/venv-NAME`` with ``install``, then the smoke test; returns its output."""
    venv = out / f"venv-{name}"
    shutil.rmtree(venv, ignore_errors=True)
    log = run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    log += run(python, "-m", "pip", "install", "--quiet", *install, env=env)
    return log + run(python, SMOKE, "--extensions", extensions, "--torch", "--workdir", out / f"smoke-{name}",
                     cwd=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=REPO / "dist-check")
    parser.add_argument("--torch-spec", default="torch==2.13.0",
                        help="the torch requirement the smoke tests install, with pip options if needed "
                             "(CI: the local CPU build)")
    parser.add_argument("--no-cibuildwheel", action="store_true", help="skip the cibuildwheel configuration check")
    args = parser.parse_args(argv)
    out = args.out.resolve()
    total = time.monotonic()
    shutil.rmtree(out, ignore_errors=True)  # a previous run's virtualenvs (each holds a torch)
    dist = out / "dist"
    timings: dict[str, float] = {}

    started = step("build the sdist, then the wheel from it")
    run(sys.executable, "-m", "build", "--outdir", dist, REPO)
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        fail(f"expected one wheel and one sdist in {dist}, found {[p.name for p in dist.iterdir()]}")
    wheel, sdist = wheels[0], sdists[0]
    if not wheel.name.startswith("packer_shards-") or not sdist.name.startswith("packer_shards-"):
        fail(f"archives are not named after the packer-shards distribution: {wheel.name}, {sdist.name}")
    done(started, timings, "build")

    started = step("twine check --strict, and what the archives hold")
    run(sys.executable, "-m", "twine", "check", "--strict", wheel, sdist)
    check_archives(wheel, sdist)
    done(started, timings, "twine + contents")

    # The two installs wait mostly on unpacking wheels (torch is ~700 MB installed): run side by side.
    started = step(f"in fresh virtualenvs with {args.torch_spec}, side by side: the wheel; the sdist without a "
                   "C compiler (CC=false)")
    no_compiler = dict(os.environ, CC="false", CXX="false", LDSHARED="false")
    torch = shlex.split(args.torch_spec)  # a requirement, possibly with pip options
    jobs = {
        "wheel": lambda: install_and_smoke(out, "wheel", [wheel, *torch], "yes"),
        "sdist": lambda: install_and_smoke(out, "sdist", ["--no-cache-dir", sdist, *torch], "no",
                                           env=no_compiler),
    }
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        logs = {name: future.result() for name, future in futures.items()}
    for name, log in logs.items():
        print(f"\n-- {name}:\n{log}", end="", flush=True)
    done(started, timings, "wheel + sdist smoke tests")

    if not args.no_cibuildwheel:
        started = step("cibuildwheel configuration")
        for platform, expected in EXPECTED_BUILDS.items():
            listed = run(sys.executable, "-m", "cibuildwheel", "--print-build-identifiers", "--platform", platform,
                         cwd=REPO, env=dict(os.environ, CIBW_ARCHS_LINUX="x86_64 aarch64",
                                            CIBW_ARCHS_MACOS="x86_64 arm64")).split()
            missing = [name for name in expected if name not in listed]
            if missing:
                fail(f"cibuildwheel --platform {platform} does not select {missing}: {listed}")
            print(f"   {platform}: {len(listed)} wheels ({', '.join(listed)})", flush=True)
        done(started, timings, "cibuildwheel")

    print("\ncheck_dist passed: " + ", ".join(f"{name} {seconds:.0f} s" for name, seconds in timings.items())
          + f"; total {time.monotonic() - total:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
