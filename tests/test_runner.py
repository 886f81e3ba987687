"""The one task lifecycle (envs.runner.TaskRunner) that collection and evaluation share."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

from agentrig.envs.runner import TaskRunner
from agentrig.harness import HarnessConfig

EXAMPLE = runpy.run_path(str(Path(__file__).resolve().parents[1] / "examples" / "my_env.py"))


class CountingShop(EXAMPLE["ShopEnv"]):
    """The example shop, counting opened and closed states; its checker can be made to raise."""

    def __init__(self, broken_checker: bool = False):
        super().__init__()
        self.opened = self.closed = 0
        self.broken = broken_checker

    def setup(self, task):
        self.opened += 1
        return super().setup(task)

    def check(self, task, state, episode):
        if self.broken:
            raise RuntimeError("checker bug")
        return super().check(task, state, episode)

    def close(self, state):
        self.closed += 1


def test_runner_checks_every_episode_and_closes_every_state():
    env = CountingShop()
    runner = TaskRunner(env, HarnessConfig(), TaskRunner.env_faults(env, 0.3), seed=5)
    tasks = env.tasks("test", 6, seed=0)
    opened = [runner.open(t, f"{t.id}#0", f"0/{t.id}/0") for t in tasks]
    ended = []
    episodes = runner.run(opened, env.expert(), batch_size=4, on_done=lambda k, ep: ended.append((k, ep.success)))
    assert [e.episode_id for e in episodes] == [f"{t.id}#0" for t in tasks]
    assert all(e.check and e.success is not None and e.seed == 5 for e in episodes)
    assert sorted(k for k, _ in ended) == list(range(6))  # on_done sees each episode after its check
    assert env.opened == env.closed == 6
    assert sum(len(e.faults) for e in episodes) > 0  # the injector ran, seeded by the fault key
    again = runner.run([runner.open(t, f"{t.id}#0", f"0/{t.id}/0") for t in tasks], env.expert(), batch_size=2)
    assert [e.faults for e in again] == [e.faults for e in episodes]


def test_a_failing_checker_still_releases_the_state():
    env = CountingShop(broken_checker=True)
    runner = TaskRunner(env, HarnessConfig())
    task = env.tasks("test", 1)[0]
    with pytest.raises(RuntimeError, match="checker bug"):
        runner.run([runner.open(task, task.id, "k")], env.expert())
    assert env.opened == env.closed == 1


def test_the_fault_hook_follows_renamed_tools():
    import random

    from agentrig.data.augment import apply_rename

    env = CountingShop()
    runner = TaskRunner(env, HarnessConfig(), TaskRunner.env_faults(env, rates={"error_503": 1.0}))
    task = env.tasks("train", 1, seed=0)[0]
    rename = lambda t, tools: apply_rename(t, tools, random.Random(0), env.tool_aliases, env.param_aliases)  # noqa: E731
    opened = runner.open(task, task.id, "k", transform=rename)
    assert opened.task.metadata["rename"]["tools"]  # renamed ...
    renamed = opened.task.metadata["rename"]["tools"]
    declared = {n for n, t in opened.tools.tools.items() if t.side_effects}  # @tool(side_effects=True), renamed
    assert declared and declared == {renamed.get(n, n) for n in ("add_to_cart", "checkout")} & set(opened.tools.tools)
    assert set(opened.hook.no_mutate) == declared  # ... and the hook knows the new names


@pytest.mark.parametrize("name", ["datadesk", "toolworld", "my_env"])
def test_every_expert_reads_results_through_the_call_echo(name):
    """With `echo_calls` each result opens with its call; every environment's expert reads the result behind
    that line, so it makes the same calls and gives the same answers, with faults, as without the echo."""
    from agentrig.envs import load_env

    env = load_env(str(Path(__file__).resolve().parents[1] / "examples" / "my_env.py") + ":make_env"
                   if name == "my_env" else name)
    tasks = env.tasks("train", 40, seed=2)
    runs = []
    for echo in (False, True):
        runner = TaskRunner(env, HarnessConfig(echo_calls=echo), TaskRunner.env_faults(env, 0.3), seed=1)
        runs.append(runner.run([runner.open(t, f"{t.id}/f", t.id) for t in tasks], env.expert(seed=0)))
    plain, echoed = runs
    assert [[s.raw_output for s in e.steps] for e in plain] == [[s.raw_output for s in e.steps] for e in echoed]
    assert [e.success for e in plain] == [e.success for e in echoed] and sum(e.success for e in echoed) >= 30
    assert sum(e.faults != [] for e in echoed) >= 5  # the experts met faults, and read them behind the echo
    first = next(m for e in echoed for m in e.messages_full if m["role"] == "tool" and m["name"] != "note")
    assert first["content"].split("\n", 1)[0].endswith(") returned:")
