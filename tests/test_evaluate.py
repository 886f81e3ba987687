"""run_eval and `agentrig eval` on a small key-value environment defined here (also loaded as a user env file)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agentrig.envs import CheckResult, Environment
from agentrig.errors import ConfigError
from agentrig.evals.evaluate import EvalConfig, parse_pairs, run_eval
from agentrig.harness import HarnessConfig, PolicyRequest
from agentrig.harness.tools import Tool, ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec

DATA = {"alpha": 11, "beta": 22, "gamma": 33}


class KeyValueEnv(Environment):
    """Tasks "what is the value of KEY?"; KEY "omega" does not exist (an impossible task)."""

    name = "kv"

    def __init__(self) -> None:
        self.states: list[dict[str, Any]] = []

    def tasks(self, split: str, n: int, seed: int = 0, start: int = 0) -> list[TaskSpec]:
        self.check_split(split)
        out = []
        for i in range(start, start + n):
            if split == "test_unseen_tools":
                family, key = "unseen", "gamma"
            elif i % 3 == 2:
                family, key = "impossible", "omega"
            else:
                family, key = "lookup", ["alpha", "beta"][i % 3]
            out.append(TaskSpec(id=f"{split}-{i}", prompt=f"What is the value of {key}?", env="kv", family=family,
                                split=split, allowed_tools=["lookup"], expected={"value": DATA.get(key)},
                                metadata={"impossible": key not in DATA}))
        return out

    def setup(self, task: TaskSpec) -> tuple[ToolSet, dict[str, Any]]:
        state: dict[str, Any] = {"closed": False}
        self.states.append(state)

        def lookup(key: str) -> dict:
            return {"value": DATA[key]}

        schema = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
        return ToolSet([Tool.from_schema("lookup", "Look a key up.", schema, lookup)], allowed=task.allowed_tools), state

    def check(self, task: TaskSpec, state: dict[str, Any], episode: Episode) -> CheckResult:
        answer = (episode.final_answer or "").lower()
        if task.metadata["impossible"]:
            return CheckResult("cannot" in answer, reasons=["said it cannot be done" if "cannot" in answer else "pretended"])
        ok = str(task.expected["value"]) in answer
        return CheckResult(ok, reasons=["figure stated" if ok else "figure missing"])

    def close(self, state: dict[str, Any]) -> None:
        state["closed"] = True


def make_env() -> KeyValueEnv:
    """Entry point for `--env tests/test_evaluate.py:make_env`."""
    return KeyValueEnv()


def rule_policy(request: PolicyRequest) -> str:
    """Looks the key up, retries a failed call once, answers; gets the unseen family wrong on purpose."""
    messages = request.messages
    key = messages[1]["content"].split()[-1].rstrip("?")
    call = f'<tool_call>\n{{"name": "lookup", "arguments": {{"key": "{key}"}}}}\n</tool_call>'
    results = [m["content"] for m in messages if m["role"] == "tool"]
    if not results:
        return call
    if results[-1].startswith('{"value"'):
        value = json.loads(results[-1])["value"]
        return f"The value is {value + 1 if key == 'gamma' else value}."
    return call if len(results) < 2 else "I cannot find that value."


def test_run_eval_checks_every_episode_and_measures() -> None:
    env = KeyValueEnv()
    config = EvalConfig(env="kv", limit=3, trials=2, harness=HarnessConfig(memory=False))
    result = run_eval(rule_policy, config, env=env)
    eps = result.episodes
    assert len(eps) == 12  # 2 splits x 3 tasks x 2 trials
    assert sorted(e.episode_id for e in eps)[:2] == ["test-0#0", "test-0#1"]
    assert len({e.episode_id for e in eps}) == 12
    assert all(s["closed"] for s in env.states) and len(env.states) == 12
    m = result.metrics
    assert (m.completion.hits, m.completion.total) == (6, 12)  # lookup 4/4, impossible 2/2, unseen 0/6
    assert (m.honest_failure.hits, m.honest_failure.total) == (2, 2)
    assert m.by_split["test"].completion.hits == 6 and m.by_split["test_unseen_tools"].completion.hits == 0
    assert m.by_family["unseen"].episodes == 6
    assert m.pass_hat_k == {1: 0.5, 2: 0.5}
    assert m.recovery.total == 0
    assert all(e.check["reasons"] for e in eps)


def test_faults_are_seeded_and_recovery_is_counted() -> None:
    config = EvalConfig(env="kv", splits=["test"], limit=6, faults=0.6, seed=3, harness=HarnessConfig(memory=False))
    first = run_eval(rule_policy, config, env=KeyValueEnv())
    again = run_eval(rule_policy, config, env=KeyValueEnv())
    assert [e.faults for e in first.episodes] == [e.faults for e in again.episodes]
    faulted = [e for e in first.episodes if e.faults]
    assert faulted, "a 60% fault rate over 6 tasks should fault something"
    assert first.metrics.recovery.total == len(faulted)
    assert first.metrics.recovery.hits == sum(1 for e in faulted if e.success)


def test_bad_options_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="--faults"):
        EvalConfig(faults=1.5)
    with pytest.raises(ConfigError, match="unknown split 'tset'"):
        run_eval(rule_policy, EvalConfig(env="kv", splits=["tset"], limit=1), env=KeyValueEnv())
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_pairs(["sft"], "--adapter")


def test_precision_refused_where_nothing_local_runs(tmp_path: Path, capsys) -> None:
    """`--precision` sets a local model's arithmetic: with the expert or a served model it is an error, not ignored."""
    from agentrig.cli import main

    assert main(["eval", "--policy", "expert", "--precision", "fp32", "--limit", "1", "--out", str(tmp_path / "a")]) == 2
    assert "the expert teacher has none to set: drop --precision" in capsys.readouterr().err
    assert main(["eval", "--base-url", "http://127.0.0.1:9/v1", "--precision", "bf16", "--limit", "1",
                 "--out", str(tmp_path / "b")]) == 2
    assert "a model behind --base-url has none to set" in capsys.readouterr().err
    assert not (tmp_path / "a" / "metrics.json").exists() and not (tmp_path / "b" / "metrics.json").exists()
    # the default, auto, is what every such run passes, and it runs
    assert main(["eval", "--policy", "expert", "--limit", "1", "--split", "test", "--out", str(tmp_path / "c")]) == 0
    assert json.loads((tmp_path / "c" / "metrics.json").read_text())["config"]["precision"] == "auto"


