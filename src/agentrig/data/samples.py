"""Canonical training samples and the conversion from episodes: cleaning rules, call normalization, windows.

A `Sample` is OpenAI-style messages, the offered tools as a JSON string, one loss weight per message
(assistant turns carry their step's weight, 0 for detours; every other message 0) and metadata. One
episode gives one sample per memory state: the steps between two memory compressions share one prompt
prefix, so they train together; each later sample starts from `context_at` (the system prompt with the
memory area, the task, the recent turns). When a stretch is longer than the token limit, `window_episode`
adds the compressions the harness itself would make under a context budget (`agentrig.harness.memory`'s
`compress_point` and `extractive_summary`), so the sample shows exactly what inference would show.

Cleaning (seed 3.2, 4.1): `keep_reason` keeps verified successes (recoveries included) and labelled
honest failures; `results_mismatch` drops episodes whose tool results do not answer their calls;
`normalize_calls` rewrites every call to the canonical JSON form. Duplicates and the BFCL check are
per sample, in `databuild`. Not handled: episodes of protocols other than the renderer's format.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable

from agentrig.harness.trajectory import Episode, MemoryEvent

SAMPLE_SCHEMA_VERSION = 1
ROLES = ("system", "user", "assistant", "tool")
DEFAULT_KEEP_LAST_TURNS = 2  # HarnessConfig's default, used when an episode does not record its config


@dataclass
class Sample:
    """One training sample: messages, tools (JSON string), per-message loss weights and metadata."""

    sample_id: str
    messages: list[dict[str, Any]]
    tools: str
    weights: list[float]
    metadata: dict[str, Any] = field(default_factory=dict)
    kind: str = "sample"
    schema_version: int = SAMPLE_SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Sample":
        """Build from a dict, checking the schema version, the messages and the tools JSON (ValueError)."""
        if data.get("kind", "sample") != "sample":
            raise ValueError(f"expected kind 'sample', got {data.get('kind')!r}")
        if data.get("schema_version") != SAMPLE_SCHEMA_VERSION:
            raise ValueError(
                f"unknown sample schema version {data.get('schema_version')!r} "
                f"(this agentrig reads version {SAMPLE_SCHEMA_VERSION})"
            )
        for key in ("sample_id", "messages", "tools", "weights"):
            if key not in data:
                raise ValueError(f"sample is missing {key!r}")
        tools = data["tools"]
        if not isinstance(tools, str):
            raise ValueError("'tools' must be a JSON string (one column type for every row)")
        try:
            parsed = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise ValueError(f"'tools' is not valid JSON: {exc}") from None
        if not isinstance(parsed, list):
            raise ValueError("'tools' must be a JSON list of function specs")
        validate_messages(data["messages"])
        weights = data["weights"]
        if not isinstance(weights, list) or len(weights) != len(data["messages"]):
            raise ValueError(f"'weights' must be a list with one number per message ({len(data['messages'])})")
        if not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights):
            raise ValueError("'weights' must hold numbers")
        return cls(
            sample_id=str(data["sample_id"]),
            messages=data["messages"],
            tools=tools,
            weights=[float(w) for w in weights],
            metadata=dict(data.get("metadata") or {}),
        )


# -- schema checks ----------------------------------------------------------------------------


def validate_messages(messages: Any) -> None:
    """Raise ValueError naming the message when the list breaks the OpenAI message schema agentrig uses."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list")
    for i, msg in enumerate(messages):
        where = f"message {i}"
        if not isinstance(msg, dict):
            raise ValueError(f"{where} is not an object")
        role = msg.get("role")
        if role not in ROLES:
            raise ValueError(f"{where} has role {role!r}; expected one of {', '.join(ROLES)}")
        content = msg.get("content")
        if content is not None and not isinstance(content, str):
            raise ValueError(f"{where}: 'content' must be a string")
        if role == "tool":
            for key in ("tool_call_id", "name"):
                if not isinstance(msg.get(key), str):
                    raise ValueError(f"{where}: a tool message needs a string {key!r}")
        calls = msg.get("tool_calls")
        if calls is None:
            continue
        if role != "assistant" or not isinstance(calls, list):
            raise ValueError(f"{where}: 'tool_calls' must be a list on an assistant message")
        for j, call in enumerate(calls):
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(call.get("id"), str):
                raise ValueError(f"{where}, call {j}: expected {{id, type: function, function: {{name, arguments}}}}")
            if not isinstance(fn.get("arguments"), str):
                raise ValueError(f"{where}, call {j}: 'arguments' must be a JSON string")
            try:
                args = json.loads(fn["arguments"])
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}, call {j}: 'arguments' is not valid JSON: {exc}") from None
            if not isinstance(args, dict):
                raise ValueError(f"{where}, call {j}: 'arguments' must encode a JSON object")


