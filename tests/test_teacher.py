"""The expert teacher drives whole episodes through the harness: clean runs, recoveries, honesty, detours."""

from __future__ import annotations

import json
import random
import re

import pytest

from agentrig.data.augment import apply_rename
from agentrig.envs import load_env
from agentrig.harness.faults import FaultConfig
from agentrig.harness import HarnessConfig, run_episode
from agentrig.harness.protocol import get_protocol
from agentrig.envs.datadesk.teacher import ExpertTeacher
from agentrig.harness.trajectory import ToolResult


@pytest.fixture(scope="module")
def env():
    return load_env("datadesk")


def _task(env, family, variant=None, split="train"):
    return next(t for t in env.tasks(split, 400, seed=4)
                if t.family == family and (variant is None or t.metadata["variant"] == variant))


def _run(env, task, hook=None, teacher=None):
    tools, state = env.setup(task)
    ep = run_episode(task, tools, teacher or ExpertTeacher(), HarnessConfig(), tool_hook=hook, episode_id=task.id)
    return ep, env.check(task, state, ep), state


def _script(kinds):
    """A hook that injects the given fault kinds on successive calls (None = run normally)."""
    seq = list(kinds)

    def hook(call, execute):
        kind = seq.pop(0) if seq else None
        if kind is None:
            return execute()
        text = {"timeout": f"Tool execution failed: '{call.name}' timed out after 10 s",
                "error_503": "Error: 503 Service Unavailable: try again later.", "no_result": "No result"}[kind]
        return ToolResult(call.id, call.name, text, ok=False, fault=kind, error=kind)

    return hook


def test_clean_transcript_of_a_chained_lookup(env):
    task = _task(env, "chained_lookup", "customer_spend")
    ep, res, _ = _run(env, task)
    assert res.success, res.reasons
    proto = get_protocol("hermes")
    msgs = ep.messages_full
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    cust = json.loads(msgs[3]["content"])
    assert msgs[2]["tool_calls"][0]["function"] == {"name": "find_customer",
                                                    "arguments": json.dumps({"name": task.metadata["params"]["name"]})}
    assert json.loads(msgs[4]["tool_calls"][0]["function"]["arguments"]) == {
        "customer_id": cust["customer_id"], "month": task.metadata["params"]["month"]}
    orders = json.loads(msgs[5]["content"])
    assert f"{orders['total']:.2f}" in msgs[6]["content"]
    for step in ep.steps:  # the teacher's raw output is exactly the canonical form
        assert step.raw_output == proto.assistant_text(step.text, step.calls) and not step.repairs


@pytest.mark.parametrize("split", ["train", "test_unseen_tools"])
def test_every_family_succeeds_without_faults(env, split):
    seen = set()
    for task in env.tasks(split, 120, seed=9):
        ep, res, _ = _run(env, task)
        assert res.success, (task.family, task.prompt, res.reasons)
        seen.add(task.family)
        if task.metadata["no_tool"]:
            assert not any(s.calls for s in ep.steps)
    assert len(seen) >= (11 if split == "train" else 1)


def test_timeout_is_retried_once(env):
    task = _task(env, "single_lookup", "sales")
    ep, res, _ = _run(env, task, hook=_script(["timeout"]))
    assert res.success and ep.faults == ["timeout"]
    assert [c.name for s in ep.steps for c in s.calls] == ["sales_total", "sales_total"]
    assert "trying once more" in ep.steps[1].text


def test_repeated_failure_switches_to_run_sql(env):
    task = _task(env, "single_lookup", "sales")
    ep, res, _ = _run(env, task, hook=_script(["error_503", "error_503"]))
    assert res.success, res.reasons
    calls = [c for s in ep.steps for c in s.calls]
    assert [c.name for c in calls] == ["sales_total", "sales_total", "run_sql"]
    assert calls[2].arguments["query"].startswith("SELECT") and "switching to run_sql" in ep.steps[2].text


