"""The files a suite runs, and whether what it runs from them changed between two commits.

A regression alert whose step spans no change on its suite's code path is a change in the machine
or its load, not in the code (RemoteANN's rows at 3c89f827: every method 8-68% slower, nothing on
its path touched). The path is the suite module, the modules of this repository it imports, read
with `ast` and followed transitively (nothing is imported), and the shipped data when a datasets
module is on it. It is read from the current checkout, so a module that an older commit imported
and the current one no longer does is not on it; the dependencies' pinned versions are not on it
either.

A file on the path that changed between two commits changes what the suite runs unless its code is
the same once docstrings and comments are left out, or it is a module the suite imports (not the
suite itself) whose changed top-level definitions nothing on the path names: intervals.py losing a
function only one other suite called changes no other suite's code. Reconstructed, and kept
conservative: a definition counts as named wherever any version of a file on the path uses its name
(a name, an attribute, an imported name, or a word in a string constant, for getattr); every other
top-level statement (imports, loops, calls) runs at import, so a change to one is a change; so is a
change to a definition whose decorator may register it, an assignment whose value calls something
other than a constructor, a dunder, anything a `from ... import *` on the path could bring, a file
that does not parse, or any change to the shipped data. What escapes it: a class a metaclass
registers by subclassing, or a module's name built at run time (no module on these paths does
either).
"""
from __future__ import annotations

import ast
import functools
import re
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .registry import REPO_ROOT

DATA = "datasets/data"
PURE_DECORATORS = frozenset({"dataclass", "cache", "lru_cache", "cached_property", "property", "staticmethod",
                             "classmethod", "abstractmethod", "contextmanager", "total_ordering"})
PURE_CALLS = frozenset({"frozenset", "set", "dict", "tuple", "list", "int", "float", "str", "bool", "range",
                        "sorted", "len", "compile", "Path", "field", "TypeVar", "namedtuple", "dataclass"})
WORD = re.compile(r"[A-Za-z_]\w*")


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


def _start(suite: str, root: Path) -> Path | None:
    """The suite's own file: suites/<suite>.py, or <suite>.py for a kernel file."""
    return next((p for p in (root / "suites" / f"{suite}.py", root / f"{suite}.py") if p.is_file()), None)


@functools.cache
def files(suite: str, root: Path = REPO_ROOT) -> tuple[str, ...]:
    """Paths (relative, sorted) on the code path of an asv suite ('ssa') or a kernel file
    ('kernels/test_lychee'); () when the suite has no file here."""
    start = _start(suite, root)
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


def unchanged(suite: str, before: str, after: str, root: Path = REPO_ROOT) -> bool | None:
    """True when nothing the suite runs from its code path differs between the two commits (no file
    changed, or only in ways the module docstring lists), False when something does; None when that
    cannot be told (no such suite file, no git, a commit this clone lacks)."""
    found = changes(suite, before, after, root)
    return None if found is None else not found


@functools.cache
def changes(suite: str, before: str, after: str, root: Path = REPO_ROOT) -> tuple[str, ...] | None:
    """What changed between the two commits that the suite runs: 'path' for a whole file (the suite's own,
    one added, removed or not parsing, one whose top-level statements changed, the shipped data) and
    'path: name' for a definition the path names; () for nothing; None where git cannot tell."""
    paths = files(suite, root)
    if not paths or not before or not after:
        return None
    code = tuple(p for p in paths if p.endswith(".py"))
    try:
        changed = subprocess.run(["git", "diff", "--name-only", before, after, "--", *paths], cwd=root,
                                 capture_output=True, text=True, timeout=30, check=True).stdout.splitlines()
        python = [p for p in changed if p in code]
        old, new = (_texts(before, code, root), _texts(after, code, root)) if python else ({}, {})
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    start = _start(suite, root).relative_to(root).as_posix()
    found = _what_runs_differently(start, python, old, new) + ((DATA,) if len(python) < len(changed) else ())
    first = (start, "impl/", "baselines/", "datasets/", "")  # the suite, then the method and its baselines
    return tuple(sorted(found, key=lambda f: next(i for i, prefix in enumerate(first) if f.startswith(prefix))))


