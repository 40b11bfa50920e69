"""The files a suite runs, and whether any of them changed between two commits.

A regression alert whose step spans no change on its suite's code path is a change in the machine
or its load, not in the code (RemoteANN's rows at 3c89f827: every method 8-68% slower, nothing on
its path touched). The path is the suite module, the modules of this repository it imports, read
with `ast` and followed transitively (nothing is imported), and the shipped data when a datasets
module is on it. It is read from the current checkout, so a module that an older commit imported
and the current one no longer does is not on it; the dependencies' pinned versions are not on it
either.
"""
from __future__ import annotations

import ast
import functools
import subprocess
import tomllib
from pathlib import Path

from .registry import REPO_ROOT

DATA = "datasets/data"


@functools.cache
def packages(root: Path) -> dict[str, str]:
    """Dotted package -> its folder: pyproject.toml's [tool.setuptools.package-dir] and claimbench in its
    own folder, the longest names first (so a subpackage's own folder wins)."""
    path = root / "pyproject.toml"
    declared = tomllib.loads(path.read_text()).get("tool", {}).get("setuptools", {}).get("package-dir", {}) \
        if path.is_file() else {}
    return dict(sorted({"claimbench": "claimbench", **declared}.items(), key=lambda item: -len(item[0])))


def module_file(name: str, root: Path) -> Path | None:
    """The file of a dotted module name of this repository, or None for any other module."""
    for package, folder in packages(root).items():
        if name == package or name.startswith(package + "."):
            base = root.joinpath(folder, *name.removeprefix(package).split(".")[1:])
            for candidate in (base / "__init__.py", base.parent / f"{base.name}.py"):
                if candidate.is_file():
                    return candidate
            return None
    return None


def _package_of(path: Path, root: Path) -> str | None:
    """The dotted package a file of this repository sits in (for its relative imports); None outside them."""
    folder, *rest = path.relative_to(root).parts
    package = next((p for p, f in packages(root).items() if f == folder), None)
    return package and ".".join([package, *rest[:-1]])


def _imported(path: Path, root: Path) -> set[Path]:
    """This repository's modules one file imports (`from package import name` counts name's module)."""
    package, names = _package_of(path, root), set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                if package is None:
                    continue
                anchor = package.rsplit(".", node.level - 1)[0]
                base = f"{anchor}.{base}" if base else anchor
            names |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return {f for f in (module_file(n, root) for n in names) if f is not None}


@functools.cache
def files(suite: str, root: Path = REPO_ROOT) -> tuple[str, ...]:
    """Paths (relative, sorted) on the code path of an asv suite ('ssa') or a kernel file
    ('kernels/test_lychee'); () when the suite has no file here."""
    start = next((p for p in (root / "suites" / f"{suite}.py", root / f"{suite}.py") if p.is_file()), None)
    if start is None:
        return ()
    seen, todo = set(), [start]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        todo += _imported(path, root) - seen
    out = {p.relative_to(root).as_posix() for p in seen}
    if any(p.startswith("datasets/") for p in out) and (root / DATA).is_dir():
        out.add(DATA)
    return tuple(sorted(out))


@functools.cache
def unchanged(suite: str, before: str, after: str, root: Path = REPO_ROOT) -> bool | None:
    """True when no file on the suite's code path differs between the two commits, False when one
    does; None when that cannot be told (no such suite file, no git, a commit this clone lacks)."""
    paths = files(suite, root)
    if not paths or not before or not after:
        return None
    try:
        done = subprocess.run(["git", "diff", "--quiet", before, after, "--", *paths], cwd=root,
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {0: True, 1: False}.get(done.returncode)