def test_total_failure_is_told_honestly_and_labelled(env):
    task = _task(env, "single_lookup", "sales")
    ep, res, _ = _run(env, task, hook=_script(["timeout"] * 4))
    assert ep.termination == "final_answer" and not res.success
    assert "could not" in ep.final_answer
    # No figure anywhere in the answer that neither the user nor a tool gave (the tools gave only errors).
    figures = re.compile(r"\d+(?:[.,]\d+)*")
    given = set(figures.findall(task.prompt + " ".join(r.content for step in ep.steps for r in step.results)))
    assert set(figures.findall(ep.final_answer)) <= given, ep.final_answer
    assert "figure" in res.reasons[0]


def test_impossible_task_verifies_then_says_so(env):
    task = _task(env, "impossible", "unknown_customer")
    ep, res, _ = _run(env, task)
    assert res.success, res.reasons
    assert [c.name for s in ep.steps for c in s.calls] == ["find_customer", "run_sql"]
    assert "could not find" in ep.final_answer


def test_report_is_sent_once_with_the_figures(env):
    task = _task(env, "report")
    ep, res, state = _run(env, task)
    assert res.success and len(state.reports) == 1 and state.reports[0].to == task.metadata["params"]["to"]


def test_long_task_notes_finished_subgoals(env):
    task = _task(env, "long_task")
    ep, res, _ = _run(env, task)
    calls = [c.name for s in ep.steps for c in s.calls if c.name != "note"]
    assert res.success and len(calls) >= 6
    assert [s.calls[0].name for s in ep.steps if s.calls and s.calls[0].name == "note"] == ["note", "note"]
    assert len(ep.memory_events) == 2


def test_detour_is_rejected_weighted_zero_and_corrected(env):
    task = _task(env, "single_lookup", "sales")
    ep, res, _ = _run(env, task, teacher=ExpertTeacher(detour_rate=1.0))
    assert res.success
    assert ep.steps[0].weight == 0.0 and ep.steps[0].defects
    assert ep.steps[0].defects[0].kind in ("schema_violation", "not_permitted", "unknown_tool")
    assert ep.steps[1].weight == 1.0 and ep.steps[1].results[0].ok and ep.detours == 1


def test_quiet_detour_sends_the_corrected_call_with_no_sentence(env):
    """`quiet_detours`: the step after a rejected detour call is the corrected call alone (the raw output starts
    with the call), the same call the sentence-led step makes; every other step, and the episode's success, stay."""
    sentence = "That call was rejected; here is the corrected one."
    seen = 0
    for task, _, loud, quiet in _without_and_with(env, env.tasks("train", 24, seed=4), "quiet_detours",
                                                  detour_rate=1.0):
        assert len(loud.steps) == len(quiet.steps), task.id
        if loud.steps[0].weight != 0.0:  # a task whose first step makes no call has no detour
            assert [s.raw_output for s in loud.steps] == [s.raw_output for s in quiet.steps]
            continue
        seen += 1
        assert quiet.steps[0].raw_output == loud.steps[0].raw_output and quiet.steps[0].defects
        assert loud.steps[1].text == sentence and quiet.steps[1].text == ""
        assert quiet.steps[1].raw_output.lstrip().startswith("<tool_call>") and sentence not in quiet.steps[1].raw_output
        assert [(c.name, c.arguments) for c in quiet.steps[1].calls] == [(c.name, c.arguments) for c in loud.steps[1].calls]
        assert quiet.steps[1].weight == 1.0 and quiet.steps[1].results[0].ok and not quiet.faults
        assert [s.raw_output for s in quiet.steps[2:]] == [s.raw_output for s in loud.steps[2:]]
    assert seen >= 16, seen


