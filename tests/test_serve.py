"""`agentrig serve` with the real `openai` client against the real server on a loopback port.

The model is a tiny Llama that has memorized a few replies (plain text, one call, text then a call, two calls,
an answer after a tool result), so every assertion is about exact output: the prompt the server renders (the
harness's, token for token), tool calls as vLLM's hermes parser writes them, streaming, adapters routed by
`model` and loaded at run time, OpenAI-shaped errors, batching of concurrent clients."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

openai = pytest.importorskip("openai")

from serve_helpers import (CALLED, MEMORIZED, OSLO_REPLY, PARIS_CALL, TOOLS, policy_for, random_adapter, serve,  # noqa: E402
                           server_prompt, train_memorized)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, smol_tokenizer) -> Path:
    return train_memorized(tmp_path_factory.mktemp("memorized"), smol_tokenizer)


@pytest.fixture(scope="module")
def adapter_dir(tmp_path_factory, model_dir) -> Path:
    return random_adapter(model_dir, tmp_path_factory.mktemp("adapter"))


@pytest.fixture(scope="module")
def server(model_dir, adapter_dir):
    running = serve(model_dir, {"alt": str(adapter_dir)}, allow_runtime_lora=True, max_body_bytes=256 * 1024)
    yield running
    running.stop()


@pytest.fixture()
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)


def _ask(client, k: int, **kwargs):
    body, _ = MEMORIZED[k]
    return client.chat.completions.create(model="tiny", **body, **kwargs)


# -- the prompt is the harness's, token for token ---------------------------------------------------------

def test_a_tools_request_renders_the_harness_prompt_token_for_token(server, smol_tokenizer) -> None:
    from agentrig.data.render import Renderer
    from agentrig.envs import load_env
    from agentrig.harness.loop import EpisodeRunner, HarnessConfig
    from agentrig.serve.app import _job
    from agentrig.serve.wire import ChatRequest

    env = load_env("datadesk")
    task = env.tasks("test", 1)[0]
    tools, state = env.setup(task)
    try:
        runner = EpisodeRunner(task, tools, HarnessConfig())
        harness_ids = Renderer(smol_tokenizer).prompt_ids(runner.context())
        openai_style = ChatRequest(model="tiny", messages=[{"role": "user", "content": task.prompt}],
                                   tools=[s for s in runner.episode.tools if s["function"]["name"] != "note"])
        harness_style = ChatRequest(model="tiny", messages=runner.context())
        for req in (openai_style, harness_style):
            job, prefix, _, _ = _job(server.state, req)
            assert job.prompt == list(harness_ids) and prefix == ""
    finally:
        env.close(state)
    # and the real client's usage says the server saw a prompt of that length
    reply = openai.OpenAI(base_url=server.url, api_key="x").chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": task.prompt}], max_tokens=2,
        tools=[s for s in runner.episode.tools if s["function"]["name"] != "note"])
    assert reply.usage.prompt_tokens == len(harness_ids)


# -- chat, tools, tool_choice --------------------------------------------------------------------------

def test_plain_chat(client) -> None:
    reply = _ask(client, 0)
    choice = reply.choices[0]
    assert choice.message.content == "Hello there, friend." and not choice.message.tool_calls
    assert choice.finish_reason == "stop" and reply.model == "tiny"
    assert reply.usage.completion_tokens == 6  # "Hello", " there", ",", " friend", "." and <|im_end|>
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_tool_calls_come_back_as_vllm_hermes_writes_them(client) -> None:
    one = _ask(client, 1)
    assert one.choices[0].finish_reason == "tool_calls" and one.choices[0].message.content is None
    (call,) = one.choices[0].message.tool_calls
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather" and call.function.arguments == '{"city": "Paris"}'
    text_first = _ask(client, 2).choices[0].message
    assert text_first.content == "Checking Oslo.\n"  # the text before the first <tool_call>, as vLLM returns it
    assert json.loads(text_first.tool_calls[0].function.arguments) == {"city": "Oslo"}
    two = _ask(client, 3).choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in two] == [
        ("get_weather", '{"city": "Rome"}'), ("get_time", '{"city": "Rome"}')]
    after_result = _ask(client, 4).choices[0]
    assert after_result.message.content == "It is sunny in Paris, 21 C." and after_result.finish_reason == "stop"


def test_tool_choice_required_named_and_none(client) -> None:
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        message = _ask(client, 1, tool_choice=choice).choices[0].message
        assert [(c.function.name, c.function.arguments) for c in message.tool_calls] == [("get_weather", '{"city": "Paris"}')]
    none = _ask(client, 1, tool_choice="none", max_tokens=8).choices[0].message
    assert not none.tool_calls and isinstance(none.content, str)  # no tool listing, no parsing
    named_unknown = pytest.raises(openai.BadRequestError, _ask, client, 1,
                                  tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "not in tools" in str(named_unknown.value)


def test_stop_strings_cut_the_reply(client) -> None:
    choice = _ask(client, 0, stop=[" there"]).choices[0]
    assert choice.message.content == "Hello" and choice.finish_reason == "stop"
    assert choice.model_extra.get("stop_reason") == " there"


def test_max_tokens_ends_with_length(client) -> None:
    choice = _ask(client, 0, max_tokens=2).choices[0]
    assert choice.finish_reason == "length" and "Hello there, friend.".startswith(choice.message.content)


# -- streaming -------------------------------------------------------------------------------------------

def _collect(stream):
    content, calls, reasons, usage, roles = "", [], [], None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            roles += [delta.role] if delta.role else []
            content += delta.content or ""
            for call in delta.tool_calls or []:
                json.loads(call.function.arguments)  # every tool-call chunk is complete JSON
                calls.append((call.index, call.id, call.function.name, call.function.arguments))
            reasons += [choice.finish_reason] if choice.finish_reason else []
    return content, calls, reasons, usage, roles


def test_streaming_text_and_tool_calls(client) -> None:
    content, calls, reasons, usage, roles = _collect(_ask(client, 0, stream=True, stream_options={"include_usage": True}))
    assert (content, calls, reasons, roles) == ("Hello there, friend.", [], ["stop"], ["assistant"])
    assert usage.completion_tokens == _ask(client, 0).usage.completion_tokens
    content, calls, reasons, usage, _ = _collect(_ask(client, 2, stream=True))
    assert content == "Checking Oslo.\n" and reasons == ["tool_calls"] and usage is None
    assert [(i, name, args) for i, _, name, args in calls] == [(0, "get_weather", '{"city": "Oslo"}')]
    _, calls, _, _, _ = _collect(_ask(client, 3, stream=True))
    assert [(i, name) for i, _, name, _ in calls] == [(0, "get_weather"), (1, "get_time")]


def test_a_client_that_disconnects_mid_stream_frees_its_slot(server, client) -> None:
    before = server.state.in_flight
    with httpx.stream("POST", server.url + "/chat/completions", timeout=30, json={
            "model": "tiny", "messages": [{"role": "user", "content": "tell me a long story"}],
            "stream": True, "max_tokens": 2000, "temperature": 1.0, "seed": 3}) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and '"content": ""' not in line:
                break  # one token arrived: go away
    for _ in range(200):
        if server.state.in_flight == before:
            break
        threading.Event().wait(0.05)
    assert server.state.in_flight == before
    assert _ask(client, 0).choices[0].message.content == "Hello there, friend."


# -- adapters ----------------------------------------------------------------------------------------------

def test_models_lists_the_base_and_adapters_and_model_picks_the_adapter(server, client, model_dir, adapter_dir) -> None:
    from agentrig.harness import PolicyRequest
    from agentrig.harness.trajectory import TaskSpec

    cards = {m.id: m for m in client.models.list().data}
    assert cards["tiny"].model_extra["parent"] is None and cards["alt"].model_extra["parent"] == "tiny"
    body, reply = MEMORIZED[0]
    served = client.chat.completions.create(model="alt", max_tokens=64, **body).choices[0].message.content
    local = policy_for(model_dir, {"alt": str(adapter_dir)})
    messages = [{"role": "user", "content": "hi"}]
    expected = local.generate(PolicyRequest(messages=messages, tools=[], task=TaskSpec(id="x", prompt="hi"), step=0)).text
    assert served == expected and served != reply
    assert client.chat.completions.create(model="tiny", **body).choices[0].message.content == reply
    missing = pytest.raises(openai.NotFoundError, client.chat.completions.create, model="nope", **body)
    assert "tiny" in str(missing.value) and "alt" in str(missing.value)


def test_runtime_lora_load_and_unload(server, client, adapter_dir, tmp_path) -> None:
    post = lambda path, body: httpx.post(server.url + path, json=body, timeout=60)  # noqa: E731
    loaded = post("/load_lora_adapter", {"lora_name": "alt2", "lora_path": str(adapter_dir)})
    assert loaded.status_code == 200, loaded.text
    body, _ = MEMORIZED[0]
    assert (client.chat.completions.create(model="alt2", **body).choices[0].message.content
            == client.chat.completions.create(model="alt", **body).choices[0].message.content)
    assert "alt2" in {m.id for m in client.models.list().data}
    for bad in ({"lora_name": "alt2", "lora_path": str(adapter_dir)},  # name in use
                {"lora_name": "x", "lora_path": str(tmp_path / "missing")},  # not an adapter folder
                {"lora_name": "y", "lora_path": str(_wide_adapter(tmp_path))}):  # trained on another base
        refused = post("/load_lora_adapter", bad)
        assert refused.status_code == 400 and refused.json()["error"]["message"], refused.text
    assert client.chat.completions.create(model="alt", **body).choices[0].message.content  # still serving
    assert post("/unload_lora_adapter", {"lora_name": "alt2"}).status_code == 200
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="alt2", **body)
    assert post("/unload_lora_adapter", {"lora_name": "alt2"}).status_code == 400


def _wide_adapter(tmp_path: Path) -> Path:
    """An adapter trained on a base with another hidden size."""
    from agentrig.models import tiny_random_model

    wide = tmp_path / "wide-base"
    tiny_random_model(1000, hidden_size=96).save_pretrained(wide)
    return random_adapter(wide, tmp_path / "wide-adapter")


def test_runtime_lora_is_off_unless_allowed(model_dir, adapter_dir) -> None:
    running = serve(model_dir)
    try:
        answer = httpx.post(running.url + "/load_lora_adapter", json={"lora_name": "a", "lora_path": str(adapter_dir)})
        assert answer.status_code == 404 and "--allow-runtime-lora" in answer.json()["error"]["message"]
    finally:
        running.stop()


# -- bad input never takes the server down -------------------------------------------------------------------

BAD_BODIES = [
    (b"{not json", 400, "not valid JSON"),
    (json.dumps({"model": "tiny", "messages": []}), 400, "messages"),
    (json.dumps({"model": "tiny", "messages": "hello"}), 400, "messages"),
    (json.dumps({"model": "tiny", "messages": [{"role": "user", "content": 5}]}), 400, "content"),
    (json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "a"}], "foo": 1}), 400, "unknown field"),
    (json.dumps({"model": "tiny", "messages": [{"role": "wizard", "content": "a"}]}), 400, "role"),
    (json.dumps({"model": "tiny", "messages": [{"role": "tool", "content": "a", "tool_call_id": "zz"}]}), 400,
     "matches no earlier"),
    (json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "a"}], "max_tokens": 10 ** 6}), 400,
     "max_tokens"),
    (json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "a"}], "temperature": "hot"}), 400,
     "temperature"),
    (json.dumps({"model": "tiny", "messages": [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{broken"}}]}]}), 400, "not JSON"),
    (json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "x" * 300_000}]}), 413, "bytes"),
    (json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "word " * 40_000}]}), 400, "tokens"),
]


@pytest.mark.parametrize("body,status,says", BAD_BODIES, ids=[f"{s}-{w}" for _, s, w in BAD_BODIES])
def test_bad_requests_get_openai_errors(server, client, body, status, says) -> None:
    answer = httpx.post(server.url + "/chat/completions", content=body, headers={"content-type": "application/json"},
                        timeout=60)
    assert answer.status_code == status, answer.text
    error = answer.json()["error"]
    assert says.lower() in error["message"].lower() and error["type"]
    assert _ask(client, 0).choices[0].message.content == "Hello there, friend."  # and it goes on serving


def test_the_openai_client_sees_typed_errors(client) -> None:
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}],
                                       extra_body={"unknown_option": True})
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("nothing-here")


def test_over_the_concurrency_limit_is_429(model_dir) -> None:
    running = serve(model_dir, max_concurrent=1)
    try:
        release = threading.Event()
        running.state.engine.control(release.wait)  # the engine is busy: the next request stays in flight
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(httpx.post, running.url + "/chat/completions", timeout=60,
                                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
            for _ in range(200):
                if running.state.in_flight == 1:
                    break
                threading.Event().wait(0.02)
            second = httpx.post(running.url + "/chat/completions", timeout=60,
                                json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
            assert second.status_code == 429 and second.json()["error"]["type"] == "rate_limit_error"
            release.set()
            assert first.result().status_code == 200
    finally:
        running.stop()


# -- concurrent clients are batched together ---------------------------------------------------------------------

def test_concurrent_clients_are_batched_and_each_gets_its_own_reply(server) -> None:
    batches_before = server.state.engine.batches
    release = threading.Event()
    server.state.engine.control(release.wait)  # hold the engine so all requests queue up together

    def one(k: int):
        body, _ = MEMORIZED[k % len(MEMORIZED)]
        c = openai.OpenAI(base_url=server.url, api_key="x", max_retries=0)
        return c.chat.completions.create(model="tiny", **body).choices[0].message

    with ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(one, k) for k in range(10)]
        for _ in range(200):
            if server.state.in_flight >= 10:
                break
            threading.Event().wait(0.02)
        release.set()
        messages = [f.result() for f in futures]
    for k, message in enumerate(messages):
        _, reply = MEMORIZED[k % len(MEMORIZED)]
        got = message.content if not message.tool_calls else None
        if reply.startswith("<tool_call>"):
            assert message.tool_calls and got is None
        elif "<tool_call>" in reply:
            assert message.content == reply[: reply.find("<tool_call>")]
        else:
            assert got == reply
    assert server.state.engine.batches - batches_before < 10  # fewer batches than requests: they shared
    assert server.state.engine.largest_batch >= 4


def test_seeded_sampling_is_reproducible(client) -> None:
    kwargs = {"temperature": 1.0, "seed": 11, "max_tokens": 12}
    body = {"messages": [{"role": "user", "content": "say something new"}]}
    first = client.chat.completions.create(model="tiny", **body, **kwargs).choices[0].message.content
    again = client.chat.completions.create(model="tiny", **body, **kwargs).choices[0].message.content
    assert first == again
    several = client.chat.completions.create(model="tiny", **body, n=3, **kwargs)
    assert [c.index for c in several.choices] == [0, 1, 2]


# -- agentrig eval through the server equals the in-process eval ----------------------------------------------------

def test_eval_through_the_server_equals_the_in_process_eval(model_dir, adapter_dir) -> None:
    from agentrig.evals.evaluate import EvalConfig, run_eval
    from agentrig.policies.openai_policy import OpenAIPolicy

    config = EvalConfig(env="datadesk", splits=["test"], limit=3, faults=0.3, seed=0)
    local = run_eval(policy_for(model_dir, {"alt": str(adapter_dir)}, max_new_tokens=24), config)
    running = serve(model_dir, {"alt": str(adapter_dir)})
    try:
        remote = run_eval(OpenAIPolicy(running.url, "alt", max_tokens=24, max_retries=0), config)
    finally:
        running.stop()

    def steps(result):
        return [[(s.raw_output, [c.name for c in s.calls]) for s in e.steps] for e in result.episodes]

    assert steps(remote) == steps(local)
    assert [e.success for e in remote.episodes] == [e.success for e in local.episodes]
    assert remote.metrics.to_dict()["completion"] == local.metrics.to_dict()["completion"]


# -- a LangGraph agent on the served model (examples/langgraph_agent.py) --------------------------------------------

def test_the_langgraph_example_runs_an_agent_loop_on_the_server(server) -> None:
    pytest.importorskip("langgraph")
    import importlib.util

    spec = importlib.util.spec_from_file_location("langgraph_agent", Path(__file__).parents[1] / "examples" / "langgraph_agent.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    executed = []

    def execute(name, arguments):
        executed.append((name, arguments))
        return "sunny, 21 C"

    messages = example.run_agent(server.url, "tiny", "What is the weather in Paris?", example.langchain_tools(TOOLS, execute))
    assert executed == [("get_weather", {"city": "Paris"})]
    assert [m.type for m in messages] == ["human", "ai", "tool", "ai"]
    assert messages[-1].content == "It is sunny in Paris, 21 C."
