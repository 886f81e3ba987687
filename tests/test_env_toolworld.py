"""The toolworld environment: generated worlds, their tools, the expert on held-out worlds, disjoint splits."""

from __future__ import annotations

import collections
import json

import pytest

from agentrig.envs import load_env
from agentrig.envs.toolworld.tasks import FAMILIES, WORLD_POOL
from agentrig.envs.toolworld.tools import ToolworldState, bind, describe, specs
from agentrig.envs.toolworld.world import NAMING_STYLES, DESCRIPTION_STYLES, noun_split, world
from agentrig.harness import HarnessConfig, run_episode
from agentrig.harness.faults import FaultConfig


def _example(schema: dict, w) -> object:
    """A valid value for a parameter schema (what a schema's own example would be)."""
    if "enum" in schema:
        return schema["enum"][-1]
    t = schema.get("type")
    if t == "string":
        if "pattern" in schema and schema["pattern"].startswith("^[0-9]{4}"):
            return "2025-06-30"
        if schema.get("pattern") == w.parent_pattern():
            return w.parents[0]["id"]
        return w.records[0]["id"] if "pattern" in schema else w.records[0]["name"]
    if t == "integer":
        return int(schema.get("minimum", 1))
    if t == "number":
        return float(schema.get("maximum", 1.0))
    if t == "boolean":
        return True
    if t == "array":
        return [w.records[0]["id"], w.records[1]["id"]]
    if t == "object":
        return {k: _example(v, w) for k, v in list(schema["properties"].items())[:1]}
    raise AssertionError(schema)


def _bad(schema: dict) -> object:
    """A value the schema must reject, by its type."""
    if "enum" in schema:
        return str(schema["enum"][0]).swapcase() + "x"
    return {"string": 12, "integer": "7", "number": "seven", "boolean": "yes", "array": "A-1",
            "object": "all"}[schema["type"]]


def test_worlds_are_deterministic_and_varied():
    a, b = world("train", 17), world("train", 17)
    assert a.records == b.records and [s.name for s in specs(a)] == [s.name for s in specs(b)]
    assert [describe(a, s) for s in specs(a)] == [describe(b, s) for s in specs(b)]
    worlds = [world("train", k) for k in range(120)]
    assert {w.naming for w in worlds} == set(NAMING_STYLES)
    assert {w.description_style for w in worlds} == set(DESCRIPTION_STYLES)
    assert len({w.noun for w in worlds}) > 40
    types = {p.schema.get("type") for w in worlds[:10] for s in specs(w) for p in s.params}
    assert {"string", "integer", "number", "boolean", "array", "object"} <= types
    env = load_env("toolworld")
    assert [t.prompt for t in env.tasks("test", 5, seed=3)] == [t.prompt for t in env.tasks("test", 5, seed=3)]
    assert [t.prompt for t in env.tasks("test", 3, seed=3, start=2)] == [t.prompt for t in env.tasks("test", 5, seed=3)][2:]


def test_every_tool_accepts_its_schema_examples_and_rejects_bad_values_field_by_field():
    checked = collections.Counter()
    for k in range(12):
        w = world("test", k)
        state = ToolworldState(w, w.fresh_records())
        for tool in bind(w, state):
            props, required = tool.parameters["properties"], tool.parameters["required"]
            good = {name: _example(props[name], w) for name in props if name in required or props[name]["type"] != "object"}
            assert tool.validate(good) == [], (tool.name, good, tool.validate(good))
            tool.fn(**good)  # really executes against the state
            for name in props:
                errors = tool.validate({**good, name: _bad(props[name])})
                assert errors and errors[0].path.startswith(f"arguments.{name}"), (tool.name, name, errors)
                checked["field"] += 1
            for name in required:
                errors = tool.validate({k: v for k, v in good.items() if k != name})
                assert [e.path for e in errors] == [f"arguments.{name}"] and errors[0].expected == "a required field"
            assert tool.validate({**good, "unexpected_field": 1})  # additionalProperties: false
            checked["tool"] += 1
    assert checked["tool"] > 100 and checked["field"] > 250


def test_no_tool_name_or_domain_of_a_held_out_world_occurs_in_training_worlds():
    train = {s.name for k in range(WORLD_POOL["train"]) for s in specs(world("train", k))}
    train_nouns = {world("train", k).noun for k in range(WORLD_POOL["train"])}
    train_parents = {world("train", k).parent for k in range(WORLD_POOL["train"])}
    for split in ("dev", "test"):
        for k in range(WORLD_POOL[split]):
            w = world(split, k)
            assert noun_split(w.noun) == split and w.noun not in train_nouns
            assert noun_split(w.parent) == split and w.parent not in train_parents
            assert not {s.name for s in specs(w)} & train, (split, k)


