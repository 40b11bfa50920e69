"""ATTUNE's gate, tuner and proposers on a tiny MoE recipe (two layers, 4 experts, 256 tokens a step)."""
import ast
import itertools
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from claimbench import measure
from claimbench.baselines.recipe_grid import GridSearch
from claimbench.datasets import recipes
from claimbench.impl import attune, attune_gate, attune_proposers
from claimbench.impl import attune_training as training
from claimbench.interfaces import RecipeProposer
from claimbench.suites import attune as suite

CHECK_TIMEOUT_S = 300  # a tiny run takes seconds: a hung one fails the test in minutes, not the gate's 30
TINY = {"model.dim": 32, "model.layers": 2, "model.heads": 2, "model.kv_heads": 1, "model.ffn_dim": 32,
        "moe.experts": 4, "train.tokens_per_step": 256, "train.sequence_length": 32, "runtime.threads": 1}


def tiny() -> dict:
    return {**recipes.load("moe-lm"), **TINY}


@pytest.fixture(scope="module")
def reference():
    return attune_gate.reference_run(tiny(), 3, CHECK_TIMEOUT_S)


def planted(changes: dict) -> dict:
    """A suite's planted change, scaled to the tiny recipe where the suite's value is its no-op."""
    start = tiny()
    scaled = {"train.tokens_per_step": 128, "train.sequence_length": 16}
    return {**start, **{k: scaled.get(k, v) if start[k] == v else v for k, v in changes.items()}}


def test_steps_hold_exactly_the_global_batch_and_every_target_once():
    recipe = tiny()
    steps = training.steps_of(recipe, 6)
    assert all(sum(s.targets for s in step) == 256 for step in steps)
    seen = [(s.doc, s.start + 1 + i) for step in steps for s in step for i in range(s.targets)]
    assert len(seen) == len(set(seen))
    for packing in (False, True):
        rows = training.rows_of(steps[0], 32, packing)
        assert sorted(id(s) for row in rows for s in row) == sorted(id(s) for s in steps[0])
        assert all(sum(s.targets for s in row) <= 32 for row in rows)


def test_moe_dispatch_implementations_agree_and_capacity_drops():
    import torch
    torch.manual_seed(0)
    layer = training.MoEFeedForward(16, 24, 4, 2)
    x = torch.randn(3, 10, 16)
    outs = {}
    for dispatch in ("loop", "sorted", "padded-bmm"):
        layer.dispatch, layer.kept_pairs = dispatch, 0
        outs[dispatch] = layer(x)
        assert layer.kept_pairs == 60
    assert torch.allclose(outs["loop"], outs["sorted"], atol=1e-6)
    assert torch.allclose(outs["loop"], outs["padded-bmm"], atol=1e-6)
    layer.capacity_factor, layer.kept_pairs = 0.5, 0
    layer(x)
    assert layer.kept_pairs <= 4 * 8 and layer.kept_pairs < 60


@pytest.mark.parametrize("name", list(suite.PLANTED))
def test_every_planted_semantic_change_is_rejected(name, reference):
    candidate = planted(suite.PLANTED[name])
    decision = attune_gate.check(candidate, tiny(), reference, tolerance=1e-5, timeout_s=CHECK_TIMEOUT_S)
    assert not decision.accepted and decision.stage == "static" and decision.reasons


@pytest.mark.parametrize("name", ["capacity factor 1.0 (drops overflow tokens)", "fake-balanced router",
                                  "documents truncated to 256 tokens", "embeddings frozen", "another initialization"])
def test_the_dynamic_check_alone_catches_changes_the_run_shows(name, reference):
    changes = dict(suite.PLANTED[name])
    if "data.truncate_tokens" in changes:
        changes["data.truncate_tokens"] = 20
    decision = attune_gate.check(planted(changes), tiny(), reference, tolerance=1e-5, timeout_s=CHECK_TIMEOUT_S,
                                static=False)
    assert not decision.accepted and decision.stage == "dynamic", decision


def test_every_legitimate_change_is_accepted(reference):
    """Each check runs in a child process of its own: two at a time (one per core here)."""
    def checked(changes: dict, tolerance: float):
        return attune_gate.check({**tiny(), **changes}, tiny(), reference, tolerance, timeout_s=CHECK_TIMEOUT_S)
    with ThreadPoolExecutor(2) as pool:
        probes = pool.map(checked, suite.NOISE_PROBES, itertools.repeat(float("inf")))
        tolerance = attune_gate.tolerance_from_noise([decision.loss_deviation for decision in probes])
        decisions = pool.map(checked, suite.LEGITIMATE.values(), itertools.repeat(tolerance))
        for name, decision in zip(suite.LEGITIMATE, decisions):
            assert decision.accepted, (name, decision)


def test_a_failing_ddp_rank_ends_the_run_with_its_error():
    one_row = {**tiny(), "train.tokens_per_step": 32, "runtime.processes": 2, "runtime.threads": 1}
    status, why = measure.in_child_within(training.run, (one_row, 2), CHECK_TIMEOUT_S)
    assert status == "error" and "fewer rows than runtime.processes" in why, why


