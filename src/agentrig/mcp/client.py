"""One MCP session, driven synchronously: connect, list tools, call tools, close.

`MCPClient(server)` speaks to one Model Context Protocol server through the official `mcp` SDK (2.x): a
stdio server (`stdio:COMMAND ARGS`, a child process) or a streamable HTTP server (`http://...`). The SDK is
asynchronous; the harness calls tools from worker threads, so the client runs the session on its own event
loop thread and every public method blocks until the server answers.

What a call can end as, and what the harness makes of it (the classification lives here, once):
- the server's result: `CallResult(text, is_error)`; `isError` results are the tool's failure, which the
  tool bridge (`agentrig.mcp.tools`) turns into an ordinary tool error the recovery rules see;
- a JSON-RPC error answer (unknown tool, bad parameters the server refused): `MCPCallError`, a tool error;
- no answer in time: `MCPCallError("... did not answer within N s")`, and the session is marked `hung`;
- the connection dropped (the server crashed or exited): `MCPServerDown`, and the session is `dead`.
Neither of the last two ends the episode loop: the call fails with a readable observation and the next
episode opens a new session (a new process for stdio), so a crashed or hung server is restarted there.

`identity()` is what an episode records about the server it used: the name and version it reported and a
hash of each tool definition, so a data build can tell when a server's tools changed since a collection.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import json
import shlex
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

from agentrig.errors import AgentrigError, ConfigError

CONNECT_TIMEOUT_S = 30.0
CLOSE_TIMEOUT_S = 10.0


class MCPServerDown(AgentrigError):
    """The MCP server's connection is gone (it crashed, exited or was never reachable)."""

    plain = True  # as a tool's failure, the model reads the message without the class name


class MCPCallError(AgentrigError):
    """A tools/call that got no result: a JSON-RPC error answer, or no answer in time."""

    plain = True


@dataclass(frozen=True)
class ServerSpec:
    """Where an MCP server is: `stdio` with a command line, or `http` with a URL (streamable HTTP)."""

    transport: str  # "stdio" or "http"
    target: str  # the command line, or the URL

    @classmethod
    def parse(cls, text: str) -> "ServerSpec":
        """`stdio:COMMAND ARGS`, `http:URL`, or a bare `http(s)://...` URL."""
        text = text.strip()
        if text.startswith(("http://", "https://")):
            return cls("http", text)
        kind, _, rest = text.partition(":")
        rest = rest.strip()
        if kind == "stdio" and rest:
            try:
                argv = shlex.split(rest)
            except ValueError as exc:
                raise ConfigError(f"cannot split the MCP server command {rest!r}: {exc}") from None
            if not argv:
                raise ConfigError("the MCP stdio server needs a command: stdio:'python server.py'")
            return cls("stdio", rest)
        if kind == "http" and rest.startswith(("http://", "https://")):
            return cls("http", rest)
        raise ConfigError(f"unknown MCP server {text!r}: use stdio:'COMMAND ARGS' or http:http://HOST:PORT/mcp")

    @property
    def argv(self) -> list[str]:
        """The stdio command line, split as a shell would."""
        return shlex.split(self.target)

    def __str__(self) -> str:
        return f"{self.transport}:{self.target}"


@dataclass
class CallResult:
    """A tools/call result as text: the content blocks joined, and whether the server flagged an error."""

    text: str
    is_error: bool = False


