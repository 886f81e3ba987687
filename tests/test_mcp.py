"""MCP tool sources with real servers: agentrig's own `mcp serve` over stdio and HTTP, and the reference
filesystem server from npm; episodes through the harness with the scripted policy, asserted whole."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("mcp")

from agentrig.envs import load_env
from agentrig.errors import ConfigError
from agentrig.evals.report import render_transcript
from agentrig.harness import HarnessConfig, ScriptedPolicy, run_episode
from agentrig.harness.faults import FaultConfig
from agentrig.harness.tools import ToolSet
from agentrig.harness.protocol import feedback
from agentrig.harness.trajectory import TaskSpec, ToolCall, ToolResult
from agentrig.mcp.client import MCPClient, MCPServerDown, ServerSpec
from agentrig.mcp.tools import harness_name, resolve_refs

ROOT = Path(__file__).resolve().parents[1]
MIS = ROOT / "tests" / "mcp" / "misbehaving_env.py"
SERVE = f"{sys.executable} -m agentrig mcp serve --env {MIS}:make_env"
FS_BIN = ROOT / ".venv" / "npm" / "node_modules" / ".bin" / "mcp-server-filesystem"


def call(name: str, **arguments) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


@pytest.fixture(scope="module")
def stdio_client():
    with MCPClient(f"stdio:{SERVE}") as client:
        yield client


def test_stdio_lists_and_calls_with_the_servers_words(stdio_client):
    c = stdio_client
    assert c.server_info == {"name": "agentrig-misbehaving", "version": __import__("agentrig").__version__}
    names = [t["name"] for t in c.list_tools()]
    assert names == ["echo", "add", "bump", "fail", "hang", "crash", "big", "lookup"]
    assert c.call("echo", {"text": "hi"}, 5).text == "hi"
    assert json.loads(c.call("add", {"a": 2, "b": 3}, 5).text) == {"sum": 5}
    failed = c.call("fail", {"reason": "disk on fire"}, 5)
    assert failed.is_error and "disk on fire" in failed.text
    # the server validates too: its per-field feedback comes back as an isError result
    bad = c.call("add", {"a": "two", "b": 3}, 5)
    assert bad.is_error and 'arguments.a: expected type integer, got "two"' in bad.text
    ident = c.identity(["echo"])
    assert ident["name"] == "agentrig-misbehaving" and list(ident["tools"]) == ["echo"]
    assert len(ident["tools"]["echo"]) == 16


def test_toolset_denies_by_default_and_validates_against_the_original_schema(stdio_client):
    tools = ToolSet.from_mcp(stdio_client, allow=["echo", "lookup"], read_only=["echo"])
    assert tools.allowed == ["echo", "lookup"] and tools.get("crash") is None
    lookup = tools.get("lookup")
    assert "$defs" not in json.dumps(lookup.parameters)  # the model sees the resolved schema
    assert lookup.parameters["properties"]["where"]["required"] == ["x", "y"]
    assert lookup.validation_schema is not None and "$defs" in lookup.validation_schema
    errs = tools.validate("lookup", {"where": {"x": 1}})
    assert [(e.path, e.expected) for e in errs] == [("arguments.where.y", "a required field")]
    ok = tools.execute(ToolCall("c1", "lookup", {"where": {"x": 1, "y": 2}}))
    assert ok.ok and json.loads(ok.content) == {"found": "point at 1,2"}
    assert tools.get("echo").inject_faults and not tools.get("echo").side_effects
    assert not tools.get("lookup").inject_faults and tools.get("lookup").side_effects
    with pytest.raises(ConfigError, match="does not list; it has: add, big, bump"):
        ToolSet.from_mcp(stdio_client, allow=["echo", "rm_rf"])


def test_episode_through_the_harness_transcript_whole(tmp_path):
    """Bad arguments get per-field feedback, an isError result is a tool error, a tool outside the allowlist
    is refused without reaching the server, and the agent answers."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "sum-1", "split": "test", "prompt": "What is 2 + 3?",
                                 "allowed_tools": ["add", "fail"], "read_only_tools": ["add"],
                                 "expect": {"figures": [5], "must_call": ["add"], "must_not_call": ["crash"]}}) + "\n")
    env = load_env(f"mcp:stdio:{SERVE}", tasks=str(tasks))
    task = env.tasks("test", 1)[0]
    tools, state = env.setup(task)
    policy = ScriptedPolicy([call("add", a="2", b=3), call("crash"), call("fail", reason="quota"),
                             call("add", a=2, b=3), "2 + 3 = 5."])
    try:
        ep = run_episode(task, tools, policy, HarnessConfig(), episode_id=task.id)
        result = env.check(task, state, ep)
    finally:
        env.close(state)
    ep.success = result.success
    text = render_transcript(ep)
    assert text.splitlines() == [
        "task sum-1 (no family) - SUCCESS, 5 steps, ended by final_answer",
        "user: What is 2 + 3?",
        '  -> call add({"a": "2", "b": 3})',
        "  <- FAILED (schema): Error: invalid arguments for 'add': - arguments.a: expected type integer, got \"2\" "
        "Fix the errors and try again.",
        "  -> call crash({})",
        "  <- FAILED (unknown_tool): Error: there is no tool named 'crash'. Available tools: add, fail, note.",
        '  -> call fail({"reason": "quota"})',
        "  <- FAILED (exception): Tool execution failed: RuntimeError: quota",
        '  -> call add({"a": 2, "b": 3})',
        '  <- ok: {"sum": 5}',
        "assistant: 2 + 3 = 5.",
    ], text
    assert result.success, result.reasons
    assert ep.metadata["mcp"]["name"] == "agentrig-misbehaving" and set(ep.metadata["mcp"]["tools"]) == {"add", "fail"}


