"""`MCPEnv`: an environment whose tools are an MCP server's and whose tasks come from a JSONL file.

    agentrig collect --env mcp:stdio:"npx -y @modelcontextprotocol/server-filesystem /data" --tasks tasks.jsonl ...
    agentrig eval    --env mcp:http:http://127.0.0.1:8765/mcp --tasks tasks.jsonl --split test ...
    agentrig eval    --env mcp:replay:collect.mcp.jsonl --tasks tasks.jsonl ...   # offline, from a recording

Each episode opens its own MCP session (for stdio, its own server process), so a server that crashed or
hung in one episode is started afresh for the next, and a server that keeps state per session gives every
episode a fresh one. State a stdio server keeps in files gets the same with a sandbox: `{sandbox}` in the
command is a new empty temporary folder per episode, `{sandbox:TEMPLATE}` a fresh copy of the folder
TEMPLATE (`mcp:stdio:"mcp-server-filesystem {sandbox:examples/mcp/files}"`); the server starts in it, the
read-back runs in it, and it is removed when the episode closes. A task line (docs/mcp.md has the full reference):

    {"id": "fs-1", "split": "train", "prompt": "What does notes.txt say?", "allowed_tools": ["read_text_file"],
     "read_only_tools": ["read_text_file"],
     "expect": {"terms": ["hello"], "figures": [3], "must_call": ["read_text_file"], "must_not_call": [],
                "read_back": {"tool": "read_text_file", "arguments": {"path": "/data/out.txt"}, "contains": "42"}},
     "impossible": false, "no_tool": false,
     "reference": [{"calls": [{"name": "read_text_file", "arguments": {"path": "/data/notes.txt"}}]},
                   {"answer": "notes.txt says hello."}]}

The checker (from the answer and the server's state): every `terms` string and `figures` number in the final
answer; every `must_call` tool called successfully, no `must_not_call` tool executed; the `read_back` call,
made after the episode through the same session, returns text containing `contains`; `no_tool` tasks make no
call; `impossible` tasks answer honestly and invent no numbers. `reference` steps make `--teacher expert`
possible (a scripted teacher); without them use `--teacher model` or `--teacher openai`. Each checked episode
records the server's identity and the hashes of the tools it was offered in `episode.metadata["mcp"]`.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrig.envs.base import (CheckResult, Environment, check_answer, check_no_tool_and_impossible, figure_spec,
                                settle)
from agentrig.errors import ConfigError
from agentrig.harness.protocol import result_text
from agentrig.harness.tools import DEFAULT_TIMEOUT_S, ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec, ToolCall
from agentrig.mcp.client import MCPCallError, MCPClient, MCPServerDown, ServerSpec
from agentrig.mcp.tools import harness_name, mcp_tools

TASK_KEYS = {"id", "prompt", "split", "family", "allowed_tools", "read_only_tools", "expect", "impossible",
             "no_tool", "reference", "metadata"}
EXPECT_KEYS = {"terms", "figures", "must_call", "must_not_call", "read_back"}


@dataclass
class MCPState:
    """One episode's session and what it records."""

    client: Any
    names: dict[str, str]  # harness name -> MCP name, for the tools offered
    sandbox: Path | None = None  # the episode's own folder (`{sandbox}` in the server command), removed at close


SANDBOX = re.compile(r"\{sandbox(?::([^}]*))?\}")


def open_sandbox(command: str) -> tuple[str, Path | None]:
    """`command` with every `{sandbox}` / `{sandbox:TEMPLATE}` replaced by a fresh temporary folder (a copy of
    TEMPLATE when given), and that folder; `(command, None)` when it has none."""
    templates = {m.group(1) for m in SANDBOX.finditer(command) if m.group(1)}
    if not SANDBOX.search(command):
        return command, None
    if len(templates) > 1:
        raise ConfigError(f"the server command names two sandbox templates ({', '.join(sorted(templates))}); "
                          "one episode has one sandbox")
    import shutil
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="agentrig-mcp-"))
    if templates:
        template = Path(next(iter(templates))).expanduser()
        if not template.is_dir():
            shutil.rmtree(folder, ignore_errors=True)
            raise ConfigError(f"sandbox template {template} is not a folder (from {{sandbox:{template}}} in the "
                              "server command)")
        shutil.copytree(template, folder, dirs_exist_ok=True)
    return SANDBOX.sub(lambda _: shlex.quote(str(folder)), command), folder


