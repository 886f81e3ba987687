"""Regional compilation: each repeated decoder layer through `torch.compile`, the rest of the model eager.

A LoRA step on a CPU spends about a quarter of its time in elementwise passes (norms, rotary embeddings, the
residual adds, the gated MLP's product, the casts autocast inserts before every matmul), each one a trip
through memory. TorchInductor fuses those passes into a few generated C++ loops per layer. Compiling the
whole model would unroll all its layers into one graph (minutes of compilation); compiling each decoder layer
(PyTorch's "regional compilation" recipe, accelerate's `compile_regions`) makes one graph that every layer
reuses. Here each layer is compiled in place with `nn.Module.compile(dynamic=True)`: the module tree and its
state dict keep their names, so checkpoints, adapters and resumes are unchanged, and one graph serves every
row length. agentrig's packed attention (`attention.py`) reads each row's sample boundaries, so the layer
graph breaks there and attention runs eagerly between the two compiled halves.

The compiled forward computes the same function: losses agree with the eager ones to float rounding (fused
passes round in another order; tested). The first step pays for compilation (about a minute on 2 CPU cores
for SmolLM2, about 20 s when TorchInductor's on-disk cache already has the kernels); the step after that is
1.2x faster on the default profile's data (`benchmarks/torch_compile.py`, docs/benchmarks.md).
"""

from __future__ import annotations

import shutil
from typing import Any

from agentrig.errors import ConfigError


def repeated_blocks(model: Any) -> list[Any]:
    """The largest `ModuleList` of `model` whose children are all one class (the decoder layers), or []."""
    import torch

    best: list[Any] = []
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) > 1:
            kinds = {type(child) for child in module}
            if len(kinds) == 1 and len(module) > len(best):
                best = list(module)
    return best


def has_cpp_compiler() -> bool:
    """Whether a C++ compiler is on PATH (TorchInductor writes C++ for the CPU and builds it)."""
    return any(shutil.which(cc) for cc in ("g++", "c++", "clang++"))


def check_compiler(device: str) -> None:
    """Refuse a CPU compile without a C++ compiler, saying what to do."""
    if device == "cpu" and not has_cpp_compiler():
        raise ConfigError("torch_compile on a CPU needs a C++ compiler (TorchInductor generates and builds C++ "
                          "kernels), and none is on PATH: install one (apt install g++) or set torch_compile: false")


def compile_layers(model: Any) -> int:
    """Compile each repeated block of `model` in place (dynamic shapes); how many were compiled."""
    import torch._dynamo

    blocks = repeated_blocks(model)
    if not blocks:
        raise ConfigError(f"torch_compile: {type(model).__name__} has no repeated layers to compile one by one; "
                          "set torch_compile: false for this model")
    check_compiler(next(model.parameters()).device.type)
    # One graph is traced per layer instance in the worst case (and again for eval mode): room for all of them.
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 4 * len(blocks))
    for block in blocks:
        block.compile(dynamic=True)
    return len(blocks)
