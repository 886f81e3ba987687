"""One LoRA adapter's weights merged into the base layers for inference, restored exactly afterwards.

At decode time on a CPU a LoRA layer costs three small matrix products and PEFT's per-layer Python instead
of one product: on SmolLM2 with LoRA on every linear layer, evaluating 16 datadesk tasks took 75.5 s
unmerged and 66.8 s merged, with the same replies. PEFT's own `merge_adapter`/`unmerge_adapter` add the
delta into the weight and subtract it again, which leaves rounding behind at every switch between
adapters and the base model. `MergedWeights` instead swaps each adapted layer's weight tensor for a new
one holding `W + delta` and keeps the original tensor, so restoring is exact; the PEFT model then runs
with its adapters disabled, whose forward is the base layer's.

Merging applies only where it is exact: every parameter of the adapter belongs to the `lora_A`/`lora_B` of a
plain `lora.Linear` (no DoRA or other variants, no LoRA bias, no embedding or convolution layers, no
`modules_to_save` copies, no quantized layers, which are other classes). Anything else runs PEFT's
forward. The merged tensors of the last adapter used are kept (the adapted layers held twice), so switching back
to it swaps references only.
"""

from __future__ import annotations

from typing import Any


def plain_lora_layers(model: Any, name: str) -> list[Any] | None:
    """The `lora.Linear` layers carrying adapter `name`, or None when any of its parameters lives elsewhere
    (or a layer is not plain: a variant, DoRA, a LoRA bias, an already merged layer)."""
    from peft.tuners.lora import Linear as LoraLinear

    layers: dict[int, Any] = {}
    owners = {id(p): m for m in model.modules() if type(m) is LoraLinear
              for sub in (m.lora_A, m.lora_B) if name in sub for p in sub[name].parameters()}
    count = 0
    for pname, param in model.named_parameters():
        if f".{name}." not in pname and not pname.endswith(f".{name}"):
            continue
        count += 1
        layer = owners.get(id(param))
        if layer is None:
            return None
        layers[id(layer)] = layer
    if not count:
        return None
    for layer in layers.values():
        if (layer.use_dora.get(name) or getattr(layer, "lora_variant", {}).get(name) is not None
                or getattr(layer, "lora_bias", {}).get(name) or layer.merged):
            return None
    return list(layers.values())


class MergedWeights:
    """Adapter weights merged into the base layers while `use(name)` holds, originals back on `restore()`.

    The merged tensors of the most recently used adapter are kept, so entering it again only swaps tensor
    references; `forget()` drops them (call it when adapters are loaded or unloaded).
    """

    def __init__(self) -> None:
        self._name: str | None = None  # whose merged tensors are kept
        self._swaps: list[tuple[Any, Any, Any]] = []  # (base layer, original weight, merged weight)
        self.active = False

    def use(self, model: Any, name: str) -> bool:
        """Swap adapter `name`'s merged weights into `model`; False (nothing changed) when it cannot merge exactly."""
        import torch

        self.restore()
        if self._name != name:
            self._swaps, self._name = [], None
            layers = plain_lora_layers(model, name)
            if layers is None:
                return False
            with torch.no_grad():
                for layer in layers:
                    base = layer.get_base_layer()
                    original = base.weight.data
                    self._swaps.append((base, original, original + layer.get_delta_weight(name).to(original.dtype)))
            self._name = name
        for base, _, merged in self._swaps:
            base.weight.data = merged
        self.active = True
        return True

    def restore(self) -> None:
        """Put every original weight tensor back (the same tensors, so exactly)."""
        if self.active:
            for base, original, _ in self._swaps:
                base.weight.data = original
            self.active = False

    def forget(self) -> None:
        """Restore and drop the kept merged tensors."""
        self.restore()
        self._swaps, self._name = [], None