@pytest.fixture()
def tiny_model_dir(tmp_path: Path, smol_tokenizer) -> Path:
    """A tiny random model and the default tokenizer saved as a model folder, plus one LoRA adapter."""
    import torch
    from peft import LoraConfig, get_peft_model

    from agentrig.models import tiny_random_model

    folder = tmp_path / "tiny"
    tiny_random_model(len(smol_tokenizer)).save_pretrained(folder)
    smol_tokenizer.save_pretrained(folder)
    torch.manual_seed(1)
    lora = LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(tiny_random_model(len(smol_tokenizer)), lora).save_pretrained(tmp_path / "adapter")
    return folder


def test_eval_cli_writes_metrics_report_and_plots(tiny_model_dir: Path, tmp_path: Path, capsys) -> None:
    from agentrig.cli import main

    out = tmp_path / "eval"
    code = main(["eval", "--model", str(tiny_model_dir), "--adapter", f"sft={tiny_model_dir.parent / 'adapter'}",
                 "--include-base", "--env", f"{__file__}:make_env", "--limit", "2", "--max-steps", "2",
                 "--max-new-tokens", "6", "--out", str(out)])
    assert code == 0
    payload = json.loads((out / "metrics.json").read_text())
    assert payload["schema"] == "agentrig.metrics/1"  # the schema `agentrig run` writes too (test_run)
    assert set(payload) == {"schema", "config", "limits", "results", "throughput", "episodes"}
    assert payload["episodes"] == {"base": "episodes_base.jsonl", "sft": "episodes_sft.jsonl"}
    assert list(payload["results"]) == ["base", "sft"]
    assert payload["results"]["sft"]["episodes"] == 4
    assert payload["config"]["limit"] == 2 and payload["config"]["adapters"]["sft"].endswith("adapter")
    assert {p.name for p in out.glob("*.png")} == {"metrics.png", "families.png", "failures.png"}
    assert (out / "report.md").read_text().count("| task completion |") == 1
    assert (out / "episodes_sft.jsonl").read_text().count("\n") == 4
    printed = capsys.readouterr().out
    assert "task completion" in printed and "family: lookup" in printed


def test_eval_cli_against_an_openai_compatible_server(tmp_path: Path, capsys) -> None:
    from test_openai_policy import FakeServer

    from agentrig.cli import main

    def answer(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        request = PolicyRequest(messages=body["messages"], tools=[], task=TaskSpec(id="x", prompt=""), step=0)
        text = rule_policy(request)
        return 200, {"choices": [{"message": {"role": "assistant", "content": text.removesuffix("</tool_call>")},
                                  "finish_reason": "stop"}]}

    server = FakeServer(answer)
    try:
        out = tmp_path / "remote"
        code = main(["eval", "--base-url", server.url, "--model", "teacher", "--env", f"{__file__}:make_env",
                     "--split", "test", "--limit", "3", "--out", str(out)])
    finally:
        server.close()
    assert code == 0
    results = json.loads((out / "metrics.json").read_text())["results"]["teacher"]
    assert results["completion"]["hits"] == 3  # alpha, beta, and the honest "cannot" on omega
    assert server.requests[0]["model"] == "teacher"


def test_eval_cli_tool_format_shapes_the_requests(tmp_path: Path) -> None:
    from test_openai_policy import FakeServer

    from agentrig.cli import main

    server = FakeServer(lambda body, headers: (200, {"choices": [{"message": {"role": "assistant", "content": "No."}}]}))
    try:
        code = main(["eval", "--base-url", server.url, "--model", "tuned", "--tool-format", "native", "--env",
                     f"{__file__}:make_env", "--split", "test", "--limit", "1", "--out", str(tmp_path / "e")])
    finally:
        server.close()
    assert code == 0
    body = server.requests[0]
    assert [t["function"]["name"] for t in body["tools"]]  # the tools go in `tools`, not in the system prompt
    assert "<tools>" not in body["messages"][0]["content"]
    assert json.loads((tmp_path / "e" / "metrics.json").read_text())["config"]["tool_format"] == "native"


@pytest.mark.slow
def test_real_smollm2_episodes_on_datadesk() -> None:
    """A few real SmolLM2-135M episodes, batched, on both test splits: every one runs, is checked and measured."""
    from agentrig.policies.hf_policy import HFPolicy

    policy = HFPolicy.from_pretrained("smollm2-135m", max_new_tokens=48)
    config = EvalConfig(env="datadesk", limit=2, harness=HarnessConfig(max_steps=2))
    result = run_eval(policy, config)
    assert len(result.episodes) == 4
    assert all(e.success is not None and e.check for e in result.episodes)
    assert all(0 < s.completion_tokens <= 48 for e in result.episodes for s in e.steps)
    assert set(result.metrics.by_split) == {"test", "test_unseen_tools"}
