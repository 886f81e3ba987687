"""Episode records: typed dataclasses with a schema version, exact JSONL round-trips, and a flat view.

An `Episode` holds everything needed to reproduce what the model saw at every step: the task, the
tools offered, the system prompt, and per step the raw policy output, parsed calls, repairs, defects,
tool results (with timings and injected faults), harness notices and memory compressions.
`agentrig.harness.transcript.context_at(episode, i)` rebuilds the exact prompt of step i from these records.
Plain dicts appear only at the JSON edge (`to_dict` / `from_dict`), validated on the way in.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal, get_args

SCHEMA_VERSION = 1

# The one place the failure kinds are listed; the records are typed with them and checked on the way in.
DefectKind = Literal["unparseable_call", "unknown_tool", "not_permitted", "schema_violation",
                     "self_written_response", "empty_output"]
"""A model mistake the harness classified (the feedback template of each is in feedback.json)."""
FaultKind = Literal["timeout", "no_result", "error_503", "error_429", "permission_denied", "truncated", "malformed",
                    "schema_drift"]
"""A fault injected at tool execution (`faults.py`)."""
ToolErrorKind = Literal["exception", "timeout", "not_permitted", "unknown_tool", "schema", "no_result", "error_503",
                        "error_429", "permission_denied", "truncated", "malformed", "hung", "crashed"]
"""Why a tool call failed: the tool raised, timed out, crashed its process or was not started because earlier
calls still hang; the harness refused it; or a fault (schema_drift never fails)."""
Termination = Literal["", "final_answer", "max_steps", "token_budget", "wall_clock", "stuck", "policy_error"]
"""Why an episode ended ("" while it runs)."""
RepairKind = Literal["json_repair", "literal_eval", "key_alias", "bare_json", "arguments_string", "unclosed_block"]
"""A lenient-parse repair the protocol applied (`protocol.py`); every kind it writes must be listed here."""
MemoryReason = Literal["note", "token_budget"]


class RecordError(ValueError):
    """A record that does not match the episode schema; the message names the file and line."""


@dataclass
class ToolCall:
    """One parsed tool call, arguments as a dict (canonical JSON is produced when rendering)."""

    id: str
    name: str
    arguments: dict[str, Any]


@dataclass
class Repair:
    """A lenient-parse repair applied to the model's output (recorded, then re-validated)."""

    kind: RepairKind
    before: str
    after: str


@dataclass
class FieldError:
    """One schema violation: where, what the schema expected, what was given."""

    path: str
    expected: str
    given: str


@dataclass
class Defect:
    """A classified model mistake."""

    kind: DefectKind
    message: str  # the feedback text the model was shown
    call_id: str | None = None
    tool: str | None = None
    fields: list[FieldError] = field(default_factory=list)


@dataclass
class ToolResult:
    """The observation for one call: what the model saw, whether the tool succeeded, and how long it took."""

    call_id: str
    name: str
    content: str
    ok: bool
    duration_s: float = 0.0
    fault: FaultKind | None = None  # injected fault kind, if any
    error: ToolErrorKind | None = None  # None when the call succeeded
    truncated: bool = False


@dataclass
class MemoryEvent:
    """A compression: `messages_full[2:upto_message]` leave the context and `summary` joins the memory area.

    `before_step` is the first step whose prompt reflects the compression.
    """

    summary: str
    upto_message: int  # index into the episode's full message list (messages_full)
    before_step: int
    reason: MemoryReason
    extractive: bool = False


@dataclass
class Step:
    """One policy turn and everything the harness did with it."""

    index: int
    raw_output: str
    text: str  # free text the model said (outside tool-call blocks)
    calls: list[ToolCall] = field(default_factory=list)
    repairs: list[Repair] = field(default_factory=list)
    defects: list[Defect] = field(default_factory=list)
    results: list[ToolResult] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    is_final: bool = False
    weight: float = 1.0  # 0.0 marks a detour step that training must not imitate
    prompt_tokens: int = 0
    completion_tokens: int = 0
    policy_s: float = 0.0


