"""Test-time training (`agentrig ttt`): the blind environment, exploration, practice tasks, the loop, compare."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from agentrig.envs import load_env
from agentrig.harness import HarnessConfig, run_episode
from agentrig.harness.policy import PolicyReply
from agentrig.ttt.blind import BlindEnv, BlindError, ttt_seed
from agentrig.ttt.explore import explore, sample_pattern, surfaces
from agentrig.ttt.practice import (PracticeEnv, PracticeExpert, build_practice, check_practice, solve,
                                   solve_with_fixes)

MY_ENV = str(Path(__file__).resolve().parent.parent / "examples" / "my_env.py") + ":make_env"


def _explored(spec: str, split: str, rounds: int = 4):
    env = BlindEnv(load_env(spec))
    surf = surfaces(env, env.tasks(split, 8, seed=ttt_seed(0)))
    return env, surf, explore(env, surf, HarnessConfig(), seed=0, per_tool=6, rounds=rounds, faults=0.0)


def test_the_blind_environment_refuses_the_checker_the_expert_and_the_answers() -> None:
    env = BlindEnv(load_env("datadesk"))
    task = env.tasks("test_unseen_tools", 1, seed=ttt_seed(0))[0]
    assert task.prompt and task.allowed_tools  # what the harness shows the model stays readable
    with pytest.raises(BlindError):
        task.expected["figures"]
    with pytest.raises(BlindError):
        task.expected.get("figures")
    with pytest.raises(BlindError):
        list(task.expected)
    tools, state = env.setup(task)  # the real tools, on a fresh state
    try:
        with pytest.raises(BlindError):
            env.check(task, state, None)
    finally:
        env.close(state)
    with pytest.raises(BlindError):
        env.expert()
    assert env.families("test_unseen_tools") == {}
    # the TTT namespace draws other tasks than the evaluation's seed 0
    evaluation = {t.id for t in load_env("datadesk").tasks("test_unseen_tools", 40, seed=0)}
    assert not evaluation & {t.id for t in env.tasks("test_unseen_tools", 40, seed=ttt_seed(0))}


@pytest.mark.parametrize("spec,split", [(MY_ENV, "test"), ("datadesk", "test_unseen_tools")])
def test_exploration_makes_valid_and_invalid_calls_of_every_tool(spec: str, split: str) -> None:
    env, surf, ex = _explored(spec, split)
    tools = {t for s in surf for t in s.tools}
    assert tools and set(ex.summary) == tools
    feedback: dict[str, list[str]] = {}
    ok: set[str] = set()
    for ep, call, result in ex.calls():
        if result.error == "schema":
            feedback.setdefault(call.name, []).append(result.content)
        elif result.ok and not result.content.startswith("No result"):
            ok.add(call.name)
    assert set(feedback) == tools  # every tool was sent broken arguments and told field by field
    for name, messages in feedback.items():
        assert all(m.startswith("Error") and name in m for m in messages)
    assert len(ok) >= len(tools) - 1 if spec != MY_ENV else ok == tools  # (datadesk's send_report is not offered)
    # an error-then-fix pair: a broken call, then the same tool succeeding in the same episode
    def error_then_fix(ep) -> bool:
        calls = [(c.name, r) for st in ep.steps for c in st.calls for r in st.results if r.call_id == c.id]
        return any(a[1].error == "schema" and a[0] == b[0] and b[1].ok for a, b in zip(calls, calls[1:]))

    fixed = [ep for ep in ex.episodes if ep.task.metadata["broken"] and error_then_fix(ep)]
    assert fixed
    if spec == "datadesk":  # chains: a value from one tool's result used as another tool's argument
        chains = [ep for ep in ex.episodes if ep.task.metadata["kind"] == "chain"]
        linked = 0
        for ep in chains:
            first, last = ep.steps[0], [st for st in ep.steps if st.calls][-1]
            if first.results[0].ok and last.results[0].ok:
                linked += any(str(v) in first.results[0].content for v in last.calls[0].arguments.values())
        assert linked >= 5
        assert any(c.name == "list_tickets" for ep in chains for st in ep.steps[1:] for c in st.calls)
    else:  # a tool that fails on a fresh state is tried after a side-effect call put a state in place
        assert any(ep.task.metadata["kind"] == "state" and c.name == "checkout" and r.ok
                   for ep in ex.episodes for st in ep.steps for c in st.calls for r in st.results if r.call_id == c.id)


def test_exploration_is_deterministic_in_its_seed() -> None:
    _, _, a = _explored(MY_ENV, "test")
    _, _, b = _explored(MY_ENV, "test")
    calls = lambda ex: [(c.name, json.dumps(c.arguments)) for _, c, _ in ex.calls()]  # noqa: E731
    assert calls(a) == calls(b)


def test_pattern_sampling() -> None:
    import random

    rng = random.Random(0)
    for pattern in (r"^T\d{4}$", r"^[A-Z]{2,3}-\d+$", r"^(EUR|USD|JPY)$", r"^\d{4}-\d{2}-\d{2}$"):
        value = sample_pattern(pattern, rng)
        assert value is not None
        import re

        assert re.search(pattern, value)
    assert sample_pattern(r"^(?!x)[^a]+$", rng) is None  # one this sampler does not know


@pytest.mark.parametrize("spec,split", [(MY_ENV, "test"), ("datadesk", "test_unseen_tools")])
def test_fix_practice_sends_a_rejected_call_at_weight_0_then_the_constructed_one(spec: str, split: str) -> None:
    env, surf, ex = _explored(spec, split)
    tasks = build_practice(ex, 12, seed=0)
    penv = PracticeEnv(env, surf, tasks)
    kept = [ep.task for ep in solve(penv, tasks, HarnessConfig())]
    fixed = solve_with_fixes(penv, kept, HarnessConfig())
    assert len(fixed) >= 0.8 * len(kept)
    for ep in fixed:
        first, then = ep.task.metadata["plan"][0], ep.steps[1].calls[0]
        broken = ep.steps[0]
        assert broken.weight == 0.0 and [c.name for c in broken.calls] == [first["name"]]
        assert broken.calls[0].arguments != first["arguments"]
        assert "invalid arguments" in broken.results[0].content  # the harness's per-field feedback
        assert all(s.weight == 1.0 for s in ep.steps[1:]) and not ep.steps[1].text.strip()
        assert (then.name, then.arguments) == (first["name"], first["arguments"]) or first.get("links")
        assert check_practice(ep.task, ep).success
    if spec == "datadesk":  # the mistake seen on the unseen tools: a field another tool has
        assert any("borrowed" in ep.metadata["fix"] for ep in fixed)


@pytest.mark.parametrize("spec,split", [(MY_ENV, "test"), ("datadesk", "test_unseen_tools"), ("toolworld", "test")])
def test_practice_tasks_pass_their_own_assertions_with_the_constructed_calls(spec: str, split: str) -> None:
    env, surf, ex = _explored(spec, split)
    tasks = build_practice(ex, 24, seed=0)
    assert tasks
    penv = PracticeEnv(env, surf, tasks)
    kept = [ep.task for ep in solve(penv, tasks, HarnessConfig())]
    assert len(kept) >= 0.9 * len(tasks)
    for task in kept:
        assert task.expected["calls"] and (task.expected["figures"] or task.expected["terms"])
        for fig in task.expected["figures"]:  # the answer is not in the request
            assert str(fig["value"]) not in task.prompt.split() or fig["kind"] == "count"
    if spec == "datadesk":
        assert {t.family for t in kept} >= {"practice_single", "practice_chain"}
    # a wrong answer, or the right answer without the calls, fails the assertion
    task = kept[0]
    tools, state = penv.setup(task)
    try:
        lazy = run_episode(task, tools, lambda r: PolicyReply("The answer is 42."), HarnessConfig(), episode_id="x")
    finally:
        penv.close(state)
    assert not check_practice(task, lazy).success
    tools, state = penv.setup(task)
    try:
        good = run_episode(task, tools, PracticeExpert(), HarnessConfig(), episode_id="y")
    finally:
        penv.close(state)
    assert check_practice(task, good).success
    answer_only = type(good)(**{**good.__dict__, "steps": [s for s in good.steps if s.is_final]})
    assert not check_practice(task, answer_only).success


def test_compare_counts_flips_with_mcnemar_and_a_paired_interval(tmp_path: Path, capsys) -> None:
    from agentrig.cli import main
    from agentrig.evals.paired import mcnemar_exact, newcombe_paired
    from agentrig.harness.trajectory import Episode, TaskSpec, write_episodes

    assert mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(1, 9) == pytest.approx(2 * 11 / 1024)
    assert mcnemar_exact(5, 5) == 1.0
    diff, lo, hi = newcombe_paired(10, 2, 8, 20)
    assert diff == pytest.approx(0.15) and lo < diff < hi and -1 <= lo and hi <= 1
    # swapping A and B negates the difference and its interval; more pairs narrow it
    d2, lo2, hi2 = newcombe_paired(10, 8, 2, 20)
    assert (d2, lo2, hi2) == pytest.approx((-diff, -hi, -lo))
    _, lo3, hi3 = newcombe_paired(100, 20, 80, 200)
    assert hi3 - lo3 < hi - lo

    def eps(outcomes: list[bool]) -> list[Episode]:
        return [Episode(f"t{i}#0", TaskSpec(id=f"t{i}", prompt="p", split="test"), "hermes", "", [], success=s)
                for i, s in enumerate(outcomes)]

    write_episodes(tmp_path / "a.jsonl", eps([True, False, False, True, False]))
    write_episodes(tmp_path / "b.jsonl", eps([True, True, True, False, False]))
    assert main(["compare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl"), "--json", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out
    assert "A 2/5, B 3/5" in out and "gained: t1#0, t2#0" in out and "lost: t3#0" in out
    payload = json.loads((tmp_path / "c.json").read_text())["splits"][0]
    assert (payload["both"], payload["only_a"], payload["only_b"], payload["neither"]) == (1, 1, 2, 1)
    from agentrig.errors import ConfigError
    from agentrig.evals.paired import compare, load_outcomes

    write_episodes(tmp_path / "other.jsonl", [Episode("z#0", TaskSpec(id="z", prompt="p"), "hermes", "", [])])
    with pytest.raises(ConfigError, match="share no episode id"):
        compare(load_outcomes(str(tmp_path / "a.jsonl")), load_outcomes(str(tmp_path / "other.jsonl")))


@pytest.fixture()
def tiny_model_and_adapter(tmp_path: Path, smol_tokenizer) -> tuple[Path, Path]:
    import torch
    from peft import LoraConfig, get_peft_model

    from agentrig.models import tiny_random_model

    model = tmp_path / "tiny"
    tiny_random_model(len(smol_tokenizer)).save_pretrained(model)
    smol_tokenizer.save_pretrained(model)
    torch.manual_seed(1)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(tiny_random_model(len(smol_tokenizer)), lora).save_pretrained(tmp_path / "adapter")
    return model, tmp_path / "adapter"


def test_a_tiny_ttt_run_changes_the_adapter_and_keeps_the_original(tmp_path: Path, tiny_model_and_adapter,
                                                                   capsys) -> None:
    import torch
    from safetensors.torch import load_file

    from agentrig.cli import main
    from agentrig.evals.paired import practice_overlap

    model, adapter = tiny_model_and_adapter
    original = adapter / "adapter_model.safetensors"
    digest = hashlib.sha256(original.read_bytes()).hexdigest()
    out = tmp_path / "ttt"
    code = main(["ttt", "--adapter", str(adapter), "--model", str(model), "--env", MY_ENV, "--split", "test",
                 "--out", str(out), "--steps", "2", "--practice-tasks", "6", "--max-new-tokens", "8",
                 "--max-steps", "3", "--replay-share", "0", "--stack-rank", "0", "--learning-rate", "1e-4"])
    assert code == 0
    summary = json.loads((out / "ttt.json").read_text())
    assert summary["steps"] == 2 and summary["practice"]["verified"] >= 1
    assert summary["rollouts"]["episodes"] == summary["practice"]["verified"]
    assert (out / "explore.jsonl").is_file() and (out / "practice_sft.jsonl").read_text().strip()
    # the original adapter is untouched; the new one has other LoRA weights
    assert hashlib.sha256(original.read_bytes()).hexdigest() == digest
    new = load_file(out / "adapter-ttt" / "adapter_model.safetensors")
    old = load_file(original)
    assert set(new) == set(old) and any(not torch.equal(new[k], old[k]) for k in old)
    # NAME-ttt loads next to NAME in one HFPolicy
    from agentrig.policies.loader import PolicySpec, load_policy

    policy = load_policy(PolicySpec(str(model), adapters={"adapter": str(adapter),
                                                          "adapter-ttt": str(out / "adapter-ttt")}))
    assert set(policy.adapter_names) == {"adapter", "adapter-ttt"}
    # the evaluator's overlap check reads the practice file
    env = load_env(MY_ENV)
    overlap = practice_overlap(out / "practice_tasks.jsonl", env, env.tasks("test", 4, seed=0))
    assert overlap["eval_tasks"] == 4 and overlap["prompts_verbatim"] == 0 and overlap["expert"]
    # a finished run folder is not overwritten
    assert main(["ttt", "--adapter", str(adapter), "--model", str(model), "--env", MY_ENV, "--split", "test",
                 "--out", str(out), "--replay-share", "0"]) == 2
    assert "already holds a finished TTT run" in capsys.readouterr().err


def test_rollout_tasks_rolls_out_a_sample_and_learns_the_rest_from_the_constructed_solution(
        tmp_path: Path, tiny_model_and_adapter) -> None:
    from agentrig.cli import main
    from agentrig.errors import ConfigError
    from agentrig.harness.trajectory import iter_episodes
    from agentrig.ttt.loop import TTTConfig, rollout_sample

    assert rollout_sample(6, None, 0) == rollout_sample(6, 9, 0) == set(range(6))
    assert len(rollout_sample(6, 2, 0)) == 2 and rollout_sample(6, 2, 0) == rollout_sample(6, 2, 0)
    assert rollout_sample(6, 0, 0) == set()
    model, adapter = tiny_model_and_adapter
    out = tmp_path / "ttt"
    assert main(["ttt", "--adapter", str(adapter), "--model", str(model), "--env", MY_ENV, "--split", "test",
                 "--out", str(out), "--steps", "1", "--practice-tasks", "6", "--max-new-tokens", "8",
                 "--max-steps", "3", "--replay-share", "0", "--rollout-tasks", "1", "--tool-name-weight", "5"]) == 0
    summary = json.loads((out / "ttt.json").read_text())
    # the tool-name tokens of the practice calls are weighted in the update, as in the adapter's own SFT
    assert summary["tool_name_weight"] == 5.0 and summary["key_tokens"] > 0
    verified = summary["practice"]["verified"]
    assert verified >= 2 and summary["rollouts"]["episodes"] == 1
    assert summary["rollouts"]["constructed_only"] == verified - 1
    rolled = list(iter_episodes(out / "rollouts.jsonl"))
    sft = list(iter_episodes(out / "practice_sft.jsonl"))
    constructed = [e for e in sft if e.episode_id.endswith("+constructed")]
    # every task not rolled out is learned from its constructed solution, which passed the task's assertion
    assert len(constructed) == verified - 1 and all(e.success for e in constructed)
    assert rolled[0].task.id not in {e.task.id for e in constructed}
    assert summary["train_data"]["practice_samples"] == len(sft) and summary["steps"] == 1
    with pytest.raises(ConfigError, match="--rollout-tasks"):
        TTTConfig(adapter=str(adapter), out=str(tmp_path / "x"), rollout_tasks=-1)
    with pytest.raises(ConfigError, match="--tool-name-weight"):
        TTTConfig(adapter=str(adapter), out=str(tmp_path / "x"), tool_name_weight=0)


def test_stack_rank_trains_a_new_lora_on_the_frozen_adapter_and_saves_both_as_one(
        tmp_path: Path, tiny_model_and_adapter) -> None:
    from safetensors.torch import load_file

    from agentrig.cli import main
    from agentrig.errors import ConfigError
    from agentrig.policies.loader import PolicySpec, load_policy
    from agentrig.ttt.loop import TTTConfig

    model, adapter = tiny_model_and_adapter
    out = tmp_path / "ttt"
    assert main(["ttt", "--adapter", str(adapter), "--model", str(model), "--env", MY_ENV, "--split", "test",
                 "--out", str(out), "--steps", "2", "--practice-tasks", "4", "--max-steps", "3",
                 "--replay-share", "0", "--rollout-tasks", "0", "--stack-rank", "2", "--learning-rate", "1e-2",
                 "--fix-share", "1"]) == 0
    summary = json.loads((out / "ttt.json").read_text())
    fix = summary["fix"]  # fix practice replaces the constructed episodes
    assert fix["picked"] == summary["practice"]["verified"] and 1 <= fix["replaced"] == len(fix["broken"])
    assert sum(json.loads(line)["episode_id"].endswith("+fix")
               for line in (out / "practice_sft.jsonl").read_text().splitlines()) == fix["replaced"]
    cfg = json.loads((out / "adapter-ttt" / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"], sorted(cfg["target_modules"])) == (6, 6, ["q_proj", "v_proj"])
    old, new = load_file(adapter / "adapter_model.safetensors"), load_file(out / "adapter-ttt" / "adapter_model.safetensors")
    assert set(new) == set(old)
    for key, tensor in old.items():  # the original (rank 4, scale 8/4 folded into B) is frozen; the new rank 2 trained
        if key.endswith("lora_A.weight"):
            assert new[key][:4].equal(tensor)
        else:
            assert new[key][:, :4].allclose(tensor * 2) and new[key][:, 4:].abs().max() > 0
    policy = load_policy(PolicySpec(str(model), adapters={"adapter-ttt": str(out / "adapter-ttt")}))
    assert policy.adapter_names == ["adapter-ttt"]
    with pytest.raises(ConfigError, match="--stack-rank"):
        TTTConfig(adapter=str(adapter), out=str(tmp_path / "x"), stack_rank=-1)


def test_the_budget_stops_training_before_a_step_would_pass_the_deadline() -> None:
    from types import SimpleNamespace

    from agentrig.ttt.loop import _Deadline

    now = [0.0]
    stop = _Deadline(deadline=100.0, reserve=3.0, clock=lambda: now[0])
    control, state = SimpleNamespace(should_training_stop=False), SimpleNamespace()
    stop.callback.on_step_begin(None, state, control)
    ends = []
    for t in range(10, 200, 10):  # 10-second steps
        now[0] = float(t)
        stop.callback.on_step_end(None, state, control)
        if control.should_training_stop:
            ends.append(t)
            break
    # at 80 s another step and the save still fit (80 + 10 + 3 < 100); at 90 s they would not
    assert ends == [90] and state.stopped_by_budget


def test_the_in_context_control_shows_the_exploration_in_the_system_prompt(tmp_path: Path) -> None:
    from agentrig.evals.incontext import HEADER, InContextPolicy, examples_block
    from agentrig.harness.trajectory import write_episodes

    _, _, ex = _explored("datadesk", "test_unseen_tools", rounds=2)
    write_episodes(tmp_path / "explore.jsonl", ex.episodes)
    block = examples_block(tmp_path / "explore.jsonl", n=8)
    lines = block.splitlines()
    assert lines[0] == HEADER and 8 < len(lines) <= 1 + 8 + 2
    assert any("ticket_details(" in line and "->" in line for line in lines)  # results of the unseen tools
    assert any("expected" in line for line in lines[9:])  # and a refusal with the harness's field feedback
    seen = []

    def policy(request):
        seen.append(request.messages[0]["content"])
        return PolicyReply("done")

    env = load_env("datadesk")
    task = env.tasks("test_unseen_tools", 1, seed=0)[0]
    tools, state = env.setup(task)
    try:
        run_episode(task, tools, InContextPolicy(policy, block), HarnessConfig(), episode_id="e")
    finally:
        env.close(state)
    assert seen and seen[0].endswith(block) and seen[0].startswith("You")


def test_practice_goes_mostly_to_the_tools_new_to_the_adapter(tmp_path: Path) -> None:
    from agentrig.ttt.loop import novel_tools

    _, surf, ex = _explored("datadesk", "test_unseen_tools")
    (tmp_path / "samples.jsonl").write_text(json.dumps({"messages": [{"role": "system", "content": "\n".join(
        f"{t}(x: string) - a tool" for t in surf[0].tools if not t.startswith("ticket") and t != "list_tickets")}]}))
    new = novel_tools(str(tmp_path), surf[0].tools)
    assert new == {"list_tickets", "ticket_details", "ticket_counts"}
    tasks = build_practice(ex, 20, seed=0, prefer=new)
    using = [t for t in tasks if t.metadata["plan"][-1]["name"] in new]
    assert len(tasks) == 20 and len(using) >= 15


def test_practice_is_spread_over_the_tools_it_ends_with() -> None:
    import collections

    _, _, ex = _explored("datadesk", "test_unseen_tools")
    new = {"list_tickets", "ticket_details", "ticket_counts"}
    tasks = build_practice(ex, 24, seed=0, prefer=new)
    last = collections.Counter(t.metadata["plan"][-1]["name"] for t in tasks)
    assert all(last[t] >= 3 for t in new), last  # ticket_counts too, though chains end elsewhere


def test_single_share_gives_every_tool_its_single_calls_whatever_the_chains() -> None:
    """Chains first (the default) leaves a new tool with few single-call tasks where the exploration found many
    chains ending in it (`ticket_counts` here: 1 single of 8 at seed 0); with `single_share` 0.5 at least half of
    each new tool's tasks are single calls, at every seed."""
    import collections

    _, _, ex = _explored("datadesk", "test_unseen_tools")
    new = {"list_tickets", "ticket_details", "ticket_counts"}
    for seed in (0, 1, 2):
        plain = build_practice(ex, 32, seed=seed, prefer=new)
        mixed = build_practice(ex, 32, seed=seed, prefer=new, single_share=0.5)
        assert len(mixed) == len(plain) == 32
        kinds = collections.Counter((t.metadata["plan"][-1]["name"], len(t.metadata["plan"]) == 1) for t in mixed)
        for tool in new:
            total = kinds[(tool, True)] + kinds[(tool, False)]
            assert total >= 3 and kinds[(tool, True)] >= total // 2, (seed, tool, kinds)
        singles = lambda ts: sum(len(t.metadata["plan"]) == 1 for t in ts)  # noqa: E731
        assert singles(mixed) >= singles(plain), seed


