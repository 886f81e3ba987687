"""One policy loader for every command: a local model with adapters, or an OpenAI-compatible endpoint.

`collect --teacher model|openai`, `eval`, `chat`, `run` and `bench` describe the policy they want as a
`PolicySpec` and call `load_policy`. A field left None keeps the policy's own default, so each command
passes only what its flags set. torch and transformers are imported only when a local model is loaded.
Not covered: the expert teacher, which is the environment's (`Environment.expert`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agentrig.errors import ConfigError


@dataclass
class PolicySpec:
    """Which policy to load. With `base_url`, an endpoint serving `model`; without, a local model."""

    model: str
    base_url: str | None = None
    adapters: dict[str, str] | None = None  # local only: adapter name -> LoRA folder
    temperature: float | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    batch_size: int | None = None  # local only: rows generated together
    api_key_env: str | None = None  # endpoint only: the environment variable holding the key
    protocol: str | None = None  # endpoint only: the output protocol the replies are written in
    concurrency: int | None = None  # endpoint only: requests in flight
    tool_format: str | None = None  # endpoint only: "harness", "hermes" or "native" (OpenAIPolicy's tool_format)
    bf16: bool | None = None  # local only: bf16 autocast on a CPU; None = HFPolicy's default (where the CPU has AMX)


def _given(**kwargs: Any) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if v is not None}


def load_policy(spec: PolicySpec) -> Any:
    """The `OpenAIPolicy` or `HFPolicy` that `spec` describes."""
    if spec.base_url:
        if spec.adapters:
            raise ConfigError("adapters are loaded on a local model; with --base-url choose the adapter by --model")
        from agentrig.policies.openai_policy import OpenAIPolicy

        return OpenAIPolicy(spec.base_url, spec.model, **_given(
            api_key_env=spec.api_key_env, temperature=spec.temperature, max_tokens=spec.max_new_tokens,
            protocol=spec.protocol, concurrency=spec.concurrency, seed=spec.seed, tool_format=spec.tool_format))
    if spec.tool_format not in (None, "harness"):
        raise ConfigError(f"tool format {spec.tool_format!r} is how requests go to an endpoint (--base-url); a local "
                          "model is always prompted with the training chat template")
    from agentrig.policies.hf_policy import HFPolicy

    return HFPolicy.from_pretrained(spec.model, spec.adapters, **_given(
        max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, seed=spec.seed, batch_size=spec.batch_size,
        bf16=spec.bf16))
