"""The real default model (SmolLM2-135M) trains: 30 LoRA steps on rendered tool-use samples.

Samples come from the data pipeline's renderer (`agentrig.data.render.Renderer.sample_ids`) on synthetic
tool-use episodes; switch the source to `agentrig data build` output once an environment's build is
importable here.
"""

from __future__ import annotations

import json
import random

import pytest


def _episodes(n: int, seed: int = 0) -> list[list[dict]]:
    rng = random.Random(seed)
    tools = ["stock_level", "reorder", "search_orders"]
    system = ("You are a function-calling agent. Tools:\n<tools>\n"
              + "\n".join(json.dumps({"name": t, "parameters": {"type": "object", "properties": {"sku": {"type": "string"}}}})
                          for t in tools) + "\n</tools>")
    out = []
    for i in range(n):
        sku = f"SKU-{rng.randint(100, 999)}"
        tool = rng.choice(tools)
        call = {"id": f"c{i}", "type": "function", "function": {"name": tool, "arguments": json.dumps({"sku": sku})}}
        out.append([
            {"role": "system", "content": system},
            {"role": "user", "content": f"Please run {tool} for {sku}."},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{i}", "name": tool, "content": json.dumps({"sku": sku, "ok": True})},
            {"role": "assistant", "content": f"Done: {tool} for {sku} succeeded."},
        ])
    return out


@pytest.mark.slow
def test_default_model_trains_30_steps(tmp_path):
    from agentrig.data.render import Renderer
    from agentrig.train.trainconfig import config_from_dict
    from agentrig.train.train import run_train

    renderer = Renderer.for_model("smollm2-135m")
    rows = []
    for i, messages in enumerate(_episodes(32)):
        ids, labels = renderer.sample_ids(messages)
        rows.append({"sample_id": str(i), "input_ids": ids, "labels": labels})
    data = tmp_path / "tokenized.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = config_from_dict(dict(dataset=str(data), output_dir=str(tmp_path / "run"), max_steps=30, save_steps=15,
                                   lora_rank=16, lora_alpha=32, lora_target="all", learning_rate=5e-4, max_seq_length=1024,
                                   per_device_train_batch_size=1, lr_scheduler_type="cosine"))
    result = run_train(config)
    losses = [h["loss"] for h in result.loss_history]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
    assert "--max-lora-rank 16" in result.vllm_command
