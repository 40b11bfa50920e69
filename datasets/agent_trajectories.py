"""Agent trajectories as replayable token counts: per turn its role, span kind and token count.

Readers: claimbench's own JSONL (one turn per line), SWE-agent `.traj` files (their `history`),
and OpenHands-style event lists. Text is counted with a tokenizer the caller passes. A bad file
(truncated, unknown role, negative count) raises TrajectoryError naming the file and the line or
item; nothing is half-loaded.

The generator is seeded. Its defaults are reconstructed to sit inside the ranges public agent
logs show (SWE-agent / OpenHands runs on SWE-bench: a few-thousand-token system prompt with tool
descriptions, a few hundred tokens of task, short assistant turns,
tool outputs that are mostly hundreds of tokens with a heavy tail of file dumps and test logs):
they are our choice, not numbers taken from the paper. Calls per task follow the digest's
"hundreds of turns" of tool use.
"""
from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

KINDS = ("system", "user", "assistant", "tool_call", "tool_output")
ROLE_OF_KIND = {"system": "system", "user": "user", "assistant": "assistant", "tool_call": "assistant",
                "tool_output": "tool"}


class TrajectoryError(ValueError):
    """A trajectory file that cannot be read; the message names the file and the line or item."""


@dataclass(frozen=True)
class Turn:
    kind: str
    tokens: int

    @property
    def role(self) -> str:
        return ROLE_OF_KIND[self.kind]

    @property
    def by_model(self) -> bool:
        return self.kind in ("assistant", "tool_call")


@dataclass(frozen=True)
class Trajectory:
    name: str
    turns: tuple[Turn, ...]

    @property
    def calls(self) -> list[int]:
        """Indices of the turns the model produced: each is one model call over all turns before it."""
        return [i for i, t in enumerate(self.turns) if t.by_model]


def _turn(kind: str, tokens, where: str) -> Turn:
    if kind not in KINDS:
        raise TrajectoryError(f"{where}: unknown span kind {kind!r}; known: {', '.join(KINDS)}")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
        raise TrajectoryError(f"{where}: token count must be a non-negative integer, got {tokens!r}")
    return Turn(kind, tokens)


def read_jsonl(path) -> Trajectory:
    """claimbench's format: one JSON object per line, {"kind": ..., "tokens": N} (role optional)."""
    path = Path(path)
    turns = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise TrajectoryError(f"{path}:{n}: not valid JSON (truncated?): {e.msg}") from None
        if not isinstance(item, dict) or "kind" not in item or "tokens" not in item:
            raise TrajectoryError(f"{path}:{n}: expected an object with 'kind' and 'tokens'")
        turn = _turn(item["kind"], item["tokens"], f"{path}:{n}")
        if "role" in item and item["role"] != turn.role:
            raise TrajectoryError(f"{path}:{n}: role {item['role']!r} does not fit kind {turn.kind!r}")
        turns.append(turn)
    return _checked(path, turns)


def write_jsonl(traj: Trajectory, path) -> None:
    Path(path).write_text("".join(json.dumps({"role": t.role, "kind": t.kind, "tokens": t.tokens}) + "\n"
                                  for t in traj.turns))


def _load_json(path: Path):
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise TrajectoryError(f"{path}:{e.lineno}: not valid JSON (truncated?): {e.msg}") from None


def _text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(part.get("text", "") if isinstance(part, dict) else str(part) for part in content)
    return "" if content is None else json.dumps(content)


def read_swe_agent(path, count: Callable[[str], int]) -> Trajectory:
    """A SWE-agent `.traj` file: its `history` of {role, content} messages."""
    path = Path(path)
    data = _load_json(path)
    history = data.get("history") if isinstance(data, dict) else None
    if not isinstance(history, list):
        raise TrajectoryError(f"{path}: no 'history' list: not a SWE-agent trajectory")
    turns, seen_user = [], False
    for i, msg in enumerate(history):
        where = f"{path}: history[{i}]"
        if not isinstance(msg, dict) or "role" not in msg:
            raise TrajectoryError(f"{where}: expected a message with a 'role'")
        role, text = msg["role"], _text(msg.get("content"))
        if role == "system":
            kind = "system"
        elif role == "assistant":
            kind = "tool_call" if msg.get("action") or msg.get("tool_calls") else "assistant"
        elif role == "tool" or (role == "user" and seen_user):
            kind = "tool_output"  # SWE-agent returns observations as user (older) or tool (newer) messages
        elif role == "user":
            kind, seen_user = "user", True
        else:
            raise TrajectoryError(f"{where}: unknown role {role!r}")
        turns.append(_turn(kind, count(text), where))
    return _checked(path, turns)