class Scripted(RecipeProposer):
    """Proposals from a list: a dict, an exception to raise, or None."""
    name = "scripted"

    def __init__(self, items):
        self.items = list(items)

    def propose(self, start, best, history):
        item = self.items.pop(0) if self.items else None
        if isinstance(item, BaseException):
            raise item
        return None if item is None else {**best, **item}


def make_tuner(reference, budget_s=1e6, clock=None):
    timing = {"tokens_per_s": 100.0, "phases": {"data": 0, "forward": 1, "backward": 1, "optimizer": 1},
              "padding_share": 0.0, "profile": None}
    return attune.RecipeTuner(tiny(), reference, timing, tolerance=1e-4, budget_s=budget_s,
                              **({"clock": clock} if clock else {}))


def test_failing_proposers_are_recorded_and_the_tuner_goes_on(reference, tmp_path):
    hang = attune_proposers.ExternalCommand([sys.executable, "-c", "import time; time.sleep(60)"], timeout_s=1)
    crash = attune_proposers.ExternalCommand([sys.executable, "-c", "raise SystemExit(3)"])
    garbage = attune_proposers.ExternalCommand(["sh", "-c", "echo 'job: [' > recipe.yaml"])
    unknown = attune_proposers.ExternalCommand(["sh", "-c", "echo 'runtime: {turbo: 1}' >> recipe.yaml"])
    statuses = []
    for proposer in (hang, crash, garbage, unknown):
        result = make_tuner(reference).run(proposer, progress=lambda m: None)
        statuses.append(result.trials[0].status)
        assert result.best == tiny() and len(result.trials) == 3  # gives up after max_failures in a row
    assert statuses == ["proposer-timeout", "proposer-crashed", "invalid", "invalid"]
    result = make_tuner(reference).run(Scripted([RuntimeError("boom"), {"train.grad_clip": 0.5},
                                                 {"runtime.optimizer_impl": "fused"}, None]), progress=lambda m: None)
    assert [t.status for t in result.trials] == ["proposer-crashed", "rejected", "accepted"]
    assert "grad_clip" in result.trials[1].reasons[0] and result.trials[2].tokens_per_s > 0


def test_the_budget_is_respected(reference, monkeypatch):
    """Each proposal takes 2 s of a fake clock; no trial starts after the 5 s budget, and a check
    run is given at most what is left of it."""
    now = [0.0]
    timeouts = []

    class Slow(Scripted):
        def propose(self, start, best, history):
            now[0] += 2.0
            return super().propose(start, best, history)

    def child(fn, args, timeout_s):
        timeouts.append((now[0], timeout_s))
        return "timeout", "no result"
    monkeypatch.setattr(measure, "in_child_within", child)
    result = make_tuner(reference, budget_s=5, clock=lambda: now[0]).run(
        Slow([{"runtime.optimizer_impl": "fused"}] * 50), progress=lambda m: None)
    assert [t.status for t in result.trials] == ["rejected", "rejected", "budget"]
    assert timeouts == [(2.0, 3.0), (4.0, 1.0)]


def test_a_proposer_that_patches_the_gate_stops_the_tuning(reference, monkeypatch):
    class Patcher(RecipeProposer):
        name = "patcher"

        def propose(self, start, best, history):
            monkeypatch.setattr(attune_gate, "check", lambda *a, **k: attune_gate.GateDecision(True, "passed"))
            return {**best, "moe.capacity_factor": 1.0}
    with pytest.raises(attune.GateTampered, match="check"):
        make_tuner(reference).run(Patcher(), progress=lambda m: None)


def test_the_gate_refuses_when_its_source_changed(monkeypatch):
    monkeypatch.setattr(attune_gate, "fingerprint", lambda: "edited")
    monkeypatch.setattr(attune, "_GATE_FUNCTIONS", {**attune._GATE_FUNCTIONS, "fingerprint": attune_gate.fingerprint})
    with pytest.raises(attune.GateTampered, match="source"):
        attune.verify_gate()


def test_proposer_modules_never_import_the_gate_or_the_tuner():
    modules = [attune_proposers.__file__, Path(attune_proposers.__file__).with_name("attune_scripted_proposer.py"),
               sys.modules[GridSearch.__module__].__file__]
    for path in modules:
        tree = ast.parse(Path(path).read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not any(name.endswith(("attune_gate", ".attune", "attune_training")) or ".attune_gate." in name
                       or name.startswith("claimbench.impl.attune.") for name in names), (path, names)


def test_profiler_guided_attacks_the_largest_bottleneck_first():
    start = tiny()
    timing = {"phases": {"data": 0.0, "forward": 1.0, "backward": 2.0, "optimizer": 6.0}, "padding_share": 0.0,
              "profile": {"top": []}}
    history = [{"proposer": "start", "changes": {}, "status": "accepted", "profile": timing}]
    first = attune_proposers.ProfilerGuided(cores=2).propose(start, start, history)
    assert first == {**start, "runtime.optimizer_impl": "fused"}
