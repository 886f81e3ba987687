"""bf16 copies of a model's linear weights, swapped in while a CPU policy generates under bf16 autocast.

Autocast casts an fp32 weight to bf16 at every call unless the weight requires grad (only those casts are
cached), so a frozen model under autocast re-reads and re-writes every linear weight at every decode
step: on SmolLM2-135M with 2 cores that cost ate the AMX speed-up and left bf16 evaluation slower than
fp32 (docs/benchmarks.md, 2026-12-07). `HalfWeights` keeps one bf16 copy per linear layer and swaps it in
for the duration of a batch; autocast then finds the weight already in bf16 and casts only the
activations, which it did anyway, so the arithmetic is autocast's. The original tensors go back on
`restore()`, untouched.

A copy is made again when the layer's weight is another tensor than the one it was made from (an
adapter's merged weights, `agentrig.policies.merged`) or was changed in place (its version counter).
Not covered: a linear layer whose weight is tied to the input embeddings (SmolLM2's head): swapping that
tensor would turn the embeddings, and so the residual stream, into bf16, which autocast keeps in fp32;
it is cast per call as before.
"""

from __future__ import annotations

from typing import Any


class HalfWeights:
    """Per linear layer, a bf16 copy of its fp32 weight, in place while `use(model)` holds."""

    def __init__(self) -> None:
        # layer -> (the fp32 tensor the copy was made from, the parameter's version then, the bf16 copy)
        self._copies: dict[Any, tuple[Any, int, Any]] = {}
        self._swapped: list[tuple[Any, Any]] = []  # (layer, its fp32 tensor) while in use

    def use(self, model: Any) -> None:
        """Swap bf16 copies into every fp32 linear layer of `model` (made or refreshed as needed)."""
        import torch

        self.restore()
        embeddings = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
        with torch.no_grad():
            for layer in model.modules():
                if not isinstance(layer, torch.nn.Linear) or layer.weight.dtype != torch.float32:
                    continue
                if embeddings is not None and layer.weight is embeddings:
                    continue
                weight, version = layer.weight.data, layer.weight._version  # `.data` has a version of its own
                kept = self._copies.get(layer)
                if kept is None or kept[0].data_ptr() != weight.data_ptr() or kept[1] != version:
                    kept = (weight, version, weight.to(torch.bfloat16))
                    self._copies[layer] = kept
                self._swapped.append((layer, weight))
                layer.weight.data = kept[2]

    def restore(self) -> None:
        """Put every original fp32 tensor back (the same tensors)."""
        for layer, weight in self._swapped:
            layer.weight.data = weight
        self._swapped = []

    def forget(self) -> None:
        """Restore and drop the copies."""
        self.restore()
        self._copies = {}