def read_openhands(path, count: Callable[[str], int]) -> Trajectory:
    """An OpenHands-style event list: [{source: user|agent|environment, action|observation, ...}]."""
    path = Path(path)
    events = _load_json(path)
    if isinstance(events, dict):
        events = events.get("events", events.get("history"))
    if not isinstance(events, list):
        raise TrajectoryError(f"{path}: expected a list of events")
    turns = []
    for i, ev in enumerate(events):
        where = f"{path}: event[{i}]"
        if not isinstance(ev, dict) or "source" not in ev:
            raise TrajectoryError(f"{where}: expected an event with a 'source'")
        source = ev["source"]
        text = _text(ev.get("content") or ev.get("message") or ev.get("args"))
        if source == "user":
            kind = "user"
        elif source == "agent" and "observation" in ev:
            kind = "tool_output"
        elif source == "agent":
            kind = "assistant" if ev.get("action") in (None, "message", "finish") else "tool_call"
        elif source == "environment":
            kind = "tool_output"
        elif source == "system":
            kind = "system"
        else:
            raise TrajectoryError(f"{where}: unknown source {source!r}")
        turns.append(_turn(kind, count(text), where))
    return _checked(path, turns)


def _checked(path: Path, turns: list[Turn]) -> Trajectory:
    if not turns:
        raise TrajectoryError(f"{path}: no turns")
    if not any(t.by_model for t in turns):
        raise TrajectoryError(f"{path}: no model turns (assistant or tool_call): nothing to replay")
    return Trajectory(path.stem, tuple(turns))


@dataclass(frozen=True)
class GeneratorParams:
    """Knobs of generated agent tasks; see the module docstring for where the defaults come from."""
    system_tokens: int = 3_000  # system prompt with tool descriptions
    task_tokens: int = 400  # the issue text
    calls_mean: float = 150.0  # model calls per task: "hundreds of turns" (the paper's digest)
    calls_sd: float = 50.0
    call_tokens_median: float = 120.0  # assistant reasoning + tool call
    output_tokens_median: float = 600.0  # tool outputs: lognormal, heavy tail
    output_tokens_sigma: float = 1.1
    output_tokens_max: int = 16_000


def generate(params: GeneratorParams, seed: int) -> Trajectory:
    rng = random.Random(seed)
    n_calls = max(5, round(rng.gauss(params.calls_mean, params.calls_sd)))
    turns = [Turn("system", params.system_tokens), Turn("user", params.task_tokens)]
    for i in range(n_calls):
        turns.append(Turn("tool_call", max(10, round(rng.lognormvariate(math.log(params.call_tokens_median), 0.5)))))
        if i < n_calls - 1:  # the last call answers; no tool output follows
            size = rng.lognormvariate(math.log(params.output_tokens_median), params.output_tokens_sigma)
            turns.append(Turn("tool_output", int(min(max(size, 5), params.output_tokens_max))))
    return Trajectory(f"generated-{seed}", tuple(turns))


@dataclass(frozen=True)
class ToolSession:
    """A multi-turn tool session in text, for accuracy checks on a real model: every tool output
    holds one fact; questions ask for a fact from a recent output or from an old one."""
    turns: tuple[tuple[str, str], ...]  # (kind, text)
    facts: tuple[tuple[str, str], ...]  # per tool output: (subject, value)

    def question(self, output_index: int) -> tuple[str, str, str]:
        """(question text, answer prefix, expected answer) about one tool output's fact."""
        subject, value = self.facts[output_index]
        return (f"What is the checksum of {subject}? Answer with the number only.",
                f"The checksum of {subject} is", value)


def tool_session(seed: int, n_outputs: int = 20, filler_sentences: int = 4) -> ToolSession:
    """System prompt, a task, then n_outputs (tool call, tool output) pairs; haystack text from the machine."""
    from .longcontext import haystack_sentences
    rng = random.Random(f"tool-session-{seed}")
    pool = haystack_sentences()
    turns = [("system", "You are an assistant that inspects files with tools and reports what they contain."),
             ("user", "Inspect every archive part and keep track of the checksums you see.")]
    facts, used = [], set()
    for j in range(n_outputs):
        subject = f"part {rng.randint(100, 999)}"
        while subject in used:
            subject = f"part {rng.randint(100, 999)}"
        used.add(subject)
        value = str(rng.randint(100_000, 999_999))
        body = [pool[rng.randrange(len(pool))] for _ in range(filler_sentences)]
        body.insert(rng.randint(0, len(body)), f"The checksum of {subject} is {value}.")
        turns += [("tool_call", f"read_archive(name=\"{subject}\")"), ("tool_output", " ".join(body))]
        facts.append((subject, value))
    return ToolSession(tuple(turns), tuple(facts))
