"""Metrics over hand-built episodes: every rate, pass^k against tau-bench's definition, Wilson intervals."""

from __future__ import annotations

import json
import math

import pytest

from agentrig.evals.metrics import MetricSet, Rate, compute_metrics, pass_hat_k, wilson_interval
from agentrig.harness.protocol import DEFECT_KINDS
from agentrig.harness.trajectory import Defect, Episode, Step, TaskSpec, ToolCall, ToolResult


def _episode(
    task_id: str,
    success: bool,
    *,
    family: str = "lookup",
    split: str = "test",
    steps: list[Step] | None = None,
    faults: list[str] | None = None,
    impossible: bool = False,
) -> Episode:
    task = TaskSpec(id=task_id, prompt="p", family=family, split=split, metadata={"impossible": impossible})
    return Episode(
        episode_id=f"{task_id}-{id(steps)}",
        task=task,
        protocol="hermes",
        system_prompt="s",
        tools=[],
        steps=steps or [Step(index=0, raw_output="done", text="done", is_final=True)],
        success=success,
        faults=faults or [],
        termination="final_answer",
    )


def _call_step(i: int, ok: bool, defect_kind: str | None = None) -> Step:
    call = ToolCall(id=f"c{i}", name="stock_level", arguments={"sku": "A"})
    result = ToolResult(call_id=call.id, name=call.name, content="x", ok=ok)
    defects = [Defect(kind=defect_kind, message="m", call_id=call.id)] if defect_kind else []
    return Step(index=i, raw_output="r", text="", calls=[call], results=[result], defects=defects)


def test_wilson_interval_matches_the_closed_form() -> None:
    low, high = wilson_interval(8, 10)
    # Reference values for 8/10 at 95% (Wilson 1927; e.g. statsmodels proportion_confint method="wilson").
    assert low == pytest.approx(0.4902, abs=1e-4)
    assert high == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 5)[0] == 0.0 and wilson_interval(5, 5)[1] == 1.0


def test_pass_hat_k_is_tau_bench_definition() -> None:
    outcomes = {"a": [True, True, False, True], "b": [False, False, False, False], "c": [True] * 4}
    # a: c=3, n=4. pass^1 = 3/4, pass^2 = C(3,2)/C(4,2) = 3/6, pass^4 = 0.
    assert pass_hat_k(outcomes, 1) == pytest.approx((0.75 + 0 + 1) / 3)
    assert pass_hat_k(outcomes, 2) == pytest.approx((0.5 + 0 + 1) / 3)
    assert pass_hat_k(outcomes, 4) == pytest.approx((0 + 0 + 1) / 3)
    assert pass_hat_k(outcomes, 5) is None
    assert math.isclose(pass_hat_k({"x": [True, False]}, 1), 0.5)


def test_compute_metrics_counts_every_rate() -> None:
    steps_ok = [_call_step(0, True), Step(index=1, raw_output="a", text="a", is_final=True)]
    steps_bad = [
        _call_step(0, False, "schema_violation"),
        Step(index=1, raw_output="<tool_call>{", text="", defects=[Defect(kind="unparseable_call", message="m")]),
        _call_step(2, True),
        Step(index=3, raw_output="a", text="a", is_final=True),
    ]
    episodes = [
        _episode("t1", True, steps=steps_ok),
        _episode("t2", False, steps=steps_bad, family="update"),
        _episode("t3", True, faults=["timeout"], steps=[_call_step(0, False), *steps_ok], family="update"),
        _episode("t4", False, faults=["error"]),
        _episode("t5", True, impossible=True, family="impossible"),
        _episode("t6", False, impossible=True, family="impossible", split="test_unseen_tools"),
    ]
    m = compute_metrics(episodes)
    assert m.episodes == 6 and m.tasks == 6
    assert (m.completion.hits, m.completion.total) == (3, 6)
    # successes: t1 (2 steps), t3 (3 steps), t5 (1 step)
    assert m.avg_turns == pytest.approx(2.0)
    # results: t1 1 ok; t2 1 bad + 1 ok; t3 1 bad + 1 ok -> 3 / 5
    assert (m.tool_call_success.hits, m.tool_call_success.total) == (3, 5)
    # attempts: t1 1, t2 2 calls + 1 unparseable, t3 2 -> 6; invalid: schema + unparseable
    assert (m.invalid_calls.hits, m.invalid_calls.total) == (2, 6)
    assert set(m.invalid_by_kind) == set(DEFECT_KINDS)
    assert m.invalid_by_kind["schema_violation"].hits == 1 and m.invalid_by_kind["unparseable_call"].hits == 1
    assert m.invalid_by_kind["unknown_tool"] == Rate(0, 6)
    assert (m.recovery.hits, m.recovery.total) == (1, 2)
    assert (m.honest_failure.hits, m.honest_failure.total) == (1, 2)
    assert m.pass_hat_k == {1: 0.5}
    assert set(m.by_family) == {"impossible", "lookup", "update"}
    assert m.by_family["update"].completion.hits == 1
    assert m.by_split["test_unseen_tools"].episodes == 1
    assert m.terminations == {"final_answer": 6}


def test_metric_set_round_trips_through_json() -> None:
    m = compute_metrics([_episode("t1", True), _episode("t1", False), _episode("t2", True), _episode("t2", True)])
    assert m.pass_hat_k == {1: 0.75, 2: 0.5}
    again = MetricSet.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again == m


def test_unchecked_episodes_are_refused() -> None:
    ep = _episode("t1", True)
    ep.success = None
    with pytest.raises(ValueError, match="never checked"):
        compute_metrics([ep])
