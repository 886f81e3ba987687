"""Running BFCL entries through agentrig's harness: entries become tasks and tools, episodes become scores.

Each BFCL function document becomes a `Tool` (schema from `agentrig.bfcl.types`); the question becomes
the task prompt; the policy answers through the configured protocol, exactly as in training.

- Single-turn categories: tools are not executed; a call gets a fixed "recorded" observation. Two verdicts
  per entry, both by `checker.check_entry`: BFCL's own (`valid`), on the calls of the model's first
  response, as BFCL reads one response per single-turn entry (a parallel answer is several calls in that
  one turn); and the whole episode's (`episode_valid`), on every call the model makes before it replies
  without one (at most SINGLE_TURN_MAX_STEPS), which also fails a model that resends its answer after the
  recorded observation or spreads a parallel answer over several steps.
- multi_turn_base: tools dispatch to the entry's live BFCL backends. Each user turn is one harness
  episode whose context carries the previous turns' messages; a turn ends when the model replies without
  a call. A turn that reaches the step limit force-terminates the entry, as in BFCL. The recorded calls
  are re-executed on fresh backends for scoring (`multi_turn.check_multi_turn`), as BFCL does.

Every parsed call counts, including ones the harness refused (unknown tool, schema violation): BFCL
scores what the model wrote. The built-in `note` tool is not offered (memory off): BFCL tasks offer only
their own functions. Not handled: BFCL's system-prompt wording (agentrig's protocol prompt is used).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrig.bfcl.checker import check_entry
from agentrig.bfcl.data import BfclEntry
from agentrig.bfcl.multi_turn import BackendCall, BackendSession, check_multi_turn
from agentrig.bfcl.types import tool_spec
from agentrig.harness import EpisodeRunner, HarnessConfig, run_episodes
from agentrig.harness.policy import generate_batch
from agentrig.harness.tools import Tool, ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec, ToolCall

# BFCL's MAXIMUM_STEP_LIMIT: policy calls allowed per user turn before the entry is force-terminated.
MAX_STEPS_PER_TURN = 20

# Single-turn episodes: the largest parallel answer (8 calls) written one call per step, plus the closing
# reply. BFCL itself takes one response; more steps would only let a looping model burn time.
SINGLE_TURN_MAX_STEPS = 9

RECORDED = "Call recorded (this benchmark does not execute single-turn calls). Reply without a tool call once the request is covered."


@dataclass
class EntryOutcome:
    """One scored entry: BFCL's verdict and error label, the whole episode's, the calls (per turn, per step), its episodes.

    `valid` is BFCL's protocol (single-turn: the first response's calls); `episode_valid` scores every call
    of the episode (single-turn: all steps until a reply without a call; multi-turn: the same as `valid`).
    """

    id: str
    category: str
    valid: bool
    error_type: str
    error: str
    calls: list[list[list[dict[str, Any]]]]
    episodes: list[Episode] = field(default_factory=list)
    episode_valid: bool | None = None  # None: the same as `valid`
    episode_error_type: str = ""

    def __post_init__(self) -> None:
        if self.episode_valid is None:
            self.episode_valid, self.episode_error_type = self.valid, self.error_type

    def to_dict(self) -> dict[str, Any]:
        """The JSON record written to results.json (episodes are written separately)."""
        return {
            "id": self.id,
            "category": self.category,
            "valid": self.valid,
            "error_type": self.error_type,
            "error": self.error,
            "episode_valid": self.episode_valid,
            "episode_error_type": self.episode_error_type,
            "calls": self.calls,
        }


def harness_config(protocol: str = "hermes", max_steps: int = MAX_STEPS_PER_TURN) -> HarnessConfig:
    """The harness rules for BFCL: a step limit, no memory tool, defaults otherwise."""
    return HarnessConfig(max_steps=max_steps, memory=False, protocol=protocol)


def build_toolset(entry: BfclEntry, execute: Callable[[str, dict[str, Any]], str] | None) -> ToolSet:
    """The entry's functions as tools; `execute(name, arguments)` runs them, None records them only."""
    tools: list[Tool] = []
    for function in entry.functions:
        spec = tool_spec(function)
        name = spec["name"]
        description = spec["description"].strip() or f"BFCL function {name}"
        tools.append(Tool.from_schema(name, description, spec["parameters"], _tool_fn(name, execute)))
    return ToolSet(tools)


def _tool_fn(name: str, execute: Callable[[str, dict[str, Any]], str] | None) -> Callable[..., str]:
    # Every keyword goes to the backend as given: the wrapper takes no parameter of its own to collide with.
    def fn(**arguments: Any) -> str:
        return RECORDED if execute is None else execute(name, arguments)

    return fn


def turn_prompt(messages: list[dict[str, str]]) -> str:
    """One user turn's text: BFCL system messages (live categories) first, then the user messages."""
    ordered = [m for m in messages if m["role"] == "system"] + [m for m in messages if m["role"] == "user"]
    return "\n\n".join(m["content"] for m in ordered)