def test_user_form_writes_months_as_people_do_and_leaves_impossible_ones() -> None:
    from agentrig.ttt.explore import user_form

    assert user_form("2024-10", "month") == "October 2024"
    assert user_form("2024-03-05", "date") == "March 5, 2024"
    assert user_form("2024-13", "month") == "2024-13"  # a pattern-sampled month that no calendar has
    assert user_form("1999-00-07", "date") == "1999-00-07"


def test_probes_of_one_tool_in_a_round_are_all_different_calls() -> None:
    """A pool with one value for a parameter must not make every probe the same call (they are drawn again)."""
    from agentrig.ttt.explore import ValuePool, plan_probes

    env = BlindEnv(load_env("datadesk"))
    surf = surfaces(env, env.tasks("test_unseen_tools", 8, seed=ttt_seed(0)))[0]
    tools, state = env.setup(surf.base)
    try:
        pool = ValuePool()
        pool.add_result("sales_total", {"region": "East", "month": "2024-03"}, {"month": "2024-03", "total": 1.0}, "e")
        import random

        probes = plan_probes(surf, {n: tools.get(n) for n in surf.tools}, pool, random.Random(0), 6, 1)
        for name in surf.tools:
            final = [json.dumps(p.calls[-1].arguments, sort_keys=True) for p in probes if p.tool == name
                     and p.kind in ("single", "chain")]
            assert len(final) == len(set(final)), (name, final)
        months = {p.calls[-1].arguments.get("month") for p in probes if p.tool in surf.tools and "month" in
                  p.calls[-1].arguments and p.kind in ("single", "chain")}
        assert len(months) > 1, months
    finally:
        env.close(state)


