"""The episode loop: build context, ask the policy, parse, validate, execute, observe, repeat.

`EpisodeRunner` is a state machine (`request()` / `submit(reply)`) so that many episodes can step
together: `run_episodes` advances all live episodes one round at a time and hands a batch policy one
`generate_batch` call per round. Rules: termination (final answer, max steps, token budget, wall
clock, the identical call repeated), the recovery rule (a tool failing N times in a row gets a notice
to switch tools or tell the user), and the memory area (`note` or the context budget compress finished
turns). Every decision is recorded so `context_at(episode, i)` (`transcript.py`) rebuilds what the model
saw at step i. The policy interface is `policy.py`.
No model output raises out of here; a policy that raises is our (or the user's) error and propagates.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

from agentrig.config import opt
from agentrig.errors import AgentrigError
from agentrig.harness.memory import compress_point, extractive_summary, with_memory
from agentrig.harness.protocol import PROTOCOLS, TOOL_LISTINGS, canonical_arguments, echo_call, feedback, get_protocol
from agentrig.harness.policy import PolicyReply, PolicyRequest, Reply, generate_batch
from agentrig.harness.tools import Tool, ToolSet
from agentrig.harness.transcript import assistant_message
from agentrig.harness.trajectory import Defect, Episode, MemoryEvent, Step, TaskSpec, ToolCall, ToolResult

ToolHook = Callable[[ToolCall, Callable[[], ToolResult]], ToolResult]
"""Wraps tool execution (fault injection): gets the call and a thunk that really executes it."""


@dataclass
class HarnessConfig:
    """The harness rules; the same values at collection, training and inference."""

    max_steps: int = opt(12, "policy steps per episode before the harness stops it")
    token_budget: int | None = opt(None, "prompt + completion tokens over the whole episode (unset: no limit)")
    context_budget: int | None = opt(None, "context tokens above which finished turns are compressed (unset: never)")
    wall_clock_s: float | None = opt(None, "seconds per episode (unset: no limit)")
    stuck_repeats: int = opt(3, "the identical call this many times in a row ends the episode, unless that copy is the first "
                                   "to answer (a retry that worked)")
    repeat_notice: bool = opt(False, "an identical call right after that call succeeded gets a notice under its result: "
                              "use the result, do not send the call again")
    echo_calls: bool = opt(False, "each tool result opens with the call it answers (`tool({arguments}) returned:`), "
                           "so a result or an error is read against its own call")
    switch_after_failures: int = opt(3, "the same tool failing this many times in a row: a notice to switch tools")
    tool_timeout_s: float = opt(10.0, "seconds a tool call may take before it times out")
    max_output_chars: int = opt(4000, "tool output characters shown to the model (the rest is cut, and says so)")
    protocol: str = opt("hermes", "output protocol of tool calls", choices=tuple(PROTOCOLS))
    tool_listing: str = opt("compact", "how the system prompt lists tools: compact signature lines or Hermes's json "
                            "specs (the listing the adapter was trained with)", choices=TOOL_LISTINGS)
    memory: bool = opt(True, "offer the built-in `note` tool and compress finished sub-goals")
    keep_last_turns: int = opt(2, "turns kept verbatim when the context budget forces a compression")


def approx_tokens(text: str) -> int:
    """A tokenizer-free token estimate (about 4 characters per token)."""
    return max(1, len(text) // 4)


def note_tool() -> Tool:
    """The built-in `note` tool (the memory area): saves a one-line summary of a finished sub-goal."""
    def note(summary: str) -> str:
        return feedback("note_saved")

    return Tool.from_schema(
        "note",
        "Save a one-line summary of a finished sub-goal to memory; the finished turns are then compressed.",
        {
            "type": "object",
            "properties": {"summary": {"type": "string", "description": "what was found, in one line"}},
            "required": ["summary"],
            "additionalProperties": False,
        },
        note,
    )


def _history(history: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    if not history:
        return []
    if history[0].get("role") != "user":
        raise AgentrigError("a conversation history must start with its first user message")
    return [dict(m) for m in history]


class EpisodeRunner:
    """One episode as a state machine: `request()` the next policy call, `submit()` its reply."""

    def __init__(
        self,
        task: TaskSpec,
        tools: ToolSet,
        config: HarnessConfig | None = None,
        tool_hook: ToolHook | None = None,
        token_counter: Callable[[str], int] | None = None,
        episode_id: str | None = None,
        seed: int | None = None,
        history: list[dict[str, Any]] | None = None,
    ):
        """`history`: earlier turns of a multi-turn conversation (starting with its first user message);
        `task.prompt` is then the new user message. The history counts as context, not as steps."""
        self.config = config or HarnessConfig()
        self.proto = get_protocol(self.config.protocol)
        extra = [note_tool()] if self.config.memory and tools.get("note") is None else []
        self.tools = ToolSet(list(tools.tools.values()) + extra, tools.allowed + [t.name for t in extra],
                             self.config.max_output_chars)
        self.tool_hook = tool_hook
        self.count = token_counter or approx_tokens
        specs = self.tools.specs()
        system = self.proto.system_prompt(specs, self.config)
        self.episode = Episode(
            episode_id=episode_id or f"{task.id}-{uuid.uuid4().hex[:8]}",
            task=task,
            protocol=self.proto.name,
            system_prompt=system,
            tools=specs,
            messages_full=[{"role": "system", "content": system}, *_history(history),
                           {"role": "user", "content": task.prompt}],
            seed=seed,
            metadata={"harness": asdict(self.config), "step_message_index": []},
        )
        self.summaries: list[str] = []
        self.context_start = 2
        self.fail_streak: dict[str, int] = {}
        self.last_call: str | None = None
        self.last_ok = False  # whether the last call succeeded
        self.repeat_count = 0
        self.repeat_answered = False  # whether a copy in the current run of identical calls succeeded
        self.started = time.perf_counter()
        self.done = False

    # -- the loop ---------------------------------------------------------------------------
    def context(self) -> list[dict[str, Any]]:
        """The messages the policy sees now."""
        ep = self.episode
        system = {"role": "system", "content": with_memory(ep.system_prompt, self.summaries)}
        return [system, ep.messages_full[1]] + ep.messages_full[self.context_start :]

    def request(self) -> PolicyRequest | None:
        """The next policy call, or None when the episode has ended."""
        if self.done:
            return None
        ep = self.episode
        cfg = self.config
        if len(ep.steps) >= cfg.max_steps:
            return self._end("max_steps")
        if cfg.wall_clock_s is not None and time.perf_counter() - self.started > cfg.wall_clock_s:
            return self._end("wall_clock")
        if cfg.token_budget is not None and ep.prompt_tokens + ep.completion_tokens >= cfg.token_budget:
            return self._end("token_budget")
        messages = self.context()
        if cfg.context_budget is not None and self._context_tokens(messages) > cfg.context_budget:
            self._compress_for_budget()
            messages = self.context()
        ep.metadata["step_message_index"].append(len(ep.messages_full))
        return PolicyRequest(messages, ep.tools, ep.task, len(ep.steps), ep.episode_id, self.proto.name)

    def submit(self, reply: str | PolicyReply) -> None:
        """Apply the policy's reply: parse, validate, execute, observe, and decide whether to go on."""
        if self.done:
            raise AgentrigError("submit() after the episode ended")
        if not isinstance(reply, PolicyReply):
            reply = PolicyReply(text=reply if isinstance(reply, str) else "")
        ep = self.episode
        index = len(ep.steps)
        parsed = self.proto.parse(reply.text, id_prefix=f"call_{index}")
        step = Step(index=index, raw_output=reply.text, text=parsed.text, repairs=parsed.repairs,
                    defects=list(parsed.defects), is_final=parsed.is_final, weight=reply.weight)
        step.prompt_tokens = reply.prompt_tokens or self._context_tokens(self.context())
        step.completion_tokens = reply.completion_tokens or self.count(reply.text)
        ep.prompt_tokens += step.prompt_tokens
        ep.completion_tokens += step.completion_tokens
        ep.steps.append(step)

        tool_messages: list[dict[str, Any]] = []
        notices: list[str] = []
        note_summary: str | None = None
        stuck_tool: str | None = None
        for call in parsed.calls:
            result, note = self._handle_call(step, call)
            step.results.append(result)
            content = echo_call(call) + "\n" + result.content if self.config.echo_calls and call.name != "note" \
                else result.content
            tool_messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": content})
            if note is not None:
                note_summary = note
            if self._track(call, result, notices):
                stuck_tool = call.name
        ep.messages_full.append(assistant_message(step))
        ep.messages_full.extend(tool_messages)
        loose = [d.message for d in step.defects if d.call_id is None]
        if stuck_tool is not None:
            notices.append(feedback("repeated_call", tool=stuck_tool, count=self.repeat_count))
        step.notices = notices
        if loose or notices:
            ep.messages_full.append({"role": "user", "content": "\n".join(loose + notices)})
        if note_summary is not None:
            self._compress(note_summary, len(ep.messages_full), "note", extractive=False)
        if stuck_tool is not None:
            self._end("stuck")
        elif step.is_final:
            ep.final_answer = step.text
            self._end("final_answer")
        elif len(ep.steps) >= self.config.max_steps:
            self._end("max_steps")

    # -- pieces -----------------------------------------------------------------------------
    def _handle_call(self, step: Step, call: ToolCall) -> tuple[ToolResult, str | None]:
        """Validate and run one parsed call; defects become that call's tool message."""
        tool = self.tools.get(call.name)
        available = ", ".join(self.tools.allowed)
        if tool is not None:
            call.arguments = canonical_arguments(call.arguments, tool.parameters)
        step.calls.append(call)
        if tool is None:
            msg = feedback("unknown_tool", tool=call.name, available=available)
            step.defects.append(Defect("unknown_tool", msg, call.id, call.name))
            return ToolResult(call.id, call.name, msg, ok=False, error="unknown_tool"), None
        if not self.tools.is_allowed(call.name):
            msg = feedback("not_permitted", tool=call.name, available=available)
            step.defects.append(Defect("not_permitted", msg, call.id, call.name))
            return ToolResult(call.id, call.name, msg, ok=False, error="not_permitted"), None
        errors = tool.validate(call.arguments)
        if errors:
            lines = "\n".join(feedback("schema_field", path=e.path, expected=e.expected, given=e.given) for e in errors)
            msg = feedback("schema_violation", tool=call.name, fields=lines)
            step.defects.append(Defect("schema_violation", msg, call.id, call.name, errors))
            return ToolResult(call.id, call.name, msg, ok=False, error="schema"), None
        if call.name == "note":
            return ToolResult(call.id, call.name, feedback("note_saved"), ok=True), str(call.arguments["summary"])

        def execute() -> ToolResult:
            return self.tools.execute(call, timeout_s=min(tool.timeout_s, self.config.tool_timeout_s))

        result = self.tool_hook(call, execute) if self.tool_hook else execute()
        if result.fault:
            self.episode.faults.append(result.fault)
        return result, None

    def _track(self, call: ToolCall, result: ToolResult, notices: list[str]) -> bool:
        """Failure streaks (recovery rule) and identical-call repeats; True when the episode is stuck."""
        ep = self.episode
        if result.ok:
            self.fail_streak[call.name] = 0
        else:
            ep.tool_failures[call.name] = ep.tool_failures.get(call.name, 0) + 1
            streak = self.fail_streak.get(call.name, 0) + 1
            self.fail_streak[call.name] = streak
            if streak >= self.config.switch_after_failures:
                notices.append(feedback("switch_tool", tool=call.name, count=streak))
        key = json.dumps([call.name, call.arguments], sort_keys=True, ensure_ascii=False, default=repr)
        if key == self.last_call:
            self.repeat_count += 1
        else:
            self.repeat_count, self.repeat_answered = 1, False
        # A retry that finally answers (fail, fail, success) is the recovery rule at work, not a loop: the run is
        # stuck when the identical call fails once more, or comes again after one of its copies already answered.
        stuck = self.repeat_count >= self.config.stuck_repeats and (not result.ok or self.repeat_answered)
        self.repeat_answered = self.repeat_answered or result.ok
        if self.config.repeat_notice and self.repeat_count > 1 and self.last_ok and result.ok and not stuck:
            notices.append(feedback("repeated_after_success", tool=call.name))
        self.last_call, self.last_ok = key, result.ok
        return stuck

    def _context_tokens(self, messages: list[dict[str, Any]]) -> int:
        return sum(self.count(str(m.get("content") or "")) + self.count(json.dumps(m.get("tool_calls", ""))) for m in messages)

    def _compress(self, summary: str, upto: int, reason: str, extractive: bool) -> None:
        self.summaries.append(summary)
        self.context_start = upto
        # A note compresses after its step (the next prompt reflects it); a budget compression happens
        # inside request(), before the step it applies to is appended: either way it is len(steps).
        before = len(self.episode.steps)
        self.episode.memory_events.append(MemoryEvent(summary, upto, before, reason, extractive))

    def _compress_for_budget(self) -> None:
        msgs = self.episode.messages_full
        cut = compress_point(msgs, self.context_start, self.config.keep_last_turns)
        if cut is None:
            return
        self._compress(extractive_summary(msgs[self.context_start : cut]), cut, "token_budget", extractive=True)

    def _end(self, reason: str) -> None:
        self.done = True
        self.episode.termination = reason
        self.episode.wall_s = time.perf_counter() - self.started
        return None


