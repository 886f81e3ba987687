"""The HTTP side of `agentrig serve`: a FastAPI app speaking OpenAI's (and vLLM's) chat-completions API.

Routes: `POST /v1/chat/completions` (plain or `stream: true`), `GET /v1/models`, `GET /health`, and with
runtime LoRA allowed, vLLM's `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`. Every error is
OpenAI's JSON shape (`{"error": {"message", "type", "param", "code"}}`): 400 for a request that is malformed,
of the wrong types, has unknown fields or breaks a limit on prompt or completion tokens; 404 for an unknown
model or route; 413 for a body over the size limit; 429 when the server already holds its most concurrent
requests; 500 when generation itself failed (the server goes on serving).

Generation happens on the `Engine` thread; a handler renders the prompt (`wire.prompt_messages`, then the
training `Renderer`), submits a job and awaits it. Streaming sends OpenAI chunks as tokens arrive: text
before a tool call as `content` deltas (a tail that could begin `<tool_call>` or a stop string is held back),
each tool call as one complete chunk once the reply is finished and parsed, then the finish reason and, on
request, `usage`. A client that disconnects mid-stream cancels its job, which leaves the batch at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentrig.errors import AgentrigError
from agentrig.policies.hf_policy import BASE
from agentrig.serve.engine import Completion, Engine, Job
from agentrig.serve.wire import (TOOL_CALL_OPEN, ChatRequest, WireError, error_body, forced_prefix, held_back,
                                 prompt_messages, reply_message)

log = logging.getLogger("agentrig.serve")


@dataclass
class Limits:
    """What one request may ask for, and how many may be in flight."""

    max_concurrent: int = 64
    max_prompt_tokens: int = 8192
    max_new_tokens: int = 2048  # the most a request may ask for
    default_max_tokens: int = 512  # when a request names no limit
    max_body_bytes: int = 4 * 1024 * 1024


@dataclass
class ServeState:
    """Everything the routes share: the engine, the rendering, the names served."""

    engine: Engine
    renderer: Any
    protocol: Any
    rules: Any  # HarnessConfig: the rules written into a system prompt built from `tools`
    note_spec: dict[str, Any] | None
    base_name: str
    adapter_dirs: dict[str, str]
    limits: Limits = field(default_factory=Limits)
    allow_runtime_lora: bool = False
    default_temperature: float = 0.0
    created: int = field(default_factory=lambda: int(time.time()))
    in_flight: int = 0

    def served(self) -> list[str]:
        """Model names a request may ask for: the base, then every adapter."""
        return [self.base_name, *self.adapter_dirs]


class LoadLora(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    lora_path: str = Field(min_length=1)


class UnloadLora(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None  # vLLM's clients may send it; unused


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
           code: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, kind, param, code), status_code=status)


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is answered 413 before any handler reads it."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_big = _error(413, f"the request body is over {self.limit} bytes; send fewer or shorter messages",
                         code="request_too_large")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await too_big(scope, receive, send)
            return
        seen = 0

        async def counted() -> dict[str, Any]:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise _TooLarge()
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await too_big(scope, receive, send)


class _TooLarge(Exception):
    """Raised inside `BodyLimit` when the bytes received pass the limit; answered 413."""


def create_app(state: ServeState) -> FastAPI:
    """The app for one `ServeState`."""
    app = FastAPI(title="agentrig serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = str(first.get("msg", "invalid request")).removeprefix("Value error, ")
        if first.get("type") == "json_invalid":
            message, where = "the request body is not valid JSON", ""
        elif first.get("type") == "extra_forbidden":
            message = f"unknown field {where!r}; agentrig serve takes OpenAI's chat-completions fields"
        elif where:
            message = f"{where}: {message}"
        return _error(400, message, param=where or None)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return _error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", kind)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed")
        return _error(500, f"the server failed on this request: {exc.__class__.__name__}: {exc}", "server_error")

    @app.get("/health")
    async def health() -> PlainTextResponse:
        return PlainTextResponse("ok")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards = [{"id": state.base_name, "object": "model", "created": state.created, "owned_by": "agentrig",
                  "root": state.base_name, "parent": None}]
        cards += [{"id": name, "object": "model", "created": state.created, "owned_by": "agentrig", "root": folder,
                   "parent": state.base_name} for name, folder in state.adapter_dirs.items()]
        return {"object": "list", "data": cards}

    @app.post("/v1/load_lora_adapter")
    async def load_lora(body: LoadLora) -> Any:
        if not state.allow_runtime_lora:
            return _error(404, "runtime LoRA loading is off; start agentrig serve with --allow-runtime-lora",
                          "not_found_error")
        if body.lora_name in state.served():
            return _error(400, f"the name {body.lora_name!r} is already served; unload it first or choose another")
        try:
            await asyncio.wrap_future(state.engine.control(
                lambda: state.engine.policy.load_adapter(body.lora_name, body.lora_path)))
        except AgentrigError as exc:
            return _error(400, str(exc), param="lora_path")
        state.adapter_dirs[body.lora_name] = body.lora_path
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora(body: UnloadLora) -> Any:
        if not state.allow_runtime_lora:
            return _error(404, "runtime LoRA loading is off; start agentrig serve with --allow-runtime-lora",
                          "not_found_error")
        if body.lora_name not in state.adapter_dirs:
            return _error(400, f"no adapter named {body.lora_name!r} is served; served adapters: "
                          f"{', '.join(state.adapter_dirs) or 'none'}", param="lora_name")
        state.adapter_dirs.pop(body.lora_name)  # new requests for it get a 404 from now on
        try:
            await asyncio.wrap_future(state.engine.control(lambda: state.engine.policy.unload_adapter(body.lora_name)))
        except AgentrigError as exc:
            return _error(400, str(exc), param="lora_name")
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    @app.post("/v1/chat/completions")
    async def chat(req: ChatRequest, request: Request) -> Any:
        try:
            job, prefix, parse_calls, forced = _job(state, req)
        except WireError as exc:
            return JSONResponse(exc.body(), status_code=exc.status)
        if state.in_flight >= state.limits.max_concurrent:
            return _error(429, f"the server is serving its limit of {state.limits.max_concurrent} concurrent requests; "
                          "retry shortly", "rate_limit_error", code="too_many_requests")
        state.in_flight += 1
        reply_id = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:
            return StreamingResponse(_stream(state, req, job, prefix, parse_calls, forced, reply_id),
                                     media_type="text/event-stream")
        try:
            completions: list[Completion] = await asyncio.wrap_future(state.engine.submit(job))
        finally:
            state.in_flight -= 1
        choices = []
        for k, c in enumerate(completions):
            message, reason, repairs = reply_message(prefix + c.text, state.protocol, parse_calls, forced)
            if repairs:
                log.info("repaired tool call(s) in %s: %s", reply_id, ", ".join(repairs))
            choices.append({"index": k, "message": message, "logprobs": None,
                            "finish_reason": reason if reason == "tool_calls" else c.finish_reason,
                            "stop_reason": c.stop_reason})
        used = sum(c.completion_tokens for c in completions)
        return {"id": reply_id, "object": "chat.completion", "created": int(time.time()), "model": req.model,
                "choices": choices, "usage": {"prompt_tokens": len(job.prompt), "completion_tokens": used,
                                              "total_tokens": len(job.prompt) + used}}

    return app


def _job(state: ServeState, req: ChatRequest) -> tuple[Job, str, bool, str | None]:
    """The engine job for a request, the forced-call prefix, whether calls are parsed, and the forced call."""
    if req.model not in state.served():
        raise WireError(404, f"The model `{req.model}` does not exist. Served models: {', '.join(state.served())}",
                        param="model", kind="not_found_error", code="model_not_found")
    adapter = BASE if req.model == state.base_name else req.model
    from agentrig.data.render import RenderError

    messages = prompt_messages(req, state.protocol, state.rules, state.note_spec)
    forced = req.forced()
    prefix = forced_prefix(forced)
    try:
        prompt = list(state.renderer.prompt_ids(messages)) + (state.renderer.encode(prefix) if prefix else [])
    except RenderError as exc:
        raise WireError(400, f"these messages cannot be rendered: {exc}", param="messages") from None
    limits = state.limits
    if len(prompt) > limits.max_prompt_tokens:
        raise WireError(400, f"the prompt is {len(prompt)} tokens, over this server's limit of "
                        f"{limits.max_prompt_tokens}; send a shorter conversation", param="messages",
                        code="context_length_exceeded")
    max_new = req.new_tokens(limits.default_max_tokens)
    if max_new > limits.max_new_tokens:
        raise WireError(400, f"max_tokens {max_new} is over this server's limit of {limits.max_new_tokens}",
                        param="max_tokens")
    temperature = state.default_temperature if req.temperature is None else req.temperature
    job = Job(prompt=prompt, adapter=adapter, max_new_tokens=max_new, temperature=temperature,
              top_p=1.0 if req.top_p is None else req.top_p, seed=req.seed, stop=list(req.stop or []), n=req.n)
    parse_calls = bool(req.tools) and req.tool_choice != "none"
    return job, prefix, parse_calls, forced


def _chunk(reply_id: str, model: str, choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> str:
    body: dict[str, Any] = {"id": reply_id, "object": "chat.completion.chunk", "created": int(time.time()),
                            "model": model, "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _stream(state: ServeState, req: ChatRequest, job: Job, prefix: str, parse_calls: bool, forced: str | None,
                  reply_id: str) -> AsyncIterator[str]:
    loop = asyncio.get_running_loop()
    updates: asyncio.Queue = asyncio.Queue()
    job.on_text = lambda row, text: loop.call_soon_threadsafe(updates.put_nowait, (row, text))
    markers = [TOOL_CALL_OPEN] if parse_calls else []
    markers += list(req.stop or [])
    sent = [0] * job.n
    future = asyncio.wrap_future(state.engine.submit(job))

    def shown(text: str) -> str:
        """The part of a row's text that is safe to stream now."""
        if parse_calls and TOOL_CALL_OPEN in text:
            return text[: text.find(TOOL_CALL_OPEN)]
        return text[: len(text) - held_back(text, markers)]

    try:
        for k in range(job.n):
            yield _chunk(reply_id, req.model, [{"index": k, "delta": {"role": "assistant", "content": ""},
                                                "logprobs": None, "finish_reason": None}])
        while not (future.done() and updates.empty()):
            getter = asyncio.ensure_future(updates.get())
            done, _ = await asyncio.wait({getter, future}, return_when=asyncio.FIRST_COMPLETED)
            if getter not in done:
                getter.cancel()
                continue
            row, text = getter.result()
            safe = shown(prefix + text)
            if len(safe) > sent[row]:
                yield _chunk(reply_id, req.model, [{"index": row, "delta": {"content": safe[sent[row]:]},
                                                    "logprobs": None, "finish_reason": None}])
                sent[row] = len(safe)
        completions: list[Completion] = await future
        for k, c in enumerate(completions):
            message, reason, _ = reply_message(prefix + c.text, state.protocol, parse_calls, forced)
            content = message.get("content") or ""
            if len(content) > sent[k]:
                yield _chunk(reply_id, req.model, [{"index": k, "delta": {"content": content[sent[k]:]},
                                                    "logprobs": None, "finish_reason": None}])
            for i, call in enumerate(message.get("tool_calls") or []):
                yield _chunk(reply_id, req.model, [{"index": k, "delta": {"tool_calls": [{"index": i, **call}]},
                                                    "logprobs": None, "finish_reason": None}])
            yield _chunk(reply_id, req.model, [{"index": k, "delta": {}, "logprobs": None,
                                                "finish_reason": reason if reason == "tool_calls" else c.finish_reason}])
        if req.stream_options is not None and req.stream_options.include_usage:
            used = sum(c.completion_tokens for c in completions)
            yield _chunk(reply_id, req.model, [], {"prompt_tokens": len(job.prompt), "completion_tokens": used,
                                                   "total_tokens": len(job.prompt) + used})
        yield "data: [DONE]\n\n"
    except Exception as exc:  # noqa: BLE001 - the status is already sent: the error goes in the stream
        yield f"data: {json.dumps(error_body(f'generation failed: {exc}', 'server_error'))}\n\n"
    finally:
        job.cancelled.set()  # a client gone mid-stream: its row leaves the batch at the next token
        state.in_flight -= 1