# -- the per-task mode ------------------------------------------------------------------------


def _scripted(task, replies):
    from agentrig.harness import ScriptedPolicy

    env = load_env("datadesk")
    tools, state = env.setup(task)
    try:
        return run_episode(task, tools, ScriptedPolicy(replies), HarnessConfig())
    finally:
        env.close(state)


def _call(name, **args):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def test_the_per_task_selector_prefers_a_finished_valid_grounded_answer_others_agree_with() -> None:
    from agentrig.ttt.pertask import disagree, score_rollouts, select

    env = load_env("datadesk")
    task = next(t for t in env.tasks("dev", 100) if t.family == "single_lookup" and t.metadata["variant"] == "manager")
    region = task.metadata["params"]["region"]
    email = f"{region.lower()}.manager@datadesk.example"
    lookup = _call("region_info", region=region)
    grounded = _scripted(task, [lookup, f"The manager is {email}."])
    invented = _scripted(task, [lookup, f"The manager is {email}; the region sold 98765.43 last year."])
    invalid = _scripted(task, [_call("region_info", area=region), lookup, f"The manager is {email}."])
    unfinished = _scripted(task, [lookup] * 3)

    rollouts = [unfinished, invented, invalid, grounded]
    scores = score_rollouts(rollouts)
    assert [s.finished for s in scores] == [False, True, True, True]
    assert scores[1].ungrounded == 1 and scores[3].ungrounded == 0
    assert scores[2].invalid == 1 and scores[3].invalid == 0
    assert scores[2].agreement == 1 and scores[3].agreement == 1  # the same answer twice; the invented one differs
    assert select(scores) == 3
    assert disagree(rollouts) and not disagree([grounded, invalid])
    # an error left unanswered counts against a rollout
    from agentrig.harness.trajectory import ToolResult

    def failing(call_, execute):
        return ToolResult(call_.id, call_.name, "Error: 503 Service Unavailable", ok=False, fault="error_503",
                          error="error_503")

    tools, state = env.setup(task)
    try:
        from agentrig.harness import ScriptedPolicy

        gave_up = run_episode(task, tools, ScriptedPolicy([lookup, "I could not look it up."]), HarnessConfig(),
                              tool_hook=failing)
    finally:
        env.close(state)
    assert score_rollouts([gave_up, grounded])[0].unanswered == 1