def run_episode(
    task: TaskSpec,
    tools: ToolSet,
    policy: Any,
    config: HarnessConfig | None = None,
    tool_hook: ToolHook | None = None,
    token_counter: Callable[[str], int] | None = None,
    episode_id: str | None = None,
    seed: int | None = None,
) -> Episode:
    """Run one episode to its end and return its record."""
    runner = EpisodeRunner(task, tools, config, tool_hook, token_counter, episode_id, seed)
    while (req := runner.request()) is not None:
        runner.submit(generate_batch(policy, [req])[0])
    return runner.episode


def run_episodes(
    jobs: Sequence[tuple[TaskSpec, ToolSet, ToolHook | None]],
    policy: Any,
    config: HarnessConfig | None = None,
    batch_size: int = 16,
    token_counter: Callable[[str], int] | None = None,
    on_done: Callable[[int, Episode], None] | None = None,
    episode_ids: Sequence[str] | None = None,
    seed: int | None = None,
) -> list[Episode]:
    """Run many episodes in lockstep: each round, every live episode asks once, in one batch call.

    Episodes come back in job order. `on_done(job_index, episode)` is called as each episode ends
    (progress bars, streaming writes). Episode ids default to the task ids; `seed` is recorded in each.
    """
    pending = deque(enumerate(jobs))
    out: list[Episode | None] = [None] * len(jobs)

    def start(k: int, task: TaskSpec, tools: ToolSet, hook: ToolHook | None) -> EpisodeRunner:
        eid = episode_ids[k] if episode_ids is not None else task.id
        return EpisodeRunner(task, tools, config, hook, token_counter, episode_id=eid, seed=seed)

    def end(k: int, runner: EpisodeRunner) -> None:
        out[k] = runner.episode
        if on_done:
            on_done(k, runner.episode)

    stream = getattr(policy, "generate_stream", None)
    if callable(stream):
        _stream_episodes(stream, pending, batch_size, start, end)
        return [e for e in out if e is not None]
    live: list[tuple[int, EpisodeRunner]] = []
    while pending or live:
        while pending and len(live) < batch_size:
            k, (task, tools, hook) = pending.popleft()
            live.append((k, start(k, task, tools, hook)))
        asks: list[tuple[int, EpisodeRunner, PolicyRequest]] = []
        for k, runner in live:
            req = runner.request()
            if req is not None:
                asks.append((k, runner, req))
        if asks:
            replies = generate_batch(policy, [a[2] for a in asks])
            for (k, runner, _), reply in zip(asks, replies):
                runner.submit(reply)
        still: list[tuple[int, EpisodeRunner]] = []
        for k, runner in live:
            if runner.done:
                end(k, runner)
            else:
                still.append((k, runner))
        live = still
    return [e for e in out if e is not None]


