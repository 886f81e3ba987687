"""DAgger: the expert takes over a student's own episode at its first different step (`agentrig data dagger`)."""

from __future__ import annotations

import json

import pytest

from agentrig.data.dagger import DaggerSummary, relabel
from agentrig.envs import load_env
from agentrig.harness import HarnessConfig, ScriptedPolicy, run_episode
from agentrig.harness.faults import FaultConfig
from agentrig.harness.trajectory import write_episodes

HARNESS = HarnessConfig(max_steps=12, tool_listing="compact")


@pytest.fixture(scope="module")
def env():
    return load_env("datadesk")


def _task(env, family, variant=None, seed=4):
    return next(t for t in env.tasks("train", 300, seed=seed)
                if t.family == family and (variant is None or t.metadata["variant"] == variant))


def _expert(env, task, hook=None):
    tools, state = env.setup(task)
    ep = run_episode(task, tools, env.expert(), HARNESS, tool_hook=hook, episode_id=task.id)
    ep.success = env.check(task, state, ep).success
    return ep


def _student(env, task, replies, hook=None):
    tools, state = env.setup(task)
    ep = run_episode(task, tools, ScriptedPolicy(replies), HARNESS, tool_hook=hook, episode_id=f"{task.id}#s")
    ep.success = env.check(task, state, ep).success
    env.close(state)
    return ep


def test_a_needless_retry_is_replaced_by_the_experts_answer_and_the_prefix_is_masked(env):
    task = _task(env, "single_lookup", "sales")
    exp = _expert(env, task)
    call, answer = exp.steps[0].raw_output, exp.steps[-1].raw_output
    student = _student(env, task, [call, call, answer])  # a second identical call after a fine result
    summary = DaggerSummary()
    (new,) = relabel([student], env, HARNESS, summary=summary)
    assert new.success and new.task.metadata["dagger"] == {"source": student.episode_id, "takeover_step": 1,
                                                           "deviation": "extra_call"}
    assert [s.weight for s in new.steps] == [0.0, 1.0]
    assert new.steps[0].raw_output == call and new.steps[1].is_final and new.steps[1].raw_output == answer
    assert new.steps[0].results[0].content == student.steps[0].results[0].content  # the call really ran again
    assert summary.to_dict() == {"episodes": 1, "relabelled": 1, "no_deviation": 0, "failed": 0,
                                 "by_deviation": {"extra_call": 1}}


def test_an_invalid_call_and_a_wrong_answer_are_taken_over_and_a_perfect_student_adds_nothing(env):
    task = _task(env, "single_lookup", "sales")
    exp = _expert(env, task)
    bad = exp.steps[0].raw_output.replace('"month": "', '"month": "month ')
    invalid = _student(env, task, [bad, "I could not do it."])
    wrong = _student(env, task, [exp.steps[0].raw_output, "The total was 12.00."])
    assert not invalid.success and not wrong.success and invalid.steps[0].defects
    summary = DaggerSummary()
    out = list(relabel([invalid, wrong, exp], env, HARNESS, summary=summary))
    assert [e.task.metadata["dagger"]["deviation"] for e in out] == ["invalid_call", "wrong_answer"]
    assert [s.weight for s in out[0].steps] == [1.0, 1.0]  # taken over at step 0: all the expert's
    assert [s.weight for s in out[1].steps] == [0.0, 1.0] and out[1].steps[1].raw_output == exp.steps[1].raw_output
    assert summary.no_deviation == 1 and summary.relabelled == 2


def test_recorded_faults_are_replayed_and_a_sent_report_is_sent_once(env):
    task = _task(env, "report")
    faults = FaultConfig(rates={"error_503": 0.5}, no_mutate=env.side_effect_tools)
    exp = _expert(env, task, hook=faults.injector("k"))
    assert exp.faults, "the fixture needs a faulted expert episode"
    # the expert's steps, then the report sent a second time (a student that retries what worked), then done
    replies = [s.raw_output for s in exp.steps[:-1]] + [exp.steps[-2].raw_output, exp.steps[-1].raw_output]
    student = _student(env, task, replies, hook=faults.injector("k"))  # the same faults as the expert met
    n = sum(len(s.results) for s in exp.steps)
    assert [r.fault for s in student.steps for r in s.results][:n] == [r.fault for s in exp.steps for r in s.results]
    assert not student.success  # two reports
    (new,) = relabel([student], env, HARNESS, faults=FaultConfig(rates={"error_503": 1.0}))
    # the prefix sees exactly the student's results (faults as recorded), and the report went out once
    for a, b in zip(new.steps[:-1], student.steps[:-1]):
        assert [(r.fault, r.content) for r in a.results] == [(r.fault, r.content) for r in b.results]
    assert new.success and new.check["side_effects_ok"] and new.task.metadata["dagger"]["takeover_step"] == len(replies) - 2


def test_a_different_harness_is_refused(env):
    task = _task(env, "single_lookup", "sales")
    student = _student(env, task, ["I do not know."])
    with pytest.raises(Exception, match="another system prompt"):
        list(relabel([student], env, HarnessConfig(max_steps=12, tool_listing="json")))


def test_the_cli_writes_episodes_the_data_build_masks_up_to_the_takeover(env, tmp_path, capsys):
    from agentrig.cli import main

    task = _task(env, "single_lookup", "stock")
    exp = _expert(env, task)
    student = _student(env, task, [exp.steps[0].raw_output, exp.steps[0].raw_output, exp.steps[-1].raw_output])
    write_episodes(tmp_path / "student.jsonl", [student])
    assert main(["data", "dagger", "--in", str(tmp_path / "student.jsonl"), "--out", str(tmp_path / "d.jsonl")]) == 0
    assert '"relabelled": 1' in capsys.readouterr().out
    assert main(["data", "build", "--in", str(tmp_path / "d.jsonl"), "--out", str(tmp_path / "data")]) == 0
    (sample,) = [json.loads(x) for x in (tmp_path / "data" / "samples.jsonl").read_text().splitlines()]
    trained = [m["content"] for m, w in zip(sample["messages"], sample["weights"]) if w > 0]
    masked = [m for m, w in zip(sample["messages"], sample["weights"]) if m["role"] == "assistant" and w == 0]
    assert len(trained) == 1 and "units" in trained[0] and len(masked) == 1 and masked[0]["tool_calls"]
