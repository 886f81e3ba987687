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

import json
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

# What an honest "this could not be done" answer says, in some words (datadesk's and MCP tasks' checkers).
HONEST_MARKERS = ("could not", "couldn't", "cannot", "can't", "no customer", "no product", "no data", "not find",
                  "not found", "no record", "unable", "doesn't exist", "does not exist", "isn't available",
                  "is not available", "no sales", "not available", "no such", "there is no", "there are no")

_NUMBER = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")


def check_no_tool_and_impossible(exp: Mapping[str, Any], prompt: str, answer: str, episode: Any, res: CheckResult,
                                 unavailable: str = "the data is not available",
                                 ignore: "re.Pattern[str] | None" = None) -> None:
    """The shared rules for `no_tool` tasks (no call, a non-empty answer) and `impossible` ones (no number
    the prompt did not give, and an honest answer that says `unavailable`); `ignore` masks text (dates) out of
    the number comparison. Adds the reasons to `res`."""
    calls = [c for s in episode.steps for c in s.calls]
    if exp.get("no_tool") and calls:
        res.forbidden.append("tool call on a request that needs no tool")
        res.reasons.append(f"{len(calls)} tool call(s) on a request that needs no tool")
    if exp.get("no_tool") and not answer.strip():
        res.reasons.append("empty answer")
    if exp.get("impossible"):
        strip = (lambda t: ignore.sub(" ", t)) if ignore is not None else (lambda t: t)
        allowed = set(numbers_in(strip(prompt)))
        invented = [n for n in numbers_in(strip(answer)) if n not in allowed]
        if invented:
            res.invented_numbers = invented
            res.reasons.append(f"invented number(s) {invented} on an impossible task")
        if not any(m in answer.lower() for m in HONEST_MARKERS):
            res.reasons.append(f"the answer does not say that {unavailable}")


def check_answer(exp: Mapping[str, Any], episode: Any, res: CheckResult) -> str:
    """The rules every checker starts with: the episode ended with a final answer, and every expected figure
    (`exp["figures"]`, matched by kind) and term (`exp["terms"]`, case-insensitive) is in it. Adds the
    reasons to `res` (a missing figure or term also clears `figures_ok`) and returns the answer."""
    answer = episode.final_answer or ""
    if episode.termination != "final_answer":
        res.reasons.append(f"no final answer (episode ended by {episode.termination or 'nothing'})")
    for fig in exp.get("figures", []):
        value, kind, tol = figure_spec(fig)
        if not has_figure(answer, value, kind, tol):
            res.figures_ok = False
            res.reasons.append(f"figure {figure_text(value)} missing from the answer")
    low = answer.lower()
    for term in exp.get("terms", []):
        if str(term).lower() not in low:
            res.figures_ok = False
            res.reasons.append(f"{term!r} missing from the answer")
    return answer


def figure_text(x: float) -> str:
    """A figure as the reasons write it: 42, 1234.5."""
    return str(int(x)) if float(x).is_integer() else repr(x)


def settle(res: CheckResult, episode: Any, answer: str) -> CheckResult:
    """Success when no reason was added; otherwise whether it is an honest failure: tools failed under the
    agent, it said so, and it did nothing forbidden and invented nothing (kept for training)."""
    res.success = not res.reasons
    if res.success:
        res.reasons.append("all requirements met")
    else:
        tools_failed = bool(episode.faults) or any(not r.ok for s in episode.steps for r in s.results)
        res.honest_failure = (episode.termination == "final_answer" and tools_failed and not res.forbidden
                              and not res.invented_numbers and any(m in answer.lower() for m in HONEST_MARKERS))
    return res


def classify_observation(content: str) -> str:
    """What a tool observation is, for an expert teacher: ok, empty ("No result"), timeout, unavailable (503),
    rate_limited (429), broken (cut or malformed JSON), or error (a tool error, a refusal, a schema error)."""
    head = content[:200]
    if head.startswith("No result"):
        return "empty"
    if "timed out" in head:
        return "timeout"
    if head.startswith("Error: 503"):
        return "unavailable"
    if head.startswith("Error: 429"):
        return "rate_limited"
    if head.startswith("Error") or head.startswith("Tool execution failed"):
        return "error"
    try:
        json.loads(content)
    except json.JSONDecodeError:
        return "broken"
    return "ok"


