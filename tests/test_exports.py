"""Each export checked with its consumer's own code: TRL's SFTTrainer (ours, and LLaMA-Factory's pinned 0.24),
LLaMA-Factory's loader and template, LLaMA-Factory's alternation rule, and OpenAIPolicy's requests.

LLaMA-Factory runs in its own environment (`make llamafactory-env`, part of `make setup`: `.venv-lf`, its own
pins, the same CPU torch), through `tests/llamafactory_check.py` in a subprocess; those tests skip, saying how
to build it, where it is absent. `AGENTRIG_LF_PYTHON` names another interpreter that has llamafactory installed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_databuild_episodes import detour_episode, note_episode, parallel_episode, recovered_episode, success_episode
from test_openai_policy import FakeServer, _completion

from agentrig.data.databuild import build_dataset
from agentrig.data.exports import config_model, export_samples
from agentrig.data.render import IGNORE_INDEX, Renderer
from agentrig.data.samples import Sample
from agentrig.errors import ConfigError
from agentrig.harness import PolicyRequest
from agentrig.harness.trajectory import TaskSpec, write_episodes
from agentrig.models import resolve_model
from agentrig.policies.openai_policy import OpenAIPolicy

ROOT = Path(__file__).resolve().parents[1]
LF_PYTHON = Path(os.environ.get("AGENTRIG_LF_PYTHON", ROOT / ".venv-lf" / "bin" / "python"))
LF_READY = LF_PYTHON.exists() if "AGENTRIG_LF_PYTHON" in os.environ else (ROOT / ".venv-lf" / ".llamafactory-installed").exists()
CHECK = Path(__file__).with_name("llamafactory_check.py")
needs_lf = pytest.mark.skipif(not LF_READY, reason=f"no LLaMA-Factory environment at {LF_PYTHON.parent.parent}: "
                              "build it with `make llamafactory-env` (or set AGENTRIG_LF_PYTHON)")


def _detours(sample):
    return sum(1 for m, w in zip(sample.messages, sample.weights) if m["role"] == "assistant" and w == 0)


def _build(tmp, renderer, episodes, **kw):
    write_episodes(tmp / "e.jsonl", episodes)
    build_dataset(tmp / "e.jsonl", tmp / "out", renderer=renderer, bfcl_check=False, **kw)
    samples = [Sample.from_dict(json.loads(line)) for line in open(tmp / "out" / "samples.jsonl")]
    tokenized = [json.loads(line) for line in open(tmp / "out" / "tokenized.jsonl")]
    return samples, tokenized


@pytest.fixture(scope="module")
def built(tmp_path_factory, smol_tokenizer):
    """Six samples: text + calls, a fault and its retry, parallel calls, a note (two windows), a detour."""
    tmp = tmp_path_factory.mktemp("exports")
    samples, tokenized = _build(tmp, Renderer(smol_tokenizer), [success_episode(), recovered_episode(),
                                parallel_episode(), note_episode(), detour_episode()])
    return tmp, samples, {r["sample_id"]: r for r in tokenized}


@pytest.fixture(scope="module")
def datadesk(tmp_path_factory, smol_tokenizer):
    """Datadesk expert episodes with faults and detours, built at 2,048 tokens: samples and tokenized rows, in order."""
    from agentrig.data.collect import CollectConfig, run_collect

    tmp = tmp_path_factory.mktemp("datadesk")
    run_collect(CollectConfig(episodes=16, out=str(tmp / "e.jsonl"), faults=0.3, detours=0.5, seed=3), progress=False)
    build_dataset(tmp / "e.jsonl", tmp / "out", renderer=Renderer(smol_tokenizer), bfcl_check=False, max_seq_length=2048)
    samples = [Sample.from_dict(json.loads(line)) for line in open(tmp / "out" / "samples.jsonl")]
    tokenized = [json.loads(line) for line in open(tmp / "out" / "tokenized.jsonl")]
    assert any(_detours(s) for s in samples)  # the detours the formats must mask are there
    return samples, tokenized


def _run_check(*args: str) -> list[dict]:
    out = Path(args[-1])
    proc = subprocess.run([str(LF_PYTHON), str(CHECK), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in out.read_text().splitlines()]


# -- TRL ---------------------------------------------------------------------------------------


def _assert_trl_rows(rows, samples, tokenized, tok):
    """TRL kept every row, in order; each is ours plus the newline after the last turn; detours are extra labels."""
    assert len(rows) == len(samples) == len(tokenized)
    for row, sample, ours in zip(rows, samples, tokenized, strict=True):
        n = len(ours["input_ids"])
        assert row["input_ids"][:n] == ours["input_ids"], sample.sample_id
        assert tok.decode(row["input_ids"][n:]) == "\n" and row["labels"][n:] == [IGNORE_INDEX]
        trl_labels = row["labels"][:n]
        if not _detours(sample):
            assert trl_labels == ours["labels"], sample.sample_id  # the same tokens supervised, end-of-turn included
        else:  # TRL cannot mask a detour turn: it supervises a superset of ours
            assert all(t == o for t, o in zip(trl_labels, ours["labels"]) if o != IGNORE_INDEX)
            assert sum(t != IGNORE_INDEX for t in trl_labels) > sum(o != IGNORE_INDEX for o in ours["labels"])


def test_trl_export_through_trls_own_tokenization_with_its_shipped_config(built, tmp_path, smol_tokenizer,
                                                                          tiny_model, monkeypatch):
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    _, samples, tokenized = built
    report = export_samples(samples, "trl", tmp_path / "trl")
    assert report.weight0_trained == 1  # TRL has no per-message weights: reported
    monkeypatch.chdir(tmp_path / "trl")  # as the config's header says: run inside the export folder
    ds = load_dataset("json", data_files="train.jsonl", split="train")
    assert ds.column_names == ["messages"]  # no `tools` column: TRL 0.24-0.28 refuse its JSON string
    settings = yaml.safe_load(open("sft_config.yaml"))
    longest = max(len(t["input_ids"]) for t in tokenized.values())
    assert settings["max_length"] == longest + 1 and settings["assistant_only_loss"] is True
    assert config_model("smollm2-135m") in open("sft_config.yaml").read()  # the recipe in its header names the folder
    args = SFTConfig(**{**settings, "output_dir": str(tmp_path / "run")}, report_to=[], bf16=False, use_cpu=True)
    tok = type(smol_tokenizer).from_pretrained(smol_tokenizer.name_or_path)  # TRL sets the template on it
    trainer = SFTTrainer(model=tiny_model, args=args, train_dataset=ds, processing_class=tok)
    rows = list(trainer.train_dataset)
    for row, sample in zip(rows, samples):
        assert row["messages"] == sample.messages
    _assert_trl_rows(rows, samples, [tokenized[s.sample_id] for s in samples], smol_tokenizer)


@needs_lf
def test_trl_export_under_llamafactorys_pinned_trl(datadesk, tmp_path, smol_tokenizer):
    samples, tokenized = datadesk
    export_samples(samples, "trl", tmp_path / "trl", max_seq_length=2048)
    rows = _run_check("trl", str(tmp_path / "trl"), resolve_model("smollm2-135m"), str(tmp_path / "rows.jsonl"))
    _assert_trl_rows(rows, samples, tokenized, smol_tokenizer)


# -- LLaMA-Factory ------------------------------------------------------------------------------


@needs_lf
def test_llamafactory_chatml_export_is_our_tokens_under_its_own_loader(datadesk, tmp_path, smol_tokenizer):
    samples, tokenized = datadesk
    report = export_samples(samples, "llamafactory", tmp_path / "lf", max_seq_length=2048,
                            renderer=Renderer(smol_tokenizer))
    assert report.layout == "chatml" and report.weight0_trained == 0
    assert report.changes["detour_masked"] == sum(_detours(s) for s in samples)
    cfg = yaml.safe_load((tmp_path / "lf" / "lora_agent.yaml").read_text())
    assert (cfg["template"], cfg["cutoff_len"], cfg["dataset_dir"]) == ("empty", 2048, ".")
    assert (Path(cfg["model_name_or_path"]) / "config.json").is_file()  # a folder it loads offline, not our alias
    rows = _run_check("lf", str(tmp_path / "lf"), str(tmp_path / "rows.jsonl"))
    assert len(rows) == len(tokenized)  # LLaMA-Factory kept every example, in order
    for row, ours, sample in zip(rows, tokenized, samples, strict=True):
        assert row["input_ids"] == ours["input_ids"], sample.sample_id
        assert row["labels"] == ours["labels"], sample.sample_id  # detours masked, no newline after <|im_end|>


@needs_lf
def test_llamafactory_leaves_out_only_an_untrained_tail(built, tmp_path, smol_tokenizer):
    _, samples, _ = built
    renderer = Renderer(smol_tokenizer)
    sample = next(s for s in samples if s.sample_id.startswith("t1"))
    last = max(k for k, m in enumerate(sample.messages) if m["role"] == "assistant")
    tail = Sample("tail", sample.messages, sample.tools, [0.0 if k == last else w for k, w in enumerate(sample.weights)],
                  {"tokens": sample.metadata["tokens"]})
    report = export_samples([tail], "llamafactory", tmp_path / "lf", renderer=renderer)
    assert report.changes == {"detour_masked": 1, "tail_left_out": 1}
    (row,) = _run_check("lf", str(tmp_path / "lf"), str(tmp_path / "rows.jsonl"))
    ours = renderer.sample_turns(tail.messages, tail.weights)
    n = len(row["input_ids"])
    assert row["input_ids"] == ours.input_ids[:n] and row["labels"] == ours.labels[:n]
    assert n < len(ours.input_ids) and set(ours.labels[n:]) == {IGNORE_INDEX}


def llamafactory_accepts(conversations, ranking=False):
    """LLaMA-Factory's SharegptDatasetConverter check (src/llamafactory/data/converter.py), re-implemented."""
    odd_tags, even_tags = ("human", "observation"), ("gpt", "function_call")
    accept_tags = (odd_tags, even_tags)
    for turn_idx, message in enumerate(conversations):
        if message["from"] not in accept_tags[turn_idx % 2]:
            return False
    if (not ranking and len(conversations) % 2 != 0) or (ranking and len(conversations) % 2 == 0):
        return False
    return True