@pytest.mark.parametrize("faults", [0.0, 0.25])
def test_the_expert_completes_every_family_on_held_out_worlds(faults):
    env = load_env("toolworld")
    expert = env.expert(detour_rate=0.2, seed=0)
    done = collections.defaultdict(lambda: [0, 0])
    for i, task in enumerate(env.tasks("test", 360, seed=5)):
        tools, state = env.setup(task)
        hook = FaultConfig.from_total(faults, no_mutate=()).injector(i, tools=tools) if faults else None
        ep = run_episode(task, tools, expert, HarnessConfig(tool_listing="compact"), tool_hook=hook, seed=i)
        res = env.check(task, state, ep)
        done[task.family][0] += res.success
        done[task.family][1] += 1
        if faults == 0:
            assert res.success, (task.prompt, res.reasons, [s.raw_output for s in ep.steps])
    assert set(done) == set(FAMILIES)
    for family, (ok, n) in done.items():
        assert ok / n >= (0.98 if faults == 0 else 0.7), (family, ok, n)  # faulted: two faults in a row end a call


def test_parallel_calls_go_out_in_one_turn_and_the_checker_reads_state_and_answer():
    env = load_env("toolworld")
    expert = env.expert()
    tasks = {t.family: t for t in env.tasks("dev", 200, seed=1)}
    par = tasks["parallel"]
    tools, state = env.setup(par)
    ep = run_episode(par, tools, expert, HarnessConfig())
    assert len(ep.steps[0].calls) == len(par.metadata["params"]["ids"]) >= 2 and ep.success is None
    assert env.check(par, state, ep).success
    # the same answer with one figure changed fails
    ep.final_answer = ep.final_answer.replace(str(par.expected["terms"][0]), "XX-000")
    assert not env.check(par, state, ep).success

    upd = tasks["update"]
    tools, state = env.setup(upd)
    ep = run_episode(upd, tools, expert, HarnessConfig())
    assert env.check(upd, state, ep).success and len(state.actions) == 1
    state.actions.append(dict(state.actions[0]))  # the same write twice
    res = env.check(upd, state, ep)
    assert not res.success and not res.side_effects_ok

    miss = tasks["missing_value"]
    tools, state = env.setup(miss)
    ep = run_episode(miss, tools, expert, HarnessConfig())
    assert ep.steps[0].calls == [] and env.check(miss, state, ep).success
    ep.final_answer = "Done."
    assert not env.check(miss, state, ep).success


def test_user_written_values_are_rejected_with_feedback_and_fixed_by_the_expert():
    """A detour writes the value as the user did ("March 5, 2024", "west" for "WEST"): the harness
    rejects it naming the field; the expert's next turn is the right call."""
    env = load_env("toolworld")
    expert = env.expert(detour_rate=1.0, seed=0)
    seen = 0
    for task in env.tasks("test", 80, seed=2):
        if task.family not in ("schedule", "update"):
            continue
        tools, state = env.setup(task)
        ep = run_episode(task, tools, expert, HarnessConfig())
        first = ep.steps[0]
        assert first.weight == 0.0 and not first.results[0].ok
        assert "invalid arguments" in first.results[0].content
        assert ep.steps[1].weight == 1.0 and ep.steps[1].results[0].ok
        assert env.check(task, state, ep).success and len(state.actions) == 1
        seen += 1
    assert seen >= 8


def test_toolworld_episodes_build_into_training_samples(tmp_path):
    from agentrig.data.collect import CollectConfig, run_collect
    from agentrig.data.databuild import build_dataset

    out = tmp_path / "tw.jsonl"
    run_collect(CollectConfig(env="toolworld", episodes=30, faults=0.25, detours=0.2, seed=0, out=str(out),
                              tool_listing="compact"), progress=False)
    build_dataset([str(out)], tmp_path / "data", model="smollm2-135m", max_seq_length=2048)
    card = json.loads((tmp_path / "data" / "data_card.json").read_text())
    assert card["envs"] == {"toolworld": card["samples"]} and card["samples"] >= 30
    assert card["tokens"]["max"] <= 2048


def test_no_toolworld_tool_is_a_bfcl_function_and_the_build_drops_one_that_is(tmp_path):
    pytest.importorskip("bfcl_eval")
    from agentrig.bfcl.data import bfcl_function_names, load_category
    from agentrig.data.databuild import bfcl_function_in

    bfcl = bfcl_function_names()
    names = {s.name.casefold() for split, n in WORLD_POOL.items() for k in range(n) for s in specs(world(split, k))}
    assert not names & bfcl
    fn = load_category("simple_python", limit=1)[0].functions[0]
    assert bfcl_function_in(json.dumps([{"type": "function", "function": fn}])) == fn["name"]
    other = {**fn, "parameters": {"type": "object", "properties": {"something_else": {"type": "string"}}}}
    assert bfcl_function_in(json.dumps([{"type": "function", "function": other}])) is None
