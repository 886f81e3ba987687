"""The Environment API: seeded tasks per split, tools bound to a fresh state per episode, and a checker.

An environment is a subclass of `Environment` with three methods:

- `tasks(split, n, seed, start=0)`: n `TaskSpec`s of a split; task i depends only on (split, seed, start+i),
  so collections can resume and shard. Each task carries `allowed_tools` (needed tools + distractors)
  and its flags in `metadata` (`impossible`, `no_tool`).
- `setup(task) -> (ToolSet, state)`: the tools bound to a fresh state for one episode, with the task's allowlist.
- `check(task, state, episode) -> CheckResult`: success from the final state and the final answer.

`expert()` optionally returns a programmatic teacher policy for `agentrig collect --teacher expert`.
Custom environments live in a user file and are loaded with `load_env("path/to/file.py:make_env")`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from agentrig.harness.tools import ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec

SPLITS = ("train", "dev", "test", "test_unseen_tools")


@dataclass
class CheckResult:
    """The checker's verdict: success plus the reasons (each failed requirement, or what passed)."""

    success: bool
    reasons: list[str] = field(default_factory=list)
    figures_ok: bool = True
    side_effects_ok: bool = True
    forbidden: list[str] = field(default_factory=list)  # forbidden actions that happened
    invented_numbers: list[float] = field(default_factory=list)  # numbers given on an impossible task
    honest_failure: bool = False  # failed, but told the user honestly what could not be done (kept for training)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (stored as `episode.check`)."""
        return {"success": self.success, "reasons": list(self.reasons), "figures_ok": self.figures_ok,
                "side_effects_ok": self.side_effects_ok, "forbidden": list(self.forbidden),
                "invented_numbers": list(self.invented_numbers), "honest_failure": self.honest_failure}


class Environment(ABC):
    """Base class of environments. Subclasses set `name` and implement `tasks`, `setup` and `check`."""

    name: str = "env"
    splits: tuple[str, ...] = SPLITS

    @abstractmethod
    def tasks(self, split: str, n: int, seed: int = 0, start: int = 0) -> list[TaskSpec]:
        """Tasks start..start+n-1 of `split` for `seed`; each depends only on (split, seed, index)."""

    @abstractmethod
    def setup(self, task: TaskSpec) -> tuple[ToolSet, Any]:
        """A ToolSet bound to a fresh episode state (allowlist = `task.allowed_tools`) and that state."""

    @abstractmethod
    def check(self, task: TaskSpec, state: Any, episode: Episode) -> CheckResult:
        """Decide success from the episode's final state and final answer."""

    def expert(self) -> Any | None:
        """A programmatic teacher policy for this environment, or None when it has none."""
        return None

    def close(self, state: Any) -> None:
        """Release an episode's state (connections, files); the default does nothing."""

    def check_split(self, split: str) -> None:
        """Raise ValueError naming the valid splits when `split` is not one of them."""
        if split not in self.splits:
            raise ValueError(f"unknown split {split!r} for environment {self.name!r}; use one of {', '.join(self.splits)}")


# -- shared checking helpers -------------------------------------------------------------------

_NUMBER = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")


def numbers_in(text: str) -> list[float]:
    """Every number written in `text` ("12,345.67", "-3", "0.5"), thousands separators removed."""
    return [float(m.group(0).replace(",", "")) for m in _NUMBER.finditer(text or "")]


def close_enough(value: float, target: float, rel: float = 2e-3, abs_tol: float = 0.011) -> bool:
    """Numeric tolerance for figures in answers: 0.2 % relative or about one cent absolute."""
    return abs(value - target) <= max(abs_tol, rel * abs(target))


def has_figure(text: str, target: float) -> bool:
    """Whether `text` states `target` within tolerance."""
    return any(close_enough(v, target) for v in numbers_in(text))