def test_sharegpt_layout_follows_llamafactory_rules(built, tmp_path):
    _, samples, _ = built
    report = export_samples(samples, "llamafactory", tmp_path / "lf", max_seq_length=2048, llamafactory_layout="sharegpt")
    rows = [json.loads(line) for line in open(tmp_path / "lf" / "agentrig_agent.jsonl")]
    assert len(rows) == len(samples)
    assert all(llamafactory_accepts(r["conversations"]) for r in rows)
    assert all("tools" not in r for r in rows)  # its template would add a second tool list to the system prompt
    assert report.changed == 2 and report.changes == {"text_and_calls": 2, "consecutive_observations": 1}
    assert report.weight0_trained == 1
    parallel = next(r for r, s in zip(rows, samples) if s.sample_id.startswith("t4"))
    assert [t["from"] for t in parallel["conversations"]] == ["human", "gpt", "observation", "gpt"]
    assert "</tool_response>\n<tool_response>" in parallel["conversations"][2]["value"]
    plain = next(r for r, s in zip(rows, samples) if s.sample_id.startswith("t2"))
    assert [t["from"] for t in plain["conversations"]][:2] == ["human", "function_call"]
    assert json.loads(plain["conversations"][1]["value"]) == {"name": "stock_level", "arguments": {"sku": "A-1"}}
    info = json.loads((tmp_path / "lf" / "dataset_info.json").read_text())
    assert info["agentrig_agent"] == {"file_name": "agentrig_agent.jsonl", "formatting": "sharegpt",
                                      "columns": {"messages": "conversations", "system": "system"}}
    cfg = yaml.safe_load((tmp_path / "lf" / "lora_agent.yaml").read_text())
    seed = {"finetuning_type": "lora", "lora_rank": 32, "lora_alpha": 64, "lora_target": "q_proj,k_proj,v_proj,o_proj",
            "learning_rate": 2.0e-4, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 8,
            "num_train_epochs": 3, "lr_scheduler_type": "cosine"}
    assert {k: cfg[k] for k in seed} == seed and cfg["cutoff_len"] == 2048 and cfg["template"] == "qwen"


