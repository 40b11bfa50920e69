"""Training recipes (YAML) for ATTUNE's small real training jobs (PAPERS.md B1), one schema for all.

Shipped recipes (`datasets/data/recipes/`, checksummed like every input): `causal-lm`, SmolLM2-135M
fine-tuned on the pinned corpus's Python docstrings, and `moe-lm`, a small byte-level MoE transformer
(top-k routing) trained from a seeded initialization on the same text.

Every key of a recipe is one of three kinds:
- locked: what is trained (model and its initialization, data source/order/seed, sequence length,
  global batch in tokens per step, precision, optimizer and schedule, loss, grad clipping). The gate
  hashes them; any change is rejected. Required.
- semantic: knobs a training framework offers that change what is trained (token truncation, label
  smoothing, loss scaling, frozen parameters, skipped steps, lower-precision autocast, an MoE capacity
  factor or a forced/fake-balanced router). Only their neutral value is allowed (the gate's deny-list).
  Optional; absent means neutral.
- tunable: how the same training runs (micro-batch with gradient accumulation, activation
  checkpointing, torch.compile, threads, data-loader workers, optimizer implementation, sequence
  packing, DDP processes, MoE dispatch). Optional; absent means the schema's default.
A recipe with an unknown key, a missing locked key or a value of the wrong type is rejected with
the file and the key named (RecipeError).
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from claimbench import inputs
from claimbench.interfaces import InputError, Knob

JOBS = ("causal-lm", "moe-lm")  # one shipped recipe per job, named after it


class RecipeError(InputError):
    """A recipe that does not fit the schema; the message names the file and the key."""


@dataclass(frozen=True)
class Field:
    kind: str  # locked / semantic / tunable
    expected: str  # what a valid value is, for error messages
    valid: Callable[[object], bool]
    default: object = None  # semantic: the neutral value; tunable: the value when absent
    why: str = ""  # semantic: what another value does to training
    jobs: tuple[str, ...] = JOBS


def _int(low: int = 0):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= low


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _one_of(*choices):
    return lambda v: v in choices


def _text(v) -> bool:
    return isinstance(v, str) and bool(v)


def _names(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _ints(v) -> bool:
    return isinstance(v, list) and all(_int()(x) for x in v)


def _pair(v) -> bool:
    return isinstance(v, list) and len(v) == 2 and all(_number(x) for x in v)


def _locked(expected, valid, jobs=JOBS):
    return Field("locked", expected, valid, jobs=jobs)


def _semantic(neutral, expected, valid, why, jobs=JOBS):
    return Field("semantic", expected, valid, neutral, why, jobs)


def _tunable(default, expected, valid, jobs=JOBS):
    return Field("tunable", expected, valid, default, jobs=jobs)


MOE = ("moe-lm",)
SCHEMA: dict[str, Field] = {
    "job": _locked(f"one of {', '.join(JOBS)}", _one_of(*JOBS)),
    "model.name": _locked("a model name", _text),
    "model.init": _locked("'gguf' (the pinned SmolLM2 weights) or 'seed:N' (a seeded random initialization)",
                          lambda v: v == "gguf" or bool(re.fullmatch(r"seed:\d+", str(v)))),
    "model.tokenizer": _locked("'smollm2' or 'bytes'", _one_of("smollm2", "bytes")),
    "model.dim": _locked("an integer >= 8", _int(8), MOE),
    "model.layers": _locked("an integer >= 1", _int(1), MOE),
    "model.heads": _locked("an integer >= 1", _int(1), MOE),
    "model.kv_heads": _locked("an integer >= 1", _int(1), MOE),
    "model.ffn_dim": _locked("an integer >= 8", _int(8), MOE),
    "data.source": _locked("a corpus source (claimbench.datasets.text.SOURCES)", _text),
    "data.order": _locked("'shuffled' (by data.seed) or 'shipped'", _one_of("shuffled", "shipped")),
    "data.seed": _locked("an integer", _int()),
    "data.truncate_tokens": _semantic(None, "null or an integer", lambda v: v is None or _int(1)(v),
                                      "drops every token of a document past it"),
    "train.sequence_length": _locked("an integer >= 8", _int(8)),
    "train.tokens_per_step": _locked("an integer >= 8 (the global batch, in target tokens)", _int(8)),
    "train.precision": _locked("'float32' or 'bfloat16'", _one_of("float32", "bfloat16")),
    "train.optimizer.name": _locked("'adamw'", _one_of("adamw")),
    "train.optimizer.lr": _locked("a number", _number),
    "train.optimizer.betas": _locked("[beta1, beta2]", _pair),
    "train.optimizer.eps": _locked("a number", _number),
    "train.optimizer.weight_decay": _locked("a number", _number),
    "train.schedule.name": _locked("'cosine' or 'constant'", _one_of("cosine", "constant")),
    "train.schedule.warmup_steps": _locked("an integer", _int()),
    "train.schedule.total_steps": _locked("an integer >= 1", _int(1)),
    "train.loss.name": _locked("'cross-entropy'", _one_of("cross-entropy")),
    "train.loss.label_smoothing": _semantic(0.0, "a number", _number, "trains towards smoothed targets"),
    "train.loss.scale": _semantic(1.0, "a number", _number,
                                  "scales the loss without unscaling the gradients (changes clipping and the step)"),
    "train.grad_clip": _locked("a number (max gradient norm)", _number),
    "train.frozen": _semantic([], "a list of parameter-name prefixes", _names, "leaves those parameters untrained"),
    "train.skip_steps": _semantic([], "a list of step indices", _ints, "skips those optimizer updates"),
    "train.autocast": _semantic("none", "'none', 'bfloat16' or 'float16'", _one_of("none", "bfloat16", "float16"),
                                "lower-precision compute is a precision change, and precision is locked"),
    "moe.experts": _locked("an integer >= 2", _int(2), MOE),
    "moe.top_k": _locked("an integer >= 1", _int(1), MOE),
    "moe.capacity_factor": _semantic(None, "null or a number", lambda v: v is None or _number(v),
                                     "drops token-expert pairs past each expert's capacity", MOE),
    "moe.router": _semantic("learned", "'learned', 'balanced' or 'forced'", _one_of("learned", "balanced", "forced"),
                            "routes tokens by a rule instead of the learned router", MOE),
    "moe.dispatch": _tunable("loop", "'loop', 'sorted' or 'padded-bmm'", _one_of("loop", "sorted", "padded-bmm"), MOE),
    "runtime.micro_batch_rows": _tunable(1, "an integer >= 1", _int(1)),
    "runtime.activation_checkpointing": _tunable(False, "true or false", _one_of(True, False)),
    "runtime.compile": _tunable("none", "'none' or 'default'", _one_of("none", "default")),
    "runtime.threads": _tunable(1, "an integer >= 1 (per process)", _int(1)),
    "runtime.loader_workers": _tunable(0, "an integer >= 0", _int()),
    "runtime.optimizer_impl": _tunable("foreach", "'for-loop', 'foreach' or 'fused'",
                                       _one_of("for-loop", "foreach", "fused")),
    "runtime.packing": _tunable(False, "true or false (packed rows keep every token, attention per document)",
                                _one_of(True, False)),
    "runtime.processes": _tunable(1, "an integer >= 1 (DDP over gloo on this machine)", _int(1)),
}
LOCKED = tuple(k for k, f in SCHEMA.items() if f.kind == "locked")
SEMANTIC = tuple(k for k, f in SCHEMA.items() if f.kind == "semantic")
TUNABLE = tuple(k for k, f in SCHEMA.items() if f.kind == "tunable")


def knob_space(recipe: dict, cores: int) -> list:
    """The fixed knob space a grid searches, for a validated recipe on `cores` cores: every tunable
    key with the values tried (the recipe's own value first, as the knob's default)."""
    values = {
        "runtime.micro_batch_rows": (1, 2, 4, 8),
        "runtime.activation_checkpointing": (True, False),
        "runtime.optimizer_impl": ("foreach", "fused", "for-loop"),
        "runtime.packing": (False, True),
        "runtime.threads": tuple(sorted({1, cores})),
        "runtime.processes": tuple(sorted({1, 2} if cores >= 2 else {1})),
        "runtime.loader_workers": (0, 1),
        "runtime.compile": ("none", "default"),
        "moe.dispatch": ("loop", "sorted", "padded-bmm"),
    }
    knobs = []
    for key, options in values.items():
        if key in recipe:
            current = recipe[key]
            knobs.append(Knob(key, (current, *[v for v in options if v != current]), current))
    return knobs


def flatten(tree: dict, prefix: str = "") -> dict[str, object]:
    """Nested mappings -> dotted keys (lists are values)."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def nest(flat: dict[str, object]) -> dict:
    """Dotted keys -> nested mappings (the inverse of flatten)."""
    out: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def validate(recipe: dict, source: str = "<recipe>") -> dict[str, object]:
    """The recipe's flat keys with absent semantic and tunable ones filled in; RecipeError otherwise."""
    if not isinstance(recipe, dict):
        raise RecipeError(f"{source}: a recipe is a mapping of keys; got {type(recipe).__name__}")
    flat = flatten(recipe)
    job = flat.get("job")
    if job not in JOBS:
        raise RecipeError(f"{source}: key 'job' must be one of {', '.join(JOBS)}; got {job!r}")
    fields = {k: f for k, f in SCHEMA.items() if job in f.jobs}
    unknown = sorted(set(flat) - set(fields))
    if unknown:
        raise RecipeError(f"{source}: unknown key(s) {', '.join(map(repr, unknown))} for job {job!r}")
    missing = [k for k, f in fields.items() if f.kind == "locked" and k not in flat]
    if missing:
        raise RecipeError(f"{source}: missing locked key(s) {', '.join(map(repr, missing))}")
    for key, value in flat.items():
        if not fields[key].valid(value):
            hint = " (YAML reads 1e-4 as text: write 1.0e-4)" if isinstance(value, str) and _looks_numeric(value) else ""
            raise RecipeError(f"{source}: key {key!r} must be {fields[key].expected}; got {value!r}{hint}")
    if job == "moe-lm" and flat["moe.top_k"] > flat["moe.experts"]:
        raise RecipeError(f"{source}: key 'moe.top_k' ({flat['moe.top_k']}) exceeds moe.experts ({flat['moe.experts']})")
    return {k: flat.get(k, copy.deepcopy(f.default)) for k, f in fields.items()}


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def locked_digest(flat: dict[str, object]) -> str:
    """sha256 over the locked keys and values of a validated recipe: independent of key order and of
    how the YAML was written (ints and floats that are equal hash alike)."""
    canonical = {k: float(v) if _number(v) else v for k, v in flat.items() if k in LOCKED}
    canonical = {k: [float(x) if _number(x) else x for x in v] if isinstance(v, list) else v
                 for k, v in canonical.items()}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def parse(text: str, source: str = "<recipe>") -> dict[str, object]:
    """YAML text -> a validated flat recipe."""
    import yaml
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise RecipeError(f"{source}: not valid YAML ({e})") from None
    return validate(tree, source)


def read(path: str | Path) -> dict[str, object]:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise RecipeError(f"{path}: cannot read the recipe ({e})") from None
    return parse(text, str(path))


def dump(flat: dict[str, object]) -> str:
    """A flat recipe as YAML (nested, in schema order)."""
    import yaml
    return yaml.safe_dump(nest(flat), sort_keys=False)


def load(name: str) -> dict[str, object]:
    """A shipped recipe, checksummed (claimbench.inputs)."""
    if name not in JOBS:
        raise RecipeError(f"unknown recipe {name!r}; shipped: {', '.join(JOBS)}")
    return read(inputs.path(f"recipes/{name}"))
