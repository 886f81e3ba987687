"""The Environment API: seeded tasks per split, tools bound to a fresh state per episode, and a checker.

An environment is a subclass of `Environment` with three methods:

- `tasks(split, n, seed, start=0, family_weights=None)`: n `TaskSpec`s of a split; task i depends only on
  (split, seed, start+i), so collections can resume and shard. Each task carries `allowed_tools` (needed
  tools + distractors) and its flags in `metadata` (`impossible`, `no_tool`). `family_weights` reweights
  the draw of task families (`collect --balance`); an environment without families ignores it.
- `setup(task) -> (ToolSet, state)`: the tools bound to a fresh state for one episode, with the task's allowlist.
- `check(task, state, episode) -> CheckResult`: success from the final state and the final answer.

Optional, each feeding one `agentrig collect` feature; the defaults switch the feature off, and a flag that
needs one says so:

- `expert(detour_rate, seed)`: a programmatic teacher policy (`--teacher expert`, `--detours`).
- `families(split, seed)`: family -> the tools its tasks need (`--balance`).
- `tool_aliases`, `param_aliases`: other names and descriptions for tools and parameters (`--rename`).
- `drift_names`: how a `schema_drift` fault renames an output field (others get a `_v2` suffix).
- `side_effect_tools`: tools that change the state; faults only ever stop them before they run.
- `eval_splits`: the splits `agentrig eval` measures when `--split` is not given.
- `pool_size(split)`: how many distinct tasks a split holds, for an environment with a finite task list;
  `agentrig eval` then takes at most that many (and any environment that repeats a task id within one
  split is refused, since its episodes would share the id `TASK_ID#TRIAL`).

Custom environments live in a user file and are loaded with `load_env("path/to/file.py:make_env")`.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar, Mapping

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
    # tool -> [(new name, new description), ...] and parameter -> [new name, ...], drawn per episode by --rename
    tool_aliases: ClassVar[Mapping[str, list[tuple[str, str]]]] = {}
    param_aliases: ClassVar[Mapping[str, list[str]]] = {}
    # output field -> its name after a schema_drift fault (a plausible new API version)
    drift_names: ClassVar[Mapping[str, str]] = {}
    # tools with side effects: a fault that needs the real output is replaced by one that stops the call
    side_effect_tools: ClassVar[tuple[str, ...]] = ()
    # the splits `agentrig eval` measures by default
    eval_splits: ClassVar[tuple[str, ...]] = ("test", "test_unseen_tools")

    @abstractmethod
    def tasks(self, split: str, n: int, seed: int = 0, start: int = 0,
              family_weights: dict[str, float] | None = None) -> list[TaskSpec]:
        """Tasks start..start+n-1 of `split` for `seed`; each depends only on (split, seed, index).

        `family_weights` (family -> relative weight, 1.0 when missing) reweights the family draw.
        """

    @abstractmethod
    def setup(self, task: TaskSpec) -> tuple[ToolSet, Any]:
        """A ToolSet bound to a fresh episode state (allowlist = `task.allowed_tools`) and that state."""

    @abstractmethod
    def check(self, task: TaskSpec, state: Any, episode: Episode) -> CheckResult:
        """Decide success from the episode's final state and final answer."""

    def expert(self, detour_rate: float = 0.0, seed: int = 0) -> Any | None:
        """A programmatic teacher policy for this environment, or None when it has none.

        `detour_rate`: the share of episodes in which it first writes a wrong step with weight 0 (a detour the
        harness rejects, masked in training) before the right one; `seed` seeds that choice.
        """
        return None

    def families(self, split: str, seed: int = 0) -> dict[str, list[str]]:
        """The task families of `split`, each with the tools its tasks need; empty when there are none.

        `collect --balance` turns these into `family_weights` that even out how often each tool is called.
        """
        return {}

    def pool_size(self, split: str) -> int | None:
        """How many distinct tasks `split` holds; None (the default) when its tasks are generated without end.

        `agentrig eval` takes at most this many tasks of the split, so a finite task list is never wrapped
        around into repeats.
        """
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
