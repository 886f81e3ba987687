"""The blind environment: what test-time training may see of an environment, and nothing more.

TTT adapts an adapter to an environment's tools before it works there, so it may set tasks up (tools bound
to a fresh state) but never learn how a task is scored. `BlindEnv(env)` wraps any environment:

- `tasks(...)` gives the inner tasks with `expected` sealed: reading it (`task.expected[...]`, `.get`, `in`,
  iteration, `len`) raises `BlindError`; the prompt, the allowlist and the metadata stay readable, since the
  harness shows the first two to the model anyway and `setup` needs the last.
- `setup(task)` sets the original task up (the inner environment may read its own `expected`), so every
  tool really executes against a fresh state.
- `check(...)` and `expert(...)` raise `BlindError`: no verdict and no teacher reach the TTT loop.

The TTT loop draws its tasks from its own seed namespace (`ttt_seed`), so the states it explores are never
the evaluation's tasks; what overlap there still is (a prompt or a gold call), the evaluator measures
(`agentrig.evals.paired.practice_overlap`), never the TTT code.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrig.envs.base import CheckResult, Environment
from agentrig.errors import AgentrigError
from agentrig.harness.tools import ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec

# Far from the seeds evaluation and collection use (0, 1, ...): task i of (split, ttt_seed(s)) is another task.
TTT_SEED_BASE = 7_919_000


def ttt_seed(seed: int) -> int:
    """The seed namespace of the TTT loop's tasks for a run seeded `seed`."""
    return TTT_SEED_BASE + int(seed)


class BlindError(AgentrigError):
    """The TTT loop reached for something a blind environment keeps from it (a checker, a task's answer)."""


class SealedExpected(dict):
    """A task's `expected`, kept from the TTT loop: any read raises `BlindError` (it is empty underneath)."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise BlindError("test-time training runs on a blind environment: a task's expected answer is not "
                         "readable (build practice tasks from tool results instead)")

    __getitem__ = get = keys = values = items = __contains__ = __iter__ = __len__ = copy = _refuse  # type: ignore[assignment]

    def __bool__(self) -> bool:
        self._refuse()
        return False

    def __repr__(self) -> str:
        return "SealedExpected(<hidden>)"


class BlindEnv(Environment):
    """`env` with its checker, its expert and its tasks' answers out of reach (see the module docstring)."""

    def __init__(self, env: Environment):
        self._env = env
        self._originals: dict[str, TaskSpec] = {}
        self.name = env.name
        self.splits = env.splits
        self.side_effect_tools = tuple(env.side_effect_tools)
        self.drift_names = dict(env.drift_names)

    def tasks(self, split: str, n: int, seed: int = 0, start: int = 0,
              family_weights: dict[str, float] | None = None) -> list[TaskSpec]:
        """The inner tasks with `expected` sealed (an object the TTT loop may hold, pass and set up)."""
        out = []
        for task in self._env.tasks(split, n, seed=seed, start=start):
            sealed = replace(task, expected=SealedExpected())
            self._originals[task.id] = task
            out.append(sealed)
        return out

    def setup(self, task: TaskSpec) -> tuple[ToolSet, Any]:
        """The tools of the original task, bound to a fresh state (allowlist: `task.allowed_tools`)."""
        return self.setup_allowing(task, list(task.allowed_tools))

    def setup_allowing(self, task: TaskSpec, allowed: list[str]) -> tuple[ToolSet, Any]:
        """The tools of a task this environment gave out, on a fresh state, with another allowlist (every
        name must be one of the task's tools)."""
        original = self._originals.get(task.id)
        if original is None:
            raise BlindError(f"a blind environment sets up only tasks it gave out (BlindEnv.tasks), not {task.id!r}")
        return self._env.setup(replace(original, allowed_tools=list(allowed)))

    def close(self, state: Any) -> None:
        """Release a state as the inner environment does."""
        self._env.close(state)

    def check(self, task: TaskSpec, state: Any, episode: Episode) -> CheckResult:
        """Refused: the TTT loop never learns how a task is scored."""
        raise BlindError("test-time training runs on a blind environment: its checker is not callable "
                         "(practice tasks carry their own assertions)")

    def expert(self, detour_rate: float = 0.0, seed: int = 0) -> Any:
        """Refused: no teacher reaches the TTT loop."""
        raise BlindError("test-time training runs on a blind environment: it has no expert teacher")

    def families(self, split: str, seed: int = 0) -> dict[str, list[str]]:
        """None: the task families would say which tools each kind of task needs."""
        return {}
