"""Attention over packed rows: causal attention inside each sample, with no mask tensor.

Packed rows (`packing.py`) hold several samples, told apart by position ids that restart at 0. Left to
itself, transformers turns those restarts into a block-diagonal mask of shape (batch, 1, seq, seq) and
hands it to SDPA; with a mask, PyTorch's CPU SDPA cannot use its fused causal kernel, materializes the
attention scores and saves a float copy of the mask per layer for backward (1 GB for SmolLM2 at 2x2048).

`packed_attention` instead finds the sample boundaries from `position_ids` and calls SDPA once per
sample with `is_causal=True` (grouped-query heads via `enable_gqa`), the CPU analogue of flash-attention's
varlen path. The result equals the masked computation (tested against it); it is faster and holds no
O(seq^2) tensors. Anything this path does not cover falls back to transformers' own SDPA function with
its mask: a padding mask, a KV cache (queries shorter than keys), no position ids, soft-capping,
attention sinks, position biases. `prompt_no_grad`'s two passes (`context.py`) come through here too.

`use_packed_attention(model)` switches a loaded model to it, when the architecture is plain causal
attention (no sliding window shorter than `max_len`, no soft-capping); it returns whether it did.
"""

from __future__ import annotations

from typing import Any

NAME = "agentrig_packed"
CONTEXT_KWARG = "agentrig_context"  # context.py's two passes reach this function under this keyword
_registered = False


def _segments(position_ids: Any) -> list[list[tuple[int, int]]]:
    """Per row, the (start, end) spans of consecutive positions: a new span wherever the step is not +1."""
    import torch

    first = position_ids[:, :1] - 1
    breaks = torch.diff(position_ids, prepend=first, dim=-1) != 1
    width = position_ids.shape[1]
    spans = []
    for row in breaks:
        starts = row.nonzero().flatten().tolist() or [0]
        if starts[0] != 0:
            starts.insert(0, 0)
        spans.append(list(zip(starts, starts[1:] + [width])))
    return spans


def packed_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, dropout: float = 0.0,
                     scaling: float | None = None, **kwargs: Any) -> tuple[Any, None]:
    """An `AttentionInterface` function: per-sample causal SDPA over (batch, heads, seq, dim) inputs."""
    import torch
    import torch.nn.functional as F
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    context = kwargs.pop(CONTEXT_KWARG, None)  # `prompt_no_grad`'s two passes (context.py)
    if context is not None:
        return _context_attention(context, module, query, key, value, attention_mask, dropout, scaling, kwargs)
    position_ids = kwargs.get("position_ids")
    special = any(kwargs.get(k) is not None for k in ("softcap", "s_aux", "sinks", "position_bias", "sliding_window"))
    if (attention_mask is not None or position_ids is None or special or query.shape[2] != key.shape[2]
            or not getattr(module, "is_causal", True)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    gqa = query.shape[1] != key.shape[1]
    rows = []
    for b, spans in enumerate(_segments(position_ids.expand(query.shape[0], -1))):
        parts = [F.scaled_dot_product_attention(query[b:b + 1, :, s:e], key[b:b + 1, :, s:e],
                                                value[b:b + 1, :, s:e], dropout_p=dropout, is_causal=True,
                                                scale=scaling, enable_gqa=gqa)
                 for s, e in spans]
        rows.append(parts[0] if len(parts) == 1 else torch.cat(parts, dim=2))
    out = rows[0] if len(rows) == 1 else torch.cat(rows, dim=0)
    return out.transpose(1, 2).contiguous(), None


def _context_attention(context: Any, module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                       dropout: float, scaling: float | None, kwargs: dict[str, Any]) -> tuple[Any, None]:
    """`prompt_no_grad`'s passes: the context pass keeps each layer's keys and values and attends as any packed
    row; the rest pass attends to them (`context.attend`).

    Never traced by TorchDynamo (`register` wraps it in `torch.compiler.disable`): the context's spans are Python
    ints that change every step, and a compiled layer that read them would recompile every step (session 48:
    minutes a step with `torch_compile`). The attention runs eagerly between the compiled halves of a layer.
    """
    if context.recording:
        context.kv[id(module)] = (key, value)
        return packed_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                **kwargs)
    from agentrig.train.context import attend

    return attend(context, module, query, key, value, dropout, scaling).transpose(1, 2).contiguous(), None


def _packed_mask(batch_size: int, q_length: int, kv_length: int, *args: Any, attention_mask: Any = None,
                 **kwargs: Any) -> Any:
    """Mask interface: no mask unless a padding mask is given (then transformers' SDPA mask, used by the fallback)."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None or bool(attention_mask.all()):
        return None
    return sdpa_mask(batch_size, q_length, kv_length, *args, attention_mask=attention_mask, **kwargs)


def register() -> str:
    """Register `packed_attention` (and its mask function) with transformers under `NAME`."""
    global _registered, _context_attention
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface

        import torch

        _context_attention = torch.compiler.disable(_context_attention)  # see its docstring
        AttentionInterface.register(NAME, packed_attention)
        AttentionMaskInterface.register(NAME, _packed_mask)
        _registered = True
    return NAME


def supports_packed_attention(config: Any, max_len: int) -> bool:
    """Whether the architecture's attention is plain causal attention over `max_len` tokens."""
    for cfg in (config, getattr(config, "text_config", None)):
        if cfg is None:
            continue
        window = getattr(cfg, "sliding_window", None)
        if window and getattr(cfg, "use_sliding_window", True) and window < max_len:
            return False
        if getattr(cfg, "attn_logit_softcapping", None) or getattr(cfg, "layer_types", None) and any(
                t != "full_attention" for t in cfg.layer_types):
            return False
    return getattr(config, "_attn_implementation", None) in (None, "sdpa", "eager", NAME)


def use_packed_attention(model: Any, max_len: int) -> bool:
    """Switch `model` to per-sample causal attention when its architecture allows; True if switched."""
    if not supports_packed_attention(model.config, max_len):
        return False
    model.set_attn_implementation(register())
    return True
