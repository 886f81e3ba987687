"""The one policy loader: each command's flags reach the policy, unset fields keep the policy's defaults."""

from __future__ import annotations

import pytest

from agentrig.errors import ConfigError
from agentrig.policies.hf_policy import HFPolicy
from agentrig.policies.loader import PolicySpec, load_policy
from agentrig.policies.openai_policy import OpenAIPolicy


def test_endpoint_spec_builds_an_openai_policy_with_only_the_given_settings():
    policy = load_policy(PolicySpec("served", base_url="http://127.0.0.1:9/v1", temperature=0.5, max_new_tokens=64,
                                    protocol="llama31", seed=3, batch_size=99))
    default = OpenAIPolicy("http://127.0.0.1:9/v1", "served")
    assert isinstance(policy, OpenAIPolicy) and policy.model == "served"
    assert (policy.temperature, policy.max_tokens, policy.seed) == (0.5, 64, 3)
    assert policy.concurrency == default.concurrency  # not given: the policy's own default


def test_adapters_with_an_endpoint_are_refused():
    with pytest.raises(ConfigError, match="--base-url"):
        load_policy(PolicySpec("served", base_url="http://127.0.0.1:9/v1", adapters={"a": "dir"}))


def test_local_spec_passes_only_the_given_settings_to_from_pretrained(monkeypatch):
    seen = []
    monkeypatch.setattr(HFPolicy, "from_pretrained", classmethod(lambda cls, *a, **kw: seen.append((a, kw)) or "p"))
    assert load_policy(PolicySpec("smollm2-135m", adapters={"sft": "dir"}, max_new_tokens=48, seed=1)) == "p"
    assert seen == [(("smollm2-135m", {"sft": "dir"}), {"max_new_tokens": 48, "seed": 1})]


def test_tool_format_reaches_an_endpoint_and_is_refused_for_a_local_model():
    policy = load_policy(PolicySpec("tuned", base_url="http://127.0.0.1:9/v1", tool_format="native"))
    assert policy.tool_format == "native"
    assert load_policy(PolicySpec("served", base_url="http://127.0.0.1:9/v1")).tool_format == "harness"
    with pytest.raises(ConfigError, match="is how requests go to an endpoint"):
        load_policy(PolicySpec("smollm2-135m", tool_format="hermes"))
