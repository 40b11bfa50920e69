"""How the shipped corpus files were made: run once, never at benchmark time.

    python datasets/data/corpus/make_corpus.py LICENSE_DIR   # writes *.jsonl.gz here, prints their sha256

LICENSE_DIR is the folder of Debian's common license texts it was made from once (Debian 12's
base-files); benchmarks never read it. Sources (README.md beside this file names versions and
licenses): those license texts,
CPython's standard-library docstrings and pydoc topics, and the docstrings of numpy, scipy and
sympy, each read from the installed package of the version the README names. Every line of a
file is one document: {"id": dotted name or license name, "text": its docstring or text}.
Everything benchmarks read comes from these files through claimbench.datasets.corpus, checksummed
against datasets/data/MANIFEST.json; rerunning this script with other versions changes the bytes
and so every digest that depends on them.
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import importlib.util
import json
import sys
import sysconfig
from pathlib import Path

HERE = Path(__file__).resolve().parent
SKIP_PARTS = {"test", "tests", "testing", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages",
              "benchmarks", "_vendor", "externals"}


def docstrings(root: Path, package: str) -> list[dict]:
    """Docstrings of modules and of their public classes, functions and methods under root, in path order."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("")
        parts = [package, *rel.parts] if package else list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if not parts or SKIP_PARTS & set(parts):  # private modules hold most public functions (scipy)
            continue
        try:
            tree = ast.parse(path.read_text("utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        module = ".".join(parts)
        if doc := ast.get_docstring(tree):
            out.append({"id": module, "text": doc})
        out += _members(tree, module)
    return out


def _members(node, prefix: str) -> list[dict]:
    out = []
    for child in getattr(node, "body", []):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not child.name.startswith("_"):
            name = f"{prefix}.{child.name}"
            if doc := ast.get_docstring(child):
                out.append({"id": name, "text": doc})
            if isinstance(child, ast.ClassDef):
                out += _members(child, name)
    return out


def package_root(name: str) -> Path:
    return Path(importlib.util.find_spec(name).origin).parent


def write(name: str, docs: list[dict]) -> None:
    seen, unique = set(), []
    for d in docs:
        if d["id"] not in seen and d["text"].strip():
            seen.add(d["id"])
            unique.append(d)
    raw = "".join(json.dumps(d, ensure_ascii=False, sort_keys=True) + "\n" for d in unique).encode()
    path = HERE / f"{name}.jsonl.gz"
    path.write_bytes(gzip.compress(raw, compresslevel=9, mtime=0))
    print(f"{path.name}: {len(unique)} documents, {len(raw)} bytes raw, {path.stat().st_size} gzipped, "
          f"sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}")


def main(licenses: Path) -> None:
    write("licenses", [{"id": p.name, "text": p.read_text("utf-8")} for p in sorted(licenses.iterdir())
                       if p.is_file() and not p.is_symlink()])
    import pydoc_data.topics
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    write("python-stdlib", docstrings(stdlib, "")
          + [{"id": f"topic:{k}", "text": v} for k, v in sorted(pydoc_data.topics.topics.items())])
    for package in ("numpy", "scipy", "sympy"):
        write(package, docstrings(package_root(package), package))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: make_corpus.py LICENSE_DIR (the folder of Debian's common license texts)")
    main(Path(sys.argv[1]))
