"""The record/replay file of an MCP collection: every tool listing and tool result, so a data build, a test
or a second evaluation can run offline and deterministically (`--env mcp:replay:FILE`).

A JSON line per event:
- `{"kind": "server", "server", "name", "version", "tools": [MCP tool definitions]}` once per distinct listing;
- `{"kind": "call", "task", "tool", "arguments", "n", "text", "is_error"}` per call (`n`: how many identical
  calls of this task came before it), or with `"raised": "MCPCallError" | "MCPServerDown", "message"` for a
  call that got no result.

`RecordingClient` wraps a live `MCPClient` and appends to the file (one `write` per line, so resumed or
parallel collections append whole lines). `ReplayClient` answers from it: the same task's n-th identical
call first, else the same call recorded for any task; a call never recorded is an `MCPCallError` that says so.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from agentrig.errors import ConfigError
from agentrig.mcp.client import CallResult, MCPCallError, MCPServerDown, tool_hash


def _key(tool: str, arguments: dict[str, Any]) -> str:
    return tool + "\x00" + json.dumps(arguments, sort_keys=True, ensure_ascii=False)


def _append(path: Path, record: dict[str, Any]) -> None:
    line = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


class RecordingClient:
    """A live client whose listings and results are appended to a replay file (see the module docstring)."""

    def __init__(self, client: Any, path: str | Path, task_id: str):
        self.client = client
        self.path = Path(path)
        self.task_id = task_id
        self._seen: dict[str, int] = defaultdict(int)
        self._listed = False

    def __getattr__(self, name: str) -> Any:  # server_name, server_info, state, identity, close, ...
        return getattr(self.client, name)

    def list_tools(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        tools = self.client.list_tools(timeout_s)
        if not self._listed:
            self._listed = True
            listing = {"kind": "server", "server": str(self.client.server), **self.client.server_info, "tools": tools}
            digest = tool_hash({"name": "", "description": json.dumps(listing, sort_keys=True)})
            if digest not in _written_listings(self.path):
                _append(self.path, {**listing, "hash": digest})
        return tools

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> CallResult:
        key = _key(name, arguments)
        n = self._seen[key]
        self._seen[key] += 1
        base = {"kind": "call", "task": self.task_id, "tool": name, "arguments": arguments, "n": n}
        try:
            result = self.client.call(name, arguments, timeout_s)
        except (MCPCallError, MCPServerDown) as exc:
            _append(self.path, {**base, "raised": type(exc).__name__, "message": str(exc)})
            raise
        _append(self.path, {**base, "text": result.text, "is_error": result.is_error})
        return result


_LISTINGS: dict[str, set[str]] = {}


def _written_listings(path: Path) -> set[str]:
    """Hashes of the listings already in the file (read once per process, then kept up to date)."""
    key = str(path.resolve())
    if key not in _LISTINGS:
        seen: set[str] = set()
        if path.exists():
            for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("kind") == "server" and rec.get("hash"):
                    seen.add(rec["hash"])
        _LISTINGS[key] = seen
    return _LISTINGS[key]


class Recording:
    """A replay file read into memory: the last tool listing and every recorded call."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ConfigError(f"MCP replay file {self.path} does not exist (record one with "
                              "`agentrig collect --env mcp:... --mcp-record FILE`)")
        self.server: dict[str, Any] | None = None
        self.by_task: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
        self.any_task: dict[str, dict[str, Any]] = {}
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise ConfigError(f"MCP replay file {self.path} is binary, not JSONL text") from None
        for i, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as exc:
                raise ConfigError(f"{self.path} line {i} is not JSON ({exc}); a replay file has one JSON "
                                  "object per line") from None
            kind = rec.get("kind") if isinstance(rec, dict) else None
            if kind == "server":
                self.server = rec
            elif kind == "call":
                key = _key(rec["tool"], rec.get("arguments") or {})
                self.by_task[(rec.get("task", ""), key)].append(rec)
                self.any_task.setdefault(key, rec)
            else:
                raise ConfigError(f"{self.path} line {i} is not a replay record (kind 'server' or 'call')")
        if self.server is None:
            raise ConfigError(f"{self.path} holds no tool listing (kind 'server'): it is not a replay file")


class ReplayClient:
    """Answers a task's calls from a `Recording`, with the interface of `MCPClient` (see the module docstring)."""

    def __init__(self, recording: Recording, task_id: str):
        self.recording = recording
        self.task_id = task_id
        info = recording.server or {}
        self.server = f"replay:{recording.path}"
        self.server_info = {"name": info.get("name", ""), "version": info.get("version", "")}
        self.server_name = self.server_info["name"] or self.server
        self.state = "open"
        self._seen: dict[str, int] = defaultdict(int)

    def start(self) -> "ReplayClient":
        return self

    def close(self) -> None:
        self.state = "closed"

    def list_tools(self, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        return list((self.recording.server or {}).get("tools", []))

    def call(self, name: str, arguments: dict[str, Any], timeout_s: float) -> CallResult:
        key = _key(name, arguments)
        n = self._seen[key]
        self._seen[key] += 1
        mine = self.recording.by_task.get((self.task_id, key), [])
        rec = mine[n] if n < len(mine) else (mine[-1] if mine else self.recording.any_task.get(key))
        if rec is None:
            raise MCPCallError(f"{name}: no recorded result for this call in {self.recording.path} (the recording "
                               "never made it); replay answers only calls that were recorded")
        if rec.get("raised") == "MCPServerDown":
            raise MCPServerDown(rec.get("message", "the server was down when this was recorded"))
        if rec.get("raised"):
            raise MCPCallError(rec.get("message", "the call failed when this was recorded"))
        return CallResult(rec.get("text", ""), bool(rec.get("is_error")))

    def identity(self, used: list[str] | None = None) -> dict[str, Any]:
        tools = self.list_tools()
        hashes = {t["name"]: tool_hash(t) for t in tools if used is None or t["name"] in used}
        return {"server": (self.recording.server or {}).get("server", ""), "name": self.server_info["name"],
                "version": self.server_info["version"], "tools": hashes, "replayed_from": str(self.recording.path)}
