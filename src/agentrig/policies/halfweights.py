"""bf16 copies of a model's linear weights, swapped in while a CPU policy generates under bf16 autocast.

Autocast casts an fp32 weight to bf16 at every call unless the weight requires grad (only those casts are
cached), so a frozen model under autocast re-reads and re-writes every linear weight at every decode
step; SmolLM2-135M's head alone (49,152 x 576, tied to the input embeddings) is 28M values a step. On 2
cores that cost ate the AMX speed-up and left bf16 evaluation slower than fp32 (docs/benchmarks.md,
2026-12-07). `HalfWeights` keeps one bf16 copy per linear layer and puts it in the layer's `weight` slot
for the duration of a batch; autocast then finds the weight already in bf16 and casts only the
activations, which it did anyway, so the arithmetic is autocast's. The slot, not the shared tensor, is
swapped, so a head tied to the embeddings gets its copy while the embeddings (and so the residual stream)
stay fp32. `restore()` puts the original parameters back, untouched.

A copy is made again when the layer's weight is another tensor than the one it was made from (an
adapter's merged weights, `agentrig.policies.merged`) or was changed in place (the parameter's version).
"""

from __future__ import annotations

from typing import Any


class HalfWeights:
    """Per linear layer, a bf16 copy of its fp32 weight, in the layer's `weight` slot while `use(model)` holds."""

    def __init__(self) -> None:
        # layer -> (the fp32 tensor the copy was made from, the parameter's version then, the bf16 copy)
        self._copies: dict[Any, tuple[Any, int, Any]] = {}
        self._swapped: list[tuple[Any, Any]] = []  # (layer, its own weight parameter) while in use

    def use(self, model: Any) -> None:
        """Put bf16 copies in every fp32 linear layer of `model` (made or refreshed as needed)."""
        import torch

        self.restore()
        with torch.no_grad():
            for layer in model.modules():
                if not isinstance(layer, torch.nn.Linear) or layer.weight.dtype != torch.float32:
                    continue
                param = layer._parameters["weight"]
                weight, version = param.data, param._version  # `.data` has a version counter of its own
                kept = self._copies.get(layer)
                if kept is None or kept[0].data_ptr() != weight.data_ptr() or kept[1] != version:
                    kept = (weight, version, weight.to(torch.bfloat16))
                    self._copies[layer] = kept
                self._swapped.append((layer, param))
                layer._parameters["weight"] = kept[2]  # the slot only: a tied parameter stays as it is

    def restore(self) -> None:
        """Put every layer's own weight parameter back (the same objects)."""
        for layer, param in self._swapped:
            layer._parameters["weight"] = param
        self._swapped = []

    def forget(self) -> None:
        """Restore and drop the copies."""
        self.restore()
        self._copies = {}
