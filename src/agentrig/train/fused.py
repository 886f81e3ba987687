"""Training ops fused for speed, with the same values and gradients: the gated MLP and the LoRA linear.

**Gated MLP.** `silu(gate) * up` as one autograd node that saves only its two inputs.

In a Llama-style MLP, `down(silu(gate(x)) * up(x))` leaves three (tokens x intermediate) tensors for
backward: `gate(x)` for the SiLU, and `silu(gate(x))` and `up(x)` for the product; SmolLM2's intermediate
size is 2.7x its hidden size, so these are the largest activations a LoRA step keeps (2.3 GB at 2x2048).
`SiluMul` saves `gate(x)` and `up(x)` and recomputes the sigmoid in backward, a cheap elementwise pass,
which drops one of the three. Values and gradients equal the unfused expression (tested).

`fuse_gated_mlps(model)` rebinds the `forward` of every MLP module that has `gate_proj`, `up_proj`,
`down_proj` and a SiLU activation (Llama, Mistral, Qwen2/3, SmolLM); PEFT's LoRA layers on those
projections still run, since the module's own projections are called. Returns how many were fused.

**LoRA linear.** PEFT's `lora.Linear.forward` computes `result + lora_B(lora_A(dropout(x))) * scaling` with
the input cast to the adapter's dtype (fp32) first. Under CPU bf16 autocast that is, per adapted layer and
step, a cast of the input to fp32 and back to bf16, then a separate scale and add over the layer's whole
output, each again in backward: on SmolLM2 with LoRA on every linear layer, about a tenth of a training step
(`benchmarks/fused_ops.py`). `fuse_lora_linears(model)` rebinds every plain `lora.Linear`'s forward to cast
the input once and fold the scale and the add into the second matmul (`addmm(result, x A^T, B^T, alpha=s)`),
which computes the same thing: in fp32 equal up to summation order (tested), under bf16 autocast with one
rounding of the sum instead of three (the scaled product, then the add). Anything else (dropout, DoRA or other
variants, several active adapters, merged or disabled adapters, mixed-batch adapter names, quantized
layers, which are other classes) runs PEFT's own forward.
"""

from __future__ import annotations

import types
from typing import Any


def _silu_mul_function() -> Any:
    import torch

    class SiluMul(torch.autograd.Function):
        """silu(gate) * up, saving gate and up only."""

        @staticmethod
        def forward(ctx: Any, gate: Any, up: Any) -> Any:
            ctx.save_for_backward(gate, up)
            return torch.nn.functional.silu(gate) * up

        @staticmethod
        def backward(ctx: Any, grad: Any) -> Any:
            gate, up = ctx.saved_tensors
            sig = torch.sigmoid(gate)
            silu = gate * sig
            grad_up = grad * silu if ctx.needs_input_grad[1] else None
            grad_gate = None
            if ctx.needs_input_grad[0]:
                # d silu / d gate = sig * (1 + gate * (1 - sig)) = sig + silu * (1 - sig)
                grad_gate = grad * up * (sig + silu * (1 - sig))
            return grad_gate, grad_up

    return SiluMul


_SILU_MUL: Any = None


def silu_mul(gate: Any, up: Any) -> Any:
    """`silu(gate) * up` as one autograd node (plain ops when no gradient is needed)."""
    import torch

    global _SILU_MUL
    if not torch.is_grad_enabled() or not (gate.requires_grad or up.requires_grad):
        return torch.nn.functional.silu(gate) * up
    if _SILU_MUL is None:
        _SILU_MUL = _silu_mul_function()
    return _SILU_MUL.apply(gate, up)


def _fused_forward(self: Any, x: Any) -> Any:
    return self.down_proj(silu_mul(self.gate_proj(x), self.up_proj(x)))


def _is_silu(act: Any) -> bool:
    import torch

    return isinstance(act, torch.nn.SiLU) or type(act).__name__ in ("SiLUActivation", "SiLU")


def fuse_gated_mlps(model: Any) -> int:
    """Rebind every SiLU-gated MLP's forward to use `silu_mul`; the number of MLPs fused."""
    fused = 0
    for module in model.modules():
        if type(module).__name__.endswith("MLP") and all(
                hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj")) and _is_silu(
                getattr(module, "act_fn", None)):
            module.forward = types.MethodType(_fused_forward, module)
            fused += 1
    global _SILU_MUL
    if fused and _SILU_MUL is None:  # made now, so a compiled layer (compile.py) does not see it change
        _SILU_MUL = _silu_mul_function()
    return fused


def _lora_forward(self: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    """`lora.Linear.forward` for one plain adapter: one input cast, scale and add inside `addmm`."""
    import torch
    import torch.nn.functional as F

    name = self.active_adapters[0] if len(self.active_adapters) == 1 else None
    if (args or kwargs or self.disable_adapters or self.merged or name not in self.lora_A
            or name in self.lora_variant or not isinstance(self.lora_dropout[name], torch.nn.Identity)):
        return type(self).forward(self, x, *args, **kwargs)
    device, weight = x.device.type, self.lora_A[name].weight
    autocast = torch.is_autocast_enabled(device)
    if autocast:
        x = x.to(torch.get_autocast_dtype(device))  # once, for the base layer and lora_A both
    result = self.base_layer(x)
    down = F.linear(x if autocast else x.to(weight.dtype), weight)  # PEFT casts to the adapter's dtype
    up = self.lora_B[name].weight.t().to(down.dtype)
    out = torch.addmm(result.reshape(-1, result.shape[-1]).to(down.dtype), down.reshape(-1, down.shape[-1]), up,
                      alpha=self.scaling[name])
    return out.view(*result.shape[:-1], out.shape[-1]).to(result.dtype)


def fuse_lora_linears(model: Any) -> int:
    """Rebind the forward of every plain PEFT `lora.Linear` in `model` (see the module docstring); how many."""
    from peft.tuners.lora.layer import Linear

    fused = 0
    for module in model.modules():
        if type(module) is Linear:
            module.forward = types.MethodType(_lora_forward, module)
            fused += 1
    return fused