def tool_hash(tool: dict[str, Any]) -> str:
    """A short, stable hash of a tool definition (name, description, schemas, annotations)."""
    keep = {k: tool.get(k) for k in ("name", "description", "inputSchema", "outputSchema", "annotations")}
    blob = json.dumps(keep, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _attr(obj: Any, snake: str, camel: str, default: Any = None) -> Any:
    """A field of an SDK object under its 2.x (snake_case) or 1.x (camelCase) attribute name."""
    value = getattr(obj, snake, None)
    return value if value is not None else getattr(obj, camel, default)


def result_text(result: Any) -> CallResult:
    """A `CallToolResult` as text: text blocks as they are, other blocks described, structured content as JSON
    when the server sent no text."""
    parts: list[str] = []
    for block in getattr(result, "content", None) or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "image" or kind == "audio":
            size = len(getattr(block, "data", "") or "") * 3 // 4
            parts.append(f"[{kind}: {_attr(block, 'mime_type', 'mimeType', '?')}, about {size} bytes]")
        elif kind == "resource":
            res = block.resource
            text = getattr(res, "text", None)
            parts.append(text if text is not None else
                         f"[resource {res.uri}: {_attr(res, 'mime_type', 'mimeType') or 'binary'}]")
        elif kind == "resource_link":
            parts.append(f"[resource link {getattr(block, 'uri', '')}]")
        else:
            parts.append(f"[{kind or 'unknown'} content]")
    structured = _attr(result, "structured_content", "structuredContent")
    if not parts and structured is not None:
        parts.append(json.dumps(structured, ensure_ascii=False))
    return CallResult("\n".join(parts), bool(_attr(result, "is_error", "isError", False)))


class MCPClient:
    """One session with one MCP server (see the module docstring). Use as a context manager, or `start`/`close`."""

    def __init__(self, server: ServerSpec | str, env: dict[str, str] | None = None, cwd: str | None = None,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S):
        self.server = server if isinstance(server, ServerSpec) else ServerSpec.parse(server)
        self.env = env
        self.cwd = cwd
        self.connect_timeout_s = connect_timeout_s
        self.server_info: dict[str, str] = {}
        self.state = "new"  # new -> open -> (hung | dead) -> closed
        self.down_reason = ""
        self._tools: list[dict[str, Any]] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._session: Any = None
        self._stop: asyncio.Event | None = None
        self._main: concurrent.futures.Future[Any] | None = None
        self._errlog: Any = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self) -> "MCPClient":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def start(self) -> "MCPClient":
        """Connect and run the MCP handshake; raises `MCPServerDown` naming the server when that fails."""
        if self.state != "new":
            return self
        try:
            import mcp  # noqa: F401
        except ImportError:
            raise ConfigError("MCP tool sources need the `mcp` package (2.x): pip install 'agentrig[mcp]'") from None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="agentrig-mcp")
        self._thread.start()
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._main = asyncio.run_coroutine_threadsafe(self._run(ready), self._loop)
        try:
            ready.result(timeout=self.connect_timeout_s)
        except concurrent.futures.TimeoutError:
            self._shutdown()
            raise MCPServerDown(f"MCP server {self.server} did not finish its handshake within "
                                f"{self.connect_timeout_s:.0f} s{self._stderr_tail()}") from None
        except BaseException as exc:
            self._shutdown()
            raise MCPServerDown(f"cannot connect to MCP server {self.server}: {_describe(exc)}"
                                f"{self._stderr_tail()}") from None
        self.state = "open"
        return self

    async def _run(self, ready: concurrent.futures.Future[None]) -> None:
        """The session's whole life in one task (the SDK's context managers must open and close in one task)."""
        from mcp import ClientSession

        self._stop = asyncio.Event()
        try:
            async with contextlib.AsyncExitStack() as stack:
                if self.server.transport == "stdio":
                    from mcp import StdioServerParameters, stdio_client

                    argv = self.server.argv
                    self._errlog = tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace")
                    params = StdioServerParameters(command=argv[0], args=argv[1:], env=self.env, cwd=self.cwd)
                    streams = await stack.enter_async_context(stdio_client(params, errlog=self._errlog))
                else:
                    from mcp.client.streamable_http import streamable_http_client

                    streams = await stack.enter_async_context(streamable_http_client(self.server.target))
                read, write = streams[0], streams[1]
                session = await stack.enter_async_context(ClientSession(read, write))
                init = await session.initialize()
                info = _attr(init, "server_info", "serverInfo")
                self.server_info = {"name": getattr(info, "name", "") or "", "version": getattr(info, "version", "") or ""}
                self._session = session
                ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - a failed connect is reported by start(), a later one here
            if not ready.done():
                ready.set_exception(exc)
            elif self.state not in ("closed",):
                self._mark_dead(f"the connection ended ({_describe(exc)})")
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            self._session = None
            if self.state == "open":  # the session ended by itself: the server went away
                self._mark_dead("the connection closed")

    def close(self) -> None:
        """End the session (for stdio: stop the server process). Safe to call twice."""
        if self.state in ("closed", "new"):
            self.state = "closed"
            return
        self.state = "closed"
        self._shutdown()

    def _shutdown(self) -> None:
        loop = self._loop
        if loop is None:
            return
        if self._stop is not None:
            loop.call_soon_threadsafe(self._stop.set)
        if self._main is not None:
            try:
                self._main.result(timeout=CLOSE_TIMEOUT_S)
            except BaseException:  # noqa: BLE001 - closing: a session that fails to end cleanly is still gone
                self._main.cancel()
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=CLOSE_TIMEOUT_S)
        if not loop.is_running():
            loop.close()
        self._loop = None
        if self._errlog is not None:
            self._errlog.close()
            self._errlog = None

    def _mark_dead(self, reason: str) -> None:
        if self.state != "closed":
            self.state = "dead"
        self.down_reason = self.down_reason or reason

    def _stderr_tail(self) -> str:
        """The last line the stdio server wrote to stderr, to explain a failure."""
        if self._errlog is None:
            return ""
        try:
            self._errlog.flush()
            self._errlog.seek(0)
            lines = [line.strip() for line in self._errlog.read()[-4000:].splitlines() if line.strip()]
        except (OSError, ValueError):
            return ""
        return f"; its last stderr line: {lines[-1][:300]}" if lines else ""

    # -- requests -------------------------------------------------------------------------------------
    def _request(self, coro_fn: Any, timeout_s: float, what: str) -> Any:
        if self.state == "dead":
            raise MCPServerDown(f"MCP server {self.server_name} is down ({self.down_reason}); it is restarted "
                                "for the next episode")
        if self.state != "open" or self._loop is None or self._session is None:
            raise MCPServerDown(f"the MCP session with {self.server_name} is not open (state {self.state})")
        fut = asyncio.run_coroutine_threadsafe(coro_fn(self._session), self._loop)
        try:
            return fut.result(timeout=timeout_s + 1.0)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            self.state = "hung" if self.state == "open" else self.state
            raise MCPCallError(f"{what}: MCP server {self.server_name} did not answer within {timeout_s:g} s") from None
        except concurrent.futures.CancelledError:
            raise MCPServerDown(f"{what}: the session with MCP server {self.server_name} was closed") from None
        except Exception as exc:
            from mcp import MCPError

            if isinstance(exc, MCPError):
                code = exc.code
                if code == -32000:  # CONNECTION_CLOSED
                    self._mark_dead(f"the connection closed{self._stderr_tail()}")
                    raise MCPServerDown(f"{what}: MCP server {self.server_name} stopped ({exc.message}"
                                        f"{self._stderr_tail()}); it is restarted for the next episode") from None
                if code == -32001:  # REQUEST_TIMEOUT: the SDK's own read timeout
                    self.state = "hung" if self.state == "open" else self.state
                    raise MCPCallError(f"{what}: MCP server {self.server_name} did not answer within "
                                       f"{timeout_s:g} s") from None
                raise MCPCallError(f"{what}: the server answered with error {code}: {exc.message}") from None
            if self._session is None or self.state == "dead":
                self._mark_dead(_describe(exc))
                raise MCPServerDown(f"{what}: MCP server {self.server_name} stopped ({_describe(exc)}"
                                    f"{self._stderr_tail()}); it is restarted for the next episode") from None
            raise MCPCallError(f"{what}: {_describe(exc)}") from None

    @property
    def server_name(self) -> str:
        return self.server_info.get("name") or str(self.server)

    def list_tools(self, timeout_s: float = CONNECT_TIMEOUT_S) -> list[dict[str, Any]]:
        """Every tool the server lists (all pages), as plain dicts in the MCP wire form."""
        if self._tools is not None:
            return self._tools

        async def walk(session: Any) -> list[dict[str, Any]]:
            tools: list[dict[str, Any]] = []
            cursor = None
            for _ in range(100):  # a paginator that never ends cannot hang the harness
                if cursor is None:
                    page = await session.list_tools()
                else:
                    from mcp.types import PaginatedRequestParams

                    page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor))
                tools.extend(t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools)
                cursor = _attr(page, "next_cursor", "nextCursor")
                if not cursor:
                    break
            return tools

        self._tools = self._request(walk, timeout_s, "tools/list")
        return self._tools

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> CallResult:
        """Call one tool; `timeout_s` is the harness's limit (the SDK waits a little longer, so the harness
        reports the timeout in its own words)."""
        async def go(session: Any) -> Any:
            return await session.call_tool(name, arguments, read_timeout_seconds=timeout_s + 0.5)

        return result_text(self._request(go, timeout_s + 0.5, f"{name}"))

    def identity(self, used: list[str] | None = None) -> dict[str, Any]:
        """The server's name and version and a hash of each tool definition (those in `used`, or all)."""
        tools = self._tools or []
        hashes = {t["name"]: tool_hash(t) for t in tools if used is None or t["name"] in used}
        return {"server": str(self.server), "name": self.server_info.get("name", ""),
                "version": self.server_info.get("version", ""), "tools": hashes}


def current_tool_hashes(server: str) -> dict[str, dict[str, str]]:
    """`{server name: {tool: hash}}` of what an MCP server (a spec, or `replay:FILE`) lists now, for the data
    build's check that episodes used the tools as they are today."""
    if server.startswith("mcp:"):
        server = server[len("mcp:"):]
    if server.startswith("replay:"):
        from agentrig.mcp.replay import Recording, ReplayClient

        client: Any = ReplayClient(Recording(server[len("replay:"):]), "")
    else:
        client = MCPClient(server).start()
    try:
        client.list_tools()
        ident = client.identity()
    finally:
        client.close()
    return {ident["name"] or ident["server"]: ident["tools"]}


def _describe(exc: BaseException) -> str:
    """One line for an exception, unwrapping task-group exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

