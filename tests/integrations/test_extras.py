"""Each integration is an optional extra: ``import packer`` never imports it, and importing the
module without its library says which extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [("packer.lightning", "lightning", "lightning"), ("packer.grain", "grain", "grain"),
         ("packer.tvtensors", "torchvision", "torchvision")]


@pytest.mark.parametrize(("module", "library", "extra"), CASES, ids=[c[0] for c in CASES])
def test_a_missing_library_names_the_extra(module: str, library: str, extra: str) -> None:
    code = (f"import sys; sys.modules[{library!r}] = None\n"  # an import of it raises ImportError
            f"import packer\n"
            f"try:\n    import {module}\n"
            f"except packer.MissingDependencyError as exc:\n    print('MISSING', exc)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "MISSING" in done.stdout and f"pip install 'packer-shards[{extra}]'" in done.stdout


def test_import_packer_imports_no_integration() -> None:
    code = ("import sys, packer, packer.dataset, packer.sources\n"
            "print(sorted(m for m in ('lightning', 'grain', 'torchvision', 'datasets', 'torch') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(("module", "library", "extra"), CASES, ids=[c[0] for c in CASES])
def test_a_missing_library_names_the_extra_in_this_process(monkeypatch: pytest.MonkeyPatch, module: str,
                                                           library: str, extra: str) -> None:
    # The same refusal in the test process itself (the promise inventory counts only this one).
    import importlib

    from packer import MissingDependencyError

    monkeypatch.setitem(sys.modules, library, None)  # an import of it raises ImportError
    monkeypatch.delitem(sys.modules, module, raising=False)  # restored after the test
    with pytest.raises(MissingDependencyError, match=rf"pip install 'packer-shards\[{extra}\]'"):
        importlib.import_module(module)
    assert module not in sys.modules  # a failed import leaves nothing half-made behind
