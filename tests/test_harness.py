"""The episode loop, driven end to end by the scripted policy: whole transcripts asserted."""

from __future__ import annotations

import json

import pytest

from agentrig.errors import AgentrigError
from agentrig.harness.demo import SCRIPT, run_demo
from agentrig.harness import EpisodeRunner, HarnessConfig, PolicyReply, ScriptedPolicy, run_episode, run_episodes
from agentrig.harness.transcript import context_at
from agentrig.harness.protocol import feedback
from agentrig.harness.tools import Tool, ToolSet, tool
from agentrig.harness.trajectory import TaskSpec, ToolResult, read_episodes

TASK = TaskSpec(id="t", prompt="What is 2 + 3?")


def call(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: first
        b: second
    """
    return a + b


@tool
def flaky(x: int) -> int:
    """Always fails.

    Args:
        x: anything
    """
    raise RuntimeError("service down")


def tools(allowed=None):
    return ToolSet([add, flaky], allowed=allowed)


def test_whole_transcript_with_schema_error_then_success():
    ep = run_episode(TASK, tools(), ScriptedPolicy([call("add", a="2", b=3), call("add", b=3, a=2), "2 + 3 = 5."]),
                     HarnessConfig(memory=False))
    assert ep.termination == "final_answer" and ep.final_answer == "2 + 3 = 5."
    roles = [m["role"] for m in ep.messages_full]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert ep.messages_full[3]["content"] == feedback(
        "schema_violation", tool="add", fields='- arguments.a: expected type integer, got "2"')
    # arguments normalized to the schema's key order
    assert ep.messages_full[4]["tool_calls"][0]["function"]["arguments"] == '{"a": 2, "b": 3}'
    assert ep.messages_full[5]["content"] == "5"
    assert [d.kind for d in ep.steps[0].defects] == ["schema_violation"]
    assert ep.tool_failures == {"add": 1}


def test_not_permitted_and_unknown_tools_are_never_run():
    ep = run_episode(TASK, tools(allowed=["add"]), ScriptedPolicy([call("flaky", x=1), call("nosuch"), "I cannot."]))
    kinds = [d.kind for s in ep.steps for d in s.defects]
    assert kinds == ["not_permitted", "unknown_tool"]
    assert ep.steps[0].results[0].error == "not_permitted" and "service down" not in ep.steps[0].results[0].content


def test_recovery_rule_fires_after_three_failures():
    ep = run_episode(TASK, tools(), ScriptedPolicy([call("flaky", x=1), call("flaky", x=2), call("flaky", x=3),
                                                    call("add", a=2, b=3), "5"]), HarnessConfig(memory=False))
    assert ep.steps[2].notices == [feedback("switch_tool", tool="flaky", count=3)]
    assert ep.steps[0].notices == [] and ep.steps[1].notices == []
    assert ep.messages_full[-4] == {"role": "user", "content": feedback("switch_tool", tool="flaky", count=3)}
    assert ep.tool_failures == {"flaky": 3} and ep.termination == "final_answer"


def test_identical_call_three_times_is_stuck():
    ep = run_episode(TASK, tools(), ScriptedPolicy([call("add", a=1, b=1)] * 5))
    assert ep.termination == "stuck" and len(ep.steps) == 3
    assert "identical call to 'add' 3 times" in ep.steps[-1].notices[-1]


def test_a_retry_that_finally_answers_is_not_stuck():
    # fail, fail, success: the third identical call answered, so the model gets to read it
    outcomes = iter([RuntimeError("timed out"), RuntimeError("timed out"), 7, 7])

    @tool
    def lookup(x: int) -> int:
        """Fails twice, then answers.

        Args:
            x: anything
        """
        out = next(outcomes)
        if isinstance(out, Exception):
            raise out
        return out

    script = [call("lookup", x=1)] * 3 + ["It is 7."]
    ep = run_episode(TASK, ToolSet([lookup]), ScriptedPolicy(script), HarnessConfig(memory=False))
    assert ep.termination == "final_answer" and ep.final_answer == "It is 7." and len(ep.steps) == 4
    assert [s.results[0].ok for s in ep.steps[:3]] == [False, False, True]
    assert [m["content"] for m in ep.messages_full if m["role"] == "tool"][-1] == "7"
    # ... but a fourth copy after that answer is stuck
    outcomes = iter([RuntimeError("timed out"), RuntimeError("timed out"), 7, 7])
    ep = run_episode(TASK, ToolSet([lookup]), ScriptedPolicy([call("lookup", x=1)] * 5), HarnessConfig(memory=False))
    assert ep.termination == "stuck" and len(ep.steps) == 4
    assert "identical call to 'lookup' 4 times" in ep.steps[-1].notices[-1]


def test_repeat_after_success_gets_a_notice_when_asked():
    script = [call("add", a=2, b=3), call("add", a=2, b=3), "2 + 3 = 5."]
    ep = run_episode(TASK, tools(), ScriptedPolicy(script), HarnessConfig(memory=False, repeat_notice=True))
    notice = feedback("repeated_after_success", tool="add")
    assert ep.steps[0].notices == [] and ep.steps[1].notices == [notice]
    assert [m["role"] for m in ep.messages_full] == ["system", "user", "assistant", "tool", "assistant", "tool", "user",
                                                      "assistant"]
    assert ep.messages_full[5]["content"] == "5" and ep.messages_full[6]["content"] == notice  # the call still ran
    assert ep.termination == "final_answer"
    # off by default; never after a failed call (that is a retry); the stuck rule still ends the third identical call
    ep = run_episode(TASK, tools(), ScriptedPolicy(script), HarnessConfig(memory=False))
    assert all(s.notices == [] for s in ep.steps)
    ep = run_episode(TASK, tools(), ScriptedPolicy([call("flaky", x=1)] * 2 + ["down"]),
                     HarnessConfig(memory=False, repeat_notice=True))
    assert all(s.notices == [] for s in ep.steps)
    ep = run_episode(TASK, tools(), ScriptedPolicy([call("add", a=1, b=1)] * 5), HarnessConfig(repeat_notice=True))
    assert ep.termination == "stuck" and [len(s.notices) for s in ep.steps] == [0, 1, 1]
    assert "identical call to 'add' 3 times" in ep.steps[-1].notices[-1]


def test_echo_calls_opens_each_result_with_its_call():
    """`echo_calls`: every tool message (a result, a tool error, a schema error) opens with the call it answers;
    `note`'s does not; the recorded result stays the tool's own text, and `result_text` reads it back."""
    from agentrig.harness.protocol import echo_call, result_text

    script = [call("add", a="2", b=3) + "\n" + call("flaky", x=1), call("add", a=2, b=3) + "\n" + call("note", summary="2 + 3 is 5"),
              "2 + 3 = 5."]
    ep = run_episode(TASK, tools(), ScriptedPolicy(script), HarnessConfig(echo_calls=True))
    results = [m for m in ep.messages_full if m["role"] == "tool"]
    assert [m["content"] for m in results] == [
        'add({"a": "2", "b": 3}) returned:\n' + feedback(
            "schema_violation", tool="add", fields='- arguments.a: expected type integer, got "2"'),
        'flaky({"x": 1}) returned:\nTool execution failed: RuntimeError: service down',
        'add({"a": 2, "b": 3}) returned:\n5',
        feedback("note_saved"),
    ]
    assert [r.content for s in ep.steps for r in s.results] == [result_text(m) for m in results]
    assert ep.termination == "final_answer" and ep.metadata["harness"]["echo_calls"] is True
    # off by default: the same script gives the bare results
    plain = run_episode(TASK, tools(), ScriptedPolicy(script), HarnessConfig())
    assert [m["content"] for m in plain.messages_full if m["role"] == "tool"] == [result_text(m) for m in results]
    # long strings are shortened in the echo; a result whose first line only looks like an echo of another tool
    # keeps it
    from agentrig.harness.trajectory import ToolCall

    line = echo_call(ToolCall("c", "run_sql", {"query": "SELECT " + "x, " * 40 + "y FROM t"}))
    assert line.startswith('run_sql({"query": "SELECT x, ') and line.endswith('..."}) returned:') and len(line) < 100
    # the memory's extractive summary quotes the result, not the echo line
    from agentrig.harness.memory import extractive_summary

    assert extractive_summary(ep.messages_full[2:]) == extractive_summary(plain.messages_full[2:])
    assert "returned:" not in extractive_summary(ep.messages_full[2:])
    other = {"role": "tool", "name": "add", "content": 'sub({"a": 1}) returned:\n0'}
    assert result_text(other) == other["content"]
    assert result_text({"role": "tool", "name": "add", "content": "5"}) == "5"


def test_max_steps_token_budget_and_wall_clock():
    ep = run_episode(TASK, tools(), ScriptedPolicy([call("add", a=i, b=1) for i in range(20)]), HarnessConfig(max_steps=4))
    assert ep.termination == "max_steps" and len(ep.steps) == 4
    ep = run_episode(TASK, tools(), ScriptedPolicy([PolicyReply(call("add", a=i, b=1), prompt_tokens=400, completion_tokens=10)
                                                    for i in range(20)]), HarnessConfig(token_budget=1000))
    assert ep.termination == "token_budget" and len(ep.steps) == 3
    ep = run_episode(TASK, tools(), ScriptedPolicy([call("add", a=i, b=1) for i in range(20)]), HarnessConfig(wall_clock_s=0.0))
    assert ep.termination == "wall_clock" and len(ep.steps) == 0


def test_unparseable_and_empty_outputs_get_feedback_and_loop_goes_on():
    ep = run_episode(TASK, tools(), ScriptedPolicy(["<tool_call>{{{</tool_call>", "", call("add", a=2, b=3), "5"]))
    assert [d.kind for d in ep.steps[0].defects] == ["unparseable_call"]
    assert ep.messages_full[2] == {"role": "assistant", "content": "<tool_call>{{{</tool_call>"}
    assert ep.messages_full[3]["role"] == "user" and ep.messages_full[3]["content"].startswith("Error: your tool call could not be parsed")
    assert ep.messages_full[5]["content"] == feedback("empty_output")
    assert ep.final_answer == "5"


def test_note_compresses_memory_and_context_at_reproduces_every_prompt():
    seen = []

    def policy(req):
        seen.append(req.messages)
        return script.pop(0)

    script = [call("add", a=1, b=2), call("note", summary="1+2=3"), call("add", a=3, b=4), "3 and 7"]
    ep = run_episode(TASK, tools(), policy)
    assert [e.reason for e in ep.memory_events] == ["note"]
    assert len(seen[2]) == 2 and seen[2][0]["content"].endswith("Memory (finished sub-goals):\n- 1+2=3")
    assert all(context_at(ep, i) == seen[i] for i in range(len(ep.steps)))


def test_context_budget_compresses_with_extractive_summary():
    seen = []

    def policy(req):
        seen.append(req.messages)
        return script.pop(0)

    script = [call("add", a=i, b=1) for i in range(6)] + ["done"]
    # 300 approximate tokens: the compact tool listing leaves ~150 for the turns, so several compressions happen
    ep = run_episode(TASK, tools(), policy, HarnessConfig(context_budget=300, keep_last_turns=1, memory=False))
    events = ep.memory_events
    assert events and all(e.reason == "token_budget" and e.extractive for e in events)
    assert "add(a=0, b=1) -> 1" in events[0].summary
    assert all(context_at(ep, i) == seen[i] for i in range(len(ep.steps)))


def test_tool_hook_wraps_execution_and_faults_are_recorded():
    def hook(call_, execute):
        return ToolResult(call_.id, call_.name, "Error: 503 Service Unavailable", ok=False, fault="error", error="error")

    ep = run_episode(TASK, tools(), ScriptedPolicy([call("add", a=1, b=1), "I could not compute it: the service is down."]),
                     tool_hook=hook)
    assert ep.faults == ["error"] and ep.steps[0].results[0].content == "Error: 503 Service Unavailable"


def test_run_episodes_batches_each_round():
    class Batch:
        calls = []

        def generate_batch(self, requests):
            self.calls.append(len(requests))
            return [call("add", a=1, b=2) if r.step == 0 else "3" for r in requests]

    jobs = [(TaskSpec(id=f"t{i}", prompt="1+2?"), tools(), None) for i in range(5)]
    eps = run_episodes(jobs, Batch(), batch_size=4)
    assert [e.episode_id for e in eps] == [f"t{i}" for i in range(5)]
    assert all(e.final_answer == "3" for e in eps)
    assert Batch.calls == [4, 4, 1, 1]


def test_run_episodes_streams_to_a_policy_with_generate_stream():
    """Continuous batching: an episode's next request is ready as soon as its own reply is applied, at most
    `batch_size` episodes are open, episodes come back in job order, and each is reported as it ends."""

    class Stream:
        def __init__(self):
            self.log = []
            self.open_max = 0

        def generate_stream(self, pull, on_reply):
            live = []
            while True:
                live += pull(2 - len(live))  # two rows decode together
                if not live:
                    return
                request = live.pop(-1)  # the newest row ends first: replies come back out of pull order
                self.log.append((request.task.id, request.step))
                on_reply(request, call("add", a=1, b=2) if request.step == 0 else "3")

    jobs = [(TaskSpec(id=f"t{i}", prompt="1+2?"), tools(), None) for i in range(5)]
    policy, ended = Stream(), []
    eps = run_episodes(jobs, policy, batch_size=3, on_done=lambda k, ep: ended.append(k))
    assert [e.episode_id for e in eps] == [f"t{i}" for i in range(5)]
    assert all(e.final_answer == "3" and len(e.steps) == 2 for e in eps)
    assert sorted(ended) == list(range(5)) and ended != list(range(5))
    # t1's second step is served before t0's first reply: no round waits for its slowest member
    assert policy.log.index(("t1", 1)) < policy.log.index(("t0", 0))

    class Broken:
        def generate_stream(self, pull, on_reply):
            pull(1)  # takes a request and never answers it

    with pytest.raises(AgentrigError, match="unfinished"):
        run_episodes(jobs[:2], Broken(), batch_size=2)


def test_async_policy_and_runner_state_machine():
    async def policy(req):
        return "no tool needed"

    ep = run_episode(TASK, tools(), policy)
    assert ep.final_answer == "no tool needed"
    runner = EpisodeRunner(TASK, tools())
    assert runner.request().step == 0
    runner.submit("done")
    assert runner.request() is None and runner.episode.termination == "final_answer"


def test_detour_weight_is_recorded():
    ep = run_episode(TASK, tools(), ScriptedPolicy([PolicyReply(call("flaky", x=1), weight=0.0), call("add", a=2, b=3), "5"]))
    assert [s.weight for s in ep.steps] == [0.0, 1.0, 1.0] and ep.detours == 1


def test_demo_recovers_and_writes_a_record(tmp_path):
    ep = run_demo(tmp_path / "ep.jsonl")
    assert ep.termination == "final_answer" and ep.tool_failures == {"get_weather": 3}
    assert ep.steps[2].notices and "get_weather" in ep.steps[2].notices[0]
    assert [c.name for c in ep.steps[3].calls] == ["search_web"]
    assert len(ep.steps) == len(SCRIPT)
    assert read_episodes(tmp_path / "ep.jsonl")[0].to_dict() == ep.to_dict()


def test_scripted_policy_running_out_is_a_clear_error():
    from agentrig.errors import AgentrigError

    with pytest.raises(AgentrigError, match="ran out of replies"):
        run_episode(TASK, tools(), ScriptedPolicy([call("add", a=1, b=1)]))


def test_history_continues_a_multi_turn_conversation():
    first = run_episode(TASK, tools(), ScriptedPolicy([call("add", a=2, b=3), "5"]), HarnessConfig(memory=False))
    seen = []

    def policy(req):
        seen.append(req.messages)
        return "10"

    second = EpisodeRunner(TaskSpec(id="t2", prompt="And doubled?"), tools(), HarnessConfig(memory=False),
                           history=first.messages_full[1:])
    while (req := second.request()) is not None:
        second.submit(policy(req))
    roles = [m["role"] for m in seen[0]]
    assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
    assert seen[0][-1]["content"] == "And doubled?" and second.episode.final_answer == "10"
    assert context_at(second.episode, 0) == seen[0] and len(second.episode.steps) == 1
    with pytest.raises(Exception, match="must start with its first user message"):
        EpisodeRunner(TASK, tools(), history=[{"role": "assistant", "content": "hi"}])
