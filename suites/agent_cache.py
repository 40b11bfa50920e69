"""Cache engineering for agents vs threshold summarization (PAPERS.md A3).

Cost: generated agent trajectories (defaults in datasets/agent_trajectories.py) replayed under
every policy and priced with each provider's published prompt-caching prices
(datasets/provider_prices.toml): cost per task, KV drop's cost change vs threshold summarization,
and the share of cost spent reading the cache; a sweep over K.
Gate: the same mechanism on SmolLM2-135M. Multi-turn tool sessions whose final question needs a
fact from a recent or an old tool output, answered with full history, KV drop (through the cache's
drop hook), text-level observation masking and an extractive summary (the first sentence of each
tool output, kept verbatim: our choice, the model is too small to summarize). KV drop's accuracy on
recent-output questions, relative to full history, is the gate of the cost claim.
Pass rates on real agent benchmarks need a strong LLM: not testable offline.
"""
import logging

from claimbench import agentcost, evidence, intervals, metrics
from claimbench.baselines.agent_context import FullHistory, ObservationMasking, ThresholdSummarization
from claimbench.datasets import agent_trajectories
from claimbench.impl.agent_cache import KVDrop

from . import common

QUICK = common.QUICK
log = logging.getLogger(__name__)
QUICK_BUDGET_S = 270  # seconds in quick mode on 2 cores (215 s in a fresh clone's make run)
INPUTS = ("corpus", "smollm2-135m")  # tool outputs' filler text; the gate's model
WINDOW = 128_000
TASKS = 10 if QUICK else 50
PROVIDERS = [p.name for p in agentcost.load_prices()]
POLICIES = {"full-history": FullHistory(), "threshold-summarization": ThresholdSummarization(),
            "observation-masking": ObservationMasking(), "kv-drop": KVDrop()}
K_SWEEP = [2, 4, 8, 12, 16, 24, 32]
SESSIONS = 1 if QUICK else 10


def costs(policies: dict, tasks: int = TASKS) -> dict:
    """Per (policy, provider): [mean cost per task, mean cache-read share, cost per task, share per
    task] (tasks in seed order, the same trajectories for every policy)."""
    prices = agentcost.load_prices()
    per_task = {}
    for seed in range(tasks):
        traj = agent_trajectories.generate(agent_trajectories.GeneratorParams(), seed)
        for name, policy in policies.items():
            s = agentcost.summarize(policy, traj, prices, WINDOW)
            for p in prices:
                cost, share = per_task.setdefault((name, p.name), ([], []))
                cost.append(s.cost[p.name]["total"])
                share.append(s.read_share(p.name))
    return {key: [sum(c) / tasks, sum(sh) / tasks, c, sh] for key, (c, sh) in per_task.items()}


class Cost:
    params = (list(POLICIES), PROVIDERS)
    param_names = ["policy", "provider"]
    timeout = 1200

    def setup_cache(self):
        return costs(POLICIES)

    def track_cost_per_task(self, r, policy, provider):
        return r[policy, provider][0]
    track_cost_per_task.unit = metrics.USD.unit

    def track_cache_read_share(self, r, policy, provider):
        return 100 * r[policy, provider][1]
    track_cache_read_share.unit = metrics.PERCENT_SHARE.unit


class KSweep:
    params = (K_SWEEP,)
    param_names = ["keep_last"]
    timeout = 1200

    def setup_cache(self):
        sweep = costs({k: KVDrop(keep_last=k) for k in K_SWEEP} | {"summary": ThresholdSummarization()})
        return {k: 100 * (sweep[k, "anthropic"][0] / sweep["summary", "anthropic"][0] - 1) for k in K_SWEEP}

    def track_cost_change_vs_summarization(self, r, keep_last):
        return r[keep_last]
    track_cost_change_vs_summarization.unit = metrics.PERCENT_CHANGE.unit


