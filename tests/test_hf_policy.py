"""HFPolicy: batched greedy equals one-at-a-time, stop at `</tool_call>`, adapter routing, base weights untouched."""

from __future__ import annotations

import pytest

from agentrig.errors import ConfigError
from agentrig.harness import PolicyRequest
from agentrig.trajectory import TaskSpec


def _request(prompt: str, family: str = "lookup") -> PolicyRequest:
    messages = [
        {"role": "system", "content": "You are a function-calling agent."},
        {"role": "user", "content": prompt},
    ]
    return PolicyRequest(messages=messages, tools=[], task=TaskSpec(id=prompt, prompt=prompt, family=family), step=0)


PROMPTS = ["hi", "what is the stock level of SKU A-17 in the north warehouse?", "list orders", "x y z " * 12]


def test_batched_greedy_equals_one_at_a_time(tiny_model, smol_tokenizer) -> None:
    from agentrig.hf_policy import HFPolicy

    policy = HFPolicy(tiny_model, smol_tokenizer, max_new_tokens=12)
    requests = [_request(p) for p in PROMPTS]
    batched = policy.generate_batch(requests)
    single = [policy.generate(r) for r in requests]
    assert [r.text for r in batched] == [r.text for r in single]
    assert [r.completion_tokens for r in batched] == [r.completion_tokens for r in single]
    lengths = [len(policy.renderer.prompt_ids(r.messages)) for r in requests]
    assert [r.prompt_tokens for r in batched] == lengths
    assert all(0 < r.completion_tokens <= 12 for r in batched)


def _bigram_model(tokenizer, chain: list[int]):
    """A tiny Llama whose next token depends only on the current one: follows `chain` exactly."""
    import torch

    from agentrig.models import tiny_random_model

    model = tiny_random_model(len(tokenizer), tie_word_embeddings=False)
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream stays the current token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        emb = model.model.embed_tokens.weight
        for a, b in zip(chain, chain[1:]):
            direction = emb[a] / emb[a].norm()
            model.lm_head.weight[b] += 50.0 * direction
    return model


def test_generation_stops_after_the_tool_call_block(smol_tokenizer) -> None:
    from agentrig.hf_policy import HFPolicy
    from agentrig.render import Renderer

    renderer = Renderer(smol_tokenizer)
    last = renderer.prompt_ids(_request("hi").messages)[-1]
    target = smol_tokenizer.encode("ok</tool_call> then more words", add_special_tokens=False)
    policy = HFPolicy(_bigram_model(smol_tokenizer, [last, *target]), smol_tokenizer, max_new_tokens=20)
    replies = policy.generate_batch([_request("hi"), _request("a longer prompt to force left padding")])
    for reply in replies:
        assert reply.text == "ok</tool_call>"
        assert reply.completion_tokens == 6  # ok, </, tool, _, call, >


def test_end_of_turn_token_ends_the_reply(smol_tokenizer) -> None:
    from agentrig.hf_policy import HFPolicy
    from agentrig.render import Renderer

    renderer = Renderer(smol_tokenizer)
    last = renderer.prompt_ids(_request("hi").messages)[-1]
    target = smol_tokenizer.encode("all done", add_special_tokens=False) + [renderer.eot_id]
    policy = HFPolicy(_bigram_model(smol_tokenizer, [last, *target]), smol_tokenizer, max_new_tokens=20)
    reply = policy.generate(_request("hi"))
    assert reply.text == "all done"
    assert reply.completion_tokens == len(target)  # the end-of-turn token counts as generated


def _save_adapter(model_factory, folder, seed: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    model = model_factory()  # seeds torch itself, so seed the LoRA init after it
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(folder)


def test_adapters_route_per_task_and_leave_base_weights_untouched(smol_tokenizer, tmp_path) -> None:
    import torch

    from agentrig.hf_policy import HFPolicy
    from agentrig.models import tiny_random_model

    def fresh():
        return tiny_random_model(len(smol_tokenizer))

    _save_adapter(fresh, tmp_path / "a", seed=1)
    _save_adapter(fresh, tmp_path / "b", seed=2)
    base = fresh()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    base_only = HFPolicy(fresh(), smol_tokenizer, max_new_tokens=8)

    policy = HFPolicy(
        base,
        smol_tokenizer,
        adapters={"a": str(tmp_path / "a"), "b": str(tmp_path / "b")},
        route={"fa": "a", "fb": "b", "*": "base"},
        max_new_tokens=8,
    )
    requests = [_request("route me", family=f) for f in ("fa", "fb", "other")]
    routed = [r.text for r in policy.generate_batch(requests)]
    assert [policy.adapter_for(r.task) for r in requests] == ["a", "b", "base"]

    alone = {}
    for name in ("a", "b", "base"):
        policy.use(name)
        alone[name] = policy.generate(requests[0]).text
    assert routed == [alone["a"], alone["b"], alone["base"]]
    assert len(set(routed)) == 3, "each adapter (and the base) should answer differently"
    assert alone["base"] == base_only.generate(requests[0]).text

    after = {k.replace(".base_layer", ""): v for k, v in policy.model.get_base_model().state_dict().items() if "lora_" not in k}
    assert set(after) == set(before)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_unknown_adapter_names_are_config_errors(tiny_model, smol_tokenizer) -> None:
    from agentrig.hf_policy import HFPolicy

    policy = HFPolicy(tiny_model, smol_tokenizer)
    with pytest.raises(ConfigError, match="unknown adapter 'sft'"):
        policy.use("sft")
    with pytest.raises(ConfigError, match="unknown adapter"):
        policy.use({"lookup": "sft"})


def test_sampling_with_a_seed_is_reproducible(tiny_model, smol_tokenizer) -> None:
    from agentrig.hf_policy import HFPolicy

    requests = [_request(p) for p in PROMPTS[:2]]
    first = HFPolicy(tiny_model, smol_tokenizer, max_new_tokens=8, temperature=1.0, seed=7).generate_batch(requests)
    again = HFPolicy(tiny_model, smol_tokenizer, max_new_tokens=8, temperature=1.0, seed=7).generate_batch(requests)
    other = HFPolicy(tiny_model, smol_tokenizer, max_new_tokens=8, temperature=1.0, seed=8).generate_batch(requests)
    assert [r.text for r in first] == [r.text for r in again]
    assert [r.text for r in first] != [r.text for r in other]
