"""Each export checked against its consumer's own rules: TRL's code path, LLaMA-Factory's alternation rule."""

from __future__ import annotations

import json

import pytest
from test_databuild_episodes import detour_episode, note_episode, parallel_episode, recovered_episode, success_episode

from agentrig.data.databuild import build_dataset
from agentrig.data.exports import export_samples
from agentrig.data.render import IGNORE_INDEX, Renderer
from agentrig.data.samples import Sample
from agentrig.harness.trajectory import write_episodes


@pytest.fixture(scope="module")
def built(tmp_path_factory, smol_tokenizer):
    tmp = tmp_path_factory.mktemp("exports")
    write_episodes(tmp / "e.jsonl", [success_episode(), recovered_episode(), parallel_episode(), note_episode(),
                                     detour_episode()])
    build_dataset(tmp / "e.jsonl", tmp / "out", renderer=Renderer(smol_tokenizer))
    samples = [Sample.from_dict(json.loads(line)) for line in open(tmp / "out" / "samples.jsonl")]
    tokenized = {r["sample_id"]: r for r in map(json.loads, open(tmp / "out" / "tokenized.jsonl"))}
    return tmp, samples, tokenized


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


def test_trl_export_through_trls_own_tokenization(built, tmp_path, smol_tokenizer, tiny_model):
    from datasets import load_dataset
    from trl import SFTConfig, SFTTrainer

    _, samples, tokenized = built
    report = export_samples(samples, "trl", tmp_path / "trl")
    assert report.weight0_trained == 1  # TRL has no per-message weights: reported
    ds = load_dataset("json", data_files=str(tmp_path / "trl" / "train.jsonl"), split="train")
    assert isinstance(ds[0]["tools"], str)
    template = (tmp_path / "trl" / "chat_template.jinja").read_text()
    args = SFTConfig(output_dir=str(tmp_path / "run"), assistant_only_loss=True, max_length=None, report_to=[], bf16=False,
                     use_cpu=True,
                     chat_template_path=None, dataset_num_proc=None)
    tok = smol_tokenizer
    tok_copy = type(tok).from_pretrained(tok.name_or_path)
    tok_copy.chat_template = template
    trainer = SFTTrainer(model=tiny_model, args=args, train_dataset=ds, processing_class=tok_copy)
    # TRL kept every row, in order: each tokenized row is the sample it is compared with below.
    assert len(trainer.train_dataset) == len(ds) == len(samples) == len(tokenized)
    for row, sample in zip(trainer.train_dataset, samples, strict=True):
        assert (row["messages"], row["tools"]) == (sample.messages, sample.tools), sample.sample_id
        ours = tokenized[sample.sample_id]
        n = len(ours["input_ids"])
        assert row["input_ids"][:n] == ours["input_ids"]  # TRL only adds the trailing newline of the last turn
        assert smol_tokenizer.decode(row["input_ids"][n:]) in ("\n", "")
        trl_labels = row["labels"][:n]
        if all(w > 0 for m, w in zip(sample.messages, sample.weights) if m["role"] == "assistant"):
            assert trl_labels == ours["labels"], sample.sample_id  # the same tokens supervised, end-of-turn included
        else:  # TRL cannot mask a detour turn: it supervises a superset of ours
            assert all(t == o for t, o in zip(trl_labels, ours["labels"]) if o != IGNORE_INDEX)
            assert sum(t != IGNORE_INDEX for t in trl_labels) > sum(o != IGNORE_INDEX for o in ours["labels"])


def test_sharegpt_export_follows_llamafactory_rules(built, tmp_path):
    _, samples, _ = built
    report = export_samples(samples, "llamafactory", tmp_path / "lf", max_seq_length=2048)
    rows = [json.loads(line) for line in open(tmp_path / "lf" / "agentrig_agent.jsonl")]
    assert len(rows) == len(samples)
    assert all(llamafactory_accepts(r["conversations"]) for r in rows)
    assert report.changed == 2 and report.changes == {"text_and_calls": 2, "consecutive_observations": 1}
    parallel = next(r for r, s in zip(rows, samples) if s.sample_id.startswith("t4"))
    assert [t["from"] for t in parallel["conversations"]] == ["human", "gpt", "observation", "gpt"]
    assert "</tool_response>\n<tool_response>" in parallel["conversations"][2]["value"]
    plain = next(r for r, s in zip(rows, samples) if s.sample_id.startswith("t2"))
    assert [t["from"] for t in plain["conversations"]][:2] == ["human", "function_call"]
    assert json.loads(plain["conversations"][1]["value"]) == {"name": "stock_level", "arguments": {"sku": "A-1"}}
    info = json.loads((tmp_path / "lf" / "dataset_info.json").read_text())
    assert info["agentrig_agent"]["formatting"] == "sharegpt" and info["agentrig_agent"]["columns"]["tools"] == "tools"
    import yaml

    cfg = yaml.safe_load((tmp_path / "lf" / "lora_agent.yaml").read_text())
    seed = {"finetuning_type": "lora", "lora_rank": 32, "lora_alpha": 64, "lora_target": "q_proj,k_proj,v_proj,o_proj",
            "learning_rate": 2.0e-4, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 8,
            "num_train_epochs": 3, "lr_scheduler_type": "cosine"}
    assert {k: cfg[k] for k in seed} == seed and cfg["cutoff_len"] == 2048


def test_openai_and_axolotl_carry_weights(built, tmp_path):
    _, samples, _ = built
    export_samples(samples, "openai", tmp_path / "oa")
    export_samples(samples, "axolotl", tmp_path / "ax")
    oa = [json.loads(line) for line in open(tmp_path / "oa" / "train.jsonl")]
    ax = [json.loads(line) for line in open(tmp_path / "ax" / "train.jsonl")]
    for s, o, a in zip(samples, oa, ax):
        assert isinstance(o["tools"], list)
        for m, w, om, am in zip(s.messages, s.weights, o["messages"], a["messages"]):
            if m["role"] == "assistant":
                assert om["weight"] == (1 if w > 0 else 0) and am["training"] == (w > 0)
            else:
                assert "weight" not in om and am["training"] is False
    assert any(m.get("weight") == 0 for o in oa for m in o["messages"])
