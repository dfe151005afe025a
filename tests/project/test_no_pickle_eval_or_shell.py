"""No pickle, eval, exec or shell anywhere in the package: the data path never runs code from a file."""

from __future__ import annotations
import ast

from helpers import REPO


# --- no pickle, eval or shell ---------------------------------------------------------------------


FORBIDDEN_CALLS = {"eval", "exec", "compile"}


FORBIDDEN_ATTRIBUTES = {("os", "system"), ("os", "popen"), ("pickle", "load"), ("pickle", "loads"),
                        ("marshal", "loads"), ("yaml", "load"), ("shelve", "open")}


FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "yaml"}


def test_no_pickle_eval_or_shell_in_the_package():
    """The package never unpickles, evals or runs a shell: data never becomes code."""
    findings = []
    for path in sorted((REPO / "packer").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        where = path.relative_to(REPO)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                findings += [f"{where}:{node.lineno} import {a.name}" for a in node.names
                             if a.name.split(".")[0] in FORBIDDEN_MODULES]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
                findings.append(f"{where}:{node.lineno} from {node.module} import")
            elif isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Name) and func.id in FORBIDDEN_CALLS:
                    findings.append(f"{where}:{node.lineno} {func.id}()")
                if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and (
                        (func.value.id, func.attr) in FORBIDDEN_ATTRIBUTES):
                    findings.append(f"{where}:{node.lineno} {func.value.id}.{func.attr}()")
                for keyword in node.keywords:
                    if keyword.arg == "shell" and not (isinstance(keyword.value, ast.Constant)
                                                       and keyword.value.value is False):
                        findings.append(f"{where}:{node.lineno} shell=")
                    if keyword.arg == "allow_pickle" and not (isinstance(keyword.value, ast.Constant)
                                                              and keyword.value.value is False):
                        findings.append(f"{where}:{node.lineno} allow_pickle=")
    assert findings == []