def step_starts(episode: Episode) -> list[int]:
    """Index in `messages_full` of each step's assistant message, checked against the steps.

    Raises ValueError when the messages and steps disagree. Sets `metadata["step_message_index"]`
    (what `context_at` reads) when an episode from elsewhere lacks it.
    """
    validate_messages(episode.messages_full)
    msgs = episode.messages_full
    if len(msgs) < 2 or msgs[0]["role"] != "system" or msgs[1]["role"] != "user":
        raise ValueError("messages_full must start with the system prompt and the user's task")
    starts = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if len(starts) != len(episode.steps):
        raise ValueError(f"{len(starts)} assistant messages for {len(episode.steps)} steps")
    recorded = episode.metadata.get("step_message_index")
    if recorded is None:
        episode.metadata["step_message_index"] = starts
    elif list(recorded) != starts:
        raise ValueError(f"metadata.step_message_index {recorded} does not match the assistant messages {starts}")
    return starts


# -- cleaning ---------------------------------------------------------------------------------


def is_honest_failure(episode: Episode) -> bool:
    """An unsuccessful episode labelled as an honest failure (the agent said what could not be done).

    The label is `check["honest_failure"]` (set by an environment's checker) or
    `metadata["label"] == "honest_failure"` (set by a person or a labelling pass).
    """
    return bool(episode.check.get("honest_failure")) or episode.metadata.get("label") == "honest_failure"


def keep_reason(episode: Episode) -> tuple[bool, str]:
    """Whether to train on an episode, and why: success / recovered / honest_failure, or failed / unverified."""
    if episode.success:
        return True, "recovered" if episode.recovered else "success"
    if is_honest_failure(episode):
        return True, "honest_failure"
    return False, "unverified" if episode.success is None else "failed"


def results_mismatch(episode: Episode) -> str | None:
    """Why the tool results do not belong to their calls, or None when every call has exactly its result."""
    msgs = episode.messages_full
    i = 0
    while i < len(msgs):
        msg = msgs[i]
        if msg["role"] == "tool":
            return f"message {i}: tool result {msg.get('tool_call_id')!r} follows no call"
        calls = msg.get("tool_calls") or [] if msg["role"] == "assistant" else []
        for j, call in enumerate(calls):
            k = i + 1 + j
            if k >= len(msgs) or msgs[k]["role"] != "tool":
                return f"message {i}: call {call['id']!r} has no tool result"
            if msgs[k]["tool_call_id"] != call["id"] or msgs[k]["name"] != call["function"]["name"]:
                return (
                    f"message {k}: result for {msgs[k]['tool_call_id']!r} ({msgs[k]['name']}) "
                    f"answers call {call['id']!r} ({call['function']['name']})"
                )
        i += 1 + len(calls)
    for step in episode.steps:
        if [r.call_id for r in step.results] != [c.id for c in step.calls]:
            return f"step {step.index}: results {[r.call_id for r in step.results]} for calls {[c.id for c in step.calls]}"
    return None


def normalize_calls(episode: Episode) -> int:
    """Rewrite every call to the canonical form in place; return how many calls changed.

    Canonical: argument keys in the tool schema's property order (unknown keys after, sorted), encoded by
    `json.dumps(..., ensure_ascii=False)` with default separators; both `messages_full` and the steps'
    parsed calls. Calls to tools that were not offered keep their key order, as the harness shows them.
    """
    from agentrig.harness.protocol import canonical_arguments

    schemas = {t["function"]["name"]: t["function"].get("parameters", {}) for t in episode.tools if "function" in t}
    changed = 0
    for msg in episode.messages_full:
        for call in msg.get("tool_calls") or []:
            fn = call["function"]
            args = json.loads(fn["arguments"])
            if fn["name"] in schemas:
                args = canonical_arguments(args, schemas[fn["name"]])
            text = json.dumps(args, ensure_ascii=False)
            if text != fn["arguments"]:
                fn["arguments"] = text
                changed += 1
    for step in episode.steps:
        for call in step.calls:
            if call.name in schemas:
                call.arguments = canonical_arguments(call.arguments, schemas[call.name])
    return changed