def test_hanging_tool_times_out_and_a_crash_is_restarted_for_the_next_episode(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "t", "split": "test", "prompt": "Echo hello.",
                                 "allowed_tools": ["echo", "hang", "crash"], "expect": {"terms": ["hello"]}}) + "\n")
    env = load_env(f"mcp:stdio:{SERVE}", tasks=str(tasks))
    env.timeout_s = 1.0
    task = env.tasks("test", 1)[0]
    tools, state = env.setup(task)
    t0 = time.perf_counter()
    hung = tools.execute(ToolCall("h", "hang", {"seconds": 5}))
    assert hung.error == "timeout" and time.perf_counter() - t0 < 3
    assert tools.execute(ToolCall("e", "echo", {"text": "still here"})).content == "still here"
    crashed = tools.execute(ToolCall("c", "crash", {}))
    assert not crashed.ok and "stopped" in crashed.content and "restarted for the next episode" in crashed.content
    after = tools.execute(ToolCall("e2", "echo", {"text": "x"}))
    assert not after.ok and "is down" in after.content
    env.close(state)
    tools2, state2 = env.setup(task)  # a new session: a new server process
    try:
        ep = run_episode(task, tools2, ScriptedPolicy([call("echo", text="hello"), "hello"]), HarnessConfig())
        assert env.check(task, state2, ep).success
    finally:
        env.close(state2)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def http_server():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentrig", "mcp", "serve", "--env", f"{MIS}:make_env",
                             "--transport", "http", "--port", str(port)], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.time() + 60
    while time.time() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            if proc.poll() is not None:
                pytest.fail(f"agentrig mcp serve exited: {proc.stderr.read()}")
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(timeout=20)


def test_http_sessions_get_fresh_state_and_errors_are_tool_errors(http_server):
    for _ in range(2):
        with MCPClient(http_server) as c:
            assert [json.loads(c.call("bump", {}, 5).text)["count"] for _ in range(3)] == [1, 2, 3]
            tools = ToolSet.from_mcp(c, allow=["fail", "big"], read_only=["big"])
            res = tools.execute(ToolCall("f", "fail", {"reason": "nope"}))
            assert not res.ok and res.error == "exception" and "nope" in res.content
            unknown = c.call  # a JSON-RPC error (a tool the server does not have) is a call error, not a crash
            with pytest.raises(Exception, match="unknown tool 'nosuch'"):
                unknown("nosuch", {}, 5)
            assert c.state == "open"
            big = tools.execute(ToolCall("b", "big", {"n": 10000}))
            assert big.ok and big.truncated and len(big.content) < 5000