def _task_error(path: Path, line: int, text: str) -> ConfigError:
    return ConfigError(f"{path} line {line}: {text}")


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    """The task lines of a tasks file, checked; a wrong line is an error naming the line and what to fix."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"tasks file {path} is a folder; --tasks takes a JSONL file of tasks (docs/mcp.md)")
    if not path.is_file():
        raise ConfigError(f"tasks file {path} does not exist (an MCP environment needs --tasks FILE.jsonl)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"tasks file {path} is binary, not JSONL text (gzipped? unpack it first)") from None
    out: list[dict[str, Any]] = []
    ids: set[str] = set()
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except ValueError as exc:
            raise _task_error(path, i, f"not JSON ({exc})") from None
        if not isinstance(task, dict):
            raise _task_error(path, i, "a task is a JSON object")
        unknown = set(task) - TASK_KEYS
        if unknown:
            raise _task_error(path, i, f"unknown field(s) {', '.join(sorted(unknown))}; a task has "
                              f"{', '.join(sorted(TASK_KEYS))}")
        for key in ("id", "prompt"):
            if not isinstance(task.get(key), str) or not task[key].strip():
                raise _task_error(path, i, f"needs a non-empty string {key!r}")
        if task["id"] in ids:
            raise _task_error(path, i, f"task id {task['id']!r} appears twice")
        ids.add(task["id"])
        allowed = task.get("allowed_tools", [])
        if not isinstance(allowed, list) or not all(isinstance(x, str) for x in allowed):
            raise _task_error(path, i, "'allowed_tools' is a list of tool names (deny by default: only these "
                              "tools are shown and callable)")
        if not allowed and not task.get("no_tool") and not task.get("impossible"):
            raise _task_error(path, i, "'allowed_tools' is empty: name the tools the task may use (or mark it "
                              "no_tool or impossible)")
        expect = task.get("expect", {})
        if not isinstance(expect, dict) or set(expect) - EXPECT_KEYS:
            raise _task_error(path, i, f"'expect' is an object with {', '.join(sorted(EXPECT_KEYS))}")
        try:
            for fig in expect.get("figures", []):
                figure_spec(fig)
        except (TypeError, ValueError, KeyError) as exc:
            raise _task_error(path, i, f"a figure is a number or {{'value', 'kind', 'tol'}}: {exc}") from None
        rb = expect.get("read_back")
        if rb is not None and (not isinstance(rb, dict) or not isinstance(rb.get("tool"), str)
                               or not isinstance(rb.get("contains"), str)):
            raise _task_error(path, i, "'read_back' is {'tool': NAME, 'arguments': {...}, 'contains': TEXT}")
        ref = task.get("reference")
        if ref is not None and (not isinstance(ref, list) or not all(
                isinstance(s, dict) and (("calls" in s and isinstance(s["calls"], list)) or isinstance(s.get("answer"), str))
                for s in ref)):
            raise _task_error(path, i, "'reference' is a list of steps, each {'calls': [{'name', 'arguments'}]} "
                              "or {'answer': TEXT}")
        task["_line"] = i
        out.append(task)
    if not out:
        raise ConfigError(f"tasks file {path} holds no tasks")
    return out


class MCPEnv(Environment):
    """Tasks from a file, tools from an MCP server (see the module docstring)."""

    name = "mcp"
    eval_splits = ("test",)

    def __init__(self, server: str, tasks: str | Path | None, record: str | Path | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        kind, _, rest = server.partition(":")
        self.replay = None
        if kind == "replay":
            from agentrig.mcp.replay import Recording

            self.replay = Recording(rest)
            self.server: ServerSpec | None = None
        else:
            self.server = ServerSpec.parse(server)
        self.spec = f"mcp:{server}"
        self.tasks_path = Path(tasks) if tasks is not None else None
        self.record = Path(record) if record else None
        self.timeout_s = timeout_s
        self._tasks = load_tasks(self.tasks_path) if self.tasks_path is not None else []
        found = sorted({t.get("split", "train") for t in self._tasks})
        self.splits = tuple(dict.fromkeys(["train", "dev", "test", "test_unseen_tools", *found]))

    # -- tasks ------------------------------------------------------------------------------------
    def _pool(self, split: str) -> list[dict[str, Any]]:
        if self.tasks_path is None:
            raise ConfigError("an MCP environment's tasks come from a file: pass --tasks FILE.jsonl (docs/mcp.md)")
        return [t for t in self._tasks if t.get("split", "train") == split]

    def pool_size(self, split: str) -> int | None:
        """The file's tasks of `split` (eval takes at most these)."""
        return len(self._pool(split))

    def tasks(self, split: str, n: int, seed: int = 0, start: int = 0,
              family_weights: dict[str, float] | None = None) -> list[TaskSpec]:
        """Tasks start..start+n-1 of `split` in file order; past the end the list repeats with ids `ID~K`."""
        self.check_split(split)
        pool = self._pool(split)
        if not pool:
            have = sorted({t.get("split", "train") for t in self._tasks})
            raise ConfigError(f"{self.tasks_path} has no task with split {split!r} (it has: {', '.join(have)}); "
                              "a task without 'split' is a train task")
        out = []
        for i in range(start, start + n):
            t = pool[i % len(pool)]
            rnd = i // len(pool)
            expect = t.get("expect", {})
            out.append(TaskSpec(
                id=t["id"] if rnd == 0 else f"{t['id']}~{rnd}", prompt=t["prompt"], env=self.name,
                family=t.get("family", ""), split=split,
                allowed_tools=[harness_name(x) for x in t.get("allowed_tools", [])],
                expected={**expect, "impossible": bool(t.get("impossible")), "no_tool": bool(t.get("no_tool"))},
                metadata={**t.get("metadata", {}), "impossible": bool(t.get("impossible")),
                          "no_tool": bool(t.get("no_tool")), "read_only_tools": list(t.get("read_only_tools", [])),
                          "reference": t.get("reference"), "mcp_allowed": list(t.get("allowed_tools", []))}))
        return out

    # -- episodes ---------------------------------------------------------------------------------
    def connect(self, task_id: str = "") -> tuple[Any, Path | None]:
        """A new session for one episode and its sandbox folder (None without one): a replay of the recording,
        or a live server (in its own sandbox when the stdio command asks for one), recorded when asked."""
        if self.replay is not None:
            from agentrig.mcp.replay import ReplayClient

            return ReplayClient(self.replay, task_id), None
        assert self.server is not None
        spec, sandbox = self.server, None
        if spec.transport == "stdio":
            command, sandbox = open_sandbox(spec.target)
            spec = ServerSpec("stdio", command)
        try:
            client: Any = MCPClient(spec, cwd=str(sandbox) if sandbox else None).start()
        except BaseException:
            if sandbox is not None:
                import shutil

                shutil.rmtree(sandbox, ignore_errors=True)
            raise
        if self.record is not None:
            from agentrig.mcp.replay import RecordingClient

            client = RecordingClient(client, self.record, task_id)
        return client, sandbox

    def setup(self, task: TaskSpec) -> tuple[ToolSet, MCPState]:
        """A fresh session and the task's allowed tools from it."""
        base_id = task.id.split("~")[0]
        client, sandbox = self.connect(base_id)
        try:
            allowed = task.metadata.get("mcp_allowed", task.allowed_tools)
            tools = mcp_tools(client, allowed, task.metadata.get("read_only_tools", []), self.timeout_s)
        except BaseException:
            client.close()
            if sandbox is not None:
                import shutil

                shutil.rmtree(sandbox, ignore_errors=True)
            raise
        names = {harness_name(n): n for n in (t["name"] for t in client.list_tools())}
        return ToolSet(tools), MCPState(client, names, sandbox)

    def close(self, state: MCPState) -> None:
        state.client.close()
        if state.sandbox is not None:
            import shutil

            shutil.rmtree(state.sandbox, ignore_errors=True)

    def check(self, task: TaskSpec, state: MCPState, episode: Episode) -> CheckResult:
        """The file's expectations against the answer, the calls and a read-back (see the module docstring)."""
        exp = task.expected
        answer = episode.final_answer or ""
        low = answer.lower()
        res = CheckResult(success=True)
        used = [state.names.get(n, n) for n in task.allowed_tools]
        episode.metadata["mcp"] = state.client.identity(used=used)
        check_answer(exp, episode, res)
        done = {r.name for s in episode.steps for r in s.results if r.ok}
        executed = {r.name for s in episode.steps for r in s.results if r.error not in
                    ("unknown_tool", "not_permitted", "schema")}
        for name in exp.get("must_call", []):
            if harness_name(name) not in done:
                res.reasons.append(f"{name} was never called successfully")
        for name in exp.get("must_not_call", []):
            if harness_name(name) in executed:
                res.side_effects_ok = False
                res.forbidden.append(f"{name} called")
                res.reasons.append(f"{name} was called, which the task forbids")
        rb = exp.get("read_back")
        if rb is not None:
            self._read_back(state, rb, res)
        check_no_tool_and_impossible(exp, task.prompt, answer, episode, res, unavailable="it could not be done")
        return settle(res, episode, answer)

    def _read_back(self, state: MCPState, rb: dict[str, Any], res: CheckResult) -> None:
        tool = state.names.get(rb["tool"], rb["tool"])
        try:
            result = state.client.call(tool, rb.get("arguments") or {}, self.timeout_s)
            text, failed = result.text, result.is_error
        except (MCPCallError, MCPServerDown) as exc:
            text, failed = str(exc), True
        if failed or rb["contains"] not in text:
            shown = re.sub(r"\s+", " ", text)[:120]
            res.side_effects_ok = False
            res.reasons.append(f"read-back {rb['tool']}: {rb['contains']!r} not in its result ({shown!r})")

    # -- teacher ----------------------------------------------------------------------------------
    def expert(self, detour_rate: float = 0.0, seed: int = 0) -> Any:
        """A scripted teacher that plays each task's `reference` steps (tasks without one are refused)."""
        return ReferencePolicy()


