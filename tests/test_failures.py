"""Failure classes: episodes of every class, driven by the scripted policy on datadesk and checked by its checker."""

from __future__ import annotations

import json

import pytest

from agentrig.envs import load_env
from agentrig.evals.failures import FAILURE_CLASSES, classify_episodes, classify_failure
from agentrig.harness import HarnessConfig, ScriptedPolicy, run_episode
from agentrig.evals.metrics import MetricSet, compute_metrics
from agentrig.evals.report import failure_examples, markdown_report, metric_rows
from agentrig.harness.trajectory import ToolResult

ENV = load_env("datadesk")
TASKS = ENV.tasks("dev", 200) + ENV.tasks("test", 200)


def task_of(family: str, variant: str | None = None):
    return next(t for t in TASKS if t.family == family and (variant is None or t.metadata["variant"] == variant))


def call(tool_name, **args):
    return "<tool_call>\n" + json.dumps({"name": tool_name, "arguments": args}) + "\n</tool_call>"


def failing_hook(call_, execute):
    return ToolResult(call_.id, call_.name, "Error: 503 Service Unavailable", ok=False, fault="error_503", error="error_503")


def episode(task, replies, harness=None, hook=None):
    tools, state = ENV.setup(task)
    try:
        ep = run_episode(task, tools, ScriptedPolicy(replies), harness or HarnessConfig(), tool_hook=hook)
        result = ENV.check(task, state, ep)
    finally:
        ENV.close(state)
    ep.success, ep.check = result.success, result.to_dict()
    return ep


SPEND = task_of("chained_lookup")  # Ben Haas, 2024-04
MANAGER = task_of("single_lookup", "manager")  # South

CASES = {
    "call_on_no_tool": lambda: episode(task_of("no_tool"), [call("list_tables"), "Done."]),
    "no_honest_answer": lambda: episode(task_of("impossible"), ["The total is 1234.50."]),
    "stuck": lambda: episode(MANAGER, [call("region_info", region="South")] * 3),
    "budget": lambda: episode(MANAGER, [call("region_info", region="South")], HarnessConfig(max_steps=1)),
    "wrong_tool": lambda: episode(MANAGER, [call("send_report", to="south.manager@datadesk.example", subject="Manager", body="x"), "I could not find it."]),
    "schema_violation": lambda: episode(SPEND, [call("find_customer", name="Ben Haas"),
                                                call("list_orders", customer_id="x", month="April 2024"), "I do not know."]),
    "unparseable_call": lambda: episode(MANAGER, ['<tool_call>\nregion_info for South, please\n</tool_call>',
                                                  "I could not find it."]),
    "no_call": lambda: episode(MANAGER, ["The manager is north.manager@datadesk.example."]),
    "gave_up": lambda: episode(MANAGER, [call("region_info", region="South"), "I could not look that up."],
                               hook=failing_hook),
    "wrong_value": lambda: episode(MANAGER, [call("region_info", region="North"), "It is north.manager@datadesk.example."]),
    "answer_figure": lambda: episode(MANAGER, [call("region_info", region="South"), "I found the region."]),
    "side_effect": lambda: episode(
        task_of("report"), [call("send_report", to="sales.lead@datadesk.example", subject="Sales",
                                body="Coastal and West sales for Sep 2024 are below."), "Sent."]),
}


@pytest.mark.parametrize("kind", sorted(CASES))
def test_each_class_is_recognised(kind):
    ep = CASES[kind]()
    assert ep.success is False, ep.check
    failure = classify_failure(ep)
    assert failure is not None and failure.kind == kind, (failure, ep.check, ep.termination)
    assert failure.detail


def test_details_name_what_went_wrong():
    stuck = classify_failure(CASES["stuck"]())
    assert stuck.detail == 'region_info({"region": "South"}) resent after a result that was fine'
    schema = classify_failure(CASES["schema_violation"]())
    assert "list_orders" in schema.detail and "month" in schema.detail and "April 2024" in schema.detail
    wrong = classify_failure(CASES["wrong_value"]())
    assert "region='North'" in wrong.detail
    gave_up = classify_failure(CASES["gave_up"]())
    assert gave_up.detail.startswith("answered after region_info failed, with ") and "run_sql" in gave_up.detail


def test_a_correct_conversion_is_grounded_and_successes_are_not_classified():
    # The user wrote "2024-04"; the same month as a name in the request also counts as grounded.
    ep = CASES["answer_figure"]()
    assert classify_failure(ep).kind == "answer_figure"
    good = episode(MANAGER, [call("region_info", region="South"), "The manager is south.manager@datadesk.example."])
    assert good.success and classify_failure(good) is None


