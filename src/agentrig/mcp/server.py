"""`agentrig mcp serve`: an environment's tools as an MCP server, over stdio or streamable HTTP.

    agentrig mcp serve --env datadesk                         # stdio (an MCP client starts it as a command)
    agentrig mcp serve --env datadesk --transport http --port 8765   # http://127.0.0.1:8765/mcp

Every MCP session gets a fresh state: `env.setup(task)` for the first task of `--split` (the environment's
tools bound to a new state; for datadesk a new database), released when the session ends. All the tools the
environment binds are served, not only one task's allowlist: the client decides what to allow. (Over HTTP
a session is its `Mcp-Session-Id`; at most `MAX_SESSIONS` states are kept, the least recently used released.) Calls run
through the harness's `ToolSet` on a worker thread, so the server keeps answering while a tool runs, and
its timeout, output truncation and error texts apply. Arguments the schema refuses come back as an
`isError` result with the harness's per-field feedback; a tool that fails comes back as `isError` with its
observation; an unknown tool is a JSON-RPC error. Tools that declare no side effects are annotated
`readOnlyHint`.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections import OrderedDict
from typing import Any

from agentrig.errors import ConfigError
from agentrig.harness.protocol import feedback
from agentrig.harness.tools import ToolSet
from agentrig.harness.trajectory import ToolCall

MAX_SESSIONS = 64  # states kept at once over HTTP; the least recently used is released first


class _Sessions:
    """One environment state per MCP session, made on the session's first request."""

    def __init__(self, env: Any, split: str, seed: int):
        self.env = env
        env.check_split(split)
        tasks = env.tasks(split, 1, seed)
        if not tasks:
            raise ConfigError(f"environment {env.name!r} has no {split} task to set a state up from")
        self.task = tasks[0]
        self.states: OrderedDict[str, tuple[ToolSet, Any]] = OrderedDict()
        self.opened = 0
        self._ids = itertools.count()

    def tools_for(self, ctx: Any) -> ToolSet:
        """The session's tools. A stdio server has one session (its process); over HTTP a session is its
        `Mcp-Session-Id` header. The oldest of more than `MAX_SESSIONS` states is released."""
        request = getattr(ctx, "request", None)
        headers = getattr(request, "headers", None)
        key = (headers.get("mcp-session-id") if headers is not None else None) or "stdio"
        if key not in self.states:
            while len(self.states) >= MAX_SESSIONS:
                _, (_, old) = self.states.popitem(last=False)
                self.env.close(old)
            tools, state = self.env.setup(self.task)
            full = ToolSet(list(tools.tools.values()), max_output_chars=tools.max_output_chars)
            self.states[key] = (full, state)
            self.opened += 1
        self.states.move_to_end(key)
        return self.states[key][0]

    def call_id(self) -> str:
        return f"mcp_{next(self._ids)}"


def build_server(env: Any, split: str = "test", seed: int = 0) -> Any:
    """The MCP `Server` (SDK low-level API) serving `env`'s tools, a fresh state per session."""
    import anyio
    import mcp.types as types
    from mcp import MCPError
    from mcp.server import Server

    import agentrig

    sessions = _Sessions(env, split, seed)

    def wire(tool: Any) -> Any:
        return types.Tool(name=tool.name, description=tool.description, inputSchema=tool.parameters,
                          annotations=types.ToolAnnotations(readOnlyHint=not tool.side_effects))

    async def list_tools(ctx: Any, params: Any) -> Any:
        tools = sessions.tools_for(ctx)
        return types.ListToolsResult(tools=[wire(t) for t in tools.tools.values()])

    async def call_tool(ctx: Any, params: Any) -> Any:
        tools = sessions.tools_for(ctx)
        tool = tools.get(params.name)
        if tool is None:
            raise MCPError(types.INVALID_PARAMS, f"unknown tool {params.name!r}; the tools are "
                           f"{', '.join(tools.tools)}")
        arguments = dict(params.arguments or {})
        errors = tool.validate(arguments)
        if errors:
            lines = "\n".join(feedback("schema_field", path=e.path, expected=e.expected, given=e.given) for e in errors)
            text = feedback("schema_violation", tool=tool.name, fields=lines)
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)
        call = ToolCall(id=sessions.call_id(), name=tool.name, arguments=arguments)
        result = await anyio.to_thread.run_sync(tools.execute, call, abandon_on_cancel=True)
        return types.CallToolResult(content=[types.TextContent(type="text", text=result.content)],
                                    isError=not result.ok)

    server = Server(f"agentrig-{env.name}", version=agentrig.__version__,
                    instructions=f"The tools of agentrig's {env.name} environment, a fresh state per session.",
                    on_list_tools=list_tools, on_call_tool=call_tool)
    server.agentrig_sessions = sessions  # type: ignore[attr-defined]
    return server


def serve_stdio(server: Any) -> None:
    """Serve one session on stdin/stdout until the client closes it."""
    import anyio
    from mcp.server.stdio import stdio_server

    async def go() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(go)


def serve_http(server: Any, host: str, port: int) -> None:
    """Serve streamable HTTP at http://HOST:PORT/mcp until interrupted."""
    import uvicorn

    app = server.streamable_http_app(host=host)
    print(f"agentrig mcp serve: http://{host}:{port}/mcp", file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")


def configure(parser: argparse.ArgumentParser) -> None:
    """`agentrig mcp serve` flags."""
    sub = parser.add_subparsers(dest="mcp_command", metavar="SUBCOMMAND")
    s = sub.add_parser("serve", help="serve an environment's tools as an MCP server (stdio or streamable HTTP)",
                       description="Serve an environment's tools as an MCP server, a fresh state per session.")
    s.add_argument("--env", default="datadesk", help="datadesk or path/to/file.py:make_env")
    s.add_argument("--split", default="test", help="the split whose first task sets each session's state up")
    s.add_argument("--seed", type=int, default=0, help="the task seed")
    s.add_argument("--transport", choices=("stdio", "http"), default="stdio")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8765)


def main(args: argparse.Namespace) -> int:
    """Run `agentrig mcp serve`."""
    if getattr(args, "mcp_command", None) != "serve":
        raise ConfigError("use: agentrig mcp serve --env ENV [--transport stdio|http]")
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ConfigError("agentrig mcp serve needs the `mcp` package (2.x): pip install 'agentrig[mcp]'") from None
    from agentrig.envs import load_env

    env = load_env(args.env)
    server = build_server(env, args.split, args.seed)
    if args.transport == "stdio":
        serve_stdio(server)
    else:
        serve_http(server, args.host, args.port)
    return 0
