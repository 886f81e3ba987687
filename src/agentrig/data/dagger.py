"""DAgger for agents: the expert takes over the student's own episodes at the first step it would do otherwise.

A model trained on expert episodes only ever saw states the expert reaches. In its own episodes it meets
others (a retry that already worked, a result it misread, an invalid call of its own) and nothing taught it
what to do there. DAgger (Ross et al., 2011) labels the student's states with the expert's actions. Here,
for each recorded student episode (`agentrig collect --teacher model --adapter ...`):

1. The environment's expert runs beside a replay of the student's replies, on fresh tools and state, with
   the same harness. While the expert's next step is the student's (the same calls, or both answer and
   the student's episode succeeded), the student's reply is replayed with weight 0 (its state is kept as
   context, its words are not trained) and each tool result is the recorded one: a call that really ran
   runs again (so side effects rebuild the state), a fault is given back as it was recorded.
2. At the first step where they differ (a wrong or invalid call, a needless retry, a premature or wrong
   answer) the expert's step is used with weight 1, and the expert finishes the episode on live tools,
   with fresh faults from the same `FaultConfig` seeded by the episode id.
3. The new episode is checked; one that succeeds is kept, with `task.metadata["dagger"]` = {source
   episode, takeover step, what the student did there}. Episodes the student finished exactly as the
   expert would add nothing and are skipped.

The result is an ordinary episodes file: `agentrig data build` turns it into samples whose supervised
turns are the expert's corrections in the student's own states.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from agentrig.envs.base import Environment
from agentrig.errors import ConfigError
from agentrig.harness import HarnessConfig, run_episode
from agentrig.harness.faults import FaultConfig
from agentrig.harness.policy import PolicyReply, PolicyRequest, as_policy, generate_batch
from agentrig.harness.protocol import get_protocol
from agentrig.harness.trajectory import Episode, Step, ToolCall, ToolResult


@dataclass
class DaggerSummary:
    """What a relabelling pass did, episode by episode."""

    episodes: int = 0  # student episodes read
    relabelled: int = 0  # new episodes written (the expert took over and succeeded)
    no_deviation: int = 0  # the student did what the expert would have: nothing to learn
    failed: int = 0  # the expert took over but the episode still failed (not written)
    by_deviation: dict[str, int] = field(default_factory=dict)  # what the student did at the takeover step

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"episodes": self.episodes, "relabelled": self.relabelled, "no_deviation": self.no_deviation,
                "failed": self.failed, "by_deviation": dict(sorted(self.by_deviation.items()))}


def _calls(calls: Iterable[ToolCall]) -> list[tuple[str, str]]:
    return [(c.name, json.dumps(c.arguments, sort_keys=True, ensure_ascii=False)) for c in calls]


def deviation_kind(step: Step, expert_final: bool) -> str:
    """A one-word account of what the student did where the expert would have done otherwise."""
    if step.defects:
        return "invalid_call"
    if step.is_final:
        return "wrong_answer" if expert_final else "answered_early"
    if expert_final:
        return "extra_call"
    return "other_call"


class _Takeover:
    """The policy of one relabelled episode: the student's replies while they agree with the expert, then the expert."""

    def __init__(self, student: Episode, expert: Any, protocol: str):
        self.student = student
        self.expert = as_policy(expert)
        self.proto = get_protocol(protocol)
        self.takeover: int | None = None
        self.deviation = ""
        self.step = 0

    def generate_batch(self, requests: list[PolicyRequest]) -> list[PolicyReply | str]:
        (request,) = requests
        self.step = request.step
        (reply,) = generate_batch(self.expert, [request])  # the expert always advances: it reads the messages
        if self.takeover is not None:
            return [reply]
        text = reply.text if isinstance(reply, PolicyReply) else reply
        parsed = self.proto.parse(text)
        mine = self.student.steps[request.step] if request.step < len(self.student.steps) else None
        if mine is not None and self._agrees(mine, parsed.is_final, parsed.calls):
            return [PolicyReply(mine.raw_output, weight=0.0)]
        self.takeover = request.step
        self.deviation = deviation_kind(mine, parsed.is_final) if mine is not None else "ran_out"
        return [reply]

    def _agrees(self, mine: Step, expert_final: bool, expert_calls: list[ToolCall]) -> bool:
        if mine.defects:
            return False
        if mine.is_final or expert_final:
            return mine.is_final and expert_final and self.student.success
        return _calls(mine.calls) == _calls(expert_calls)


class _ReplayHook:
    """Tool results of the replayed steps as recorded (real calls re-run, faults given back); then live faults."""

    def __init__(self, takeover: _Takeover, live: Any | None):
        self.takeover = takeover
        self.live = live
        self.recorded: dict[tuple[int, str, str], list[ToolResult]] = {}
        for step in takeover.student.steps:
            for call, result in zip(step.calls, step.results):
                key = (step.index, call.name, json.dumps(call.arguments, sort_keys=True, ensure_ascii=False))
                self.recorded.setdefault(key, []).append(result)

    def __call__(self, call: ToolCall, execute: Any) -> ToolResult:
        t = self.takeover
        if t.takeover is None or t.step < t.takeover:
            key = (t.step, call.name, json.dumps(call.arguments, sort_keys=True, ensure_ascii=False))
            queue = self.recorded.get(key)
            if queue:
                was = queue.pop(0)
                if was.fault is None:
                    return execute()
                return ToolResult(call.id, call.name, was.content, ok=was.ok, duration_s=0.0, fault=was.fault,
                                  error=was.error, truncated=was.truncated)
        return self.live(call, execute) if self.live is not None else execute()


def relabel(episodes: Iterable[Episode], env: Environment, harness: HarnessConfig,
            faults: FaultConfig | None = None, summary: DaggerSummary | None = None) -> Iterator[Episode]:
    """The expert's takeovers of `episodes` that succeed (see the module docstring), in input order."""
    expert = env.expert()
    if expert is None:
        raise ConfigError(f"environment {env.name!r} has no expert (Environment.expert), so nothing can label "
                          "the student's states; DAgger needs one")
    summary = summary if summary is not None else DaggerSummary()
    faults = faults if faults is not None and faults.total > 0 else None
    for student in episodes:
        summary.episodes += 1
        task = student.task
        tools, state = env.setup(task)
        takeover = _Takeover(student, expert, harness.protocol)
        key = f"dagger/{student.episode_id}"
        live = faults.injector(key, None, tools) if faults is not None else None
        try:
            ep = run_episode(task, tools, takeover, harness, tool_hook=_ReplayHook(takeover, live),
                             episode_id=f"{student.episode_id}+dagger")
            if ep.system_prompt != student.system_prompt:
                raise ConfigError(f"episode {student.episode_id}: the harness gives another system prompt than the one "
                                  "the student saw; relabel with the harness settings of its collection "
                                  "(--tool-listing, --max-steps, --memory ...)")
            if takeover.takeover is None:
                summary.no_deviation += 1
                continue
            result = env.check(task, state, ep)
        finally:
            env.close(state)
        if not result.success:
            summary.failed += 1
            continue
        ep.success, ep.check = True, result.to_dict()
        ep.task = replace(task, metadata={**task.metadata, "dagger": {
            "source": student.episode_id, "takeover_step": takeover.takeover, "deviation": takeover.deviation}})
        summary.relabelled += 1
        summary.by_deviation[takeover.deviation] = summary.by_deviation.get(takeover.deviation, 0) + 1
        yield ep