def test_plan_first_opens_the_first_calls_with_the_tasks_plan(env):
    """`plan_first`: the episode's first turn is the one-line plan, then the same calls; every later step, the
    weights and the episode's success stay. The plan names the tools the episode then calls, in that order, under
    the episode's names; a task with no tool step (`no_tool`) gets none."""
    seen = set()
    for task, _, plain, planned in _without_and_with(env, env.tasks("train", 60, seed=4), "plan_first"):
        assert [s.weight for s in plain.steps] == [s.weight for s in planned.steps], task.id
        assert [s.raw_output for s in plain.steps[1:]] == [s.raw_output for s in planned.steps[1:]], task.id
        first = planned.steps[0]
        if not plain.steps[0].calls:
            assert first.raw_output == plain.steps[0].raw_output, task.id
            continue
        plan, rest = first.raw_output.split("\n", 1)
        assert plan.startswith("Plan: ") and plan.endswith(".") and rest == plain.steps[0].raw_output, task.id
        assert [(c.name, c.arguments) for c in first.calls] == [(c.name, c.arguments) for c in plain.steps[0].calls]
        words = [w.split(" ")[0] for w in plan[len("Plan: "):-1].split(", ")]
        assert words[-1] in ("answer", "confirm") and words[0] == first.calls[0].name, (task.id, plan)
        called = [s.calls[0].name for s in planned.steps if s.calls]  # one plan item per step
        if not planned.faults and task.family != "impossible":  # the happy path: the plan is what was called
            assert words[:-1] == called, (task.id, plan, called)
        seen.add(task.family)
    assert {"arithmetic", "long_task", "comparison", "report", "single_lookup"} <= seen, seen


def test_sequential_sends_the_same_calls_one_a_turn(env):
    """`sequential`: every turn carries at most one call; the episode makes the same calls in the same order as the
    plain expert's parallel turns, and gives the same answer. Under a fault the retry is the very next turn and
    resends the call that failed, not another one of its round."""
    several = 0
    for task, _, plain, seq in _without_and_with(env, env.tasks("train", 60, seed=4), "sequential"):
        assert all(len(s.calls) <= 1 for s in seq.steps), task.id
        assert ([(c.name, c.arguments) for s in plain.steps for c in s.calls]
                == [(c.name, c.arguments) for s in seq.steps for c in s.calls]), task.id
        assert plain.final_answer == seq.final_answer, task.id
        several += any(len(s.calls) > 1 for s in plain.steps)
    assert several >= 10, several
    task = _task(env, "long_task", "three_regions_usd")
    ep, res, _ = _run(env, task, hook=_script([None, "timeout"]), teacher=ExpertTeacher(sequential=True))
    assert res.success, res.reasons
    first, second, retry = ep.steps[0].calls[0], ep.steps[1].calls[0], ep.steps[2].calls[0]
    assert first.arguments != second.arguments and not ep.steps[1].results[0].ok
    assert (retry.name, retry.arguments) == (second.name, second.arguments)
    assert ep.steps[2].text == f"{second.name} failed (it timed out); trying once more."


def test_retry_round_sends_a_turn_with_a_failure_again_whole(env):
    """`retry_round`: after a turn of several calls in which one failed, the next turn is that whole turn again, in
    its order (the failed call retried, the others as they were), so the results come back together; the episode
    succeeds. Without faults it changes nothing, and a turn of one call is retried alone as before."""
    for task, _, plain, rounds in _without_and_with(env, env.tasks("train", 40, seed=4), "retry_round"):
        assert [s.raw_output for s in plain.steps] == [s.raw_output for s in rounds.steps], task.id
    task = _task(env, "comparison", "months")
    ep, res, _ = _run(env, task, hook=_script(["timeout"]), teacher=ExpertTeacher(retry_round=True))
    assert res.success, res.reasons
    first, again = ep.steps[0], ep.steps[1]
    assert len(first.calls) == 2 and not first.results[0].ok and first.results[1].ok
    assert [(c.name, c.arguments) for c in again.calls] == [(c.name, c.arguments) for c in first.calls]
    assert all(r.ok for r in again.results)
    assert again.text == f"{first.calls[0].name} failed (it timed out); trying once more."
    assert ep.steps[2].is_final
    task = _task(env, "single_lookup")
    ep, res, _ = _run(env, task, hook=_script(["timeout"]), teacher=ExpertTeacher(retry_round=True))
    assert res.success and len(ep.steps[1].calls) == 1, res.reasons


