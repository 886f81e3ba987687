"""Merged adapter weights at inference (`agentrig.policies.merged`): the same replies and logits as PEFT's
unmerged forward, the original weight tensors back after every batch (so nothing outside sees a merged
model), and adapters that cannot merge exactly (DoRA, `modules_to_save`) left to PEFT's forward. In fp32
(`bf16=False`): under bf16 autocast the merged sum is rounded once and PEFT's three products each."""

from __future__ import annotations

import pytest

from agentrig.harness import PolicyRequest
from agentrig.harness.trajectory import TaskSpec

PROMPTS = ["hi", "what is the stock level of SKU A-17 in the north warehouse?", "list orders", "x y z " * 12]


def _request(prompt: str) -> PolicyRequest:
    messages = [{"role": "system", "content": "You are a function-calling agent."}, {"role": "user", "content": prompt}]
    return PolicyRequest(messages=messages, tools=[], task=TaskSpec(id=prompt, prompt=prompt), step=0, episode_id=prompt)


def _model(tokenizer):
    from agentrig.models import tiny_random_model

    return tiny_random_model(len(tokenizer), initializer_range=0.2)  # clear logit margins: no greedy ties


def _adapter(tokenizer, folder, seed: int, **lora) -> str:
    import torch
    from peft import LoraConfig, get_peft_model

    model = _model(tokenizer)
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
                        init_lora_weights=False, **lora)
    get_peft_model(model, config).save_pretrained(folder)
    return str(folder)


def _logits(policy, ids):
    import torch

    with torch.inference_mode():
        return policy.model(input_ids=torch.tensor([ids])).logits[0]


def test_merged_weights_give_peft_replies_and_are_swapped_back(smol_tokenizer, tmp_path) -> None:
    import torch

    from agentrig.policies.hf_policy import HFPolicy

    adapters = {"a": _adapter(smol_tokenizer, tmp_path / "a", 1), "b": _adapter(smol_tokenizer, tmp_path / "b", 2)}
    merged = HFPolicy(_model(smol_tokenizer), smol_tokenizer, adapters=adapters, route="a", max_new_tokens=10,
                      merge_adapters=True, bf16=False)
    peft = HFPolicy(_model(smol_tokenizer), smol_tokenizer, adapters=adapters, route="a", max_new_tokens=10,
                    merge_adapters=False, bf16=False)
    assert HFPolicy(_model(smol_tokenizer), smol_tokenizer, adapters=adapters)._merged is not None  # CPU: on
    requests = [_request(p) for p in PROMPTS]
    q = merged.model.get_base_model().model.layers[0].self_attn.q_proj
    original = q.base_layer.weight
    before = original.detach().clone()
    for name in ("a", "b", "base", "a"):
        merged.use(name)
        peft.use(name)
        assert [r.text for r in merged.generate_batch(requests)] == [r.text for r in peft.generate_batch(requests)]
        assert q.base_layer.weight is original and torch.equal(original, before)  # exactly the same tensor again
    texts = {r.text for r in peft.generate_batch(requests)}
    assert len(texts) > 1

    ids = list(merged.renderer.prompt_ids(requests[1].messages))
    with merged._adapter("a"):
        assert not torch.equal(q.base_layer.weight, before)  # merged while the batch runs
        inside = _logits(merged, ids)
    with peft._adapter("a"):
        unmerged = _logits(peft, ids)
    torch.testing.assert_close(inside, unmerged, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(inside, _logits(HFPolicy(_model(smol_tokenizer), smol_tokenizer), ids), atol=1e-3)
    # outside a batch the model is PEFT's own: the adapter applied once, not on top of merged weights
    merged.model.set_adapter("a")
    torch.testing.assert_close(_logits(merged, ids), unmerged, rtol=1e-4, atol=1e-4)


def test_loading_and_unloading_adapters_drops_the_kept_merge(smol_tokenizer, tmp_path) -> None:
    from agentrig.policies.hf_policy import HFPolicy

    a, b = _adapter(smol_tokenizer, tmp_path / "a", 1), _adapter(smol_tokenizer, tmp_path / "b", 2)
    policy = HFPolicy(_model(smol_tokenizer), smol_tokenizer, max_new_tokens=8, merge_adapters=True, bf16=False)
    reference = HFPolicy(_model(smol_tokenizer), smol_tokenizer, adapters={"x": b}, route="x", max_new_tokens=8,
                         merge_adapters=False, bf16=False)
    request = _request("list orders")
    policy.load_adapter("x", a)
    policy.use("x")
    first = policy.generate(request).text
    policy.unload_adapter("x")
    policy.load_adapter("x", b)  # the same name, other weights: the kept merge of `a` must not be reused
    policy.use("x")
    assert policy.generate(request).text == reference.generate(request).text != first


@pytest.mark.parametrize("lora", [{"use_dora": True}, {"modules_to_save": ["lm_head"]}])
def test_adapters_that_cannot_merge_exactly_keep_pefts_forward(smol_tokenizer, tmp_path, lora) -> None:
    from agentrig.policies.hf_policy import HFPolicy
    from agentrig.policies.merged import plain_lora_layers

    folder = _adapter(smol_tokenizer, tmp_path / "odd", 3, **lora)
    merged = HFPolicy(_model(smol_tokenizer), smol_tokenizer, adapters={"odd": folder}, max_new_tokens=8,
                      merge_adapters=True, bf16=False)
    peft = HFPolicy(_model(smol_tokenizer), smol_tokenizer, adapters={"odd": folder}, max_new_tokens=8,
                    merge_adapters=False, bf16=False)
    assert plain_lora_layers(merged.model, "odd") is None
    requests = [_request(p) for p in PROMPTS]
    assert [r.text for r in merged.generate_batch(requests)] == [r.text for r in peft.generate_batch(requests)]
    assert merged._merged.use(merged.model, "odd") is False and merged._merged.active is False
