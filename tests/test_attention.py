"""Per-sample causal attention over packed rows equals transformers' masked SDPA, values and gradients."""

from __future__ import annotations

import random

import pytest


def packed_batch(seed: int = 0):
    from agentrig.train.packing import TokenizedSample, collate_rows, pack_rows

    rng = random.Random(seed)
    samples = []
    for i in range(9):
        ids = [rng.randrange(200, 3000) for _ in range(rng.randint(10, 90))]
        samples.append(TokenizedSample(f"s{i}", ids, [-100] * 5 + ids[5:]))
    rows = pack_rows(samples, 160)
    assert len(rows) < len(samples) and len(rows) >= 2  # several samples per row, several rows (padded tail)
    return collate_rows(rows, pad_id=0)


def loss_and_grads(model, batch):
    from agentrig.train.lmloss import add_supervised_head

    add_supervised_head(model)
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], supervised_labels=batch["labels"])
    loss = -out["token_logps"].mean()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if "layers.0.self_attn" in name}
    return out["token_logps"].detach(), grads


def test_packed_attention_equals_masked_sdpa_forward_and_backward(smol_tokenizer):
    import torch

    from agentrig.train.attention import NAME, use_packed_attention
    from agentrig.models import tiny_random_model

    batch = packed_batch()
    masked = tiny_random_model(len(smol_tokenizer))  # grouped-query attention: 4 heads, 2 KV heads
    assert masked.config._attn_implementation == "sdpa"
    packed = tiny_random_model(len(smol_tokenizer))
    assert use_packed_attention(packed, 160) and packed.config._attn_implementation == NAME

    logps_masked, grads_masked = loss_and_grads(masked, batch)
    logps_packed, grads_packed = loss_and_grads(packed, batch)
    assert torch.allclose(logps_masked, logps_packed, atol=1e-5)
    assert set(grads_masked) == set(grads_packed) and len(grads_masked) == 4
    for name, grad in grads_masked.items():
        assert torch.allclose(grad, grads_packed[name], atol=1e-6), name


def test_segments_follow_position_restarts():
    import torch

    from agentrig.train.attention import _segments

    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5, 6, 0, 1]])
    assert _segments(pos) == [[(0, 3), (3, 5), (5, 9)], [(0, 7), (7, 9)]]
    # A row that does not start at 0 (a window of a longer sample) is still one span.
    assert _segments(torch.tensor([[5, 6, 7]])) == [[(0, 3)]]


def test_generation_with_padding_and_cache_falls_back_to_sdpa(smol_tokenizer):
    """A model switched to packed attention still generates exactly as with SDPA (padding mask, KV cache)."""
    import torch

    from agentrig.train.attention import use_packed_attention
    from agentrig.models import tiny_random_model

    # initializer_range 0.2: at the default 0.02 the tiny model repeats one token whatever it is given, and
    # a broken padding mask would go unseen
    reference = tiny_random_model(len(smol_tokenizer), initializer_range=0.2).eval()
    switched = tiny_random_model(len(smol_tokenizer), initializer_range=0.2).eval()
    use_packed_attention(switched, 512)
    ids = torch.tensor([[0, 0, 0, 501, 502, 503], [601, 602, 603, 604, 605, 606]])
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        expected = reference.generate(ids, **kwargs)
        assert torch.equal(expected, switched.generate(ids, **kwargs))
        assert not torch.equal(expected[0, 6:], expected[1, 6:])  # the rows' replies differ: the test can see a mix-up
        unpadded = reference.generate(ids[:1, 3:], attention_mask=mask[:1, 3:], max_new_tokens=6, do_sample=False,
                                      pad_token_id=0)
        assert torch.equal(expected[0, 6:], unpadded[0, 3:])  # the padded row generates as it does unpadded


@pytest.mark.parametrize("overrides, allowed", [
    ({}, True),
    ({"sliding_window": 64, "use_sliding_window": True}, False),   # a window shorter than the rows: needs its mask
    ({"sliding_window": 4096, "use_sliding_window": True}, True),  # longer than any row: plain causal
    ({"attn_logit_softcapping": 50.0}, False),
])
def test_only_plain_causal_architectures_switch(overrides, allowed):
    from transformers import LlamaConfig

    from agentrig.train.attention import supports_packed_attention

    config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_hidden_layers=1)
    for key, value in overrides.items():
        setattr(config, key, value)
    assert supports_packed_attention(config, 2048) is allowed


def test_padding_free_batch_equals_padded_batch(smol_tokenizer):
    """Joining a batch's rows into one (no pad tokens) gives the same log-probs as padding them."""
    import torch

    from agentrig.train.attention import use_packed_attention
    from agentrig.train.lmloss import add_supervised_head
    from agentrig.models import tiny_random_model
    from agentrig.train.packing import RowCollator, TokenizedSample, pack_rows

    rng = random.Random(1)
    samples = [TokenizedSample(f"s{i}", ids, [-100] * 3 + ids[3:])
               for i, ids in enumerate([[rng.randrange(200, 3000) for _ in range(rng.randint(20, 120))]
                                        for _ in range(8)])]
    rows = pack_rows(samples, 160)
    model = tiny_random_model(len(smol_tokenizer)).eval()
    use_packed_attention(model, 160)
    add_supervised_head(model)
    padded, joined = RowCollator(0)(rows), RowCollator(0, padding_free=True)(rows)
    real = sum(len(r["input_ids"]) for r in rows)
    assert joined["input_ids"].shape == (1, real) and padded["input_ids"].numel() > real
    assert int(joined["num_tokens"]) == int(padded["num_tokens"]) == real
    with torch.no_grad():
        out_p, out_j = (model(input_ids=b["input_ids"], position_ids=b["position_ids"], supervised_labels=b["labels"])
                        for b in (padded, joined))
    assert torch.allclose(out_p["token_logps"], out_j["token_logps"], atol=1e-5)