def test_faults_only_touch_read_only_mcp_tools(stdio_client):
    tools = ToolSet.from_mcp(stdio_client, allow=["echo", "bump"], read_only=["echo"])
    hook = FaultConfig.from_total(1.0).injector("s", tools=tools)
    faulted = hook(ToolCall("1", "echo", {"text": "a"}), lambda: tools.execute(ToolCall("1", "echo", {"text": "a"})))
    assert faulted.fault is not None
    for i in range(20):
        res = hook(ToolCall(str(i), "bump", {}), lambda: tools.execute(ToolCall("x", "bump", {})))
        assert res.fault is None and res.ok


def test_names_map_reversibly_and_refs_resolve():
    assert harness_name("read_file") == "read_file"
    long = "a" * 128
    odd = "weird name/with:chars"
    mapped = {harness_name(n) for n in (long, long + "b", odd, "9lives", "ns::tool")}
    assert len(mapped) == 5 and all(len(m) <= 64 for m in mapped)
    assert harness_name("9lives").startswith("t_9lives_") and harness_name(odd).startswith("weird_name_with_chars_")
    schema = {"type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"type": "string",
                                                                                           "enum": ["x"]}}}
    assert resolve_refs(schema) == {"type": "object", "properties": {"a": {"type": "string", "enum": ["x"]}}}
    recursive = {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}},
                 "$defs": {"N": {"type": "object", "properties": {"next": {"$ref": "#/$defs/N"}}}}}
    assert "$ref" not in json.dumps(resolve_refs(recursive))


def test_bad_specs_and_task_files_say_what_to_do(tmp_path):
    with pytest.raises(ConfigError, match="stdio:'COMMAND ARGS'"):
        ServerSpec.parse("ftp://x")
    with pytest.raises(MCPServerDown, match="cannot connect"):
        MCPClient("stdio:/nonexistent/server --flag").start()
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"id": "a", "prompt": "x", "allowed_tools": ["echo"]}\n{"id": "a", "prompt": "y", "allowed_tools": ["e"]}\n')
    with pytest.raises(ConfigError, match="line 2: task id 'a' appears twice"):
        load_env(f"mcp:stdio:{SERVE}", tasks=str(bad))
    bad.write_text('{"id": "a", "prompt": "x", "allowed_tool": ["echo"]}\n')
    with pytest.raises(ConfigError, match="line 1: unknown field"):
        load_env(f"mcp:stdio:{SERVE}", tasks=str(bad))
    bad.write_text('{"id": "a", "prompt": "x"}\n')
    with pytest.raises(ConfigError, match="'allowed_tools' is empty"):
        load_env(f"mcp:stdio:{SERVE}", tasks=str(bad))
    with pytest.raises(ConfigError, match="belong to MCP environments"):
        load_env("datadesk", tasks=str(bad))
    env = load_env(f"mcp:stdio:{SERVE}")
    with pytest.raises(ConfigError, match="pass --tasks"):
        env.tasks("test", 1)


# -- a third-party server: the reference filesystem server from npm -------------------------------

needs_fs = pytest.mark.skipif(not FS_BIN.exists(), reason=f"{FS_BIN} is missing: `make setup` installs it with npm "
                              "(node and npm must be on PATH)")


@needs_fs
def test_filesystem_server_episode_lists_reads_writes_and_is_refused_outside(tmp_path):
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("The launch is on Friday.\n")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({
        "id": "fs-1", "split": "test", "prompt": "Copy the launch day from notes.txt into day.txt and tell me.",
        "allowed_tools": ["list_directory", "read_text_file", "write_file"],
        "read_only_tools": ["list_directory", "read_text_file"],
        "expect": {"terms": ["Friday"], "must_call": ["write_file"],
                   "read_back": {"tool": "read_text_file", "arguments": {"path": "day.txt"}, "contains": "Friday"}}}) + "\n")
    env = load_env(f"mcp:stdio:{FS_BIN} {root}", tasks=str(tasks))
    task = env.tasks("test", 1)[0]
    tools, state = env.setup(task)
    policy = ScriptedPolicy([call("list_directory", path="."), call("read_text_file", path="/etc/hostname"),
                             call("move_file", source="notes.txt", destination="/tmp/x"),
                             call("read_text_file", path="notes.txt"), call("write_file", path="day.txt", content="Friday"),
                             "The launch is on Friday; I wrote it to day.txt."])
    try:
        ep = run_episode(task, tools, policy, HarnessConfig(), episode_id=task.id)
        result = env.check(task, state, ep)
    finally:
        env.close(state)
    results = [r for s in ep.steps for r in s.results]
    assert results[0].ok and results[0].content == "[FILE] notes.txt"
    assert not results[1].ok and "Access denied - path outside allowed directories" in results[1].content
    assert results[2].error == "unknown_tool"  # move_file is not in the allowlist: never sent to the server
    assert results[3].content == "The launch is on Friday.\n"
    assert results[4].ok and (root / "day.txt").read_text() == "Friday"
    assert (root / "notes.txt").exists() and not Path("/tmp/x").exists()
    assert result.success, result.reasons
    assert ep.metadata["mcp"]["name"] == "secure-filesystem-server"