def test_the_per_task_mode_answers_every_task_twice_and_keeps_the_adapter(tmp_path: Path, tiny_model_and_adapter,
                                                                           capsys) -> None:
    from agentrig.cli import main
    from agentrig.harness.trajectory import iter_episodes

    model, adapter = tiny_model_and_adapter
    original = adapter / "adapter_model.safetensors"
    digest = hashlib.sha256(original.read_bytes()).hexdigest()
    out = tmp_path / "pertask"
    args = ["ttt", "--per-task", "--adapter", str(adapter), "--model", str(model), "--env", MY_ENV,
            "--split", "test", "--out", str(out), "--k", "2", "--limit", "2", "--task-steps", "1",
            "--max-new-tokens", "8", "--max-steps", "2"]
    assert main(args) == 0
    env = load_env(MY_ENV)
    ids = sorted(f"{t.id}#0" for t in env.tasks("test", 2, seed=0))
    for mode in ("best_of_k", "per_task"):
        episodes = list(iter_episodes(out / f"episodes_{mode}.jsonl"))
        assert sorted(ep.episode_id for ep in episodes) == ids
        assert all(ep.success is not None and ep.check for ep in episodes)  # checked by the evaluator
    summary = json.loads((out / "pertask.json").read_text())
    assert len(summary["tasks"]) == 2 and set(summary["completed"]) == {"best_of_k", "per_task"}
    # a tiny random model's sampled rollouts disagree, so each task got its training steps
    assert summary["trained"] == 2 and all(t["steps"] == 1 for t in summary["tasks"])
    assert len(list(iter_episodes(out / "rollouts.jsonl"))) == 4
    assert json.loads((out / "metrics.json").read_text())["results"].keys() == {"best_of_k", "per_task"}
    assert hashlib.sha256(original.read_bytes()).hexdigest() == digest
    assert main(args) == 2 and "already holds a finished per-task run" in capsys.readouterr().err
    bad = ["ttt", "--per-task", "--adapter", str(adapter), "--model", str(model), "--env", MY_ENV, "--split", "test",
           "--out", str(tmp_path / "x"), "--k", "1"]
    assert main(bad) == 2 and "--k of at least 2" in capsys.readouterr().err
    # --task-steps 0: best-of-k alone, no training, several tasks' rollouts in one batch
    only = tmp_path / "best_of_k"
    assert main(args[:args.index("--out") + 1] + [str(only), "--k", "2", "--limit", "3", "--task-steps", "0",
                                                   "--max-new-tokens", "8", "--max-steps", "2"]) == 0
    assert not (only / "episodes_per_task.jsonl").exists()
    assert sorted(ep.episode_id for ep in iter_episodes(only / "episodes_best_of_k.jsonl")) == sorted(
        f"{t.id}#0" for t in env.tasks("test", 3, seed=0))
    summary = json.loads((only / "pertask.json").read_text())
    assert summary["trained"] == 0 and set(summary["completed"]) == {"best_of_k"}
    assert len(list(iter_episodes(only / "rollouts.jsonl"))) == 6


