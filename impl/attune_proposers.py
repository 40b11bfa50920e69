"""ATTUNE's proposers beside grid search (PAPERS.md B1). Neither imports the gate or the tuner.

- ProfilerGuided: reads the best recipe's profile (time per phase, padding share, torch.profiler's
  top operators) and proposes the one knob change that attacks the largest bottleneck, greedily
  from the best so far; a change that was tried is not proposed again. Its rules (which knob attacks
  which bottleneck, and the share each is credited with) are ours: reconstructed, since the paper's
  tuner is a coding agent reading profiles.
- ExternalCommand: hands a copy of the best recipe to any program (a coding-agent CLI, a script) in
  a scratch folder and reads the edited copy back. No coding agent runs offline here; the shipped
  example is a script (`python -m claimbench.impl.attune_scripted_proposer {dir}`).
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from claimbench.datasets import recipes
from claimbench.interfaces import ProposerFailed, RecipeProposer

_CATEGORIES = {  # torch operator name fragments -> the bottleneck they belong to
    "dispatch": ("nonzero", "index_add", "index_select", "argsort", "sort", "bincount", "repeat_interleave",
                 "index_put", "scatter", "gather", "aten::index"),
    "optimizer": ("adam", "_foreach", "optimizer"),
    "matmul": ("mm", "matmul", "linear", "addmm", "bmm"),
}


def operator_shares(profile: dict | None) -> dict[str, float]:
    """Share of profiled self CPU time per bottleneck category (first matching category wins)."""
    shares = dict.fromkeys(_CATEGORIES, 0.0)
    for op in (profile or {}).get("top", []):
        name = op["name"].lower()
        for category, fragments in _CATEGORIES.items():
            if any(f in name for f in fragments):
                shares[category] += op["share"]
                break
    return shares


def bottlenecks(best: dict, timing: dict, cores: int) -> list[tuple[float, str, dict]]:
    """(credited share of step time, bottleneck, knob change that attacks it), largest first."""
    phases = timing["phases"]
    total = sum(phases.values()) or 1.0
    share = {k: v / total for k, v in phases.items()}
    compute = share["forward"] + share["backward"]
    ops = operator_shares(timing.get("profile"))
    out = []
    if best["runtime.optimizer_impl"] != "fused":
        out.append((share["optimizer"], "optimizer step", {"runtime.optimizer_impl": "fused"}))
    if best["runtime.activation_checkpointing"]:
        out.append((share["forward"], "forward recomputed in backward", {"runtime.activation_checkpointing": False}))
    if not best["runtime.packing"] and best["runtime.micro_batch_rows"] > 1:
        out.append((timing["padding_share"] * compute, "padding", {"runtime.packing": True}))
    if best.get("moe.dispatch") == "loop":
        out.append((ops["dispatch"] * compute, "expert dispatch", {"moe.dispatch": "sorted"}))
        out.append((0.8 * ops["dispatch"] * compute, "expert dispatch", {"moe.dispatch": "padded-bmm"}))
    if best["runtime.micro_batch_rows"] < 8:  # small matmuls: per-call overhead outside the matmul kernels
        bigger = best["runtime.micro_batch_rows"] * 2
        change = {"runtime.micro_batch_rows": bigger, **({} if best["runtime.packing"] else {"runtime.packing": True})}
        out.append(((1 - ops["matmul"]) * compute * 0.5, "small micro-batches", change))
    if share["data"] > 0.02 and best["runtime.loader_workers"] == 0:
        out.append((share["data"], "data loading", {"runtime.loader_workers": 1}))
    used = best["runtime.threads"] * best["runtime.processes"]
    if used < cores:
        out.append((1 - used / cores, "idle cores", {"runtime.threads": cores // best["runtime.processes"]}))
    if best["runtime.processes"] == 1 and cores >= 2:  # two ranks on one core each: less per-op threading overhead
        out.append(((1 - ops["matmul"]) * compute * 0.3, "threading overhead",
                    {"runtime.processes": 2, "runtime.threads": max(1, cores // 2)}))
    if best["runtime.compile"] == "none":
        out.append((0.05 * compute, "operator overhead", {"runtime.compile": "default"}))
    return sorted(out, key=lambda item: -item[0])


@dataclass
class ProfilerGuided(RecipeProposer):
    cores: int
    name = "profiler-guided"
    _tried: list = field(default_factory=list, repr=False)

    def propose(self, start: dict, best: dict, history: list[dict]) -> dict | None:
        timing = _best_timing(best, start, history)
        for _, _, change in bottlenecks(best, timing, self.cores):
            candidate = {**best, **change}
            if candidate != best and candidate not in self._tried:
                self._tried.append(candidate)
                return candidate
        return None


def _best_timing(best: dict, start: dict, history: list[dict]) -> dict:
    """The profile of the trial that produced `best` (the starting recipe's when nothing beat it)."""
    target = {k: v for k, v in best.items() if start.get(k) != v}
    for trial in reversed(history):
        if trial.get("profile") and trial["changes"] == target:
            return trial["profile"]
    return next(t["profile"] for t in history if t["proposer"] == "start")


@dataclass
class ExternalCommand(RecipeProposer):
    """`command` runs in a scratch folder ("{dir}" in it is replaced by the folder's path) holding
    recipe.yaml (the best recipe so far, to edit in place), start.yaml and history.json. Exit 0 with
    recipe.yaml edited: the proposal; exit 0 with it unchanged: out of ideas; anything else fails."""
    command: list[str]
    timeout_s: float = 300.0
    name: str = "external"

    def propose(self, start: dict, best: dict, history: list[dict]) -> dict | None:
        with tempfile.TemporaryDirectory(prefix="attune-proposer-") as scratch:
            folder = Path(scratch)
            written = recipes.dump(best)
            (folder / "recipe.yaml").write_text(written)
            (folder / "start.yaml").write_text(recipes.dump(start))
            (folder / "history.json").write_text(json.dumps(history, default=str))
            argv = [part.replace("{dir}", scratch) for part in self.command]
            try:
                done = subprocess.run(argv, cwd=scratch, capture_output=True, text=True, timeout=self.timeout_s,
                                      stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                raise ProposerFailed("timeout", f"{argv[0]} gave no answer within {self.timeout_s:.0f}s") from None
            except OSError as e:
                raise ProposerFailed("crashed", f"{argv[0]} did not start: {e}") from None
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
                raise ProposerFailed("crashed", f"{argv[0]} exited with {done.returncode}: {tail[0]}")
            edited = folder / "recipe.yaml"
            text = edited.read_text() if edited.exists() else ""
            if text == written:
                return None
            try:
                return recipes.parse(text, f"recipe.yaml from {argv[0]}")
            except recipes.RecipeError as e:
                raise ProposerFailed("invalid", str(e)) from None


def scripted_example(timeout_s: float = 60.0) -> ExternalCommand:
    """The shipped external proposer: a script, standing in for a coding agent."""
    return ExternalCommand([sys.executable, "-m", "claimbench.impl.attune_scripted_proposer", "{dir}"], timeout_s,
                           name="external script")