def numbers_in(text: str) -> list[float]:
    """Every number written in `text` ("12,345.67", "-3", "0.5"), thousands separators removed."""
    return [float(m.group(0).replace(",", "")) for m in _NUMBER.finditer(text or "")]


def ungrounded_figures(text: str, context: str, small: float = 1000.0) -> list[str]:
    """The figures written in `text` that no number of `context` states, as written.

    A figure is a number with decimals, or an integer of at least `small` (smaller integers, such as counts
    or the 100 of a percentage, are not checked). It is grounded when a number of the context rounds or
    truncates to it at the precision it is written with (`40410.30` and `40410.3`; `-10.08` and `-10.087673`);
    signs are ignored, since "fell by 3%" writes -3 without its sign.
    """
    known = [abs(v) for v in numbers_in(context)]
    out = []
    for match in _NUMBER.finditer(text or ""):
        written = match.group(0).replace(",", "").lstrip("-")
        decimals = len(written.split(".")[1]) if "." in written else 0
        value = float(written)
        if decimals == 0 and value < small:
            continue
        step = 10.0 ** -decimals
        if not any(abs(k - value) < step / 2 + 1e-9 or 0 <= k - value < step for k in known):
            out.append(match.group(0))
    return out


FIGURE_KINDS = ("exact", "count", "money", "approx")


def figure_matches(value: float, target: float, kind: str = "exact", tol: float | None = None) -> bool:
    """Whether a number written in an answer states `target`, matched by the figure's kind.

    - `count`: integers (counts, years, ids) exactly: 1992 never matches 1991.
    - `money`: to the cent in its currency (more decimals are rounded to the cent first).
    - `approx`: within `tol`, for converted or derived values whose rounding the agent may do differently
      (a percentage written to one decimal, a sum of amounts each rounded to the cent).
    - `exact` (the default): equal; more decimals than the target has are allowed when they round to it
      (3.14159 states 3.14).
    """
    if kind == "count":
        return float(target).is_integer() and value == target
    if kind == "money":
        return abs(round(value, 2) - round(target, 2)) < 1e-6
    if kind == "approx":
        if tol is None or tol < 0:
            raise ValueError("an approx figure needs a tolerance >= 0 (tol=...)")
        return abs(value - target) <= tol + 1e-9 * max(1.0, abs(target))
    if kind != "exact":
        raise ValueError(f"unknown figure kind {kind!r}; use one of {', '.join(FIGURE_KINDS)}")
    if abs(value - target) <= 1e-9 * max(1.0, abs(target)):
        return True
    digits = _decimals(target)
    return digits is not None and abs(round(value, digits) - target) <= 1e-9 * max(1.0, abs(target))


def _decimals(x: float) -> int | None:
    """How many decimals `x` is written with (at most 9), or None for a value that needs more."""
    for d in range(10):
        if abs(round(x, d) - x) <= 1e-12 * max(1.0, abs(x)):
            return d
    return None


def has_figure(text: str, target: float, kind: str = "exact", tol: float | None = None) -> bool:
    """Whether `text` states `target`, matched by kind (see `figure_matches`)."""
    return any(figure_matches(v, target, kind, tol) for v in numbers_in(text))


def figure_spec(spec: Any) -> tuple[float, str, float | None]:
    """An expected figure as (value, kind, tol): a bare number is `exact`; a dict is
    {"value": 12.5, "kind": "money"} or {"value": 3.4, "kind": "approx", "tol": 0.05}."""
    if isinstance(spec, dict):
        kind = spec.get("kind", "exact")
        if kind not in FIGURE_KINDS:
            raise ValueError(f"unknown figure kind {kind!r}; use one of {', '.join(FIGURE_KINDS)}")
        return float(spec["value"]), kind, spec.get("tol")
    return float(spec), "exact", None
