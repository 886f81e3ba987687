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
    import torch.nn.functional as F

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
        head = self.get_output_embeddings()
        logits = head(hidden[:, :-1][at]).float()
        token_logps = -F.cross_entropy(logits, targets[at], reduction="none")
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
