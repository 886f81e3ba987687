"""`OpenAIPolicy`: a policy behind any OpenAI-compatible chat-completions endpoint.

Works with vLLM or SGLang (a LoRA adapter is chosen by the `model` name the server registered it under),
DeepSeek's API, or any server speaking `/v1/chat/completions`. By default (`tool_format="harness"`) the
harness's messages go as they are: they already carry the protocol's system prompt with the tool list, so
no `tools` field is sent and a server rendering with the training chat template sees the prompt a local
model sees. A model fine-tuned on agentrig's OpenAI export is asked in the export's form instead
(`tool_format="hermes"` or `"native"`, `agentrig.harness.protocol.wire_messages`, the one conversion both
use). When the server parsed tool calls itself (`message.tool_calls`), they are written back into the
protocol's text form (`get_protocol(...).assistant_text`) so the harness parses one format; otherwise the
message text is returned as is and the harness scans it for `<tool_call>` blocks.

`generate_batch` sends the requests concurrently from a thread pool. 429 and 5xx answers and connection
errors are retried with exponential backoff; other errors raise `OpenAIPolicyError` with the server's
message. Not covered: streaming, and token accounting when the server returns no `usage`.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import httpx

from agentrig.errors import AgentrigError
from agentrig.harness import PolicyReply, PolicyRequest
from agentrig.harness.protocol import WIRE_FORMATS, wire_messages
from agentrig.harness.trajectory import ToolCall

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
TOOL_RESPONSE_OPEN = "<tool_response>"


class OpenAIPolicyError(AgentrigError):
    """The endpoint refused a request or stayed unreachable after the retries."""


class OpenAIPolicy:
    """A policy that asks an OpenAI-compatible endpoint for each step.

    Args:
        base_url: the API root, e.g. `http://127.0.0.1:8000/v1` (`/chat/completions` is appended).
        model: the model name the server knows; for vLLM/SGLang LoRA serving, the adapter's name.
        api_key: the key; when None it is read from the environment variable `api_key_env`
            (no Authorization header is sent when that is unset, as local servers need none).
        api_key_env: the environment variable holding the key.
        temperature: 0.0 is greedy.
        max_tokens: completion limit per step.
        protocol: the harness protocol whose text form server-parsed tool calls are written back in.
        stop_at_response: send `<tool_response>` as a stop string, so a reply that starts writing a tool
            result itself ends there, as with HFPolicy; the turn otherwise runs to its end, several tool
            calls included. When the server reports that it stopped at that string (vLLM's `stop_reason`),
            the string is put back on the text so the harness classifies the self-written result.
        tool_format: how the messages and tools are sent. "harness": the harness's messages as they are, no
            `tools` field (for servers rendering with the training chat template: `agentrig serve`, vLLM or
            SGLang with `--chat-template`). "hermes": calls as `<tool_call>` text in the assistant turns,
            results as user turns in `<tool_response>` tags, no `tools` (a model tuned on
            `data build --format openai --openai-tools hermes`). "native": the `tools` field, native
            `tool_calls`, the system prompt without its tool list (a model tuned on `--openai-tools
            native`, or any model with native function calling). Needs protocol "hermes" unless "harness".
        concurrency: parallel requests in `generate_batch`.
        max_retries: retries of a 429/5xx/connection failure before giving up.
        backoff_s: first retry delay, doubled each retry.
        timeout_s: per-request timeout.
        seed: sent as `seed` when not None (servers that support it sample reproducibly).
        sleep: the delay function (tests pass one that does not sleep).
        transport: an httpx transport (tests may pass a mock); None uses the network.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float = 0.0,
        max_tokens: int = 512,
        protocol: str = "hermes",
        stop_at_response: bool = True,
        tool_format: str = "harness",
        concurrency: int = 8,
        max_retries: int = 4,
        backoff_s: float = 1.0,
        timeout_s: float = 120.0,
        seed: int | None = None,
        sleep: Callable[[float], None] = time.sleep,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise OpenAIPolicyError(f"--base-url must start with http:// or https://, got {base_url!r}")
        if concurrency < 1:
            raise OpenAIPolicyError(f"concurrency must be at least 1, got {concurrency}")
        if tool_format not in WIRE_FORMATS:
            raise OpenAIPolicyError(f"unknown tool format {tool_format!r}; choose one of: {', '.join(WIRE_FORMATS)}")
        if tool_format != "harness" and protocol != "hermes":
            raise OpenAIPolicyError(f"tool format {tool_format!r} converts Hermes messages, but the protocol is "
                                    f"{protocol!r}: use tool format 'harness' or protocol 'hermes'")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.protocol = protocol
        self.stop_at_response = stop_at_response
        self.tool_format = tool_format
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.seed = seed
        self._sleep = sleep
        key = api_key if api_key is not None else os.environ.get(api_key_env)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(headers=headers, timeout=timeout_s, transport=transport)

    # -- the policy interface ----------------------------------------------------------------
    def generate(self, request: PolicyRequest) -> PolicyReply:
        """One step: POST the request's messages and return the assistant turn in protocol text form."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": wire_messages(request.messages, self.tool_format),
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        if self.tool_format == "native":
            body["tools"] = request.tools
        if self.stop_at_response:
            body["stop"] = [TOOL_RESPONSE_OPEN]
        if self.seed is not None:
            body["seed"] = self.seed
        data = self._post("/chat/completions", body)
        return self._reply_from(data)

    def generate_batch(self, requests: list[PolicyRequest]) -> list[PolicyReply]:
        """All requests concurrently (up to `concurrency` at a time); replies in request order."""
        if len(requests) <= 1 or self.concurrency == 1:
            return [self.generate(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, len(requests))) as pool:
            return list(pool.map(self.generate, requests))

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    # -- internals ----------------------------------------------------------------------------
    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = self.base_url + path
        delay = self.backoff_s
        last_problem = ""
        for attempt in range(self.max_retries + 1):
            try:
                response = self._client.post(url, json=body)
            except httpx.TransportError as exc:
                last_problem = f"cannot reach {url}: {exc.__class__.__name__}: {exc}"
            else:
                if response.status_code == 200:
                    try:
                        return response.json()
                    except json.JSONDecodeError:
                        raise OpenAIPolicyError(
                            f"{url} answered 200 with a body that is not JSON: {response.text[:200]!r}"
                        ) from None
                last_problem = f"{url} answered {response.status_code}: {_server_message(response)}"
                if response.status_code not in RETRY_STATUS:
                    raise OpenAIPolicyError(last_problem + _hint(response.status_code, self.model))
            if attempt < self.max_retries:
                self._sleep(delay)
                delay *= 2
        raise OpenAIPolicyError(f"{last_problem} (gave up after {self.max_retries + 1} attempts)")

    def _reply_from(self, data: dict[str, Any]) -> PolicyReply:
        try:
            choice = data["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise OpenAIPolicyError(f"the server's answer has no choices[0].message: {str(data)[:300]}") from None
        content = message.get("content") or ""
        server_calls = message.get("tool_calls") or []
        if server_calls:
            text = calls_to_text(content, server_calls, self.protocol)
        else:
            text = content
            if self.stop_at_response and choice.get("stop_reason") == TOOL_RESPONSE_OPEN:
                text = text + TOOL_RESPONSE_OPEN  # the server dropped the stop string
        usage = data.get("usage") or {}
        return PolicyReply(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
        )


def calls_to_text(content: str, server_calls: list[dict[str, Any]], protocol: str = "hermes") -> str:
    """Write server-parsed `tool_calls` back in the protocol's text form, so the harness parses one format.

    A call whose `arguments` string is not JSON is written verbatim inside a tool-call block, so the
    harness's parser sees (and reports) the model's mistake instead of it vanishing here.
    """
    from agentrig.harness.protocol import get_protocol

    calls: list[ToolCall] = []
    broken: list[str] = []
    for i, raw in enumerate(server_calls):
        fn = raw.get("function") or {}
        name = str(fn.get("name", ""))
        arguments = fn.get("arguments", "{}")
        if isinstance(arguments, dict):
            parsed: Any = arguments
        else:
            try:
                parsed = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                parsed = None
        if isinstance(parsed, dict):
            calls.append(ToolCall(id=str(raw.get("id") or f"call_{i}"), name=name, arguments=parsed))
        else:
            broken.append(f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n{TOOL_CALL_CLOSE}')
    text = get_protocol(protocol).assistant_text(content, calls)
    return "\n".join([text, *broken]) if broken else text


def _server_message(response: httpx.Response) -> str:
    try:
        data = response.json()
    except json.JSONDecodeError:
        return response.text[:300] or "(empty body)"
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    return str(data)[:300]


def _hint(status: int, model: str) -> str:
    if status == 401:
        return " (set the API key in OPENAI_API_KEY or name its variable with --api-key-env)"
    if status == 404:
        return f" (check --base-url ends with /v1 and that the server serves model {model!r})"
    return ""
