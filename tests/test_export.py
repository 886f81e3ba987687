"""Adapters out: vLLM's load rules, and a merged export that gives the same logits as base + adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train import synthetic_samples, tiny_config, tiny_model_dir, write_jsonl  # noqa: F401 (fixture)

from agentrig.train.export import check_vllm_adapter


def _adapter_config(folder: Path, **fields) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"peft_type": "LORA", "r": 24, "base_model_name_or_path": "base", "modules_to_save": None,
           "use_dora": False}
    cfg.update(fields)
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    return folder


def test_vllm_check_rejects_modules_to_save_and_dora(tmp_path):
    check = check_vllm_adapter(_adapter_config(tmp_path / "a", modules_to_save=["lm_head"]))
    assert not check.ok and "modules_to_save" in check.report()
    check = check_vllm_adapter(_adapter_config(tmp_path / "b", use_dora=True))
    assert not check.ok and "DoRA" in check.report()


def test_vllm_check_rounds_rank_up_and_prints_the_command(tmp_path):
    check = check_vllm_adapter(_adapter_config(tmp_path / "a"))
    assert check.ok and check.rank == 24 and check.max_lora_rank == 32
    assert check.serve_command("agent") == (
        f"vllm serve base --enable-lora --lora-modules agent={tmp_path / 'a'} --max-lora-rank 32")


def test_vllm_check_refuses_an_adapter_that_states_no_rank(tmp_path):
    folder = _adapter_config(tmp_path / "a")
    cfg = json.loads((folder / "adapter_config.json").read_text())
    del cfg["r"]
    (folder / "adapter_config.json").write_text(json.dumps(cfg))
    check = check_vllm_adapter(folder)
    assert not check.ok and check.problems == ["adapter_config.json states no rank `r`"]
    assert not check_vllm_adapter(_adapter_config(tmp_path / "b", r=0)).ok


def test_vllm_check_sizes_max_lora_rank_for_the_largest_rank_pattern_entry(tmp_path):
    """A `rank_pattern` rank above `r` is the one vLLM must hold: 48 needs --max-lora-rank 64, not r's 8."""
    check = check_vllm_adapter(_adapter_config(tmp_path / "a", r=8, rank_pattern={"q_proj": 48, "v_proj": 16}))
    assert check.ok and (check.rank, check.max_lora_rank) == (48, 64)
    assert check.serve_command().endswith("--max-lora-rank 64")
    below = check_vllm_adapter(_adapter_config(tmp_path / "b", r=32, rank_pattern={"q_proj": 4}))
    assert (below.rank, below.max_lora_rank) == (32, 32)


@pytest.mark.parametrize("r, ok, max_lora_rank", [(512, True, 512), (513, False, 513), (1024, False, 1024)])
def test_vllm_check_refuses_a_rank_above_the_largest_max_lora_rank(tmp_path, r, ok, max_lora_rank):
    check = check_vllm_adapter(_adapter_config(tmp_path / "a", r=r))
    assert (check.ok, check.max_lora_rank) == (ok, max_lora_rank)
    if not ok:
        assert check.problems == [f"rank {r} exceeds vLLM's largest --max-lora-rank 512"]
        assert "vLLM cannot load this adapter" in check.report()
    pattern = check_vllm_adapter(_adapter_config(tmp_path / "b", r=16, rank_pattern={"o_proj": r}))
    assert pattern.ok == ok  # the same limit, reached through rank_pattern


def test_merged_export_loads_and_matches_base_plus_adapter(tmp_path, tiny_model_dir):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrig.cli import main as cli_main
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(4, seed=9))
    result = run_train(tiny_config(tiny_model_dir, data, tmp_path / "run", max_steps=3, save_steps=3,
                                   learning_rate=2e-2))
    out = tmp_path / "merged"
    assert cli_main(["export", "--adapter", result.adapter_dir, "--merge", "--out", str(out)]) == 0

    merged = AutoModelForCausalLM.from_pretrained(out).eval()
    assert any(p.name.endswith(".safetensors") for p in out.iterdir())
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                          result.adapter_dir).eval()
    ids = torch.tensor([synthetic_samples(1, seed=10)[0]["input_ids"]])
    with torch.no_grad():
        assert torch.allclose(merged(ids).logits, reference(ids).logits, atol=1e-4)
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
        assert not torch.allclose(base(ids).logits, reference(ids).logits, atol=1e-4)  # the adapter did something
    # The exported tokenizer carries the tool-calling template the training data was rendered with.
    from agentrig.data.render import Renderer

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == Renderer(AutoTokenizer.from_pretrained(tiny_model_dir)).chat_template
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]}],
        tokenize=False)
    assert '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>' in text

def test_export_without_out_is_an_error(tmp_path):
    from agentrig.errors import ConfigError
    from agentrig.train.export import main

    class Args:
        adapter, merge, out, base_model, name = str(_adapter_config(tmp_path / "a")), True, None, None, "agent"

    with pytest.raises(ConfigError, match="--out"):
        main(Args())
