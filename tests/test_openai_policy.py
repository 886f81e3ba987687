"""OpenAIPolicy against a real local HTTP server speaking the chat-completions API on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator

import pytest

from agentrig.harness import HarnessConfig, PolicyRequest, run_episode
from agentrig.policies.openai_policy import OpenAIPolicy, OpenAIPolicyError
from agentrig.harness.tools import Tool, ToolSet
from agentrig.harness.trajectory import TaskSpec

Handler = Callable[[dict[str, Any], dict[str, str]], tuple[int, dict[str, Any]]]


class FakeServer:
    """A chat-completions server whose answers come from a Python function; records every request."""

    def __init__(self, answer: Handler) -> None:
        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        server = self

        class _H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                server.requests.append(body)
                server.headers.append(dict(self.headers))
                if self.path != "/v1/chat/completions":
                    status, payload = 404, {"error": {"message": f"no route {self.path}"}}
                else:
                    status, payload = server.answer(body, dict(self.headers))
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return None  # keep test output clean

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture()
def serve() -> Iterator[Callable[[Handler], FakeServer]]:
    servers: list[FakeServer] = []

    def start(answer: Handler) -> FakeServer:
        servers.append(FakeServer(answer))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _completion(content: str | None, tool_calls: list[dict[str, Any]] | None = None, finish: str = "stop") -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 5},
    }


def _request(text: str = "how many units of A?") -> PolicyRequest:
    messages = [{"role": "system", "content": "SYSTEM PROMPT"}, {"role": "user", "content": text}]
    return PolicyRequest(messages=messages, tools=[], task=TaskSpec(id=text, prompt=text), step=0)


def test_sends_the_harness_messages_and_model_name(serve, monkeypatch) -> None:
    monkeypatch.setenv("MY_KEY", "sk-test")
    server = serve(lambda body, headers: (200, _completion("The answer is 4.")))
    policy = OpenAIPolicy(server.url, "my-lora", api_key_env="MY_KEY")
    reply = policy.generate(_request())
    assert reply.text == "The answer is 4."
    assert (reply.prompt_tokens, reply.completion_tokens) == (11, 5)
    body = server.requests[0]
    assert body["model"] == "my-lora"
    assert body["messages"] == _request().messages  # the same system prompt, no separate tools field
    assert "tools" not in body
    assert body["stop"] == ["<tool_response>"] and body["temperature"] == 0.0
    assert server.headers[0]["Authorization"] == "Bearer sk-test"


def test_server_parsed_tool_calls_become_protocol_text(serve) -> None:
    calls = [{"id": "x1", "type": "function", "function": {"name": "stock_level", "arguments": '{"sku": "A"}'}}]
    server = serve(lambda body, headers: (200, _completion("Checking.", calls, finish="tool_calls")))
    reply = OpenAIPolicy(server.url, "m").generate(_request())
    assert reply.text == 'Checking.\n<tool_call>\n{"name": "stock_level", "arguments": {"sku": "A"}}\n</tool_call>'


def test_a_turn_with_several_text_calls_comes_back_whole(serve) -> None:
    text = ('<tool_call>\n{"name": "stock_level", "arguments": {"sku": "A"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "stock_level", "arguments": {"sku": "B"}}\n</tool_call>')
    server = serve(lambda body, headers: (200, _completion(text)))
    reply = OpenAIPolicy(server.url, "m").generate(_request())
    assert reply.text == text


def test_a_self_written_tool_response_gets_its_stop_string_back(serve) -> None:
    text = '<tool_call>\n{"name": "stock_level", "arguments": {"sku": "A"}}\n</tool_call>\n'
    answer = _completion(text)
    answer["choices"][0]["stop_reason"] = "<tool_response>"  # what vLLM reports for a matched stop string
    server = serve(lambda body, headers: (200, answer))
    reply = OpenAIPolicy(server.url, "m").generate(_request())
    assert reply.text == text + "<tool_response>"
    from agentrig.harness.protocol import get_protocol

    parsed = get_protocol("hermes").parse(reply.text)
    assert [d.kind for d in parsed.defects] == ["self_written_response"] and len(parsed.calls) == 1


def test_retries_429_and_5xx_with_backoff(serve) -> None:
    statuses = iter([429, 503])

    def answer(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        status = next(statuses, 200)
        return (status, {"error": {"message": "busy"}}) if status != 200 else (200, _completion("ok"))

    server = serve(answer)
    delays: list[float] = []
    policy = OpenAIPolicy(server.url, "m", backoff_s=0.5, sleep=delays.append)
    assert policy.generate(_request()).text == "ok"
    assert delays == [0.5, 1.0]
    assert len(server.requests) == 3


def test_errors_are_clear(serve) -> None:
    server = serve(lambda body, headers: (400, {"error": {"message": "model 'nope' does not exist"}}))
    with pytest.raises(OpenAIPolicyError, match="answered 400: model 'nope' does not exist"):
        OpenAIPolicy(server.url, "nope").generate(_request())
    with pytest.raises(OpenAIPolicyError, match="answered 404.*ends with /v1"):
        OpenAIPolicy(server.url.removesuffix("/v1"), "m", sleep=lambda s: None).generate(_request())
    always_busy = serve(lambda body, headers: (500, {"error": {"message": "boom"}}))
    with pytest.raises(OpenAIPolicyError, match="boom.*gave up after 3 attempts"):
        OpenAIPolicy(always_busy.url, "m", max_retries=2, sleep=lambda s: None).generate(_request())
    with pytest.raises(OpenAIPolicyError, match="must start with http"):
        OpenAIPolicy("localhost:8000", "m")


def test_generate_batch_sends_requests_concurrently(serve) -> None:
    barrier = threading.Barrier(4, timeout=10)  # only passes when four requests are in flight together

    def answer(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        barrier.wait()
        return 200, _completion("echo: " + body["messages"][-1]["content"])

    server = serve(answer)
    replies = OpenAIPolicy(server.url, "m", concurrency=4).generate_batch([_request(f"q{i}") for i in range(4)])
    assert [r.text for r in replies] == [f"echo: q{i}" for i in range(4)]


def test_drives_a_whole_episode_through_the_harness(serve) -> None:
    def stock_level(sku: str) -> dict:
        return {"sku": sku, "units": 4}

    schema = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
    tools = ToolSet([Tool.from_schema("stock_level", "Units in stock.", schema, stock_level)])
    call = [{"id": "c", "type": "function", "function": {"name": "stock_level", "arguments": '{"sku": "A"}'}}]

    def answer(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        if body["messages"][-1]["role"] == "user":
            return 200, _completion(None, call, finish="tool_calls")
        return 200, _completion("There are 4 units of A.")

    server = serve(answer)
    task = TaskSpec(id="t", prompt="How many units of A?")
    episode = run_episode(task, tools, OpenAIPolicy(server.url, "m"), HarnessConfig(memory=False))
    assert episode.termination == "final_answer"
    assert episode.final_answer == "There are 4 units of A."
    assert episode.steps[0].results[0].ok and '"units": 4' in episode.steps[0].results[0].content
    second = server.requests[1]["messages"]
    assert second[0]["content"] == episode.system_prompt
    assert second[-1]["role"] == "tool"


def _episode_requests(serve, tool_format: str, first_reply: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    """A two-step episode (one call, then the answer) through the harness; the episode and the requests sent."""
    def stock_level(sku: str) -> dict:
        return {"sku": sku, "units": 4}

    schema = {"type": "object", "properties": {"sku": {"type": "string"}}, "required": ["sku"]}
    tools = ToolSet([Tool.from_schema("stock_level", "Units in stock.", schema, stock_level)])

    def answer(body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        return 200, first_reply if len(server.requests) == 1 else _completion("There are 4 units of A.")

    server = serve(answer)
    policy = OpenAIPolicy(server.url, "m", tool_format=tool_format)
    episode = run_episode(TaskSpec(id="t", prompt="How many units of A?"), tools, policy, HarnessConfig(memory=False))
    assert episode.termination == "final_answer" and episode.steps[0].results[0].ok
    return episode, server.requests


def test_native_tool_format_sends_tools_and_native_calls(serve) -> None:
    from agentrig.harness.protocol import native_system_prompt

    call = [{"id": "c", "type": "function", "function": {"name": "stock_level", "arguments": '{"sku": "A"}'}}]
    episode, requests = _episode_requests(serve, "native", _completion(None, call, finish="tool_calls"))
    assert requests[0]["tools"] == episode.tools and requests[1]["tools"] == episode.tools
    system = requests[1]["messages"][0]["content"]
    assert system == native_system_prompt(episode.system_prompt)
    assert "<tools>" not in system and "<tool_call>" not in system and "Rules:" in system
    assistant, tool = requests[1]["messages"][2:]
    assert assistant["tool_calls"][0]["function"] == {"name": "stock_level", "arguments": '{"sku": "A"}'}
    assert tool == {"role": "tool", "tool_call_id": assistant["tool_calls"][0]["id"], "content": tool["content"]}


def test_hermes_tool_format_sends_text_both_ways(serve) -> None:
    text = '<tool_call>\n{"name": "stock_level", "arguments": {"sku": "A"}}\n</tool_call>'
    episode, requests = _episode_requests(serve, "hermes", _completion(text))
    assert all("tools" not in r for r in requests)
    system, user, assistant, result = requests[1]["messages"]
    assert system["content"] == episode.system_prompt and user["role"] == "user"
    assert assistant == {"role": "assistant", "content": text}  # the call as the model wrote it, no tool_calls
    assert result == {"role": "user", "content": f"<tool_response>\n{episode.steps[0].results[0].content}\n</tool_response>"}


def test_tool_format_errors_are_clear() -> None:
    from agentrig.harness.memory import with_memory
    from agentrig.harness.protocol import get_protocol, native_system_prompt

    with pytest.raises(OpenAIPolicyError, match="choose one of: harness, hermes, native"):
        OpenAIPolicy("http://127.0.0.1:9/v1", "m", tool_format="openai")
    with pytest.raises(OpenAIPolicyError, match="converts Hermes messages, but the protocol is 'llama31'"):
        OpenAIPolicy("http://127.0.0.1:9/v1", "m", tool_format="native", protocol="llama31")
    prompt = get_protocol("llama31").system_prompt([], HarnessConfig())
    with pytest.raises(ValueError, match="not the Hermes protocol's"):
        native_system_prompt(prompt)
    hermes = with_memory(get_protocol("hermes").system_prompt([], HarnessConfig()), ["A-1 has 7 units"])
    assert native_system_prompt(hermes).endswith("- A-1 has 7 units")  # the memory area stays
