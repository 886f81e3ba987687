"""Tools: definition from typed functions or JSON schemas, per-field validation, allowlists, safe execution.

A `Tool` has one source of truth for its name, description and JSON schema. `ToolSet` holds every tool
an environment knows plus the task's allowlist: a call outside the allowlist is never executed.
Execution never raises for the tool's own failures: exceptions, timeouts, unserializable results and
huge outputs all become a `ToolResult` with a readable observation, even a tool's SystemExit (an argparse
CLI wrapped as a tool exits on bad arguments). The user's Ctrl-C is not the model's business: a
KeyboardInterrupt, while the harness waits or raised in the tool, propagates and stops the run.
Arguments are validated with `jsonschema` and nothing is coerced.

Two ways to run a call (`Tool.isolation`):
- `thread` (the default): on a daemon worker thread. A call that outlives its timeout is abandoned and keeps
  its thread; at most `MAX_HUNG_PER_TOOL` such calls of one tool (and `MAX_HUNG` in all) may be running,
  after that the tool is not started again until one finishes (the model is told to use another tool).
- `process`: in a forked child process that is killed at the timeout, so a hung or crashing tool (even a
  segfault) costs nothing after its call. The child's changes to Python objects are lost with it: use it
  for tools whose effects live outside the process (files, databases on disk, network services).
`Tool.side_effects` declares a tool that changes the world; fault injection then never runs it and
corrupts its output (which would invite a duplicate write). `Tool.inject_faults=False` keeps fault
injection off a tool entirely (an MCP tool nobody marked read-only). Not handled here: fault injection
(`faults.py`) and the recovery rule (`loop.py`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import inspect
import json
import os
import queue
import re
import sys
import threading
import time
import types
import typing
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Literal, Union, get_args, get_origin

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from agentrig.errors import AgentrigError
from agentrig.harness.protocol import feedback
from agentrig.harness.trajectory import FieldError, ToolCall, ToolResult

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MAX_OUTPUT_CHARS = 4000
MAX_HUNG_PER_TOOL = 4  # timed-out calls of one tool still running before it is not started again
MAX_HUNG = 32  # the same, over all tools of the process
ISOLATIONS = ("thread", "process")


class ToolDefinitionError(AgentrigError):
    """A tool cannot be defined (missing type hints, docstring, or an invalid schema)."""


@dataclass
class Tool:
    """A callable the model may use, with its JSON schema."""

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., Any]
    timeout_s: float = DEFAULT_TIMEOUT_S
    side_effects: bool = False  # it changes the world: faults only ever stop it before it runs
    isolation: str = "thread"  # or "process": a forked child, killed at the timeout (see the module docstring)
    inject_faults: bool = True  # False: fault injection never touches this tool (MCP tools not marked read-only)
    validation_schema: dict[str, Any] | None = None  # validate against this instead of `parameters` (the
    # original of a schema shown to the model in a simpler form, e.g. an MCP inputSchema with $ref resolved)

    def __post_init__(self) -> None:
        if self.isolation not in ISOLATIONS:
            raise ToolDefinitionError(f"tool {self.name!r}: isolation must be one of {', '.join(ISOLATIONS)}, "
                                      f"got {self.isolation!r}")
        if self.isolation == "process" and not hasattr(os, "fork"):
            raise ToolDefinitionError(f"tool {self.name!r}: isolation='process' needs os.fork (Linux or macOS)")
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}", self.name):
            raise ToolDefinitionError(f"tool name {self.name!r} must be 1-64 letters, digits, '_', '.' or '-'")
        if not self.description.strip():
            raise ToolDefinitionError(f"tool {self.name!r} needs a description")
        try:
            Draft202012Validator.check_schema(self.parameters)
        except SchemaError as exc:
            raise ToolDefinitionError(f"tool {self.name!r} has an invalid JSON schema: {exc.message}") from None
        if self.parameters.get("type") != "object":
            raise ToolDefinitionError(f"tool {self.name!r}: the parameters schema must have type 'object'")
        if self.validation_schema is not None:
            try:
                Draft202012Validator.check_schema(self.validation_schema)
            except SchemaError as exc:
                raise ToolDefinitionError(f"tool {self.name!r} has an invalid validation schema: {exc.message}") from None
        self._validator = Draft202012Validator(self.validation_schema if self.validation_schema is not None
                                               else self.parameters)

    @classmethod
    def from_schema(
        cls,
        name: str,
        description: str,
        parameters: dict[str, Any],
        fn: Callable[..., Any],
        timeout_s: float = DEFAULT_TIMEOUT_S,
        side_effects: bool = False,
        isolation: str = "thread",
    ) -> "Tool":
        """Define a tool from a name, a description, a JSON schema and a callable taking keyword arguments."""
        return cls(name=name, description=description, parameters=parameters, fn=fn, timeout_s=timeout_s,
                   side_effects=side_effects, isolation=isolation)

    @classmethod
    def from_openai(cls, spec: dict[str, Any], fn: Callable[..., Any], timeout_s: float = DEFAULT_TIMEOUT_S,
                    side_effects: bool = False, isolation: str = "thread") -> "Tool":
        """Define a tool from an OpenAI function spec (`{"type": "function", "function": {...}}` or the inner dict)."""
        fn_spec = spec.get("function", spec)
        if "name" not in fn_spec:
            raise ToolDefinitionError(f"an OpenAI function spec needs a 'name': {json.dumps(spec)[:200]}")
        return cls(
            name=fn_spec["name"],
            description=fn_spec.get("description", ""),
            parameters=fn_spec.get("parameters") or {"type": "object", "properties": {}},
            fn=fn,
            timeout_s=timeout_s,
            side_effects=side_effects,
            isolation=isolation,
        )

    def spec(self) -> dict[str, Any]:
        """The OpenAI function spec of this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def validate(self, arguments: Any) -> list[FieldError]:
        """Every schema violation of `arguments`, one per field; empty when valid. Nothing is coerced."""
        if not isinstance(arguments, dict):
            return [FieldError(path="arguments", expected="an object", given=_short(arguments))]
        errors = []
        for err in sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.absolute_path)):
            errors.append(_field_error(err))
        return errors

    def renamed(self, name: str, description: str | None = None, params: dict[str, str] | None = None) -> "Tool":
        """A copy under a new name (and parameter names), translating calls back to the original function."""
        params = params or {}
        props = self.parameters.get("properties", {})
        new_schema = dict(self.parameters)
        new_schema["properties"] = {params.get(k, k): v for k, v in props.items()}
        if "required" in self.parameters:
            new_schema["required"] = [params.get(k, k) for k in self.parameters["required"]]
        back = {v: k for k, v in params.items()}
        original = self.fn

        def call(**kwargs: Any) -> Any:
            return original(**{back.get(k, k): v for k, v in kwargs.items()})

        # a renamed copy validates against its own (renamed) schema: the original names no longer apply
        return Tool(name, description or self.description, new_schema, call, self.timeout_s, self.side_effects,
                    self.isolation, self.inject_faults)


