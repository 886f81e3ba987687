"""The OpenAI-compatible contract agentrig relies on, for ANY server: agentrig serve, vLLM or SGLang.

By default it runs against `agentrig serve` on a tiny random model. To check a real server (say vLLM on a GPU,
started with the commands in docs/serving.md):

    AGENTRIG_SERVE_URL=http://127.0.0.1:8000/v1 AGENTRIG_SERVE_MODEL=sft pytest tests/test_serve_contract.py

Only what must hold whatever the model writes is asserted: the shapes of replies, tool calls and stream
chunks, usage, and OpenAI-shaped errors for an unknown model and a malformed body."""

from __future__ import annotations

import json
import os

import httpx
import pytest

openai = pytest.importorskip("openai")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory, smol_tokenizer):
    url = os.environ.get("AGENTRIG_SERVE_URL")
    if url:
        yield url.rstrip("/"), os.environ.get("AGENTRIG_SERVE_MODEL") or openai.OpenAI(
            base_url=url, api_key=os.environ.get("OPENAI_API_KEY", "unused")).models.list().data[0].id
        return
    from agentrig.harness.loop import HarnessConfig
    from agentrig.models import tiny_random_model
    from agentrig.policies.hf_policy import HFPolicy
    from agentrig.serve.server import ServeConfig, build_state, start_server

    policy = HFPolicy(tiny_random_model(len(smol_tokenizer)), smol_tokenizer, max_new_tokens=16)
    running = start_server(build_state(ServeConfig(model="tiny"), {}, HarnessConfig(), policy=policy))
    yield running.url, "tiny"
    running.stop()


@pytest.fixture()
def client(endpoint):
    return openai.OpenAI(base_url=endpoint[0], api_key=os.environ.get("OPENAI_API_KEY", "unused"), max_retries=0)


def test_models_lists_the_model(endpoint, client) -> None:
    assert endpoint[1] in {m.id for m in client.models.list().data}


def test_a_chat_completion_has_the_openai_shape(endpoint, client) -> None:
    reply = client.chat.completions.create(model=endpoint[1], messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=8, temperature=0)
    assert reply.object == "chat.completion" and len(reply.choices) == 1
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length", "tool_calls")
    assert reply.usage.prompt_tokens > 0 and 0 < reply.usage.completion_tokens <= 8
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_tool_calls_when_present_carry_json_string_arguments(endpoint, client) -> None:
    for tool_choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        reply = client.chat.completions.create(model=endpoint[1], tools=[WEATHER], tool_choice=tool_choice,
                                               messages=[{"role": "user", "content": "Weather in Paris?"}],
                                               max_tokens=32, temperature=0)
        choice = reply.choices[0]
        for call in choice.message.tool_calls or []:
            assert call.type == "function" and call.id and call.function.name
            assert isinstance(json.loads(call.function.arguments), dict)
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"


def test_a_stream_is_openai_chunks_ending_in_done(endpoint) -> None:
    lines = []
    with httpx.stream("POST", endpoint[0] + "/chat/completions", timeout=120, json={
            "model": endpoint[1], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True,
            "temperature": 0, "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[5:]) for line in lines[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert any(ch.get("finish_reason") for c in chunks for ch in c["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] > 0


def test_errors_have_the_openai_shape(endpoint, client) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model-here", messages=[{"role": "user", "content": "hi"}])
    bad = httpx.post(endpoint[0] + "/chat/completions", content=b"{not json",
                     headers={"content-type": "application/json"}, timeout=60)
    assert bad.status_code == 400
    body = bad.json()
    assert "message" in (body.get("error") or body)  # vLLM and OpenAI nest it under "error"