def session_accuracy(sessions: int = SESSIONS, keep_last: int = 12, n_outputs: int = 20) -> dict:
    """Per (policy, 'recent' | 'old'): whether each tool session's question was answered right, with the
    real model (the same sessions, in seed order, for every policy)."""
    from claimbench.impl.agent_cache import KVDropSession
    from claimbench.llm.evaluate import generate

    model, tok, eos = common.smollm2()

    def chat(kind, text):
        role = {"tool_call": "assistant", "tool_output": "tool"}.get(kind, kind)
        return f"<|im_start|>{role}\n{text}<|im_end|>\n"

    def ask(question, prefix):
        return f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n{prefix}"

    def answer_text(prompt_ids):
        return tok.decode(generate(model, prompt_ids, 12, eos))

    scores = {}
    for seed in range(sessions):
        log.info("agent-cache: session %d of %d, a recent and an old question under each policy", seed + 1, sessions)
        session = agent_trajectories.tool_session(seed, n_outputs)
        outputs = [i for i, (kind, _) in enumerate(session.turns) if kind == "tool_output"]
        old = set(outputs[:-keep_last])
        for label, which in (("recent", n_outputs - 1 - seed % keep_last), ("old", seed % (n_outputs - keep_last))):
            question, prefix, expected = session.question(which)
            texts = {
                "full-history": [chat(k, t) for k, t in session.turns],
                "observation-masking": [chat(k, "[output omitted]" if i in old else t)
                                        for i, (k, t) in enumerate(session.turns)],
                "threshold-summarization": session_summary(session, chat),
            }
            for policy, parts in texts.items():
                out = answer_text(tok.encode("".join(parts) + ask(question, prefix)).ids)
                scores.setdefault((policy, label), []).append(expected in out)
            live = KVDropSession(model, keep_last=keep_last)
            for kind, text in session.turns:
                live.add(kind, tok.encode(chat(kind, text)).ids)
            out = tok.decode(live.answer(tok.encode(ask(question, prefix)).ids, 12, eos))
            scores.setdefault(("kv-drop", label), []).append(expected in out)
    return scores


def session_summary(session, chat) -> list[str]:
    """Head turns verbatim, then one extractive summary: the first sentence of every tool output."""
    firsts = [text.split(". ")[0].rstrip(".") + "." for kind, text in session.turns if kind == "tool_output"]
    return [chat(k, t) for k, t in session.turns[:2]] + [chat("user", "Summary of the work so far: " + " ".join(firsts))]


class Claim:
    """KV drop's cost change vs threshold summarization (claim: -27.7%) and the cache-read share
    under full history (claim: up to 82.4%), gated on the mechanism's accuracy on the real model
    (computed once here, reported per provider row alike)."""
    params = (PROVIDERS,)
    param_names = ["provider"]
    timeout = 3600

    def setup_cache(self):
        return {"cost": costs({k: POLICIES[k] for k in ("full-history", "threshold-summarization", "kv-drop")}),
                "accuracy": session_accuracy()}

    @evidence.estimate
    def track_cost_change_vs_summarization(self, r, provider):
        """100 x (KV drop's mean cost / summarization's - 1), paired bootstrap over the same tasks."""
        common.check_gate("agent_cache.Claim.track_cost_change_vs_summarization",
                          self.track_recent_accuracy_vs_full(r, provider),
                          "KV drop lost accuracy on recent tool outputs: its cost does not count")
        c = r["cost"]
        pairs = list(zip(c["kv-drop", provider][2], c["threshold-summarization", provider][2]))
        return intervals.bootstrap(pairs, lambda xs: 100 * (sum(a for a, _ in xs) / sum(b for _, b in xs) - 1),
                                   [100 * (a / b - 1) for a, b in pairs])
    track_cost_change_vs_summarization.unit = metrics.PERCENT_CHANGE.unit

    @evidence.estimate
    def track_cache_read_share_full_history(self, r, provider):
        shares = r["cost"]["full-history", provider][3]
        return intervals.bootstrap(shares, lambda xs: 100 * sum(xs) / len(xs), [100 * x for x in shares])
    track_cache_read_share_full_history.unit = metrics.PERCENT_SHARE.unit

    @evidence.estimate
    def track_recent_accuracy_vs_full(self, r, provider):
        """KV drop's accuracy on the recent-output questions over full history's (the cost claim's gate),
        paired bootstrap over the same sessions."""
        sessions = list(zip(r["accuracy"]["kv-drop", "recent"], r["accuracy"]["full-history", "recent"]))
        return intervals.bootstrap(sessions, lambda xs: sum(k for k, _ in xs) / max(sum(f for _, f in xs), 1e-9))
    track_recent_accuracy_vs_full.unit = metrics.ACCURACY_RATIO.unit


for policy in POLICIES:
    for about in ("recent", "old"):
        common.add_estimate_track(
            Claim, f"accuracy_{policy.replace('-', '_')}_{about}",
            f"Share of the {about}-output questions answered right under {policy}, Wilson interval over the sessions.",
            metrics.ACCURACY.unit, lambda self, r, provider, key=(policy, about): intervals.rate(r["accuracy"][key]))