@dataclass
class TaskSpec:
    """The task as the harness saw it. `expected` is the checker's data (never shown to the model)."""

    id: str
    prompt: str
    env: str = ""
    family: str = ""
    split: str = ""
    allowed_tools: list[str] = field(default_factory=list)
    expected: dict[str, Any] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class Episode:
    """A whole episode. `messages_full` is the uncompressed OpenAI-style conversation."""

    episode_id: str
    task: TaskSpec
    protocol: str
    system_prompt: str
    tools: list[dict[str, Any]]  # OpenAI function specs as offered
    steps: list[Step] = field(default_factory=list)
    messages_full: list[dict[str, Any]] = field(default_factory=list)
    memory_events: list[MemoryEvent] = field(default_factory=list)
    termination: Termination = ""
    final_answer: str | None = None
    success: bool | None = None
    check: dict[str, Any] = field(default_factory=dict)
    tool_failures: dict[str, int] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    seed: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION

    # -- derived views -------------------------------------------------------------------
    @property
    def detours(self) -> int:
        """Number of steps marked as detours (weight 0)."""
        return sum(1 for s in self.steps if s.weight == 0.0)

    @property
    def recovered(self) -> bool:
        """The one definition of "recovered": at least one injected fault, and the episode still succeeded.

        The metrics' recovery rate (`evals.metrics.recovery_rate`), collection's counts and the data's
        `recovered` label all read this. The model's own failed calls are measured apart (tool-call success,
        invalid calls), so a rate over injected faults compares runs with the same fault seed.
        """
        return bool(self.success) and bool(self.faults)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Episode":
        """Build from a dict, checking the schema version and required fields."""
        if not isinstance(data, dict):
            raise RecordError(f"an episode must be a JSON object, got {type(data).__name__}")
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise RecordError(
                f"unknown episode schema version {version!r} (this agentrig reads version {SCHEMA_VERSION})"
            )
        try:
            steps = [_step_from_dict(s) for s in data.get("steps", [])]
            task = TaskSpec(**data["task"])
            memory = [MemoryEvent(**m) for m in data.get("memory_events", [])]
            fields_ = {k: v for k, v in data.items() if k not in ("steps", "task", "memory_events")}
            episode = cls(task=task, steps=steps, memory_events=memory, **fields_)
        except (KeyError, TypeError) as exc:
            raise RecordError(f"episode does not match the schema: {exc}") from None
        _check_kinds(episode)
        return episode


def _check_kinds(episode: Episode) -> None:
    """Every kind in the record is one of its Literal's values; the message names the field and the value."""
    checks: list[tuple[str, Any, Any]] = [("termination", episode.termination, Termination)]
    checks += [("memory_events.reason", m.reason, MemoryReason) for m in episode.memory_events]
    for s in episode.steps:
        checks += [("defects.kind", d.kind, DefectKind) for d in s.defects]
        checks += [("repairs.kind", r.kind, RepairKind) for r in s.repairs]
        checks += [("results.error", r.error, ToolErrorKind) for r in s.results if r.error is not None]
        checks += [("results.fault", r.fault, FaultKind) for r in s.results if r.fault is not None]
    for name, value, kind in checks:
        if value not in get_args(kind):
            raise RecordError(f"episode {episode.episode_id}: {name} {value!r} is not one of {', '.join(map(repr, get_args(kind)))}")


def _step_from_dict(d: dict[str, Any]) -> Step:
    d = dict(d)
    d["calls"] = [ToolCall(**c) for c in d.get("calls", [])]
    d["repairs"] = [Repair(**r) for r in d.get("repairs", [])]
    d["defects"] = [
        Defect(**{**x, "fields": [FieldError(**f) for f in x.get("fields", [])]}) for x in d.get("defects", [])
    ]
    d["results"] = [ToolResult(**r) for r in d.get("results", [])]
    return Step(**d)


# -- JSONL I/O -------------------------------------------------------------------------------


def dumps_episode(episode: Episode) -> str:
    """One JSONL line (no trailing newline)."""
    return json.dumps(episode.to_dict(), ensure_ascii=False, separators=(",", ":"))


def write_episodes(path: str | Path, episodes: list[Episode], append: bool = False) -> None:
    """Write episodes one per line, flushed and fsynced."""
    with open(path, "a" if append else "w", encoding="utf-8") as fh:
        for ep in episodes:
            fh.write(dumps_episode(ep) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def iter_episodes(path: str | Path, skip_truncated_tail: bool = False) -> Iterator[Episode]:
    """Read episodes; a bad line raises RecordError naming file and line.

    With `skip_truncated_tail`, a last line without its newline (a torn write) is skipped silently.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        lines = fh.read().split(b"\n")
    last = len(lines) - 1  # lines[last] is b"" when the file ends with a newline
    for lineno, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        torn = lineno - 1 == last  # no newline after it
        try:
            data = json.loads(raw.decode("utf-8"))
            yield Episode.from_dict(data)
        except (UnicodeDecodeError, json.JSONDecodeError, RecordError) as exc:
            if torn and skip_truncated_tail:
                return
            raise RecordError(f"{path}:{lineno}: {exc}") from None


def read_episodes(path: str | Path, skip_truncated_tail: bool = False) -> list[Episode]:
    """All episodes of a JSONL file."""
    return list(iter_episodes(path, skip_truncated_tail=skip_truncated_tail))


# -- flat view -------------------------------------------------------------------------------


def flat_view(episode: Episode) -> dict[str, Any]:
    """The seed's reading view (section 3.2): system, user, observation, action, result, final."""
    actions: list[str] = []
    results: list[str] = []
    observations: list[str] = []
    for step in episode.steps:
        if step.text:
            observations.append(step.text)
        for call in step.calls:
            actions.append(f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)})")
        for res in step.results:
            results.append(res.content)
        observations.extend(step.notices)
    return {
        "system": episode.system_prompt,
        "user": episode.task.prompt,
        "observation": observations,
        "action": actions,
        "result": results,
        "final": episode.final_answer,
    }