def _task(entry: BfclEntry, prompt: str, turn: int) -> TaskSpec:
    suffix = f"/turn{turn}" if entry.is_multi_turn else ""
    return TaskSpec(
        id=f"{entry.id}{suffix}", prompt=prompt, env="bfcl", family=entry.category, split="test",
        metadata={"bfcl_id": entry.id, "turn": turn},
    )


def _call_dicts(steps: list[list[ToolCall]]) -> list[list[dict[str, Any]]]:
    return [[{"name": c.name, "arguments": c.arguments} for c in step] for step in steps]


def run_single_turn(entries: list[BfclEntry], policy: Any, config: HarnessConfig, batch_size: int = 16) -> list[EntryOutcome]:
    """Run and score single-turn entries (one episode each): the first response (BFCL's), and the whole episode."""
    jobs = [(_task(e, turn_prompt(e.turns[0]), 0), build_toolset(e, None), None) for e in entries]
    episodes = run_episodes(jobs, policy, config, batch_size=batch_size)
    outcomes: list[EntryOutcome] = []
    for entry, episode in zip(entries, episodes):
        first = list(episode.steps[0].calls) if episode.steps else []
        steps = [step.calls for step in episode.steps if step.calls]
        whole = check_entry(entry.category, entry.functions, [call for step in steps for call in step], entry.answer)
        result = check_entry(entry.category, entry.functions, first, entry.answer)
        outcomes.append(EntryOutcome(entry.id, entry.category, result.valid, result.error_type, result.error,
                                     [_call_dicts(steps)], [episode], whole.valid, whole.error_type))
    return outcomes


@dataclass
class _Conversation:
    """A multi-turn entry in progress: live backends, the messages so far, the calls of each turn."""

    entry: BfclEntry
    session: BackendSession
    toolset: ToolSet
    history: list[dict[str, Any]] = field(default_factory=list)  # the conversation so far, after the system prompt
    turns: list[list[list[ToolCall]]] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    stopped: bool = False


def _conversation(entry: BfclEntry) -> _Conversation:
    session = BackendSession(entry.involved_classes, entry.initial_config)

    def execute(name: str, arguments: dict[str, Any]) -> str:
        return session.execute(BackendCall(name, (), copy.deepcopy(arguments)))

    return _Conversation(entry, session, build_toolset(entry, execute))


def _turn_runner(conv: _Conversation, turn: int, config: HarnessConfig) -> EpisodeRunner:
    """An episode for user turn `turn`, continuing the conversation of the earlier turns."""
    prompt = turn_prompt(conv.entry.turns[turn])
    return EpisodeRunner(_task(conv.entry, prompt, turn), conv.toolset, config,
                         episode_id=f"{conv.entry.id}/turn{turn}", history=conv.history or None)


def _lockstep(runners: list[EpisodeRunner], policy: Any, batch_size: int) -> None:
    """Advance all runners to their end, one batched policy call per round for up to `batch_size` of them."""
    live = list(runners)
    while live:
        for start in range(0, len(live), batch_size):
            group = live[start : start + batch_size]
            asks = [(runner, req) for runner in group if (req := runner.request()) is not None]
            if asks:
                for (runner, _), reply in zip(asks, generate_batch(policy, [req for _, req in asks])):
                    runner.submit(reply)
        live = [runner for runner in live if not runner.done]


def run_multi_turn(entries: list[BfclEntry], policy: Any, config: HarnessConfig, batch_size: int = 16) -> list[EntryOutcome]:
    """Run and score multi-turn entries: one round of episodes per user turn, all entries in lockstep."""
    conversations = [_conversation(entry) for entry in entries]
    for turn in range(max((len(e.turns) for e in entries), default=0)):
        active = [c for c in conversations if not c.stopped and turn < len(c.entry.turns)]
        runners = [_turn_runner(c, turn, config) for c in active]
        _lockstep(runners, policy, batch_size)
        for conv, runner in zip(active, runners):
            episode = runner.episode
            conv.episodes.append(episode)
            conv.turns.append([step.calls for step in episode.steps if step.calls])
            conv.history = episode.messages_full[1:]  # the whole conversation so far, after the system prompt
            if episode.termination == "max_steps":
                conv.stopped = True  # BFCL force-terminates the entry; the remaining turns go unanswered
    outcomes: list[EntryOutcome] = []
    for conv in conversations:
        entry = conv.entry
        model_turns = [[[BackendCall.from_tool_call(c) for c in step] for step in steps] for steps in conv.turns]
        result = check_multi_turn(entry.involved_classes, entry.initial_config, entry.answer, model_turns)
        outcomes.append(EntryOutcome(entry.id, entry.category, result.valid, result.error_type, result.error,
                                     [_call_dicts(steps) for steps in conv.turns], conv.episodes))
    return outcomes


def run_entries(entries: list[BfclEntry], policy: Any, config: HarnessConfig, batch_size: int = 16) -> list[EntryOutcome]:
    """Run and score entries of one category."""
    if entries and entries[0].is_multi_turn:
        return run_multi_turn(entries, policy, config, batch_size)
    single = dataclasses.replace(config, max_steps=min(config.max_steps, SINGLE_TURN_MAX_STEPS))
    return run_single_turn(entries, policy, single, batch_size)
