"""Stop-gradient context: each packed sample's prompt encoded once without gradient (`prompt_no_grad`).

In an agent's SFT row most tokens are context: the system prompt with its tool listing and the user's request
come before the first supervised token and carry no loss (63% of the default profile's tokens). Their backward
pass is still paid in full, because later tokens attend to their keys and values and LoRA changes those. With
`prompt_no_grad: true` the forward runs in two passes, split in each sample at the token before its first
supervised label:

1. the context tokens of every sample, under `torch.no_grad`, as an ordinary packed row whose keys and values
   each layer keeps; nothing of this pass is kept for backward;
2. the remaining tokens with gradient, each sample's queries attending to its own kept context (every
   position) and causally to its own tokens (`attend`).

The logits are the one-pass forward's (tested against it); the gradient leaves out one path, how LoRA changes
the context's keys and values, as Transformer-XL's stop-gradient memory does across segments (Dai et al.,
2019). What it buys is the context's backward pass, less than its share suggests since the supervised tokens
still attend to every context position: on the default profile's data 1.1-1.27x the steps a minute
(`benchmarks/prompt_no_grad.py`, docs/benchmarks.md). Samples without a supervised token (the pad tail) are dropped from
both passes: nothing attends to them and they carry no loss.

The passes reach the attention function through a keyword argument (`agentrig_context`), which transformers
hands from the decoder down to every layer's attention call, so a recomputation under gradient checkpointing
sees the same context. It works with agentrig's packed attention (`attention.py`) only. With `torch_compile` the
compiled layers pass the context through untouched: the attention that reads its spans (Python ints that change
every step) is kept out of TorchDynamo's tracing, so the layers compile once per mode (with and without gradient)
and not once a step (tested).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agentrig.data.render import IGNORE_INDEX
from agentrig.train.attention import CONTEXT_KWARG as KWARG


@dataclass
class Context:
    """The two passes' layout and the recorded keys/values, keyed by attention module."""

    prefix_spans: list[tuple[int, int]]  # each sample's context in pass 1's row
    rest_spans: list[tuple[int, int]]  # each sample's remaining tokens in pass 2's row
    recording: bool = True
    kv: dict[int, tuple[Any, Any]] = field(default_factory=dict)


@dataclass
class Split:
    """One batch cut into the context row (no gradient) and the rest row (gradient), both of batch size 1."""

    prefix_ids: Any
    prefix_positions: Any
    rest_ids: Any
    rest_positions: Any
    rest_labels: Any
    context: Context


def split_batch(input_ids: Any, labels: Any, position_ids: Any) -> Split:
    """Cut each sample (a span of `position_ids` counting up by one) before its first supervised target.

    The hidden state that predicts the first supervised label is the token before it, so that token starts
    the rest. Samples are taken row by row, in order, so the supervised positions keep their row-major order.
    A sample whose first label is supervised is refused (its target would cross samples in either layout).
    """
    import torch

    from agentrig.train.attention import _segments

    prefix_idx: list[Any] = []
    rest_idx: list[Any] = []
    prefix_spans, rest_spans = [], []
    p = r = 0
    width = input_ids.shape[1]
    flat = torch.arange(input_ids.numel(), device=input_ids.device).view(-1, width)
    for b, spans in enumerate(_segments(position_ids.expand(input_ids.shape[0], -1))):
        for s, e in spans:
            supervised = (labels[b, s:e] != IGNORE_INDEX).nonzero()
            if not len(supervised):
                continue
            if int(supervised[0]) == 0:  # packing.py and dpo.py mask every sample's first label
                raise ValueError("prompt_no_grad: a sample's first label is supervised, so it would be predicted "
                                 "from the previous sample's last token; mask it (-100), as agentrig's rows do")
            cut = s + int(supervised[0]) - 1
            prefix_idx.append(flat[b, s:cut])
            rest_idx.append(flat[b, cut:e])
            prefix_spans.append((p, p + cut - s))
            rest_spans.append((r, r + e - cut))
            p, r = p + cut - s, r + e - cut
    empty = torch.zeros(0, dtype=torch.long, device=input_ids.device)
    pre = torch.cat(prefix_idx) if prefix_idx else empty
    rest = torch.cat(rest_idx) if rest_idx else empty
    ids, pos, labs = input_ids.reshape(-1), position_ids.expand_as(input_ids).reshape(-1), labels.reshape(-1)
    return Split(ids[pre][None], pos[pre][None], ids[rest][None], pos[rest][None], labs[rest][None],
                 Context(prefix_spans, rest_spans))


def attend(ctx: Context, module: Any, query: Any, key: Any, value: Any, dropout: float,
           scaling: float | None) -> Any:
    """One layer's attention in the rest pass: each sample's queries over its kept context and, causally, its own
    tokens; returns (batch, heads, seq, dim) like SDPA. (The context pass is ordinary packed attention.)"""
    import torch
    import torch.nn.functional as F

    gqa = query.shape[1] != key.shape[1]
    parts = []
    for (s, e), (ps, pe) in zip(ctx.rest_spans, ctx.prefix_spans):
        q, k, v = query[:, :, s:e], key[:, :, s:e], value[:, :, s:e]
        if ps == pe:
            parts.append(F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True, scale=scaling,
                                                        enable_gqa=gqa))
            continue
        kept_k, kept_v = ctx.kv[id(module)]
        k = torch.cat([kept_k[:, :, ps:pe].to(k.dtype), k], dim=2)
        v = torch.cat([kept_v[:, :, ps:pe].to(v.dtype), v], dim=2)
        n, m = e - s, pe - ps
        allowed = torch.arange(m + n, device=q.device)[None, :] <= torch.arange(n, device=q.device)[:, None] + m
        parts.append(F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout, scale=scaling,
                                                    enable_gqa=gqa))
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)


def forward(decoder: Any, input_ids: Any, labels: Any, position_ids: Any) -> tuple[Any, Any]:
    """The backbone's last hidden states of the rest row and its labels, the context encoded without gradient."""
    import torch

    split = split_batch(input_ids, labels, position_ids)
    ctx = split.context
    if split.prefix_ids.shape[1]:
        with torch.no_grad():
            decoder(input_ids=split.prefix_ids, position_ids=split.prefix_positions, use_cache=False,
                    **{KWARG: ctx})
    ctx.recording = False
    hidden = decoder(input_ids=split.rest_ids, position_ids=split.rest_positions, use_cache=False,
                     **{KWARG: ctx}).last_hidden_state
    return hidden, split.rest_labels
