"""Fault injection: seeded, recorded in the episode, realistic texts, never sleeping."""

from __future__ import annotations

import json

import pytest

from agentrig.envs import load_env
from agentrig.errors import ConfigError
from agentrig.harness.faults import FAULT_KINDS, FaultConfig, drift
from agentrig.harness import HarnessConfig, run_episode
from agentrig.envs.datadesk import DatadeskEnv
from agentrig.envs.datadesk.teacher import ExpertTeacher
from agentrig.harness.trajectory import ToolCall, ToolResult

# datadesk's tool facts, as collect and eval pass them (Environment.side_effect_tools, drift_names)
DATADESK = {"no_mutate": DatadeskEnv.side_effect_tools, "drift_names": DatadeskEnv.drift_names}


def _ok(call):
    return lambda: ToolResult(call.id, call.name, json.dumps({"total": 12.5, "currency": "EUR"}), ok=True)


def _run(cfg, seed, n=200):
    hook = cfg.injector(seed)
    out = []
    for i in range(n):
        call = ToolCall(f"c{i}", "sales_total", {"region": "North", "month": "2024-01"})
        out.append(hook(call, _ok(call)))
    return out


def test_same_seed_same_faults_and_rates_per_kind():
    cfg = FaultConfig.from_total(0.5)
    a, b, c = _run(cfg, "s1"), _run(cfg, "s1"), _run(cfg, "s2")
    assert [(r.fault, r.content) for r in a] == [(r.fault, r.content) for r in b]
    assert [r.fault for r in a] != [r.fault for r in c]
    assert 60 <= sum(r.fault is not None for r in a) <= 140
    only = FaultConfig(rates={"error_429": 1.0})
    assert {r.fault for r in _run(only, 0, 20)} == {"error_429"}
    assert _run(only, 0, 1)[0].content.startswith("Error: 429 Too Many Requests")


def test_each_kind_looks_real_and_timeouts_are_not_slept():
    for kind in FAULT_KINDS:
        (r,) = _run(FaultConfig(rates={kind: 1.0}, **DATADESK), 0, 1)
        assert r.fault == kind
        if kind == "timeout":
            assert "timed out after 10 s" in r.content and r.duration_s == 0.0 and not r.ok
        if kind == "schema_drift":
            assert set(json.loads(r.content)) in ({"total_amount", "currency"}, {"total", "ccy"})
        if kind in ("truncated", "malformed"):
            with pytest.raises(json.JSONDecodeError):
                json.loads(r.content)
    assert drift("[1, 2]", __import__("random").Random(0)) is None
    assert drift('{"price": 2}', __import__("random").Random(0)) == '{"price_v2": 2}'  # no names: a suffix


def test_side_effect_tools_only_get_faults_that_stop_the_call():
    cfg = FaultConfig(rates={"truncated": 1.0}, **DATADESK)
    hook = cfg.injector(0, renames={"send_report": "email_report"})
    ran = []
    call = ToolCall("c", "email_report", {})
    r = hook(call, lambda: ran.append(1) or ToolResult("c", "email_report", "{}", ok=True))
    assert r.fault == "error_503" and not ran


def test_bad_rates_are_config_errors():
    with pytest.raises(ConfigError, match="unknown fault kind"):
        FaultConfig(rates={"gremlins": 0.1})
    with pytest.raises(ConfigError, match="at most 1"):
        FaultConfig(rates={"timeout": 0.7, "error_503": 0.6})
    assert FaultConfig.parse("timeout=0.1, error_503=0.05").rates == {"timeout": 0.1, "error_503": 0.05}


def test_faults_are_recorded_in_the_episode_and_reproducible():
    env = load_env("datadesk")
    cfg = FaultConfig.from_total(0.6, **DATADESK)
    task = next(t for t in env.tasks("train", 50, seed=2) if t.family == "long_task")

    def once():
        tools, state = env.setup(task)
        ep = run_episode(task, tools, ExpertTeacher(), HarnessConfig(), tool_hook=cfg.injector("x"),
                         episode_id=task.id)
        return ep, [(r.fault, r.content) for s in ep.steps for r in s.results]

    (ep1, r1), (ep2, r2) = once(), once()
    assert ep1.faults and ep1.faults == ep2.faults and r1 == r2
    assert ep1.faults == [r.fault for s in ep1.steps for r in s.results if r.fault]


def _writer_episode(kind: str, seed: int, declared: bool) -> tuple[int, bool]:
    """One episode of a retrying agent against a custom tool that writes: (writes made, last call ok)."""
    from agentrig.harness.policy import FunctionPolicy
    from agentrig.harness.tools import ToolSet, tool
    from agentrig.harness.trajectory import TaskSpec

    written: list[str] = []

    @tool(side_effects=declared)
    def save_note(text: str) -> dict:
        """Save a note to the user's notebook.

        Args:
            text: What to write.
        """
        written.append(text)
        return {"saved": True, "count": len(written)}

    def agent(request):
        last = request.messages[-1]
        if last["role"] == "tool":
            try:
                if json.loads(last["content"]).get("saved"):
                    return "Saved your note."
            except (json.JSONDecodeError, AttributeError):
                pass
        if request.step >= 4:
            return "Sorry, the notebook kept failing; the note may not be saved."
        return '<tool_call>\n{"name": "save_note", "arguments": {"text": "buy milk"}}\n</tool_call>'

    task = TaskSpec(id=f"note-{seed}", prompt="Write 'buy milk' in my notebook.", allowed_tools=["save_note"])
    hook = FaultConfig(rates={kind: 0.6}).injector(seed, tools=ToolSet([save_note]))
    ep = run_episode(task, ToolSet([save_note]), FunctionPolicy(agent), HarnessConfig(), tool_hook=hook,
                     episode_id=task.id)
    results = [r for s in ep.steps for r in s.results]
    return len(written), bool(results) and results[-1].ok and results[-1].fault is None


def test_a_declared_write_tool_is_never_written_twice_under_any_fault_kind():
    for kind in FAULT_KINDS:
        outcomes = [_writer_episode(kind, seed, declared=True) for seed in range(30)]
        assert all(writes <= 1 for writes, _ in outcomes), kind
        assert all(writes == 1 for writes, ok in outcomes if ok), kind  # a retry after a stopped call writes once
    # the same tool undeclared: a fault that corrupts the real output invites a retry, and the write happens twice
    for kind in ("truncated", "malformed"):
        assert any(writes == 2 for writes, _ in (_writer_episode(kind, s, declared=False) for s in range(30))), kind