def test_retry_empty_sends_a_look_up_that_found_nothing_once_more(env):
    """`retry_empty`: a look-up answered "No result" is sent once more before the run_sql fallback (an injected
    "No result" then answers at the retry); a look-up that truly finds nothing gets the retry, then the fallback,
    then the honest answer. Without the option the first "No result" goes to run_sql at once."""
    task = _task(env, "single_lookup")
    ep, res, _ = _run(env, task, hook=_script(["no_result"]), teacher=ExpertTeacher(retry_empty=True))
    assert res.success, res.reasons
    first, again = ep.steps[0], ep.steps[1]
    assert first.results[0].content == "No result" and again.results[0].ok
    assert [(c.name, c.arguments) for c in again.calls] == [(c.name, c.arguments) for c in first.calls]
    assert again.text == f"{first.calls[0].name} found nothing; trying once more." and ep.steps[2].is_final
    ep, res, _ = _run(env, task, hook=_script(["no_result"]))
    assert res.success and ep.steps[1].calls[0].name == "run_sql", res.reasons
    assert ep.steps[1].text == f"{ep.steps[0].calls[0].name} found nothing; checking the database directly."
    impossible = next(t for t in env.tasks("train", 200, seed=1) if t.family == "impossible"
                      and t.metadata.get("params", {}).get("region"))
    ep, res, _ = _run(env, impossible, teacher=ExpertTeacher(retry_empty=True))
    assert res.success, (res.reasons, [s.raw_output for s in ep.steps])
    names = [c.name for s in ep.steps for c in s.calls]
    assert names[0] == names[1] != "run_sql" and names[2] == "run_sql" and ep.steps[-1].is_final


def test_renamed_tools_are_used_consistently(env):
    task = _task(env, "currency_aggregation")
    tools, state = env.setup(task)
    task, tools = apply_rename(task, tools, random.Random(1), env.tool_aliases, env.param_aliases)
    mapping = task.metadata["rename"]["tools"]
    ep = run_episode(task, tools, ExpertTeacher(), HarnessConfig(), episode_id=task.id)
    res = env.check(task, state, ep)
    assert res.success, res.reasons
    names = {c.name for s in ep.steps for c in s.calls}
    assert names <= set(task.allowed_tools) and mapping["sales_total"] in names


def test_most_faulted_episodes_still_succeed(env):
    cfg = FaultConfig.from_total(0.25, no_mutate=env.side_effect_tools, drift_names=env.drift_names)
    ok = total = 0
    for i, task in enumerate(env.tasks("train", 80, seed=11)):
        ep, res, _ = _run(env, task, hook=cfg.injector(i))
        ok += res.success
        total += 1
        if not res.success:
            assert ep.faults  # without faults the expert never fails
    assert ok / total > 0.85


