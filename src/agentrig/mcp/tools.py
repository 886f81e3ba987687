"""MCP tools as harness tools: names mapped reversibly, schemas shown resolved and validated as given.

`mcp_tools(client, allow, read_only)` turns the tools an MCP server lists into `agentrig.harness.Tool`s:
- deny by default: only the tools `allow` names exist for the harness (`["*"]` means every listed tool,
  written out on purpose); a tool outside it is neither shown to the model nor callable;
- `harness_name` maps an MCP name (up to 128 characters, any the server likes) to one the harness and the
  Hermes format handle (1-64 of letters, digits, `_`, `.`, `-`, not starting with a digit); it is a pure
  function of the name, so task files can name tools either way, and the map back is kept per tool;
- the model is shown the `inputSchema` with `$ref`/`$defs` resolved inline; arguments are validated against
  the server's own schema, field by field, with the harness's usual feedback;
- each call goes through `MCPClient.call` with the tool's timeout; `isError` results and JSON-RPC errors
  raise `ToolError`, which the harness turns into an ordinary tool error for the recovery rules;
- a tool the user marks read-only may get injected faults; every other MCP tool is a write as far as the
  harness knows (`side_effects=True`, `inject_faults=False`): it is never retried or duplicated by a fault.
"""

from __future__ import annotations

import copy
import hashlib
import re
from typing import Any, Iterable

from agentrig.errors import ConfigError
from agentrig.harness.protocol import feedback
from agentrig.harness.tools import DEFAULT_TIMEOUT_S, Tool, ToolDefinitionError
from agentrig.mcp.client import MCPClient

_OK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")
MAX_REF_DEPTH = 8


class ToolError(Exception):
    """An MCP tool's own failure (an `isError` result): the model sees the server's text as it is."""

    plain = True


_FAILED = feedback("tool_exception", reason="")  # "Tool execution failed: ", which the harness adds itself


def harness_name(mcp_name: str) -> str:
    """The harness name for an MCP tool name: the name itself when it fits the harness's rules, else a
    cleaned form plus 6 hex digits of the original's hash (so two names never map to one)."""
    if _OK_NAME.fullmatch(mcp_name):
        return mcp_name
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "_", mcp_name).strip("_") or "tool"
    if not re.match(r"[A-Za-z_]", clean):
        clean = "t_" + clean
    digest = hashlib.sha256(mcp_name.encode()).hexdigest()[:6]
    return f"{clean[:57]}_{digest}"


def resolve_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with local `$ref`s (`#/$defs/X`, `#/definitions/X`) replaced by what they point at, and the
    definitions removed; a reference deeper than `MAX_REF_DEPTH` (a recursive type) is left as a plain object."""
    root = schema

    def lookup(ref: str) -> Any:
        if not ref.startswith("#/"):
            return None
        node: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                return None
            node = node[part]
        return node

    def walk(node: Any, depth: int) -> Any:
        if isinstance(node, list):
            return [walk(x, depth) for x in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node and isinstance(node["$ref"], str):
            target = lookup(node["$ref"])
            rest = {k: v for k, v in node.items() if k != "$ref"}
            if target is None or depth >= MAX_REF_DEPTH:
                return {"type": "object", **walk(rest, depth)}
            merged = {**walk(target, depth + 1), **walk(rest, depth)}
            return merged
        return {k: walk(v, depth) for k, v in node.items() if k not in ("$defs", "definitions")}

    return walk(copy.deepcopy(schema), 0)


def _parameters(input_schema: dict[str, Any] | None) -> dict[str, Any]:
    schema = dict(input_schema or {})
    schema.setdefault("type", "object")
    if "type" in schema and schema["type"] != "object":
        schema = {"type": "object", "properties": {}}
    return schema


def mcp_tools(client: MCPClient, allow: Iterable[str], read_only: Iterable[str] = (),
              timeout_s: float = DEFAULT_TIMEOUT_S) -> list[Tool]:
    """The harness tools for the MCP tools `allow` names (MCP or harness names; `["*"]`: all), see the module
    docstring. Raises `ConfigError` naming the server's tools when `allow` names one it does not list."""
    listed = client.list_tools()
    by_name = {t["name"]: t for t in listed}
    by_harness = {harness_name(t["name"]): t["name"] for t in listed}
    allow = list(allow)
    if allow == ["*"]:
        wanted = [t["name"] for t in listed]
    else:
        wanted = []
        for name in allow:
            original = name if name in by_name else by_harness.get(name)
            if original is None:
                raise ConfigError(f"the allowlist names {name!r}, which MCP server {client.server_name} does not "
                                  f"list; it has: {', '.join(sorted(by_name)) or 'no tools'}")
            wanted.append(original)
    read_only_set = set()
    for name in read_only:
        read_only_set.add(by_harness.get(name, name))
    tools = []
    for original in wanted:
        spec = by_name[original]
        tools.append(_bridge(client, spec, original in read_only_set, timeout_s))
    return tools


def _bridge(client: MCPClient, spec: dict[str, Any], read_only: bool, timeout_s: float) -> Tool:
    original = spec["name"]
    name = harness_name(original)
    given = _parameters(spec.get("inputSchema"))
    shown = _parameters(resolve_refs(given))
    description = (spec.get("description") or spec.get("title") or "").strip() or f"The MCP tool {original}."

    def call(**arguments: Any) -> str:
        result = client.call(original, arguments, timeout_s)
        if result.is_error:
            text = result.text.strip()
            raise ToolError(text.removeprefix(_FAILED) or f"{original} reported an error without a message")
        return result.text

    try:
        return Tool(name, description, shown, call, timeout_s=timeout_s, side_effects=not read_only,
                    inject_faults=read_only, validation_schema=given if given != shown else None)
    except ToolDefinitionError as exc:
        raise ConfigError(f"MCP server {client.server_name} lists tool {original!r} with a schema the harness "
                          f"cannot use: {exc}") from None
