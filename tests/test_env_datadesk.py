"""The datadesk environment: database, tools, task splits and the checker."""

from __future__ import annotations

import pytest

from agentrig.envs import SPLITS, load_env
from agentrig.envs.datadesk.db import ensure_db, open_readonly
from agentrig.envs.datadesk.tasks import FAMILIES
from agentrig.envs.datadesk.tools import TICKET_TOOLS, CalculatorError, calculate
from agentrig.harness import HarnessConfig, ScriptedPolicy, run_episode


@pytest.fixture(scope="module")
def env():
    return load_env("datadesk")


def test_database_content_is_deterministic(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRIG_CACHE", str(tmp_path))
    a = ensure_db(0)
    dump = "\n".join(open_readonly(a).iterdump())
    monkeypatch.setenv("AGENTRIG_CACHE", str(tmp_path / "other"))
    b = ensure_db(0)
    assert dump == "\n".join(open_readonly(b).iterdump())
    assert dump != "\n".join(open_readonly(ensure_db(1)).iterdump())


def test_splits_are_disjoint_and_tickets_held_out(env):
    keys = {}
    for split in SPLITS:
        tasks = env.tasks(split, 400, seed=3)
        keys[split] = {t.metadata["key"] for t in tasks}
        for t in tasks:
            assert t.split == split
            held = set(TICKET_TOOLS) & set(t.allowed_tools)
            assert bool(held) == (split == "test_unseen_tools"), (split, t.allowed_tools)
            needed = set(t.expected["needed_tools"])
            assert needed <= set(t.allowed_tools)
            assert 2 <= len(set(t.allowed_tools) - needed - {"run_sql"}) <= 3
    for a in SPLITS:
        for b in SPLITS:
            if a < b:
                assert not keys[a] & keys[b], (a, b)
    # test_unseen_tools never appears with seen-only families, and train covers all families
    assert {t.family for t in env.tasks("train", 400, seed=3)} == set(FAMILIES)


def test_tasks_depend_only_on_split_seed_and_index(env):
    whole = env.tasks("train", 30, seed=5)
    part = env.tasks("train", 10, seed=5, start=20)
    assert [t.prompt for t in whole[20:]] == [t.prompt for t in part]
    assert env.tasks("train", 5, seed=6)[0].prompt != whole[0].prompt or env.tasks("train", 5, seed=6)[1].prompt != whole[1].prompt


def test_held_out_tools_are_not_even_in_the_train_toolset(env):
    task = env.tasks("train", 1, seed=0)[0]
    tools, state = env.setup(task)
    assert all(tools.get(name) is None for name in TICKET_TOOLS)
    env.close(state)


def test_calculator_parses_without_eval():
    assert calculate("(1200.5 - 980) / 980 * 100") == pytest.approx(22.5)
    assert calculate("2^10") == 1024
    for bad in ["__import__('os').system('x')", "[1]*10", "9**9**9", "1/0", "a+1"]:
        with pytest.raises(CalculatorError):
            calculate(bad)


def _answer(env, task, text):
    tools, state = env.setup(task)
    ep = run_episode(task, tools, ScriptedPolicy([text]), HarnessConfig(), episode_id=task.id)
    return env.check(task, state, ep)


def test_checker_impossible_task_rejects_invented_numbers(env):
    task = next(t for t in env.tasks("train", 200, seed=1) if t.family == "impossible")
    ok = _answer(env, task, "I could not find that in the database, so I cannot give a figure.")
    assert ok.success, ok.reasons
    bad = _answer(env, task, "I could not find it exactly, but it is about 4200.50.")
    assert not bad.success and bad.invented_numbers == [4200.5]


def test_checker_figures_tolerance_and_no_tool(env):
    # an amount, not a count: a count also needs its look-up (tests/test_checker_figures.py)
    task = next(t for t in env.tasks("train", 200, seed=1) if t.family == "single_lookup" and t.expected["figures"]
                and t.expected["figures"][0]["kind"] != "count")
    fig = task.expected["figures"][0]["value"]
    assert _answer(env, task, f"It was {fig:,.2f}.").success
    assert not _answer(env, task, f"It was {fig * 1.05:.2f}.").success
    assert not _answer(env, task, f"It was {fig + (1 if fig == int(fig) else 0.01):,.2f}.").success
    nt = next(t for t in env.tasks("train", 200, seed=1) if t.family == "no_tool")
    assert nt.metadata["no_tool"] and _answer(env, nt, "SKU means stock keeping unit.").success
    tools, state = env.setup(nt)
    name = nt.allowed_tools[0]
    call = '<tool_call>\n{"name": "%s", "arguments": {}}\n</tool_call>' % name
    ep = run_episode(nt, tools, ScriptedPolicy([call, "Done."]), HarnessConfig(), episode_id=nt.id)
    res = env.check(nt, state, ep)
    assert not res.success and res.forbidden


def test_families_list_every_tool_a_family_needs_and_balance_keeps_every_family(env):
    """`families()` is the union over a family's variants (it once kept only the last task's tools, so
    single_lookup read as stock_level alone), and `--balance`'s weights stay bounded: no family vanishes."""
    from collections import Counter

    from agentrig.data.augment import flatten_weights

    fams = env.families("train")
    assert list(fams) == FAMILIES
    assert set(fams["single_lookup"]) == {"sales_total", "stock_level", "find_customer", "region_info"}
    assert {"find_product", "stock_level", "find_customer", "region_info", "list_orders"} <= set(fams["chained_lookup"])
    assert fams["no_tool"] == []
    w = flatten_weights(fams)
    assert set(w) == set(FAMILIES) and w["no_tool"] == 1.0
    assert all(0.25 <= v <= 4.0 for v in w.values()), w
    assert w["ranking"] > 1.0 > w["currency_aggregation"]  # top_products is rare, sales_total is everywhere

    def spread(weights):
        tasks = env.tasks("train", 600, seed=0, family_weights=weights)
        calls = Counter(t for task in tasks for t in set(task.expected["needed_tools"]))
        return min(calls.values()) / max(calls.values())

    assert spread(w) > spread(None) + 0.05