def test_repeat_detour_resends_a_call_that_answered_then_goes_on(env):
    """A repeat detour: the identical call again behind the student's retry sentence (weight 0), the harness's
    notice, and a supervised next step that goes on from the first result; the episode still succeeds."""
    notice_cfg = HarnessConfig(repeat_notice=True)
    seen = 0
    for task in env.tasks("train", 60, seed=4):
        tools, state = env.setup(task)
        ep = run_episode(task, tools, ExpertTeacher(repeat_rate=1.0), notice_cfg, episode_id=task.id)
        res = env.check(task, state, ep)
        assert res.success, (task.id, task.family, ep.final_answer, res.reasons)
        zero = [s for s in ep.steps if s.weight == 0.0]
        assert len(zero) <= 1
        if not zero:
            continue
        seen += 1
        z = zero[0]
        before = ep.steps[z.index - 1]
        assert [(c.name, c.arguments) for c in z.calls] == [(c.name, c.arguments) for c in before.calls]
        assert before.results[0].ok and z.raw_output.split("\n")[0].endswith("trying once more.")
        assert z.notices == [f"Notice: '{z.calls[0].name}' already answered exactly this call, and its result is "
                             "above. Do not send it again: use that result for your next call or for your final answer."]
        after = ep.steps[z.index + 1]
        assert after.weight == 1.0 and [(c.name, c.arguments) for c in after.calls] != [(c.name, c.arguments)
                                                                                         for c in z.calls]
        assert "trying once more" not in after.raw_output
        assert all(c.name != "send_report" for c in z.calls)
    assert seen >= 20, seen
    # with injected faults too: a repeat never follows a retry (a third identical call would end the episode)
    faults = FaultConfig.from_total(0.25)
    ends = {}
    for rate in (0.0, 1.0):
        eps = []
        for task in env.tasks("train", 60, seed=4):
            tools, state = env.setup(task)
            ep = run_episode(task, tools, ExpertTeacher(repeat_rate=rate), notice_cfg, episode_id=task.id,
                             tool_hook=faults.injector(task.id, tools=tools))
            eps.append((ep.termination, env.check(task, state, ep).success))
        ends[rate] = eps
    assert all(t != "stuck" for t, _ in ends[1.0])
    assert sum(ok for _, ok in ends[1.0]) >= sum(ok for _, ok in ends[0.0]) - 1
    # an episode without a repeat detour is the one the teacher always wrote (the draw has its own RNG)
    same = 0
    for task in env.tasks("train", 60, seed=4):
        runs = []
        for rate in (0.0, 1.0):
            tools, _ = env.setup(task)
            runs.append(run_episode(task, tools, ExpertTeacher(detour_rate=0.3, repeat_rate=rate), notice_cfg,
                                    episode_id=task.id))
        if not any("already answered" in n for s in runs[1].steps for n in s.notices):
            assert [s.raw_output for s in runs[0].steps] == [s.raw_output for s in runs[1].steps], task.id
            same += 1
    assert same >= 5, same


def test_repeat_detours_on_an_expert_without_them_is_a_clear_error():
    from agentrig.data.collect import CollectConfig, _expert
    from agentrig.errors import ConfigError

    with pytest.raises(ConfigError, match="has no repeat detours"):
        _expert(load_env("toolworld"), CollectConfig(env="toolworld", repeat_detours=0.5))
    assert _expert(load_env("datadesk"), CollectConfig(repeat_detours=0.5)).repeat_rate == 0.5


def _without_and_with(env, tasks, option, **teacher):
    """Each task run through the harness by the expert with `option` at 0 and at 1 (the rest of its settings in
    `teacher`), both checked successful: yields (task, the second run's tools, the plain episode, the other)."""
    for task in tasks:
        runs = []
        for rate in (0.0, 1.0):
            tools, state = env.setup(task)
            expert = ExpertTeacher(**teacher, **{option: rate})
            ep = run_episode(task, tools, expert, HarnessConfig(), episode_id=task.id)
            res = env.check(task, state, ep)
            assert res.success, (task.id, task.family, ep.final_answer, res.reasons)
            runs.append(ep)
        yield task, tools, runs[0], runs[1]


def test_mixup_detour_sends_the_name_to_the_wrong_lookup_then_makes_the_right_call(env):
    """A mix-up detour: the request's region, customer or product name sent to the look-up of another kind of thing
    that the task offers (weight 0, really executed: "No result"), then a supervised step that says what the name is
    and makes the call the teacher always makes; the episode still succeeds. Without one, the episode is unchanged."""
    from agentrig.envs.datadesk.teacher import _ENTITY_ARG

    seen, same, impossible = 0, 0, 0
    for task, _, plain, mixed in _without_and_with(env, env.tasks("train", 80, seed=4), "mixup_rate", detour_rate=0.2):
        if [s.raw_output for s in plain.steps] == [s.raw_output for s in mixed.steps]:
            same += 1
            continue
        seen += 1
        wrong, right = mixed.steps[0], mixed.steps[1]
        assert wrong.weight == 0.0 and plain.steps[0].weight == 1.0  # never on top of a rejected-call detour
        assert task.family not in ("no_tool", "sql_query")
        impossible += task.family == "impossible"
        (call,) = wrong.calls
        assert call.name in task.allowed_tools and call.name not in [c.name for c in plain.steps[0].calls]
        assert wrong.results[0].content == "No result"
        key, kind = _ENTITY_ARG[plain.steps[0].calls[0].name]
        name = plain.steps[0].calls[0].arguments[key]
        assert list(call.arguments.values()) == [name]
        assert right.weight == 1.0 and right.text.startswith(f"{name} is a {kind}, not a ")
        assert [(c.name, c.arguments) for c in right.calls] == [(c.name, c.arguments) for c in plain.steps[0].calls]
        assert [s.raw_output for s in mixed.steps[2:]] == [s.raw_output for s in plain.steps[1:]]
    assert seen >= 10 and same >= 10 and impossible >= 1, (seen, same, impossible)


