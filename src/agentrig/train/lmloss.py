"""Language-model head and log-probabilities only at supervised positions.

A causal LM normally projects every position onto the whole vocabulary (SmolLM2: 49,152 logits per
token, ~57 MFLOP forward per token, about a fifth of the model's compute) and then throws most of them
away under the -100 mask. Here the backbone's hidden states are gathered where the next-token label is
supervised, and only those rows go through the head and the log-softmax.

`add_supervised_head(model)` patches the model's own `forward` (like TRL's fused LM head), so the call
still goes through DDP/FSDP/DeepSpeed wrappers and PEFT: `model(input_ids=..., position_ids=...,
supervised_labels=labels)` returns `{"token_logps": (n,), "mask": (batch, seq-1) bool}` where `n` is the
number of supervised positions, in row-major order. Without `supervised_labels` the forward is the
original one, so generation and saving are unchanged.

`head_logps` computes those log-probabilities in chunks of rows with a hand-written backward, when the head
is a frozen bias-free linear layer (LoRA never trains it): the logits of a chunk are made, reduced to their
log-sum-exp and the target's logit, and dropped; backward makes them again and multiplies `softmax - onehot`
by the head. autograd's own path keeps the (rows x vocabulary) logits, their fp32 copy and the log-softmax,
and in backward fills a zero tensor of that size for the target gradient, casts it and runs the
log-softmax backward: on the default profile's rows about a sixth of a CPU training step, for the same
values (tested against it). The head's weight is cast to the compute dtype once and kept while unchanged,
not on every step.
"""

from __future__ import annotations

import functools
import types
from typing import Any

from agentrig.data.render import IGNORE_INDEX


def add_supervised_head(model: Any, prompt_no_grad: bool = False) -> Any:
    """Patch a `*ForCausalLM` (before PEFT wraps it) to accept `supervised_labels`; returns the model.

    `prompt_no_grad`: encode each sample's context before its first supervised token without gradient, in a
    pass of its own (`context.py`; needs agentrig's packed attention). The returned values are the same.
    """
    from agentrig.train import context

    original_forward = model.forward

    @functools.wraps(type(model).forward)
    def forward(self: Any, *args: Any, supervised_labels: Any = None, **kwargs: Any) -> Any:
        if supervised_labels is None:
            return original_forward(*args, **kwargs)
        # PEFT passes these explicitly as None; the backbone takes the rest.
        for key in ("labels", "inputs_embeds", "output_attentions", "output_hidden_states", "return_dict"):
            kwargs.pop(key, None)
        # Without a cache (use_cache=False), transformers turns position-id restarts into a block-diagonal
        # mask; with one, it silently falls back to plain causal attention across packed samples.
        kwargs["use_cache"] = False
        targets = supervised_labels[:, 1:]
        mask = targets != IGNORE_INDEX
        if prompt_no_grad and bool(mask.any()):
            hidden, labels = context.forward(self.get_decoder(), kwargs["input_ids"], supervised_labels,
                                             kwargs["position_ids"])
            targets = labels[:, 1:]
            at = targets != IGNORE_INDEX
        else:
            hidden = self.get_decoder()(*args, **kwargs).last_hidden_state
            at = mask
        token_logps = head_logps(self.get_output_embeddings(), hidden[:, :-1][at], targets[at])
        return {"token_logps": token_logps, "mask": mask}

    model.forward = types.MethodType(forward, model)
    return model


def sequence_logps(token_logps: Any, mask: Any) -> Any:
    """Sum the supervised token log-probs of each row: shape (batch,)."""
    import torch

    rows = mask.nonzero(as_tuple=True)[0]
    out = torch.zeros(mask.shape[0], dtype=token_logps.dtype, device=token_logps.device)
    return out.index_add(0, rows, token_logps)


def full_logits_loss(model: Any, batch: dict[str, Any]) -> Any:
    """Reference loss through the model's ordinary forward (full logits): mean over supervised tokens.

    Used by tests to check the supervised head gives the same number.
    """
    import torch.nn.functional as F

    # use_cache=False matters: with a cache, transformers skips packed-sequence detection and the samples
    # of a packed row would attend to each other.
    logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
    targets = batch["labels"][:, 1:]
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets.reshape(-1),
                           ignore_index=IGNORE_INDEX)


_CHUNK = 512  # rows of logits at a time: 512 x 49,152 fp32 is 100 MB
_cast_cache: dict[str, Any] = {}


def autograd_head_logps(head: Any, hidden: Any, targets: Any) -> Any:
    """log p(target) of each row of `hidden` under `head` through autograd: the whole logits, kept for backward."""
    import torch.nn.functional as F

    return -F.cross_entropy(head(hidden).float(), targets, reduction="none")


def head_logps(head: Any, hidden: Any, targets: Any) -> Any:
    """log p(target) of each row of `hidden` (n, d) under `head`, in fp32: shape (n,)."""
    import torch

    weight = head.weight
    if type(head) is not torch.nn.Linear or head.bias is not None or weight.requires_grad:
        return autograd_head_logps(head, hidden, targets)
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    return _head_logps_function().apply(hidden, _cast_weight(weight, dtype), targets)


def _cast_weight(weight: Any, dtype: Any) -> Any:
    """`weight` in `dtype`, cast once and reused while the weight is unchanged (its version counter)."""
    if weight.dtype == dtype:
        return weight
    key = (id(weight), weight.data_ptr(), weight._version, dtype)
    if _cast_cache.get("key") != key:
        _cast_cache.update(key=key, weight=weight.detach().to(dtype))
    return _cast_cache["weight"]


_HEAD_LOGPS: Any = None


def _head_logps_function() -> Any:
    global _HEAD_LOGPS
    if _HEAD_LOGPS is not None:
        return _HEAD_LOGPS
    import torch

    class HeadLogps(torch.autograd.Function):
        """log_softmax(hidden @ weight.T)[target], chunked over rows; logits made again in backward."""

        @staticmethod
        def forward(ctx: Any, hidden: Any, weight: Any, targets: Any) -> Any:
            with torch.autocast(hidden.device.type, enabled=False):
                h = hidden.to(weight.dtype)
                out = torch.empty(h.shape[0], dtype=torch.float32, device=h.device)
                lse = torch.empty_like(out)
                for s in range(0, h.shape[0], _CHUNK):
                    logits = (h[s:s + _CHUNK] @ weight.t()).float()
                    lse[s:s + _CHUNK] = torch.logsumexp(logits, dim=-1)
                    out[s:s + _CHUNK] = logits.gather(1, targets[s:s + _CHUNK, None]).squeeze(1) - lse[s:s + _CHUNK]
            ctx.save_for_backward(h, weight, targets, lse)
            ctx.hidden_dtype = hidden.dtype
            return out

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            h, weight, targets, lse = ctx.saved_tensors
            dh = torch.empty_like(h)
            with torch.autocast(h.device.type, enabled=False):
                for s in range(0, h.shape[0], _CHUNK):
                    g = grad[s:s + _CHUNK, None].float()
                    probs = ((h[s:s + _CHUNK] @ weight.t()).float() - lse[s:s + _CHUNK, None]).exp_()
                    probs.mul_(-g).scatter_add_(1, targets[s:s + _CHUNK, None], g)  # g * (onehot - softmax)
                    dh[s:s + _CHUNK] = probs.to(h.dtype) @ weight
            return dh.to(ctx.hidden_dtype), None, None

    _HEAD_LOGPS = HeadLogps
    return HeadLogps
