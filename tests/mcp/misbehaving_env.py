"""An environment whose tools misbehave on purpose, served by `agentrig mcp serve` in tests/test_mcp.py.

`echo` and `add` work; `bump` counts calls in the session's state (a fresh state per session starts at 1);
`fail` raises (an isError result); `hang` sleeps (a client-side timeout); `crash` kills the server process;
`big` returns a long text (the harness truncates it); `lookup` takes a `$ref`-typed argument.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

from agentrig.envs import CheckResult, Environment
from agentrig.harness.tools import Tool, ToolSet, tool
from agentrig.harness.trajectory import Episode, TaskSpec


@dataclass
class Counter:
    n: int = 0


def make_tools(state: Counter) -> list[Tool]:
    @tool
    def echo(text: str) -> str:
        """Return the text unchanged.

        Args:
            text: Any text.
        """
        return text

    @tool
    def add(a: int, b: int) -> dict[str, int]:
        """Add two integers.

        Args:
            a: The first integer.
            b: The second integer.
        """
        return {"sum": a + b}

    @tool(side_effects=True)
    def bump() -> dict[str, int]:
        """Count one more call in this session."""
        state.n += 1
        return {"count": state.n}

    @tool
    def fail(reason: str) -> str:
        """Always fails, with the given reason.

        Args:
            reason: What to complain about.
        """
        raise RuntimeError(reason)

    @tool(timeout_s=30)
    def hang(seconds: float) -> str:
        """Sleep, then answer.

        Args:
            seconds: How long to sleep.
        """
        time.sleep(seconds)
        return "awake"

    @tool
    def crash() -> str:
        """Kill the server process."""
        os._exit(3)

    @tool
    def big(n: int) -> str:
        """Return n characters.

        Args:
            n: How many.
        """
        return "x" * n

    lookup = Tool.from_schema(
        "lookup", "Find a point by its coordinates.",
        {"type": "object", "$defs": {"point": {"type": "object", "properties": {"x": {"type": "integer"},
                                                                                 "y": {"type": "integer"}},
                                               "required": ["x", "y"], "additionalProperties": False}},
         "properties": {"where": {"$ref": "#/$defs/point"}}, "required": ["where"]},
        lambda where: {"found": f"point at {where['x']},{where['y']}"})
    return [echo, add, bump, fail, hang, crash, big, lookup]


class MisbehavingEnv(Environment):
    name = "misbehaving"

    def tasks(self, split: str, n: int, seed: int = 0, start: int = 0,
              family_weights: dict[str, float] | None = None) -> list[TaskSpec]:
        return [TaskSpec(id=f"mis-{split}-{i}", prompt="Echo hello.", env=self.name, split=split,
                         allowed_tools=["echo"]) for i in range(start, start + n)]

    def setup(self, task: TaskSpec) -> tuple[ToolSet, Counter]:
        state = Counter()
        return ToolSet(make_tools(state), allowed=task.allowed_tools), state

    def check(self, task: TaskSpec, state: Any, episode: Episode) -> CheckResult:
        return CheckResult(success="hello" in (episode.final_answer or ""))


def make_env() -> MisbehavingEnv:
    return MisbehavingEnv()
