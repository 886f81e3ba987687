"""The built-in `toolworld` environment: procedurally generated tool worlds, for tools the agent has never seen.

Each task lives in one generated world (`world.py`): an entity kind with its own records, a related kind
each record belongs to, and an API of 9 tool kinds plus near-miss distractors, named and described in the
world's own style (`tools.py`), with real execution against the episode's copy of the records. `tasks.py` holds the thirteen task families,
`checker.py` the success rules, `teacher.py` the expert that acts from any state. Splits are disjoint by
world: the test worlds' nouns, and so every one of their tool names, never occur in a training world
(`agentrig.envs.toolworld.world.noun_split`); no generated tool is a BFCL function (`tools.BFCL_NAMES`), and
`agentrig data build` refuses any sample that offers one or asks a BFCL question.
"""

from __future__ import annotations

from typing import Any

from agentrig.envs.base import CheckResult, Environment
from agentrig.envs.toolworld.checker import check_toolworld
from agentrig.envs.toolworld.tasks import FAMILIES, FAMILY_KINDS, TaskFactory
from agentrig.envs.toolworld.tools import ToolworldState, bind, specs
from agentrig.envs.toolworld.world import world
from agentrig.harness.tools import ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec


class ToolworldEnv(Environment):
    """Generated worlds; train, dev and test hold disjoint worlds (test_unseen_tools: the test worlds)."""

    name = "toolworld"
    eval_splits = ("test",)

    def __init__(self) -> None:
        self.factory = TaskFactory()

    def tasks(self, split: str, n: int, seed: int = 0, start: int = 0,
              family_weights: dict[str, float] | None = None) -> list[TaskSpec]:
        """Tasks start..start+n-1 of `split`, each in one world of the split's pool."""
        self.check_split(split)
        return [self.factory.task(split, seed, i, family_weights) for i in range(start, start + n)]

    def setup(self, task: TaskSpec) -> tuple[ToolSet, ToolworldState]:
        """The task's world, its records copied for this episode, and every tool of the world bound to them."""
        w = world(task.metadata["world"]["split"], task.metadata["world"]["index"])
        state = ToolworldState(w, w.fresh_records())
        return ToolSet(bind(w, state), allowed=list(task.allowed_tools)), state

    def check(self, task: TaskSpec, state: ToolworldState, episode: Episode) -> CheckResult:
        """See `agentrig.envs.toolworld.checker`."""
        return check_toolworld(task, state, episode)

    def families(self, split: str, seed: int = 0) -> dict[str, list[str]]:
        """Every family with the tool kinds it needs (tool names differ per world; kinds are shared)."""
        return {f: list(FAMILY_KINDS[f]) for f in FAMILIES}

    def expert(self, detour_rate: float = 0.0, seed: int = 0) -> Any:
        """The programmatic teacher (`agentrig.envs.toolworld.teacher.ToolworldExpert`)."""
        from agentrig.envs.toolworld.teacher import ToolworldExpert

        return ToolworldExpert(detour_rate=detour_rate, seed=seed)


__all__ = ["ToolworldEnv", "specs", "world"]