# -- configs: the model, lengths ----------------------------------------------------------------


def test_configs_name_a_model_their_tools_load_offline(built, tmp_path):
    _, samples, _ = built
    folder = config_model("smollm2-135m")
    assert Path(folder).is_absolute() and (Path(folder) / "config.json").is_file()
    assert config_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"  # a hub id
    export_samples(samples, "axolotl", tmp_path / "ax", max_seq_length=1024)
    text = (tmp_path / "ax" / "axolotl.yaml").read_text()
    assert text.startswith("# ") and "inside this folder" in text  # `path: train.jsonl` is relative to it
    cfg = yaml.safe_load(text)
    assert cfg["base_model"] == folder and cfg["datasets"][0]["path"] == "train.jsonl" and cfg["sequence_len"] == 1024
    export_samples(samples, "llamafactory", tmp_path / "lf", llamafactory_layout="sharegpt")
    cfg = yaml.safe_load((tmp_path / "lf" / "lora_agent.yaml").read_text())
    assert cfg["model_name_or_path"] == folder
    assert cfg["cutoff_len"] == max(s.metadata["tokens"] for s in samples)  # no limit given: the longest sample


def test_a_limit_shorter_than_a_sample_is_refused(built, tmp_path):
    _, samples, _ = built
    with pytest.raises(ConfigError, match=r"tokens, more than max_seq_length 64: .*--max-seq-length"):
        export_samples(samples, "trl", tmp_path / "trl", max_seq_length=64)
    with pytest.raises(ConfigError, match="choose one of: chatml, sharegpt"):
        export_samples(samples, "llamafactory", tmp_path / "lf", llamafactory_layout="alpaca")


# -- OpenAI and Axolotl -------------------------------------------------------------------------