@pytest.mark.parametrize("spec,split", [("datadesk", "test_unseen_tools"), ("toolworld", "test")])
def test_missing_tasks_want_the_call_and_an_honest_answer(spec: str, split: str) -> None:
    env, surf, ex = _explored(spec, split)
    tasks = build_practice(ex, 20, seed=0, missing_share=0.25)
    missing = [t for t in tasks if t.family == "practice_missing"]
    assert len(missing) == 5 and len(tasks) == 20
    assert len({t.metadata["plan"][0]["name"] for t in missing}) >= 2  # spread over the tools
    penv = PracticeEnv(env, surf, tasks)
    kept = {ep.task.id for ep in solve(penv, tasks, HarnessConfig())}
    assert {t.id for t in missing} <= kept  # the constructed call finds nothing, the honest answer passes
    task = missing[0]
    assert task.expected["impossible"] and not task.expected["figures"]
    for months in re.findall(r"\b(\d{4})-(\d{2})\b", json.dumps(task.expected["calls"])):
        assert 1990 <= int(months[0]) <= 2040 and 1 <= int(months[1]) <= 12  # a request a person could make

    def episode(reply):
        tools, state = penv.setup(task)
        try:
            return run_episode(task, tools, reply, HarnessConfig(), episode_id="m")
        finally:
            penv.close(state)

    good = episode(PracticeExpert())
    assert check_practice(task, good).success
    assert [c.name for s in good.steps for c in s.calls] == [task.metadata["plan"][0]["name"]]
    # the honest words without the call, or the call and an invented figure, fail
    assert not check_practice(task, episode(lambda r: PolicyReply(task.metadata["answer"]))).success
    invented = type(good)(**{**good.__dict__, "final_answer": "It is 4817.", "steps": good.steps})
    result = check_practice(task, invented)
    assert not result.success and result.invented_numbers == [4817.0]


def test_missing_tasks_leave_the_other_tasks_as_they_were() -> None:
    _, _, ex = _explored("datadesk", "test_unseen_tools")
    plain = build_practice(ex, 12, seed=0)
    mixed = build_practice(ex, 16, seed=0, missing_share=0.25)
    assert [t.prompt for t in mixed if t.family != "practice_missing"] == [t.prompt for t in plain]