def _texts(commit: str, paths: tuple[str, ...], root: Path) -> dict[str, str | None]:
    """Each path's text at a commit (None where the commit has no such file), in one `git cat-file`."""
    query = "".join(f"{commit}:{p}\n" for p in paths).encode()
    out = subprocess.run(["git", "cat-file", "--batch"], input=query, cwd=root, capture_output=True, timeout=30,
                         check=True).stdout
    texts, at = {}, 0
    for path in paths:
        end = out.index(b"\n", at)
        header = out[at:end].split()
        if header[-1] == b"missing":
            texts[path], at = None, end + 1
            continue
        size = int(header[2])
        texts[path], at = out[end + 1:end + 1 + size].decode("utf-8", "replace"), end + 2 + size
    return texts


@dataclass(frozen=True)
class _Module:
    """One version of a module, docstrings left out: the source of each top-level definition under its
    name (a def, a class, an assignment to one name), every other top-level statement in order, and each
    top-level statement's (name it defines or None, names it uses)."""
    definitions: dict[str, tuple[str, ...]]
    rest: tuple[str, ...]
    uses: tuple[tuple[str | None, frozenset[str]], ...]


def _callee(node: ast.expr) -> str:
    """The name a call or a decorator calls: f in f(...), a.f(...), @f or @a.f."""
    node = node.func if isinstance(node, ast.Call) else node
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _defined(statement: ast.stmt) -> str | None:
    """The name a top-level statement defines with no effect at import beyond it; None for any other."""
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        pure = all(_callee(d) in PURE_DECORATORS for d in statement.decorator_list)
        return statement.name if pure and not statement.name.startswith("__") else None
    target = statement.targets[0] if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
        else statement.target if isinstance(statement, ast.AnnAssign) else None
    if not isinstance(target, ast.Name) or target.id.startswith("__"):
        return None
    calls = [n for n in ast.walk(statement.value) if isinstance(n, ast.Call)] if statement.value else []
    return target.id if all(_callee(c) in PURE_CALLS for c in calls) else None


def _uses(statement: ast.stmt) -> frozenset[str]:
    """Every name a statement could reach a definition by: names, attributes, imported names, and the
    words of its string constants."""
    names = set()
    for node in ast.walk(statement):
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.update(node.name.split("."))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.update(WORD.findall(node.value))
    return frozenset(names)


@functools.cache
def _module(text: str) -> _Module | None:
    """A module's text read as a _Module; None where it does not parse."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    definitions, rest, uses = {}, [], []
    for statement in tree.body:
        name = _defined(statement)
        if name is None:
            rest.append(ast.dump(statement))
        else:
            definitions[name] = definitions.get(name, ()) + (ast.dump(statement),)
        uses.append((name, _uses(statement)))
    return _Module(definitions, tuple(rest), tuple(uses))


def _what_runs_differently(start: str, changed: list[str], old: dict[str, str | None],
                           new: dict[str, str | None]) -> tuple[str, ...]:
    """Of the changed files (all Python, on the path), what changes what the suite at `start` runs, as
    `changes` names it (the module docstring says how). old and new hold every file on the path at the
    two commits."""
    modules = {(path, version): _module(text) for version, texts in (("old", old), ("new", new))
               for path, text in texts.items() if text is not None}
    out, changed_names = [], {}
    for path in changed:
        before, after = modules.get((path, "old")), modules.get((path, "new"))
        names = set() if before is None or after is None else {
            n for n in before.definitions.keys() | after.definitions.keys()
            if before.definitions.get(n) != after.definitions.get(n)}
        if before is None or after is None or before.rest != after.rest or (names and path == start):
            out.append(path)
        else:
            changed_names[path] = names
    uses = [(home, defined, used) for (home, _), module in modules.items() if module is not None
            for defined, used in module.uses]
    if any(module is None for module in modules.values()):
        uses.append((None, None, frozenset({"*"})))  # a file that does not parse could name anything
    out += [f"{path}: {name}" for path, names in changed_names.items() for name in sorted(names)
            if any("*" in used or name in used for home, defined, used in uses
                   if not (home == path and defined == name))]
    return tuple(out)
