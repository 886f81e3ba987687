"""Stacking a new LoRA on an existing one (`create_new_adapter`): the saved adapter is both, concatenated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train import synthetic_samples, tiny_config, tiny_model_dir, write_jsonl  # noqa: F401 (fixture)

from agentrig.errors import ConfigError


def _random_adapter(model_dir: Path, out: Path, *, base: Path | None = None, seed: int, **lora) -> Path:
    """A LoRA adapter with random A and B (so its update is not zero), saved to `out`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base or model_dir),
                           LoraConfig(init_lora_weights=False, task_type="CAUSAL_LM", **lora))
    model.save_pretrained(out)
    return out


def _logits(model_dir: Path, *adapters: Path) -> "torch.Tensor":  # noqa: F821
    """Logits of the base with each adapter in turn merged into it."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    for adapter in adapters:
        model = PeftModel.from_pretrained(model, str(adapter)).merge_and_unload()
    with torch.no_grad():
        return model(torch.arange(200, 232).unsqueeze(0)).logits


def test_stacked_adapter_equals_the_base_with_both_merged(tmp_path, tiny_model_dir):
    from agentrig.train.export import check_vllm_adapter
    from agentrig.train.stack import stack_adapters

    first = _random_adapter(tiny_model_dir, tmp_path / "first", seed=1, r=8, lora_alpha=16,
                            target_modules=["q_proj", "v_proj"])
    # The second adapts other modules too, at another rank and scale, trained on the first's merged weights.
    merged = tmp_path / "merged"
    _merge_to(tiny_model_dir, first, merged)
    second = _random_adapter(tiny_model_dir, tmp_path / "second", base=merged, seed=2, r=4, lora_alpha=32,
                             target_modules=["q_proj", "k_proj", "gate_proj"])
    expected = _logits(tiny_model_dir, first, second)
    assert not _logits(tiny_model_dir, first).allclose(expected, atol=1e-3)  # the second one matters

    cfg = stack_adapters(first, second, tmp_path / "stacked")
    assert (cfg["r"], cfg["lora_alpha"]) == (12, 12)
    assert cfg["target_modules"] == ["gate_proj", "k_proj", "q_proj", "v_proj"]
    assert _logits(tiny_model_dir, tmp_path / "stacked").allclose(expected, atol=1e-4)
    assert check_vllm_adapter(tmp_path / "stacked").ok


def _merge_to(model_dir: Path, adapter: Path, out: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(adapter)).merge_and_unload() \
        .save_pretrained(out)


def test_create_new_adapter_trains_only_the_new_one_and_saves_both(tmp_path, tiny_model_dir):
    from safetensors.torch import load_file

    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(6, seed=3))
    first = Path(run_train(tiny_config(tiny_model_dir, data, tmp_path / "first", max_steps=3, save_steps=3)).adapter_dir)
    old = load_file(str(first / "adapter_model.safetensors"))
    result = run_train(tiny_config(tiny_model_dir, data, tmp_path / "stacked", max_steps=3, save_steps=3,
                                   adapter_name_or_path=str(first), create_new_adapter=True, lora_rank=4,
                                   lora_alpha=8, lora_target="q_proj,k_proj,v_proj,o_proj,gate_proj"))
    cfg = json.loads((Path(result.adapter_dir) / "adapter_config.json").read_text())
    assert (cfg["r"], cfg["lora_alpha"]) == (12, 12)
    new = load_file(str(Path(result.adapter_dir) / "adapter_model.safetensors"))
    scale = 16 / 8  # the first adapter's alpha / rank, folded into B
    for key, a in old.items():
        if key.endswith("lora_A.weight"):
            assert new[key][:8].equal(a), key  # the first adapter is frozen: its rows are unchanged
        else:
            assert new[key][:, :8].allclose(a * scale), key
    b_keys = [k for k in new if k.endswith("lora_B.weight")]
    assert any("gate_proj" in k for k in b_keys)
    # the new LoRA (B starts at zero) was trained on every module it targets
    assert all(new[k][:, 8:].abs().max() > 0 for k in b_keys)


def test_create_new_adapter_needs_an_adapter_and_a_plain_lora(tmp_path, tiny_model_dir):
    from agentrig.train.stack import stack_adapters

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(2))
    with pytest.raises(ConfigError, match="adapter_name_or_path"):
        tiny_config(tiny_model_dir, data, tmp_path / "run", create_new_adapter=True)
    dora = _random_adapter(tiny_model_dir, tmp_path / "dora", seed=0, r=4, target_modules=["q_proj"], use_dora=True)
    with pytest.raises(ConfigError, match="use_dora"):
        stack_adapters(dora, dora, tmp_path / "out")