def _stream_episodes(
    stream: Callable[..., None],
    pending: deque[tuple[int, tuple[TaskSpec, ToolSet, ToolHook | None]]],
    batch_size: int,
    start: Callable[[int, TaskSpec, ToolSet, ToolHook | None], EpisodeRunner],
    end: Callable[[int, EpisodeRunner], None],
) -> None:
    """`run_episodes` for a policy with `generate_stream` (continuous batching, `HFPolicy`): each episode's
    next request is ready as soon as its reply is applied, not when the round's longest reply ends; at most
    `batch_size` episodes are open at once."""
    live: dict[int, EpisodeRunner] = {}
    ready: deque[tuple[int, PolicyRequest]] = deque()
    asked: dict[int, int] = {}  # id(request) -> job index

    def advance(k: int) -> None:
        request = live[k].request()
        if request is None:
            end(k, live.pop(k))
        else:
            ready.append((k, request))

    def pull(free: int) -> list[PolicyRequest]:
        while pending and len(live) < batch_size:
            k, (task, tools, hook) = pending.popleft()
            live[k] = start(k, task, tools, hook)
            advance(k)
        got = []
        while ready and len(got) < free:
            k, request = ready.popleft()
            asked[id(request)] = k
            got.append(request)
        return got

    def on_reply(request: PolicyRequest, reply: Reply) -> None:
        k = asked.pop(id(request))
        live[k].submit(reply)
        advance(k)

    stream(pull, on_reply)
    if live or ready or pending:
        raise AgentrigError(f"the policy's generate_stream returned with {len(live)} episodes unfinished")
