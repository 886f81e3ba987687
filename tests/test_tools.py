"""Tools: definition from functions and schemas, per-field validation, allowlist, safe execution."""

from __future__ import annotations

import time
from typing import Literal

import pytest

from agentrig.harness.tools import Tool, ToolDefinitionError, ToolSet, tool
from agentrig.harness.trajectory import ToolCall


@tool
def lookup(customer: str, limit: int = 5, region: Literal["north", "south"] | None = None) -> dict:
    """Find a customer.

    Args:
        customer: the customer's name
        limit: how many rows
        region: optional region filter
    """
    return {"customer": customer, "limit": limit}


def test_schema_from_typed_docstringed_function():
    spec = lookup.spec()["function"]
    assert spec["name"] == "lookup" and spec["description"] == "Find a customer."
    props = spec["parameters"]["properties"]
    assert props["customer"] == {"type": "string", "description": "the customer's name"}
    assert props["limit"] == {"type": "integer", "description": "how many rows", "default": 5}
    assert props["region"]["anyOf"] == [{"enum": ["north", "south"]}, {"type": "null"}]
    assert spec["parameters"]["required"] == ["customer"]


def test_missing_hints_or_docstring_fail_at_definition():
    with pytest.raises(ToolDefinitionError, match="needs a docstring"):
        @tool
        def nodoc(x: int) -> int:
            return x

    with pytest.raises(ToolDefinitionError, match="parameter 'x' needs a type hint"):
        @tool
        def nohint(x) -> int:
            """Doc."""
            return x

    with pytest.raises(ToolDefinitionError, match="invalid JSON schema"):
        Tool.from_schema("bad", "desc", {"type": "object", "properties": {"a": {"type": "nonsense"}}}, lambda: 1)


def test_validation_reports_every_field_and_coerces_nothing():
    errors = lookup.validate({"limit": "5", "region": "east", "extra": 1})
    by_path = {e.path: e for e in errors}
    assert by_path["arguments.customer"].expected == "a required field"
    assert by_path["arguments.limit"].expected == "type integer" and by_path["arguments.limit"].given == '"5"'
    assert "arguments.region" in by_path
    assert any("unexpected field extra" in e.given for e in errors)
    assert lookup.validate({"customer": "Ada"}) == []
    assert lookup.validate([1, 2])[0].expected == "an object"


