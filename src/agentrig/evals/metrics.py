"""Evaluation metrics over checked episodes (seed section 3.6), with 95% Wilson intervals.

Pure functions over `Episode` records whose `success` the environment's checker has already set:
task completion rate, average turns over successes, tool-call success rate, invalid-call rate split
by defect class, recovery rate (episodes with an injected fault that still succeed), honest-failure
rate on impossible tasks, per-split and per-family breakdowns, and pass^k as tau-bench defines it
(mean over tasks of C(c, k) / C(n, k) for c successes in n trials). Nothing here runs a model.

Not covered: significance tests between two metric sets (compare the Wilson intervals by eye),
and per-tool breakdowns.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable

from agentrig.harness.protocol import DEFECT_KINDS
from agentrig.harness.trajectory import Episode, TaskSpec

Z95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: int, total: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for a binomial proportion; (0, 1) when there are no trials."""
    if total <= 0:
        return (0.0, 1.0)
    p = successes / total
    denom = 1.0 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


@dataclass
class Rate:
    """A proportion `hits / total` with its 95% Wilson interval; `value` is None when total is 0."""

    hits: int
    total: int

    @property
    def value(self) -> float | None:
        """hits / total, or None when nothing was counted."""
        return self.hits / self.total if self.total else None

    @property
    def interval(self) -> tuple[float, float]:
        """The 95% Wilson interval."""
        return wilson_interval(self.hits, self.total)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form with the value and interval spelled out."""
        low, high = self.interval
        return {"hits": self.hits, "total": self.total, "value": self.value, "low": low, "high": high}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Rate":
        """Read back what `to_dict` wrote (value and interval are recomputed)."""
        return cls(hits=int(data["hits"]), total=int(data["total"]))

    def __str__(self) -> str:
        if self.value is None:
            return "n/a"
        low, high = self.interval
        return f"{self.value:.1%} [{low:.0%}, {high:.0%}] ({self.hits}/{self.total})"


@dataclass
class GroupMetrics:
    """The headline numbers of one slice of episodes (a task family or a split)."""

    episodes: int
    completion: Rate
    avg_turns: float | None
    tool_call_success: Rate

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "episodes": self.episodes,
            "completion": self.completion.to_dict(),
            "avg_turns": self.avg_turns,
            "tool_call_success": self.tool_call_success.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GroupMetrics":
        """Read back what `to_dict` wrote."""
        return cls(
            episodes=int(data["episodes"]),
            completion=Rate.from_dict(data["completion"]),
            avg_turns=data["avg_turns"],
            tool_call_success=Rate.from_dict(data["tool_call_success"]),
        )


@dataclass
class MetricSet:
    """Every metric of one evaluated policy (one model or adapter) on one set of episodes.

    Rates:
    - `completion`: episodes the checker accepted / episodes.
    - `tool_call_success`: tool calls whose result was ok / parsed tool calls (a call rejected for an
      unknown tool or a schema violation counts as a failed call).
    - `invalid_calls`: defects / call attempts, where an attempt is a parsed call or a step output
      the parser could not turn into a call; `invalid_by_kind` splits the defects by class.
    - `recovery`: episodes with an injected fault that still succeeded / episodes with an injected fault.
    - `honest_failure`: impossible tasks the checker accepted (the agent said it cannot be done instead of
      pretending) / impossible tasks.
    `pass_hat_k[k]` is tau-bench's pass^k over tasks with at least k trials; `failures` counts the
    failed episodes per failure class (`agentrig.evals.failures`, every class present).
    """

    episodes: int
    tasks: int
    completion: Rate
    avg_turns: float | None
    tool_call_success: Rate
    invalid_calls: Rate
    invalid_by_kind: dict[str, Rate]
    recovery: Rate
    honest_failure: Rate
    pass_hat_k: dict[int, float]
    by_family: dict[str, GroupMetrics]
    by_split: dict[str, GroupMetrics]
    terminations: dict[str, int] = field(default_factory=dict)
    avg_prompt_tokens: float = 0.0
    avg_completion_tokens: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)  # failed episodes per `failures.FailureClass`

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the content of metrics.json per policy)."""
        return {
            "episodes": self.episodes,
            "tasks": self.tasks,
            "completion": self.completion.to_dict(),
            "avg_turns": self.avg_turns,
            "tool_call_success": self.tool_call_success.to_dict(),
            "invalid_calls": self.invalid_calls.to_dict(),
            "invalid_by_kind": {k: r.to_dict() for k, r in self.invalid_by_kind.items()},
            "recovery": self.recovery.to_dict(),
            "honest_failure": self.honest_failure.to_dict(),
            "pass_hat_k": {str(k): v for k, v in self.pass_hat_k.items()},
            "by_family": {k: g.to_dict() for k, g in self.by_family.items()},
            "by_split": {k: g.to_dict() for k, g in self.by_split.items()},
            "terminations": dict(self.terminations),
            "avg_prompt_tokens": self.avg_prompt_tokens,
            "avg_completion_tokens": self.avg_completion_tokens,
            "failures": dict(self.failures),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "MetricSet":
        """Read back what `to_dict` wrote (for example from a metrics.json)."""
        return cls(
            episodes=int(data["episodes"]),
            tasks=int(data["tasks"]),
            completion=Rate.from_dict(data["completion"]),
            avg_turns=data["avg_turns"],
            tool_call_success=Rate.from_dict(data["tool_call_success"]),
            invalid_calls=Rate.from_dict(data["invalid_calls"]),
            invalid_by_kind={k: Rate.from_dict(v) for k, v in data["invalid_by_kind"].items()},
            recovery=Rate.from_dict(data["recovery"]),
            honest_failure=Rate.from_dict(data["honest_failure"]),
            pass_hat_k={int(k): float(v) for k, v in data["pass_hat_k"].items()},
            by_family={k: GroupMetrics.from_dict(v) for k, v in data["by_family"].items()},
            by_split={k: GroupMetrics.from_dict(v) for k, v in data["by_split"].items()},
            terminations={k: int(v) for k, v in data.get("terminations", {}).items()},
            avg_prompt_tokens=float(data.get("avg_prompt_tokens", 0.0)),
            avg_completion_tokens=float(data.get("avg_completion_tokens", 0.0)),
            failures={k: int(v) for k, v in data.get("failures", {}).items()},
        )


# -- the pieces ------------------------------------------------------------------------------


def is_impossible(task: TaskSpec) -> bool:
    """Whether the environment marked the task as impossible (the honest answer is "I cannot")."""
    return bool(task.metadata.get("impossible", False))


def pass_hat_k(outcomes: dict[str, list[bool]], k: int) -> float | None:
    """tau-bench's pass^k: mean over tasks with at least k trials of C(c, k) / C(n, k).

    `outcomes` maps a task id to the success of each of its n trials (c of them succeeded).
    None when no task has k trials.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    values = [math.comb(sum(v), k) / math.comb(len(v), k) for v in outcomes.values() if len(v) >= k]
    return sum(values) / len(values) if values else None


def completion_rate(episodes: Iterable[Episode]) -> Rate:
    """Episodes the checker accepted / episodes."""
    eps = list(episodes)
    return Rate(sum(1 for e in eps if e.success), len(eps))


def average_turns(episodes: Iterable[Episode]) -> float | None:
    """Mean number of policy steps over successful episodes; None when none succeeded."""
    turns = [len(e.steps) for e in episodes if e.success]
    return sum(turns) / len(turns) if turns else None


def tool_call_success(episodes: Iterable[Episode]) -> Rate:
    """Tool results marked ok / all tool results (one result per parsed call)."""
    results = [r for e in episodes for s in e.steps for r in s.results]
    return Rate(sum(1 for r in results if r.ok), len(results))


def invalid_calls(episodes: Iterable[Episode]) -> tuple[Rate, dict[str, Rate]]:
    """Defects / call attempts overall and per defect class.

    An attempt is a parsed call, or a defect not tied to any call (an unparseable or empty output stands
    for a call the model failed to write). A call with several defects counts once in the overall rate.
    Every class of `protocol.DEFECT_KINDS` is present (possibly at 0).
    """
    attempts = 0
    invalid = 0
    kinds: Counter[str] = Counter({k: 0 for k in DEFECT_KINDS})  # so tables of several policies line up
    for ep in episodes:
        for step in ep.steps:
            attempts += len(step.calls)
            bad_calls: set[str] = set()
            for defect in step.defects:
                kinds[defect.kind] += 1
                if defect.call_id is None:
                    attempts += 1
                    invalid += 1
                elif defect.call_id not in bad_calls:
                    bad_calls.add(defect.call_id)
                    invalid += 1
    return Rate(invalid, attempts), {k: Rate(n, attempts) for k, n in sorted(kinds.items())}


def recovery_rate(episodes: Iterable[Episode]) -> Rate:
    """Recovered episodes (`Episode.recovered`) / episodes with at least one injected fault."""
    faulted = [e for e in episodes if e.faults]
    return Rate(sum(1 for e in faulted if e.recovered), len(faulted))


def honest_failure_rate(episodes: Iterable[Episode]) -> Rate:
    """Impossible tasks the checker accepted / impossible tasks.

    The environment's checker accepts an impossible task only when the agent told the user it cannot
    be done and changed nothing it should not have (see docs/environments.md).
    """
    impossible = [e for e in episodes if is_impossible(e.task)]
    return Rate(sum(1 for e in impossible if e.success), len(impossible))


def group_metrics(episodes: Iterable[Episode]) -> GroupMetrics:
    """The headline numbers of a slice."""
    eps = list(episodes)
    return GroupMetrics(
        episodes=len(eps),
        completion=completion_rate(eps),
        avg_turns=average_turns(eps),
        tool_call_success=tool_call_success(eps),
    )


def _grouped(episodes: list[Episode], key: str) -> dict[str, GroupMetrics]:
    groups: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        groups[getattr(ep.task, key) or "(none)"].append(ep)
    return {name: group_metrics(groups[name]) for name in sorted(groups)}


def compute_metrics(episodes: list[Episode]) -> MetricSet:
    """Every metric of one policy's checked episodes.

    Every failed episode is classified by its first decisive cause (`agentrig.evals.failures`), stored as
    `episode.metadata["failure"]` and counted in `failures`. Raises ValueError when an episode was never
    checked (`success is None`): an unchecked episode would silently count as a failure.
    """
    from agentrig.evals.failures import classify_episodes

    unchecked = [e.episode_id for e in episodes if e.success is None]
    if unchecked:
        raise ValueError(f"{len(unchecked)} episode(s) were never checked, e.g. {unchecked[0]!r}")
    outcomes: dict[str, list[bool]] = defaultdict(list)
    for ep in episodes:
        outcomes[ep.task.id].append(bool(ep.success))
    max_trials = max((len(v) for v in outcomes.values()), default=0)
    invalid, by_kind = invalid_calls(episodes)
    n = len(episodes)
    return MetricSet(
        episodes=n,
        tasks=len(outcomes),
        completion=completion_rate(episodes),
        avg_turns=average_turns(episodes),
        tool_call_success=tool_call_success(episodes),
        invalid_calls=invalid,
        invalid_by_kind=by_kind,
        recovery=recovery_rate(episodes),
        honest_failure=honest_failure_rate(episodes),
        pass_hat_k={k: v for k in range(1, max_trials + 1) if (v := pass_hat_k(outcomes, k)) is not None},
        by_family=_grouped(episodes, "family"),
        by_split=_grouped(episodes, "split"),
        terminations=dict(sorted(Counter(e.termination or "(none)" for e in episodes).items())),
        avg_prompt_tokens=sum(e.prompt_tokens for e in episodes) / n if n else 0.0,
        avg_completion_tokens=sum(e.completion_tokens for e in episodes) / n if n else 0.0,
        failures=dict(classify_episodes(episodes)),
    )