@needs_fs
def test_collect_build_and_replay_offline(tmp_path):
    """Ten tasks on the filesystem server with the reference (scripted) teacher, recorded; built into training
    data; then replayed without the server to the same episodes."""
    from agentrig.data.collect import CollectConfig, run_collect
    from agentrig.data.databuild import build_dataset
    from agentrig.harness.trajectory import read_episodes

    root = tmp_path / "files"
    root.mkdir()
    lines = []
    for i in range(10):
        (root / f"f{i}.txt").write_text(f"value {i * 7}\n")
        lines.append(json.dumps({
            "id": f"read-{i}", "prompt": f"What value is in f{i}.txt?", "allowed_tools": ["read_text_file"],
            "read_only_tools": ["read_text_file"], "expect": {"figures": [i * 7]},
            "reference": [{"calls": [{"name": "read_text_file", "arguments": {"path": f"f{i}.txt"}}]},
                          {"answer": f"f{i}.txt holds the value {i * 7}."}]}))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(lines) + "\n")
    record = tmp_path / "record.jsonl"
    out = tmp_path / "train.jsonl"
    cfg = CollectConfig(env=f"mcp:stdio:{FS_BIN} {root}", tasks=str(tasks), split="train", episodes=10,
                        teacher="expert", faults=0.0, detours=0.0, paraphrase=0.0, mcp_record=str(record), out=str(out))
    summary = run_collect(cfg, progress=False)
    assert summary.successes == 10
    live = read_episodes(out)
    assert all(ep.metadata["mcp"]["name"] == "secure-filesystem-server" for ep in live)
    report = build_dataset([out], tmp_path / "data", model="smollm2-135m")
    assert report.samples == 10
    sample = json.loads((tmp_path / "data" / "samples.jsonl").read_text().splitlines()[3])
    assert sample["messages"][2]["tool_calls"][0]["function"]["name"] == "read_text_file"
    assert sample["messages"][3] == {"role": "tool", "tool_call_id": sample["messages"][2]["tool_calls"][0]["id"],
                                     "name": "read_text_file", "content": "value 21\n"}
    # replay: no server, the same tool results and verdicts
    shutil.rmtree(root)
    cfg2 = CollectConfig(env=f"mcp:replay:{record}", tasks=str(tasks), split="train", episodes=10, teacher="expert",
                         faults=0.0, detours=0.0, paraphrase=0.0, out=str(tmp_path / "replayed.jsonl"))
    assert run_collect(cfg2, progress=False).successes == 10
    replayed = read_episodes(tmp_path / "replayed.jsonl")
    for a, b in zip(live, replayed):
        assert [r.content for s in a.steps for r in s.results] == [r.content for s in b.steps for r in s.results]
        assert a.final_answer == b.final_answer and b.success
    # the server's tools changed since one episode was collected: reported, and refused against the server now
    from agentrig.mcp.client import current_tool_hashes

    rows = [json.loads(x) for x in out.read_text().splitlines()]
    rows[0]["metadata"]["mcp"]["tools"]["read_text_file"] = "0" * 16
    changed = tmp_path / "changed.jsonl"
    changed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "changed.jsonl.meta.json").write_text((tmp_path / "train.jsonl.meta.json").read_text())
    flagged = build_dataset([changed], tmp_path / "d2", model="smollm2-135m")
    assert flagged.samples == 10 and flagged.mcp_changed_tools == ["secure-filesystem-server/read_text_file"]
    now = current_tool_hashes(f"mcp:replay:{record}")
    refused = build_dataset([changed], tmp_path / "d3", model="smollm2-135m", mcp_current=now)
    assert refused.samples == 9 and refused.dropped == {"mcp_tools_changed": 1}
    # the command line: an offline evaluation from the recording, the reference teacher as the policy
    proc = subprocess.run([sys.executable, "-m", "agentrig", "eval", "--env", f"mcp:replay:{record}", "--tasks",
                           str(tasks), "--split", "train", "--policy", "expert", "--out", str(tmp_path / "ev")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    metrics = json.loads((tmp_path / "ev" / "metrics.json").read_text())
    assert json.dumps(metrics).count('"completion"') >= 1 and "10/10" in proc.stdout + proc.stderr


@needs_fs
def test_reference_teacher_retries_a_faulted_call_into_a_recovery(tmp_path):
    root = tmp_path / "files"
    shutil.copytree(ROOT / "examples" / "mcp" / "files", root)
    tasks = ROOT / "examples" / "mcp" / "files_tasks.jsonl"
    env = load_env(f"mcp:stdio:{FS_BIN} {root}", tasks=str(tasks))
    task = env.tasks("test", 1)[0]  # files-transport: read budget.csv, answer 310
    tools, state = env.setup(task)
    first: list[str] = []

    def hook(c, execute):  # the first call gets the injected 503 text, the retry runs for real
        if not first:
            first.append(c.name)
            return ToolResult(c.id, c.name, feedback("fault_error_503", tool=c.name), ok=False, fault="error_503")
        return execute()

    try:
        ep = run_episode(task, tools, env.expert(), HarnessConfig(), tool_hook=hook, episode_id=task.id)
        result = env.check(task, state, ep)
    finally:
        env.close(state)
    assert ep.faults == ["error_503"], ep.faults
    assert [c.name for s in ep.steps for c in s.calls] == ["read_text_file", "read_text_file"]
    assert result.success and ep.final_answer == "Transport is budgeted at 310."


@needs_fs
def test_each_episode_gets_its_own_sandbox_folder(tmp_path):
    template = tmp_path / "template"
    template.mkdir()
    (template / "a.txt").write_text("A")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"id": "w", "split": "test", "prompt": "Write b.txt.",
                                 "allowed_tools": ["write_file", "list_directory"]}) + "\n")
    env = load_env(f"mcp:stdio:{FS_BIN} {{sandbox:{template}}}", tasks=str(tasks))
    task = env.tasks("test", 1)[0]
    tools, state = env.setup(task)
    assert state.sandbox is not None and state.sandbox != template
    assert tools.execute(ToolCall("1", "write_file", {"path": "b.txt", "content": "B"})).ok
    assert (state.sandbox / "b.txt").read_text() == "B" and not (template / "b.txt").exists()
    env.close(state)
    assert not state.sandbox.exists()
    tools2, state2 = env.setup(task)  # the next episode starts from the template again
    try:
        assert tools2.execute(ToolCall("2", "list_directory", {"path": "."})).content == "[FILE] a.txt"
    finally:
        env.close(state2)
    with pytest.raises(ConfigError, match="is not a folder"):
        load_env(f"mcp:stdio:{FS_BIN} {{sandbox:{tmp_path / 'nope'}}}", tasks=str(tasks)).setup(task)


@needs_fs
def test_the_documented_example_completes_with_its_reference_teacher(tmp_path):
    root = "{sandbox:" + str(ROOT / "examples" / "mcp" / "files") + "}"
    proc = subprocess.run([sys.executable, "-m", "agentrig", "eval", "--env", f"mcp:stdio:{FS_BIN} {root}", "--tasks",
                           str(ROOT / "examples" / "mcp" / "files_tasks.jsonl"), "--split", "train,test",
                           "--policy", "expert", "--out", str(tmp_path / "ev")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "(14/14)" in proc.stdout and not (ROOT / "examples" / "mcp" / "files" / "reminder.txt").exists()


def test_chat_tools_from_an_mcp_server_are_denied_by_default():
    from agentrig.evals.chat import session_tools

    env = load_env(f"mcp:stdio:{SERVE}")
    with pytest.raises(ConfigError, match="denied by default"):
        session_tools(env)
    tools, state = session_tools(env, ["echo", "add"], ["echo"])
    try:
        assert tools.allowed == ["echo", "add"]
        assert tools.execute(ToolCall("1", "echo", {"text": "hey"})).content == "hey"
    finally:
        env.close(state)