def _short(value: Any, limit: int = 80) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _field_error(err: Any) -> FieldError:
    """Turn a jsonschema error into (path, expected, given)."""
    path = "arguments" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.absolute_path)
    v, vv = err.validator, err.validator_value
    if v == "required":
        missing = re.findall(r"'([^']+)' is a required property", err.message)
        name = missing[0] if missing else "?"
        return FieldError(path=f"{path}.{name}", expected="a required field", given="nothing")
    if v == "additionalProperties":
        extra = re.findall(r"'([^']+)'", err.message)
        return FieldError(path=path, expected="no other fields", given="unexpected field " + ", ".join(extra))
    if v == "type":
        expected = f"type {vv}" if isinstance(vv, str) else "type " + " or ".join(vv)
    elif v == "enum":
        expected = "one of " + ", ".join(json.dumps(x) for x in vv)
    else:
        templates = {
            "minimum": "a number >= {}", "maximum": "a number <= {}", "exclusiveMinimum": "a number > {}",
            "exclusiveMaximum": "a number < {}", "minLength": "at least {} characters",
            "maxLength": "at most {} characters", "pattern": "a string matching {}", "minItems": "at least {} items",
            "maxItems": "at most {} items", "format": "format {}",
        }
        expected = templates[v].format(vv) if v in templates else f"{v} {_short(vv, 40)}"
    return FieldError(path=path, expected=expected, given=_short(err.instance))


