"""The OpenAI chat-completions wire format: requests checked field by field, messages turned into the harness's
rendering input, and model text turned into OpenAI `tool_calls` as vLLM's `--tool-call-parser hermes` writes them.

A request is a `ChatRequest` (pydantic, unknown fields refused). `prompt_messages` gives the messages the
`Renderer` renders: when the request carries `tools` (and `tool_choice` is not "none"), the system prompt is
the harness's own (`OutputProtocol.system_prompt` over those tools, plus the `note` tool when the harness rules
have memory on, as at training); a system message the client sent follows it after a blank line. Without
`tools` the messages are rendered as sent, which is what `OpenAIPolicy` (and so `agentrig eval --base-url`)
sends: the harness's system prompt already lists the tools.

`reply_message` parses the generated text with the harness protocol's parser (strict JSON first, then the
recorded repairs) and writes each call as OpenAI's `{"id", "type": "function", "function": {"name",
"arguments"}}`, `arguments` a JSON string from `json.dumps(..., ensure_ascii=False)`; `content` is the text
before the first `<tool_call>`, or None when that is empty: byte for byte what vLLM's hermes parser returns
for text it can parse. Not covered: content parts other than text (images, audio), `logprobs`, `response_format`.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

TOOL_CALL_OPEN = "<tool_call>"


class WireError(Exception):
    """A request the server refuses, with the HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict[str, Any]:
        """OpenAI's error JSON."""
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`, the shape OpenAI and vLLM answer errors in."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


Content = Union[str, list[TextPart], None]


class FunctionCall(_Strict):
    name: str
    arguments: str


class ToolCallIn(_Strict):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Content = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    refusal: str | None = None  # sent back by some clients on assistant turns; ignored

    def text(self) -> str:
        """The content as one string (text parts joined)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class FunctionSpec(_Strict):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolSpec(_Strict):
    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(_Strict):
    include_usage: bool = False


class ChatRequest(_Strict):
    """`POST /v1/chat/completions`; fields OpenAI defines that this server cannot honour are refused, not ignored."""

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: Union[Literal["auto", "none", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    n: int = Field(default=1, ge=1, le=8)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logprobs: bool | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: Any) -> list[str]:
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 4 or any(not s for s in stops):
            raise ValueError("stop takes at most 4 non-empty strings")
        return stops

    @model_validator(mode="after")
    def _supported(self) -> "ChatRequest":
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise ValueError(f"{name} is not supported by agentrig serve; leave it unset or 0")
        if self.logprobs:
            raise ValueError("logprobs are not supported by agentrig serve; leave logprobs unset")
        if self.tool_choice is not None and self.tool_choice != "none" and not self.tools:
            raise ValueError("tool_choice needs tools: send the tools the model may call")
        if isinstance(self.tool_choice, NamedToolChoice):
            names = [t.function.name for t in self.tools or []]
            if self.tool_choice.function.name not in names:
                raise ValueError(f"tool_choice names {self.tool_choice.function.name!r}, which is not in tools "
                                 f"({', '.join(names)})")
        seen: set[str] = set()
        for k, m in enumerate(self.messages):
            for call in m.tool_calls or []:
                if m.role != "assistant":
                    raise ValueError(f"messages[{k}]: only assistant messages carry tool_calls")
                seen.add(call.id)
            if m.role == "tool":
                if not m.tool_call_id:
                    raise ValueError(f"messages[{k}]: a tool message needs the tool_call_id of the call it answers")
                if m.tool_call_id not in seen:
                    raise ValueError(f"messages[{k}]: tool_call_id {m.tool_call_id!r} matches no earlier assistant "
                                     "tool call")
        return self

    def new_tokens(self, default: int) -> int:
        """The completion limit: `max_completion_tokens`, else `max_tokens`, else the server's default."""
        return self.max_completion_tokens or self.max_tokens or default

    def forced(self) -> str | None:
        """The call a `tool_choice` forces: "*" for required, the tool's name for a named one, else None."""
        if self.tool_choice == "required":
            return "*"
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.function.name
        return None


def prompt_messages(req: ChatRequest, protocol: Any, rules: Any, note_spec: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The messages to render (see the module docstring); tool calls keep their JSON-string arguments."""
    out: list[dict[str, Any]] = []
    system_parts: list[str] = []
    listed = bool(req.tools) and req.tool_choice != "none"
    for k, m in enumerate(req.messages):
        if listed and m.role in ("system", "developer"):
            system_parts.append(m.text())
            continue
        role = "system" if m.role == "developer" else m.role
        msg: dict[str, Any] = {"role": role, "content": m.text()}
        if m.tool_calls:
            for call in m.tool_calls:
                try:
                    args = json.loads(call.function.arguments or "{}")
                except json.JSONDecodeError as exc:
                    raise WireError(400, f"messages[{k}]: tool call {call.function.name!r} has arguments that are not "
                                    f"JSON ({exc})", param=f"messages[{k}].tool_calls") from None
                if not isinstance(args, dict):
                    raise WireError(400, f"messages[{k}]: tool call arguments must be a JSON object",
                                    param=f"messages[{k}].tool_calls")
            msg["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments or "{}"}}
                                 for c in m.tool_calls]
        if m.role == "tool":
            msg["tool_call_id"] = m.tool_call_id
        out.append(msg)
    if listed:
        specs = [t.model_dump(exclude_none=True) for t in req.tools or []]
        if note_spec is not None and all(s["function"]["name"] != note_spec["function"]["name"] for s in specs):
            specs.append(note_spec)
        system = protocol.system_prompt(specs, rules)
        extra = "\n\n".join(p for p in system_parts if p)
        out.insert(0, {"role": "system", "content": f"{system}\n\n{extra}" if extra else system})
    return out


def forced_prefix(forced: str | None) -> str:
    """The text a forced tool call's generation starts from (it ends where the training tokenization has a token
    boundary: after `<tool_call>\\n`, or after `"arguments":` for a named tool)."""
    if forced is None:
        return ""
    if forced == "*":
        return f"{TOOL_CALL_OPEN}\n"
    return f'{TOOL_CALL_OPEN}\n{{"name": {json.dumps(forced)}, "arguments":'


def call_id() -> str:
    """A tool call id in vLLM's form."""
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def reply_message(text: str, protocol: Any, parse_calls: bool, forced: str | None = None) -> tuple[dict[str, Any], str, list[str]]:
    """The assistant message for generated `text`, whether it holds tool calls, and the repairs the parser made."""
    if not parse_calls or TOOL_CALL_OPEN not in text:
        return {"role": "assistant", "content": text, "tool_calls": []}, "stop", []
    parsed = protocol.parse(text)
    calls = parsed.calls[:1] if forced not in (None, "*") else parsed.calls
    if not calls:  # nothing parseable: the text goes back as it is, as vLLM does
        return {"role": "assistant", "content": text, "tool_calls": []}, "stop", []
    content = text[: text.find(TOOL_CALL_OPEN)]
    message = {
        "role": "assistant",
        "content": content if content else None,
        "tool_calls": [{"id": call_id(), "type": "function",
                        "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                       for c in calls],
    }
    return message, "tool_calls", [r.kind for r in parsed.repairs]


def held_back(text: str, markers: list[str]) -> int:
    """How many trailing characters of `text` could be the start of one of `markers` (not streamed yet)."""
    keep = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), 0, -1):
            if text.endswith(marker[:n]):
                keep = max(keep, n)
                break
    return keep