def _requests_agree(sample, row, tool_format, serve_answers):
    """Before every assistant turn of the row, OpenAIPolicy sends exactly the row's messages (and tools) so far."""
    server = FakeServer(serve_answers)
    try:
        policy = OpenAIPolicy(server.url, "tuned", tool_format=tool_format)
        assert len(row["messages"]) == len(sample.messages)  # no detour left out: one row message per message
        for j, m in enumerate(row["messages"]):
            if m["role"] != "assistant":
                continue
            context = sample.messages[:j]  # what the harness hands the policy before this turn
            policy.generate(PolicyRequest(context, json.loads(sample.tools), TaskSpec(id="t", prompt=""), j))
            body = server.requests[-1]
            assert body["messages"] == [{k: v for k, v in x.items() if k != "weight"} for x in row["messages"][:j]]
            assert body.get("tools") == row.get("tools")
    finally:
        server.close()


def test_openai_export_and_policy_agree_native(built, tmp_path):
    _, samples, _ = built
    report = export_samples(samples, "openai", tmp_path / "oa")
    assert report.layout == "native" and report.changes == {}  # the test detour calls a tool it was offered
    rows = [json.loads(line) for line in open(tmp_path / "oa" / "train.jsonl")]
    for s, row in zip(samples, rows):
        assert row["tools"] == json.loads(s.tools)
        system = row["messages"][0]["content"]
        assert "<tools>" not in system and "<tool_call>" not in system and system.endswith(
            s.messages[0]["content"].split("Rules:\n", 1)[1])  # the rules and memory stay
        for m, w, om in zip(s.messages, s.weights, row["messages"]):
            assert om["role"] == m["role"] and ("weight" in om) == (m["role"] == "assistant")
            if m["role"] == "assistant":
                assert om["weight"] == (1 if w > 0 else 0) and om.get("tool_calls") == m.get("tool_calls")
            if m["role"] == "tool":
                assert set(om) == {"role", "tool_call_id", "content"}  # no `name`
        _requests_agree(s, row, "native", lambda body, headers: (200, _completion("ok")))


def test_openai_export_and_policy_agree_hermes(built, tmp_path):
    _, samples, _ = built
    export_samples(samples, "openai", tmp_path / "oa", openai_tools="hermes")
    rows = [json.loads(line) for line in open(tmp_path / "oa" / "train.jsonl")]
    for s, row in zip(samples, rows):
        assert "tools" not in row and row["messages"][0] == s.messages[0]  # the system prompt lists the tools
        for m, om in zip(s.messages, row["messages"]):
            assert "tool_calls" not in om and "tool_call_id" not in om
            if m["role"] == "tool":
                assert om == {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"}
        _requests_agree(s, row, "hermes", lambda body, headers: (200, _completion("ok")))
    parallel = next(r for r, s in zip(rows, samples) if s.sample_id.startswith("t4"))
    assert parallel["messages"][2]["content"] == (
        'Checking both.\n<tool_call>\n{"name": "stock_level", "arguments": {"sku": "A-1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "stock_level", "arguments": {"sku": "B-2"}}\n</tool_call>')


def test_native_openai_export_leaves_out_detours_it_cannot_express(datadesk, tmp_path):
    samples, _ = datadesk
    report = export_samples(samples, "openai", tmp_path / "oa")
    rows = [json.loads(line) for line in open(tmp_path / "oa" / "train.jsonl")]
    left_out = 0
    for s, row in zip(samples, rows):
        offered = {t["function"]["name"] for t in row["tools"]}
        calls = [c["function"]["name"] for m in row["messages"] for c in m.get("tool_calls") or []]
        assert set(calls) <= offered  # every call names a tool in `tools`
        supervised = [m for m, w in zip(s.messages, s.weights) if m["role"] == "assistant" and w > 0]
        assert [m.get("tool_calls") for m in row["messages"] if m.get("weight") == 1] == [
            m.get("tool_calls") for m in supervised]  # every trained turn is there, in order
        left_out += sum(1 for m, w in zip(s.messages, s.weights) if m["role"] == "assistant" and w == 0
                        and any(c["function"]["name"] not in offered for c in m.get("tool_calls") or []))
    assert left_out > 0 and report.changes["detour_left_out"] >= left_out


def test_axolotl_carries_weights(built, tmp_path):
    _, samples, _ = built
    export_samples(samples, "axolotl", tmp_path / "ax")
    ax = [json.loads(line) for line in open(tmp_path / "ax" / "train.jsonl")]
    for s, a in zip(samples, ax):
        for m, w, am in zip(s.messages, s.weights, a["messages"]):
            assert am["training"] == (m["role"] == "assistant" and w > 0)


def test_the_check_script_says_how_to_use_it():
    proc = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True)
    assert proc.returncode == 2 and "EXPORT_DIR" in proc.stderr