# -- @tool: schemas from typed, docstringed functions --------------------------------------

_SIMPLE_TYPES: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    dict: {"type": "object"},
    list: {"type": "array"},
    Any: {},
}


def _type_schema(annotation: Any, where: str) -> dict[str, Any]:
    """JSON schema of a Python annotation (str, int, float, bool, list[X], dict[str, X], Literal, Optional, Enum)."""
    if annotation in _SIMPLE_TYPES:
        return dict(_SIMPLE_TYPES[annotation])
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        schemas = [_type_schema(a, where) for a in non_none]
        if len(non_none) < len(args):
            schemas.append({"type": "null"})
        return schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    if origin in (list, tuple, set, typing.Sequence):
        item = args[0] if args else Any
        return {"type": "array", "items": _type_schema(item, where)}
    if origin is dict:
        value = args[1] if len(args) == 2 else Any
        return {"type": "object", "additionalProperties": _type_schema(value, where)}
    if inspect.isclass(annotation) and issubclass(annotation, enum.Enum):
        return {"enum": [m.value for m in annotation]}
    raise ToolDefinitionError(f"{where}: cannot express type {annotation!r} as JSON schema")


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into (description, {param: description})."""
    lines = inspect.cleandoc(doc).splitlines()
    desc: list[str] = []
    params: dict[str, str] = {}
    section = "desc"
    current = None
    for line in lines:
        stripped = line.strip()
        if re.fullmatch(r"(Args|Arguments|Parameters):", stripped):
            section = "args"
            continue
        if re.fullmatch(r"(Returns|Raises|Yields|Examples?|Notes?):", stripped):
            section = "other"
            continue
        if section == "desc":
            desc.append(line)
        elif section == "args":
            m = re.match(r"\s*(\w+)\s*(\([^)]*\))?\s*:\s*(.*)", line)
            if m and (line.startswith("    ") or not line.startswith(" ")) and m.group(1) not in params:
                current = m.group(1)
                params[current] = m.group(3).strip()
            elif current and stripped:
                params[current] = (params[current] + " " + stripped).strip()
    return " ".join(x.strip() for x in desc if x.strip()), params


def tool(
    fn: Callable[..., Any] | None = None, *, name: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
    side_effects: bool = False, isolation: str = "thread",
) -> Any:
    """Decorator: a `Tool` from a typed function whose docstring describes it (Google-style `Args:`).

    Every parameter needs a type hint and the function a docstring; otherwise definition fails here,
    not when the model first calls the tool. `side_effects=True` marks a tool that changes the world
    (faults never corrupt its output after it ran); `isolation="process"` runs each call in a child process.
    """

    def build(f: Callable[..., Any]) -> Tool:
        where = f"tool {name or f.__name__!r}"
        if not f.__doc__ or not f.__doc__.strip():
            raise ToolDefinitionError(f"{where} needs a docstring: it becomes the description the model reads")
        description, param_docs = _parse_docstring(f.__doc__)
        hints = typing.get_type_hints(f)
        properties: dict[str, Any] = {}
        required: list[str] = []
        for pname, param in inspect.signature(f).parameters.items():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolDefinitionError(f"{where}: *args/**kwargs cannot be described to the model")
            if pname not in hints:
                raise ToolDefinitionError(f"{where}: parameter {pname!r} needs a type hint")
            schema = _type_schema(hints[pname], f"{where}, parameter {pname!r}")
            if pname in param_docs:
                schema["description"] = param_docs[pname]
            if param.default is inspect.Parameter.empty:
                required.append(pname)
            elif isinstance(param.default, (str, int, float, bool)) or param.default is None:
                schema["default"] = param.default
            properties[pname] = schema
        parameters: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
        if required:
            parameters["required"] = required
        return Tool(name or f.__name__, description, parameters, f, timeout_s, side_effects, isolation)

    return build(fn) if fn is not None else build


# -- execution --------------------------------------------------------------------------------


class _DaemonPool:
    """Daemon worker threads: a tool that never returns keeps its thread, the episode goes on.

    (concurrent.futures' pool joins its threads at exit, so one hung tool would hang the process.)
    It also counts the calls that outlived their timeout and still run, per tool name, to bound them.
    """

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._idle = 0
        self._lock = threading.Lock()
        self.hung: dict[str, int] = {}

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._lock:
            if self._idle == 0:
                threading.Thread(target=self._work, daemon=True, name="agentrig-tool").start()
            else:
                self._idle -= 1
        self._tasks.put((fn, fut))
        return fut

    def _work(self) -> None:
        while True:
            fn, fut = self._tasks.get()
            try:
                fut.set_result(fn())
            except BaseException as exc:  # delivered to the waiting caller, who classifies it
                fut.set_exception(exc)
            with self._lock:
                self._idle += 1

    def abandon(self, name: str, fut: Future[Any]) -> None:
        """Count a call of `name` that outlived its timeout until it finishes."""
        with self._lock:
            self.hung[name] = self.hung.get(name, 0) + 1

        def finished(_: Future[Any]) -> None:
            with self._lock:
                self.hung[name] -= 1
                if not self.hung[name]:
                    del self.hung[name]

        fut.add_done_callback(finished)

    def too_many_hung(self, name: str) -> int:
        """How many calls of `name` still hang when that is too many to start another (else 0)."""
        with self._lock:
            mine = self.hung.get(name, 0)
            if mine >= MAX_HUNG_PER_TOOL or sum(self.hung.values()) >= MAX_HUNG:
                return max(mine, 1)
            return 0


_POOL = _DaemonPool()


def to_observation(value: Any) -> str:
    """A tool's return value as text: strings unchanged, everything else as JSON (unserializable parts via repr)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=_json_fallback)


def _json_fallback(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, (datetime.date, datetime.datetime, datetime.time)):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return repr(value)


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
    """Cut text over `max_chars`, with a visible marker saying how much was left out."""
    if len(text) <= max_chars:
        return text, False
    return text[:max_chars] + feedback("truncated", omitted=len(text) - max_chars), True


def _invoke(fn: Callable[..., Any], arguments: dict[str, Any]) -> Any:
    result = fn(**arguments)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Any) -> Any:
    return await awaitable


