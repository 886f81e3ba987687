"""Model Context Protocol: any MCP server's tools in the harness, and agentrig's environments as MCP servers.

- `client.py`: `MCPClient`, one session with a stdio or streamable HTTP server, driven synchronously;
- `tools.py`: the server's tools as harness `Tool`s (allowlist, reversible names, schemas, read-only marks);
- `env.py`: `MCPEnv`, an environment from a server plus a tasks file (`--env mcp:stdio:CMD --tasks F`);
- `replay.py`: the record/replay file of a collection's tool results (`--env mcp:replay:FILE`);
- `server.py`: `agentrig mcp serve`, an environment's tools served over MCP.

May import: `agentrig.harness`, `agentrig.envs` and the top-level helpers. Three edges come in, each inside
the function that needs it: `ToolSet.from_mcp`, `load_env("mcp:...")` and `data build --mcp-server`.
Needs the `mcp` package (2.x, `pip install 'agentrig[mcp]'`); nothing here imports it before it is used.
See docs/mcp.md.
"""