def test_every_class_covered_and_counted_in_metrics_and_report():
    assert set(CASES) == set(FAILURE_CLASSES) - {"other"}
    episodes = [make() for make in CASES.values()]
    metrics = compute_metrics(episodes)
    assert metrics.failures == {k: (0 if k == "other" else 1) for k in FAILURE_CLASSES}
    assert MetricSet.from_dict(json.loads(json.dumps(metrics.to_dict()))).failures == metrics.failures
    assert all(ep.metadata["failure"]["kind"] in CASES for ep in episodes)
    rows = dict(metric_rows({"m": metrics}))
    assert rows["failed: stuck"] == ["1"] and "failed: other" not in rows
    examples = failure_examples(episodes)
    assert set(examples) == set(CASES)
    page = markdown_report({"m": metrics}, {}, [], failures=examples)
    assert "## Why episodes failed" in page and "### gave_up" in page and "failure class: stuck" in page


def test_classify_episodes_clears_a_stale_class():
    ep = CASES["no_call"]()
    assert classify_episodes([ep])["no_call"] == 1
    ep.success = True
    assert sum(classify_episodes([ep]).values()) == 0 and "failure" not in ep.metadata


def test_a_permitted_tool_the_task_does_not_need_is_a_wrong_tool_unless_chosen_after_a_failure():
    task = next(t for t in TASKS if t.family == "single_lookup" and t.metadata["variant"] == "manager"
                and "list_tables" in t.allowed_tools)
    assert task.expected["needed_tools"] == ["region_info"]
    chosen = episode(task, [call("list_tables"), "I could not find the manager."])
    failure = classify_failure(chosen)
    assert failure.kind == "wrong_tool", failure
    assert failure.detail == ("called list_tables, which this task does not need (it needs region_info), "
                              "while every call so far had worked")
    # region_info fails first: trying another tool is recovery, and the episode is classified by what follows.
    switched = episode(task, [call("region_info", region=task.metadata["params"]["region"]), call("list_tables"),
                              "I could not find the manager."], hook=lambda c, execute: failing_hook(c, execute)
                       if c.name == "region_info" else execute())
    assert switched.success is False and classify_failure(switched).kind != "wrong_tool"


def test_a_wrong_tool_that_leads_into_a_loop_or_out_of_steps_is_classified_by_the_choice():
    """The first decisive cause: the unneeded tool chosen first, not the loop or the step budget it led to."""
    task = next(t for t in TASKS if t.family == "single_lookup" and t.metadata["variant"] == "manager"
                and "list_tables" in t.allowed_tools)
    region = task.metadata["params"]["region"]
    looped = episode(task, [call("list_tables"), call("region_info", region=region)]
                     + [call("region_info", region=region)] * 2)
    assert looped.termination == "stuck"
    assert classify_failure(looped).kind == "wrong_tool"
    ran_out = episode(task, [call("list_tables"), call("list_tables"), call("region_info", region=region)],
                      HarnessConfig(max_steps=2))
    assert ran_out.termination == "max_steps"
    assert classify_failure(ran_out).kind == "wrong_tool"
    # The same loop without the wrong choice first is `stuck`.
    assert classify_failure(episode(task, [call("region_info", region=region)] * 3)).kind == "stuck"


def test_a_calculation_with_a_figure_no_result_gave_is_a_wrong_value():
    # The model fetches both months, then computes with a figure of its own: the calculation, not the answer,
    # is the first decisive cause. The same calculation with the fetched figures (written to two decimals)
    # is grounded, and a bare month such as "2024-06" is still matched as a string, not as arithmetic.
    task = task_of("arithmetic", "pct_change")
    region, (first, second) = task.metadata["params"]["region"], task.metadata["params"]["months"]
    fetch = call("sales_total", region=region, month=first)
    fetch_second = call("sales_total", region=region, month=second)
    probe = episode(task, [fetch, fetch_second, "Fetched."])
    totals = [json.loads(r.content)["total"] for step in probe.steps for r in step.results]
    a, b = (f"{t:.2f}" for t in totals)

    invented = episode(task, [fetch, fetch_second, call("calculator", expression=f"({b} - 50369.99) / 50369.99 * 100"),
                              "It changed by 12%."])
    failure = classify_failure(invented)
    assert failure.kind == "wrong_value", failure
    assert "the figure 50369.99 in expression appears neither" in failure.detail

    right = episode(task, [fetch, fetch_second, call("calculator", expression=f"({b} - {a}) / {a} * 100"),
                           "It changed by 12%."])
    assert classify_failure(right).kind == "answer_figure"

    other_month = episode(task, [fetch, call("sales_total", region=region, month="2023-06"), "It changed by 12%."])
    failure = classify_failure(other_month)
    assert failure.kind == "wrong_value" and "month='2023-06'" in failure.detail
