"""The task lifecycle, written once for collection and evaluation: setup, fault hook, run, check, close.

`TaskRunner(env, harness, faults)` opens a task (`open`: a fresh tool state from `env.setup`, an optional
transform of the task and its tools such as collection's renaming, and the episode's seeded fault
injector), runs opened tasks through the harness in lockstep batches (`run`), and finishes each episode
as it ends (`finish`: the environment's checker sets `success` and `check`, then `env.close` releases the
state). `agentrig collect` and `agentrig eval` both run their episodes through it; what differs between
them is only which tasks, which episode ids and which fault seeds they choose:

- collection: episode id = task id, fault seed `"{seed}/{index}"`, the task transformed by augmentation;
- evaluation: episode id `TASK_ID#TRIAL`, fault seed `"{seed}/{task id}/{trial}"`.

States are opened per batch chunk by the caller, never all at once, since a state may hold connections.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from agentrig.envs.base import Environment
from agentrig.harness import HarnessConfig, run_episodes
from agentrig.harness.faults import FaultConfig
from agentrig.harness.loop import ToolHook
from agentrig.harness.tools import ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec

Transform = Callable[[TaskSpec, ToolSet], tuple[TaskSpec, ToolSet]]


@dataclass
class OpenTask:
    """A task ready to run: its (possibly transformed) spec, tools bound to a fresh state, its fault hook."""

    task: TaskSpec
    tools: ToolSet
    state: Any
    hook: ToolHook | None
    episode_id: str


class TaskRunner:
    """Runs an environment's tasks through the harness and checks them (see the module docstring)."""

    def __init__(self, env: Environment, harness: HarnessConfig, faults: FaultConfig | None = None,
                 seed: int | None = None):
        self.env = env
        self.harness = harness
        self.faults = faults if faults is not None and faults.total > 0 else None
        self.seed = seed

    @staticmethod
    def env_faults(env: Environment, rate: float = 0.0, rates: dict[str, float] | None = None) -> FaultConfig:
        """A fault config (a total rate, or per-kind `rates`) with the environment's tool facts."""
        facts: dict[str, Any] = {"no_mutate": tuple(env.side_effect_tools), "drift_names": dict(env.drift_names)}
        return FaultConfig(rates=rates, **facts) if rates else FaultConfig.from_total(rate, **facts)

    def open(self, task: TaskSpec, episode_id: str, fault_key: str, transform: Transform | None = None) -> OpenTask:
        """Set the task up on a fresh state; `transform(task, tools)` may rewrite both before the fault hook
        is made (the hook follows renamed tools through `task.metadata["rename"]`)."""
        tools, state = self.env.setup(task)
        if transform is not None:
            task, tools = transform(task, tools)
        renames = (task.metadata.get("rename") or {}).get("tools")
        hook = self.faults.injector(fault_key, renames, tools) if self.faults is not None else None
        return OpenTask(task, tools, state, hook, episode_id)

    def finish(self, opened: OpenTask, episode: Episode) -> Episode:
        """Check the episode against the final state, record the verdict, release the state."""
        try:
            result = self.env.check(opened.task, opened.state, episode)
        finally:
            self.env.close(opened.state)
        episode.episode_id = opened.episode_id
        episode.success = result.success
        episode.check = result.to_dict()
        return episode

    def run(self, opened: list[OpenTask], policy: Any, batch_size: int = 16,
            on_done: Callable[[int, Episode], None] | None = None) -> list[Episode]:
        """Run the opened tasks in lockstep batches; each episode is finished as it ends, then `on_done(k, ep)`."""
        def done(k: int, episode: Episode) -> None:
            self.finish(opened[k], episode)
            if on_done is not None:
                on_done(k, episode)

        return run_episodes([(o.task, o.tools, o.hook) for o in opened], policy, self.harness,
                            batch_size=batch_size, on_done=done, episode_ids=[o.episode_id for o in opened],
                            seed=self.seed)
