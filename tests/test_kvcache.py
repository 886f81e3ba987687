"""BufferedCache: decoding over it gives DynamicCache's logits (also past its capacity), and dropping rows
leaves the remaining rows' logits as if they had been decoded alone."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


def _model():
    from agentrig.models import tiny_random_model

    return tiny_random_model(256, initializer_range=0.2).eval()


def _buffered(cache, capacity: int):
    """A BufferedCache holding a DynamicCache's contents, with room for `capacity` positions."""
    from agentrig.policies.kvcache import BufferedCache

    layers = []
    for layer in cache.layers:
        n = layer.keys.shape[2]
        k = layer.keys.new_zeros((*layer.keys.shape[:2], capacity, layer.keys.shape[3]))
        v = torch.zeros_like(k)
        k[:, :, :n], v[:, :, :n] = layer.keys, layer.values
        layers.append((k, v))
    return BufferedCache(layers, n)


def _decode(model, cache, first, steps: int) -> list:
    """Greedy decode `steps` tokens from `first` ([batch, 1]); returns each step's logits."""
    out, ids = [], first
    for _ in range(steps):
        logits = model(input_ids=ids, cache=cache, use_cache=True).logits[:, -1]
        out.append(logits)
        ids = logits.argmax(-1, keepdim=True)
    return out


@pytest.mark.parametrize("capacity", [40, 12])  # 12: fills after 2 steps, so the buffers must grow
def test_buffered_cache_decodes_like_dynamic_cache(capacity: int) -> None:
    from transformers import DynamicCache

    model = _model()
    prompt = torch.randint(3, 256, (3, 10))
    with torch.inference_mode():
        prefill = model(input_ids=prompt, use_cache=True)
        first = prefill.logits[:, -1].argmax(-1, keepdim=True)
        kv = [(layer.keys.clone(), layer.values.clone()) for layer in prefill.cache.layers]
        expected = _decode(model, DynamicCache(ddp_cache_data=kv), first, 8)
        buffered = _buffered(prefill.cache, capacity)
        got = _decode(model, buffered, first, 8)
    for a, b in zip(expected, got):
        torch.testing.assert_close(a, b)
    assert buffered.get_seq_length() == 18
    assert buffered.layers[0].key_buffer.shape[2] >= 18


def test_keep_rows_continues_the_kept_rows_as_if_alone() -> None:
    from transformers import DynamicCache

    model = _model()
    prompt = torch.randint(3, 256, (3, 10))
    with torch.inference_mode():
        prefill = model(input_ids=prompt, use_cache=True)
        first = prefill.logits[:, -1].argmax(-1, keepdim=True)
        cache = _buffered(prefill.cache, 32)
        _decode(model, cache, first, 2)  # two steps for all three rows
        cache.keep_rows([2, 0])  # row 1 finished; the others go on, in a new order
        alone = model(input_ids=prompt[[2, 0]], use_cache=True)
        kv = [(layer.keys, layer.values) for layer in alone.cache.layers]
        reference = DynamicCache(ddp_cache_data=kv)
        ids = first[[2, 0]]
        for _ in range(2):  # replay the same two steps for the kept rows alone
            ids = model(input_ids=ids, cache=reference, use_cache=True).logits[:, -1].argmax(-1, keepdim=True)
        torch.testing.assert_close(cache.layers[0].keys, reference.layers[0].keys)
        nxt = torch.tensor([[5], [7]])
        torch.testing.assert_close(
            model(input_ids=nxt, cache=cache, use_cache=True).logits,
            model(input_ids=nxt, cache=reference, use_cache=True).logits,
        )
    assert cache.layers[0].key_buffer.shape[0] == 2