FAILED_PREFIXES = ("Error:", "Tool execution failed:", "No result")  # how the harness and its faults say a call failed
MAX_RETRIES = 2  # the recovery rule's "retry once" and a second try, then the reference moves on


def _reference_position(messages: list[dict[str, Any]]) -> tuple[int, int]:
    """(the reference step to play, how many times in a row the last one failed), from the conversation: a
    turn whose tool results include a failure does not advance, so the reference retries it."""
    position, retries = 0, 0
    i = 0
    while i < len(messages):
        if messages[i].get("role") != "assistant":
            i += 1
            continue
        j = i + 1
        results = []
        while j < len(messages) and messages[j].get("role") == "tool":
            results.append(result_text(messages[j]))
            j += 1
        failed = any(r.startswith(FAILED_PREFIXES) for r in results)
        if failed and retries < MAX_RETRIES:
            retries += 1
        else:
            position, retries = position + 1, 0
        i = j
    return position, retries


class ReferencePolicy:
    """Plays a task's `reference` in the request's protocol: the next step after each turn whose calls all
    succeeded; a turn with a failed call (an injected fault, a server error) is sent again, up to
    `MAX_RETRIES` times, so collecting with `--faults` gives recovery episodes."""

    def generate(self, request: Any) -> str:
        from agentrig.harness.protocol import get_protocol

        ref = request.task.metadata.get("reference")
        if not ref:
            raise ConfigError(f"task {request.task.id!r} has no 'reference' steps, so --teacher expert cannot "
                              "play it; give it a reference or use --teacher model / --teacher openai")
        position, _ = _reference_position(request.messages)
        if position >= len(ref):
            return ref[-1].get("answer", "I could not finish this task.")
        step = ref[position]
        if "answer" in step:
            return step["answer"]
        calls = [ToolCall(id=f"ref{request.step}_{k}", name=harness_name(c["name"]), arguments=c.get("arguments", {}))
                 for k, c in enumerate(step["calls"])]
        return get_protocol(request.protocol).format_calls(calls)

    def generate_batch(self, requests: list[Any]) -> list[str]:
        return [self.generate(r) for r in requests]


def make_mcp_env(spec: str, tasks: str | Path | None, record: str | Path | None = None) -> MCPEnv:
    """`mcp:stdio:CMD`, `mcp:http:URL` or `mcp:replay:FILE` with its tasks file."""
    return MCPEnv(spec[len("mcp:"):], tasks, record)