def test_borrowed_field_detour_sends_another_tools_field_then_the_corrected_call(env):
    """A borrowed-field detour: the first call with one more field taken from another offered tool's signature
    (weight 0), refused by the validator as an unexpected field that it names; then the corrected call, and the
    episode goes on as the teacher's other detours do. Without one, the episode is unchanged."""
    seen, same = 0, 0
    tasks = env.tasks("train", 60, seed=4)
    for task, tools, plain, borrowed in _without_and_with(env, tasks, "borrow_rate", detour_rate=0.5, seed=3):
        if [s.raw_output for s in plain.steps] == [s.raw_output for s in borrowed.steps]:
            same += 1
            continue
        seen += 1
        wrong, right = borrowed.steps[0], borrowed.steps[1]
        assert wrong.weight == 0.0 and plain.steps[0].weight == 0.0  # only a detour step becomes a borrowed one
        (call,) = wrong.calls
        (fixed,) = [c for c in right.calls if c.name == call.name][:1]
        extra = set(call.arguments) - set(fixed.arguments)
        assert len(extra) == 1 and {k: call.arguments[k] for k in fixed.arguments} == fixed.arguments
        (field,) = extra
        schema = tools.get(call.name).parameters["properties"]
        assert field not in schema and any(field in tools.get(t).parameters.get("properties", {})
                                           for t in task.allowed_tools if t != call.name)
        assert f"unexpected field {field}" in wrong.results[0].content
        assert right.weight == 1.0 and right.text == "That call was rejected; here is the corrected one."
        assert [s.raw_output for s in borrowed.steps[1:]] == [s.raw_output for s in plain.steps[1:]]
    assert seen >= 8 and same >= 8, (seen, same)


def test_sql_detour_sends_a_wrong_column_then_names_it_and_sends_the_right_query(env):
    """An SQL detour: the episode's first `run_sql` query (the fallback after "No result", or `sql_query`'s own)
    first sent with a column its table does not have (weight 0, really executed and refused, the refusal listing
    the columns that exist), then a supervised step that names the refused column and sends the query the teacher
    always sends; the episode still succeeds. Episodes without a `run_sql` call are unchanged."""
    from agentrig.envs.datadesk.teacher import TABLE_COLUMNS

    seen, same = 0, 0
    tasks = [t for t in env.tasks("train", 120, seed=4) if t.family in ("impossible", "sql_query", "single_lookup")]
    for task, _, plain, detoured in _without_and_with(env, tasks, "sql_rate"):
        uses_sql = any(c.name == "run_sql" for s in plain.steps for c in s.calls)
        if not uses_sql:
            assert [s.raw_output for s in plain.steps] == [s.raw_output for s in detoured.steps], task.id
            same += 1
            continue
        seen += 1
        i = next(i for i, s in enumerate(plain.steps) if any(c.name == "run_sql" for c in s.calls))
        assert [s.raw_output for s in detoured.steps[:i]] == [s.raw_output for s in plain.steps[:i]]
        wrong, right = detoured.steps[i], detoured.steps[i + 1]
        (bad,), good = wrong.calls, [c for c in plain.steps[i].calls]
        assert wrong.weight == 0.0 and bad.name == "run_sql" and bad.arguments != good[0].arguments
        ref = re.search(r"no such column: ([\w.]+);", wrong.results[0].content).group(1)
        assert ref not in good[0].arguments["query"] and not wrong.results[0].ok
        assert ref.split(".")[-1] in {c for cols in TABLE_COLUMNS.values() for c in cols}  # a real column, misplaced
        assert " has " in wrong.results[0].content  # the refusal lists the columns that exist
        assert right.weight == 1.0 and right.text == f"run_sql refused that query (no such column: {ref}); here is the corrected one."
        assert [(c.name, c.arguments) for c in right.calls] == [(c.name, c.arguments) for c in good]
        assert [s.raw_output for s in detoured.steps[i + 2:]] == [s.raw_output for s in plain.steps[i + 1:]]
    assert seen >= 5 and same >= 5, (seen, same)