# -- windows ----------------------------------------------------------------------------------


def keep_last_turns(episode: Episode) -> int:
    """The harness's `keep_last_turns` as recorded with the episode (the default when not recorded)."""
    return int((episode.metadata.get("harness") or {}).get("keep_last_turns", DEFAULT_KEEP_LAST_TURNS))


def memory_groups(episode: Episode) -> list[list[int]]:
    """Steps grouped by the memory state their prompt shows (consecutive steps between compressions)."""
    groups: list[list[int]] = []
    last: tuple[int, ...] | None = None
    for i in range(len(episode.steps)):
        state = tuple(k for k, e in enumerate(episode.memory_events) if e.before_step <= i)
        if state != last:
            groups.append([])
            last = state
        groups[-1].append(i)
    return groups


def window_episode(episode: Episode, fits: Callable[[int, Episode], bool]) -> Episode:
    """A copy of the episode with the budget compressions the harness would make so every step fits.

    `fits(i, episode)` says whether step i's prompt plus its assistant turn fit the token limit. For each
    step that does not fit, the finished turns before it are compressed exactly as the harness's context
    budget does (`compress_point`, `extractive_summary`), keeping the configured number of recent turns,
    and fewer only while that is still too long. A step that fits in no way is left as it is (the build's
    length check names it).
    """
    from agentrig.harness.memory import compress_point, extractive_summary

    ep = replace(episode, memory_events=list(episode.memory_events))
    starts = ep.metadata["step_message_index"]
    for i in range(len(ep.steps)):
        if fits(i, ep):
            continue
        context_start = max([2] + [e.upto_message for e in ep.memory_events if e.before_step <= i])
        finished = ep.messages_full[: starts[i]]
        for keep in range(keep_last_turns(ep), -1, -1):
            cut = compress_point(finished, context_start, keep)
            if cut is None or cut <= context_start:
                continue
            event = MemoryEvent(extractive_summary(finished[context_start:cut]), cut, i, "token_budget", True)
            trial = replace(ep, memory_events=sorted(ep.memory_events + [event], key=lambda e: e.before_step))
            if fits(i, trial) or keep == 0:
                ep = trial
                break
    return ep


def message_weights(messages: list[dict[str, Any]], step_weights: dict[int, float]) -> list[float]:
    """Per-message weights: `step_weights[k]` for the assistant message at k, 0.0 for every other message."""
    return [step_weights.get(k, 0.0) if m["role"] == "assistant" else 0.0 for k, m in enumerate(messages)]


def episode_metadata(episode: Episode, reason: str) -> dict[str, Any]:
    """The sample metadata of an episode: environment, family, split, faults, outcome, detours."""
    return {
        "episode_id": episode.episode_id,
        "task_id": episode.task.id,
        "env": episode.task.env,
        "family": episode.task.family,
        "split": episode.task.split,
        "faults": list(episode.faults),
        "success": episode.success,
        "recovered": episode.recovered,
        "kept_as": reason,
        "detours": episode.detours,
        "steps": len(episode.steps),
        "termination": episode.termination,
    }


def episode_samples(episode: Episode, reason: str, *, context_at: Any) -> list[tuple[Sample, list[int]]]:
    """One sample per memory group, each with the step indexes it trains (weights from the steps).

    A sample is `context_at(first step of the group)` followed by the full messages up to the group's
    last assistant turn; its tool results and feedback after that turn are not part of it.
    """
    starts = episode.metadata["step_message_index"]
    groups = memory_groups(episode)
    tools = json.dumps(episode.tools, ensure_ascii=False)
    out: list[tuple[Sample, list[int]]] = []
    for g, steps in enumerate(groups):
        head = context_at(episode, steps[0])
        body = episode.messages_full[starts[steps[0]] : starts[steps[-1]] + 1]
        messages = head + body
        offset = len(head) - starts[steps[0]]
        weights = message_weights(messages, {starts[i] + offset: episode.steps[i].weight for i in steps})
        meta = episode_metadata(episode, reason)
        meta.update(
            window=g,
            windows=len(groups),
            window_steps=steps,
            memory=sum(1 for e in episode.memory_events if e.before_step <= steps[0]),
        )
        sample_id = episode.episode_id if len(groups) == 1 else f"{episode.episode_id}#w{g}"
        out.append((Sample(sample_id, messages, tools, weights, meta), steps))
    return out
