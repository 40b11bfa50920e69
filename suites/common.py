"""What every suite shares: quick mode, the computed-once base, families of track_ methods, the
gate-failure exception and the gates themselves (read from papers.toml, never restated here)."""
import os

from claimbench import evidence, registry, suitelog

QUICK = os.environ.get("CLAIMBENCH_QUICK") == "1"
# progress lines (logging.getLogger(__name__).info) reach `claimbench run` as they happen; asv imports this
# package as `suites`, outside the claimbench loggers
suitelog.configure(__name__.rpartition(".")[0])


class GateFailed(AssertionError):
    """The method failed its quality gate: its speed (or cost) does not count, and asv records the
    benchmark as failed."""


class ComputedOnce:
    """A suite whose setup_cache measures everything once and whose track_ methods read it."""
    rounds = 1
    repeat = 1
    number = 1

    @staticmethod
    def _get(table: dict, key, why: str):
        """table[key], or asv's skip with the reason the suite has no such row."""
        if key not in table:
            from asv_runner.benchmarks.mark import SkipNotImplemented
            raise SkipNotImplemented(why)
        return table[key]


def add_tracks(cls, tracks: dict, unit: str) -> None:
    """Add one track_<name> method per entry (name -> function(self, result, *params)), all in one unit."""
    for name, function in tracks.items():
        function.unit = unit
        function.__name__ = f"track_{name}"
        setattr(cls, function.__name__, function)


def add_estimate_track(cls, name: str, doc: str, unit: str, estimate) -> None:
    """Add track_<name> to cls: estimate(self, result, *params), an Estimate whose interval it records
    (named first: evidence.estimate reads the name, and the suite's module, when it wraps the track)."""
    def track(self, r, *params):
        return estimate(self, r, *params)
    track.__name__, track.__qualname__, track.__doc__ = f"track_{name}", f"{cls.__name__}.track_{name}", doc
    track.__module__ = cls.__module__
    add_tracks(cls, {name: evidence.estimate(track)}, unit)


def gate(benchmark: str) -> registry.Gate:
    """The gate papers.toml sets on the claim measured by `benchmark`."""
    return registry.load().gate_of(benchmark)


def check_gate(benchmark: str, value: float, failure: str) -> None:
    """Raise GateFailed (with `failure` and the gate) unless value passes the claim's gate."""
    rule = gate(benchmark)
    if not rule.passes(value):
        raise GateFailed(f"{failure} ({rule.benchmark} = {value:.4g}; the gate is {rule.describe()})")


def minilm():
    """all-MiniLM-L6-v2 (model, tokenizer) on every core."""
    import torch

    from claimbench import embedder
    torch.set_num_threads(os.cpu_count() or 1)
    return embedder.load()


def smollm2():
    """SmolLM2-135M (model, tokenizer, eos id) on every core."""
    import torch

    from claimbench.llm import smollm
    torch.set_num_threads(os.cpu_count() or 1)
    return smollm.load()