def test_mixup_detours_on_an_expert_without_them_is_a_clear_error():
    from agentrig.data.collect import CollectConfig, _expert
    from agentrig.errors import ConfigError

    with pytest.raises(ConfigError, match="has no mix-up detours"):
        _expert(load_env("toolworld"), CollectConfig(env="toolworld", mixup_detours=0.5))
    assert _expert(load_env("datadesk"), CollectConfig(mixup_detours=0.5)).mixup_rate == 0.5
    with pytest.raises(ConfigError, match="has no borrowed-field detours"):
        _expert(load_env("toolworld"), CollectConfig(env="toolworld", borrow_detours=0.5))
    assert _expert(load_env("datadesk"), CollectConfig(borrow_detours=0.5)).borrow_rate == 0.5
    with pytest.raises(ConfigError, match="has no SQL detours"):
        _expert(load_env("toolworld"), CollectConfig(env="toolworld", sql_detours=0.5))
    assert _expert(load_env("datadesk"), CollectConfig(sql_detours=0.5)).sql_rate == 0.5
    for param, lacks in (("quiet_detours", "writes no detour"), ("plan_first", "writes no plans"),
                         ("sequential", "has no one-call"), ("retry_round", "has no whole-turn"),
                         ("retry_empty", "has no retry of an empty")):
        flag = "--" + param.replace("_", "-")
        with pytest.raises(ConfigError, match=f"{flag}: the expert of environment 'toolworld' {lacks}"):
            _expert(load_env("toolworld"), CollectConfig(env="toolworld", **{param: True}))
        assert getattr(_expert(load_env("datadesk"), CollectConfig(**{param: True})), param) is True


_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_DATE = re.compile(r"\d{4}-\d{2}(?:-\d{2})?")


def _figures(text):
    return [float(x) for x in _NUMBER.findall(_DATE.sub(" ", text))]


def _list_lengths(content):
    """How many items each list of a JSON result holds (a count read off the result, not worked out)."""
    try:
        stack, out = [json.loads(content)], []
    except ValueError:
        return []
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            stack += v.values()
        elif isinstance(v, list):
            out.append(float(len(v)))
            stack += v
    return out


def test_every_figure_the_expert_answers_was_in_the_request_or_a_tool_result(env):
    """The teacher never states a number it worked out in its head: the student would learn to invent figures.

    Checked with faults on, so fallbacks through run_sql (whose rows must then carry the total the lookup tool
    would have given) are covered too."""
    cfg = FaultConfig.from_total(0.25, no_mutate=env.side_effect_tools, drift_names=env.drift_names)
    unground = []
    for i, task in enumerate(env.tasks("train", 160, seed=12)):
        ep, _, _ = _run(env, task, hook=cfg.injector(i))
        if not ep.final_answer:
            continue
        seen = _figures(task.prompt) + [x for s in ep.steps for r in s.results
                                        for x in _figures(r.content) + _list_lengths(r.content)]
        for v in _figures(ep.final_answer):
            if not any(abs(v - x) < 1e-9 or abs(v - round(x, 2)) < 1e-9 for x in seen):
                unground.append((task.family, v, ep.final_answer))
    assert not unground, unground[:5]
