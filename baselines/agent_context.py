"""What agents do with a growing context, as the cache-engineering paper's baselines (PAPERS.md A3).

FullHistory: every turn appended; the previous prompt is always a cached prefix.
ThresholdSummarization: once the context passes `threshold` of the window, the history after the
task is replaced by a summary the model writes (one extra call); the prompt after the task is new
and must be prefilled and written to the cache again.
ObservationMasking: tool outputs older than the `keep_last` most recent are replaced in the text
by a short placeholder; each newly masked output edits the text, so the cache is invalid from it on.
"""
from __future__ import annotations

from dataclasses import dataclass

from claimbench.agentcost import bill, history, old_tool_outputs
from claimbench.interfaces import ContextPolicy, Segment


@dataclass
class FullHistory(ContextPolicy):
    name = "full-history"

    def prompt(self, traj, upto, state):
        return history(traj, upto)


@dataclass
class ThresholdSummarization(ContextPolicy):
    threshold: float = 0.8
    summary_tokens: int = 2_000
    head_turns: int = 2  # system prompt and task stay verbatim
    name = "threshold-summarization"

    def prompt(self, traj, upto, state):
        since = state.get("since")
        turns = history(traj, upto)
        if since is None:
            return turns
        return turns[:self.head_turns] + [Segment(("summary", state["n"]), self.summary_tokens)] + turns[since:]

    def before_call(self, traj, upto, state, prompt, window, min_cacheable, previous):
        context = sum(s.tokens for s in prompt)
        if context <= self.threshold * window:
            return prompt, previous, []
        summary_call = bill(previous, prompt, self.summary_tokens, min_cacheable, kind="summary")
        state["since"], state["n"] = upto, state.get("n", 0) + 1
        return self.prompt(traj, upto, state), prompt, [summary_call]


@dataclass
class ObservationMasking(ContextPolicy):
    keep_last: int = 12
    placeholder_tokens: int = 10
    name = "observation-masking"

    def prompt(self, traj, upto, state):
        masked = old_tool_outputs(traj, upto, self.keep_last)
        return [Segment(s.key, self.placeholder_tokens, version=1) if s.key in masked else s
                for s in history(traj, upto)]