class ToolSet:
    """The tools an environment knows, and the allowlist of the current task."""

    def __init__(self, tools: list[Tool], allowed: list[str] | None = None, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS):
        self.tools: dict[str, Tool] = {}
        for t in tools:
            if t.name in self.tools:
                raise ToolDefinitionError(f"two tools are named {t.name!r}")
            self.tools[t.name] = t
        names = list(self.tools) if allowed is None else list(allowed)
        unknown = [n for n in names if n not in self.tools]
        if unknown:
            raise ToolDefinitionError(f"allowlist names unknown tools: {', '.join(unknown)}")
        self.allowed: list[str] = names
        self.max_output_chars = max_output_chars
        self.source: Any = None  # what owns the tools' connection (an MCP client), closed by `close()`

    @classmethod
    def from_mcp(cls, server: Any, allow: list[str], read_only: list[str] | tuple[str, ...] = (),
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> "ToolSet":
        """The tools of an MCP server that `allow` names (deny by default; `["*"]` for all), executed through
        the server; `server` is an open `agentrig.mcp.MCPClient` or a spec (`stdio:COMMAND`, `http:URL`),
        which is then connected here and closed by `close()`. See `agentrig.mcp.tools`."""
        from agentrig.mcp.client import MCPClient
        from agentrig.mcp.tools import mcp_tools

        client = server if isinstance(server, MCPClient) else MCPClient(server).start()
        try:
            toolset = cls(mcp_tools(client, allow, read_only, timeout_s), max_output_chars=max_output_chars)
        except BaseException:
            if client is not server:
                client.close()
            raise
        toolset.source = client if client is not server else None  # the caller's own client stays theirs
        return toolset

    def close(self) -> None:
        """Close the connection behind the tools, if this ToolSet opened one (`from_mcp` with a spec)."""
        if self.source is not None:
            self.source.close()
            self.source = None

    def get(self, name: str) -> Tool | None:
        """The tool of that name, permitted or not."""
        return self.tools.get(name)

    def is_allowed(self, name: str) -> bool:
        """Whether the task's allowlist permits the tool."""
        return name in self.allowed

    def offered(self) -> list[Tool]:
        """The tools the task may use, in allowlist order."""
        return [self.tools[n] for n in self.allowed]

    def specs(self) -> list[dict[str, Any]]:
        """OpenAI specs of the offered tools."""
        return [t.spec() for t in self.offered()]

    def validate(self, name: str, arguments: Any) -> list[FieldError]:
        """Schema violations of a call to a known tool."""
        return self.tools[name].validate(arguments)

    def execute(self, call: ToolCall, timeout_s: float | None = None) -> ToolResult:
        """Run a permitted, validated call. Never raises for the tool's failures (Ctrl-C propagates); never
        runs a tool outside the allowlist."""
        t = self.tools.get(call.name)
        if t is None or not self.is_allowed(call.name):
            return ToolResult(call.id, call.name, feedback("not_permitted", tool=call.name, available=", ".join(self.allowed)), ok=False, error="not_permitted")
        limit = t.timeout_s if timeout_s is None else timeout_s
        if t.isolation == "process":
            return self._execute_in_process(t, call, limit)
        hung = _POOL.too_many_hung(t.name)
        if hung:
            return ToolResult(call.id, call.name, feedback("tool_hung", tool=call.name, count=hung), ok=False,
                              error="hung")
        start = time.perf_counter()
        fut = _POOL.submit(lambda: _invoke(t.fn, call.arguments))
        try:
            value = fut.result(timeout=limit)
        except BaseException as exc:
            if not fut.done():  # raised here while waiting, not by the tool: our timeout, or Ctrl-C (re-raised)
                if not isinstance(exc, TimeoutError):
                    raise
                _POOL.abandon(t.name, fut)
                return ToolResult(call.id, call.name, feedback("tool_timeout", tool=call.name, seconds=limit),
                                  ok=False, duration_s=time.perf_counter() - start, error="timeout")
            if isinstance(exc, KeyboardInterrupt):  # the user's Ctrl-C: the run stops, the episode is not the model's
                raise
            return self._exception_result(call, exc, time.perf_counter() - start)
        duration = time.perf_counter() - start
        try:
            text = to_observation(value)
        except Exception as exc:  # a cycle, a repr that raises: the tool's defect, told to the model
            return self._exception_result(call, f"its result could not be serialized ({type(exc).__name__}: {exc})",
                                          duration)
        content, cut = truncate(text, self.max_output_chars)
        return ToolResult(call.id, call.name, content, ok=True, duration_s=duration, truncated=cut)

    @staticmethod
    def _exception_result(call: ToolCall, exc: BaseException | str, duration: float) -> ToolResult:
        """The tool's own failure: an observation for the model. An exception whose class sets `plain = True`
        (a remote tool's error text, already written for the model) is shown without its class name."""
        if isinstance(exc, str) or (getattr(exc, "plain", False) and str(exc)):
            reason = str(exc)
        else:
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        return ToolResult(call.id, call.name, feedback("tool_exception", reason=reason[:500]), ok=False,
                          duration_s=duration, error="exception")

    def _execute_in_process(self, t: Tool, call: ToolCall, limit: float) -> ToolResult:
        start = time.perf_counter()
        status, text = run_in_process(t.fn, call.arguments, limit, read_limit=max(65536, 8 * self.max_output_chars))
        duration = time.perf_counter() - start
        if status == "ok":
            content, cut = truncate(text, self.max_output_chars)
            return ToolResult(call.id, call.name, content, ok=True, duration_s=duration, truncated=cut)
        if status == "error":
            if text.startswith("KeyboardInterrupt"):  # Ctrl-C reached the child (the same process group)
                raise KeyboardInterrupt
            return self._exception_result(call, text, duration)
        if status == "timeout":
            return ToolResult(call.id, call.name, feedback("tool_timeout", tool=call.name, seconds=limit), ok=False,
                              duration_s=duration, error="timeout")
        return ToolResult(call.id, call.name, feedback("tool_crashed", tool=call.name, reason=text), ok=False,
                          duration_s=duration, error="crashed")


def run_in_process(fn: Callable[..., Any], arguments: dict[str, Any], timeout_s: float,
                   read_limit: int = 1 << 20) -> tuple[str, str]:
    """Call `fn(**arguments)` in a forked child, killed after `timeout_s`: ("ok", observation text),
    ("error", "Type: message"), ("timeout", "") or ("crashed", how it died).

    The child sends its observation (at most `read_limit` bytes are read; a longer one is cut and the child
    killed) and exits with `os._exit`, so nothing of the parent's shutdown runs twice. Ctrl-C while waiting
    kills the child and propagates.
    """
    import faulthandler
    import select
    import signal
    import warnings

    read_fd, write_fd = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() in a threaded process: the child only runs fn
        pid = os.fork()
    if pid == 0:  # the child
        code = 0
        try:
            os.close(read_fd)
            faulthandler.disable()  # a crash is reported to the model as one line, not as a dump on the terminal
            try:
                payload = b"O" + to_observation(_invoke(fn, arguments)).encode("utf-8", errors="replace")
            except BaseException as exc:  # noqa: BLE001 - everything the tool raised goes back as text
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                payload = b"E" + reason.encode("utf-8", errors="replace")
            view = memoryview(payload)
            while view:
                view = view[os.write(write_fd, view):]
        except BaseException:  # noqa: BLE001 - the parent sees the broken pipe
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    chunks: list[bytes] = []
    size = 0
    deadline = time.monotonic() + timeout_s
    outcome = ""
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                outcome = "timeout"
                break
            ready, _, _ = select.select([read_fd], [], [], left)
            if not ready:
                continue
            data = os.read(read_fd, 65536)
            if not data:
                break
            chunks.append(data)
            size += len(data)
            if size >= read_limit:
                outcome = "cut"
                break
    finally:
        os.close(read_fd)
        if outcome or sys.exc_info()[0] is not None:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _, status = os.waitpid(pid, 0)
    if outcome == "timeout":
        return "timeout", ""
    payload = b"".join(chunks)
    if outcome != "cut" and (not payload or os.waitstatus_to_exitcode(status) != 0):
        code = os.waitstatus_to_exitcode(status)
        how = f"killed by signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        return "crashed", f"its process died: {how}"
    text = payload[1:].decode("utf-8", errors="replace")
    return ("ok" if payload[:1] == b"O" else "error"), text