def test_from_openai_spec_and_renamed_tool_translates_arguments():
    t = Tool.from_openai({"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
        lambda a, b: a + b)
    r = t.renamed("plus", "Sum two integers.", {"a": "x", "b": "y"})
    assert r.parameters["required"] == ["x", "y"]
    res = ToolSet([r]).execute(ToolCall("c", "plus", {"x": 2, "y": 3}))
    assert res.ok and res.content == "5"


def test_allowlist_blocks_execution():
    ran = []
    t = Tool.from_schema("danger", "Deletes things.", {"type": "object", "properties": {}}, lambda: ran.append(1))
    ts = ToolSet([t, lookup], allowed=["lookup"])
    res = ts.execute(ToolCall("c", "danger", {}))
    assert not res.ok and res.error == "not_permitted" and "not permitted" in res.content
    assert ran == []
    assert [x.name for x in ts.offered()] == ["lookup"]


def _tool(fn, name="t", timeout_s=10.0):
    return Tool.from_schema(name, "A test tool.", {"type": "object", "properties": {}}, fn, timeout_s)


def test_exception_becomes_readable_observation():
    def boom():
        raise PermissionError("permission denied for table orders")

    res = ToolSet([_tool(boom)]).execute(ToolCall("c", "t", {}))
    assert not res.ok and res.error == "exception"
    assert res.content == "Tool execution failed: PermissionError: permission denied for table orders"
    assert "Traceback" not in res.content


def test_tool_that_blocks_forever_is_abandoned():
    def hang():
        time.sleep(3600)

    start = time.perf_counter()
    res = ToolSet([_tool(hang, timeout_s=0.2)]).execute(ToolCall("c", "t", {}))
    assert time.perf_counter() - start < 2
    assert not res.ok and res.error == "timeout" and "timed out after 0.2 s" in res.content


def test_tool_raising_systemexit_or_timeouterror_is_an_observation():
    def leave():
        raise SystemExit(3)

    def own_timeout():
        raise TimeoutError("upstream took too long")

    ts = ToolSet([_tool(leave, "a"), _tool(own_timeout, "b")])
    assert ts.execute(ToolCall("c", "a", {})).error == "exception"
    res = ts.execute(ToolCall("c", "b", {}))
    assert res.error == "exception" and "upstream took too long" in res.content


def test_ctrl_c_while_a_tool_runs_is_not_a_tool_failure():
    import os
    import signal
    import threading

    started, release = threading.Event(), threading.Event()

    def slow():
        started.set()
        release.wait(10)

    def press_ctrl_c():
        started.wait(10)
        os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: the main thread is waiting for the tool

    # Python's own Ctrl-C handler: a library imported by an earlier test (the trainer's stack) may have
    # installed another one in this process, and then SIGINT would not raise KeyboardInterrupt at all.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Thread(target=press_ctrl_c, daemon=True).start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ToolSet([_tool(slow, timeout_s=10)]).execute(ToolCall("c", "t", {}))
    finally:
        release.set()
        signal.signal(signal.SIGINT, previous)


def test_unserializable_and_huge_results():
    class Thing:
        def __repr__(self):
            return "<Thing>"

    ts = ToolSet([_tool(lambda: {"when": __import__("datetime").date(2026, 1, 2), "obj": Thing(), "s": {1}}, "a"),
                  _tool(lambda: "x" * 10_000, "b")], max_output_chars=100)
    res = ts.execute(ToolCall("c", "a", {}))
    assert res.ok and res.content == '{"when": "2026-01-02", "obj": "<Thing>", "s": [1]}'
    big = ts.execute(ToolCall("c", "b", {}))
    assert big.truncated and big.content.startswith("x" * 100) and "[output truncated: 9900 more characters]" in big.content


def test_async_tool_runs():
    async def fetch():
        return "fetched"

    assert ToolSet([_tool(fetch)]).execute(ToolCall("c", "t", {})).content == "fetched"


def test_keyboard_interrupt_raised_in_a_tool_stops_the_run():
    def interrupted():
        raise KeyboardInterrupt

    for isolation in ("thread", "process"):
        t = Tool("t", "interrupted", {"type": "object", "properties": {}}, interrupted, isolation=isolation)
        with pytest.raises(KeyboardInterrupt):
            ToolSet([t]).execute(ToolCall("c", "t", {}))


def test_hung_calls_are_bounded_per_tool_and_counted_until_they_finish():
    import threading

    from agentrig.harness import tools as tools_module

    release = threading.Event()

    def hang():
        release.wait(30)
        return "late"

    ts = ToolSet([_tool(hang, "stuck", timeout_s=0.05), _tool(lambda: "fine", "other")])
    before = threading.active_count()
    try:
        results = [ts.execute(ToolCall(f"c{i}", "stuck", {})) for i in range(3 * tools_module.MAX_HUNG_PER_TOOL)]
        assert [r.error for r in results] == (["timeout"] * tools_module.MAX_HUNG_PER_TOOL
                                              + ["hung"] * 2 * tools_module.MAX_HUNG_PER_TOOL)
        assert "did not finish its last 4 calls and was not started again" in results[-1].content
        assert threading.active_count() - before <= tools_module.MAX_HUNG_PER_TOOL  # no thread per refused call
        assert ts.execute(ToolCall("x", "other", {})).ok  # other tools still run
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while tools_module._POOL.hung.get("stuck") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "stuck" not in tools_module._POOL.hung
    release.clear()
    assert ts.execute(ToolCall("again", "stuck", {})).error == "timeout"  # started again once they finished
    release.set()


def _proc_tool(fn, name="t", timeout_s=5.0):
    return Tool(name, f"{name} tool", {"type": "object", "properties": {}}, fn, timeout_s=timeout_s, isolation="process")


def test_process_isolation_kills_hung_and_crashing_tools_and_the_next_call_runs():
    import os
    import signal

    def hang():
        time.sleep(3600)

    def segfault():
        os.kill(os.getpid(), signal.SIGSEGV)

    def leave():
        os._exit(3)

    def boom():
        raise ValueError("bad input")

    def big():
        return {"pid": os.getpid(), "x": "y" * 50_000}

    import psutil

    before = {c.pid for c in psutil.Process().children()}
    ts = ToolSet([_proc_tool(hang, "hang", 0.3), _proc_tool(segfault, "seg"), _proc_tool(leave, "leave"),
                  _proc_tool(boom, "boom"), _proc_tool(big, "big"), _proc_tool(lambda: {"ok": 1}, "fine")],
                 max_output_chars=200)
    start = time.perf_counter()
    res = ts.execute(ToolCall("c", "hang", {}))
    assert res.error == "timeout" and time.perf_counter() - start < 2
    seg = ts.execute(ToolCall("c", "seg", {}))
    assert seg.error == "crashed" and "killed by signal SIGSEGV" in seg.content
    assert ts.execute(ToolCall("c", "leave", {})).content.endswith("its process died: exit code 3)")
    err = ts.execute(ToolCall("c", "boom", {}))
    assert err.error == "exception" and err.content == "Tool execution failed: ValueError: bad input"
    out = ts.execute(ToolCall("c", "big", {}))
    assert out.ok and out.truncated and out.content.startswith('{"pid": ')
    assert int(out.content.split('"pid": ')[1].split(",")[0]) != os.getpid()
    fine = ts.execute(ToolCall("c", "fine", {}))
    assert fine.ok and fine.content == '{"ok": 1}'
    # no child is left behind: every one was reaped (other tests' children may exist; ours must not)
    assert {c.pid for c in psutil.Process().children()} <= before


def test_a_bad_isolation_is_refused_at_definition():
    with pytest.raises(ToolDefinitionError, match="isolation must be one of thread, process"):
        Tool("t", "x", {"type": "object", "properties": {}}, lambda: 1, isolation="docker")


def test_a_result_that_cannot_be_serialized_is_an_observation_not_a_crash():
    class BadRepr:
        def __repr__(self):
            raise RuntimeError("repr exploded")

    cyclic: dict = {}
    cyclic["self"] = cyclic
    for isolation in ("thread", "process"):
        ts = ToolSet([Tool("a", "cycle", {"type": "object", "properties": {}}, lambda: cyclic, isolation=isolation),
                      Tool("b", "bad repr", {"type": "object", "properties": {}}, lambda: {"x": BadRepr()},
                           isolation=isolation)])
        a, b = ts.execute(ToolCall("c", "a", {})), ts.execute(ToolCall("c", "b", {}))
        assert a.error == b.error == "exception", isolation
        assert "Circular reference" in a.content and "repr exploded" in b.content
