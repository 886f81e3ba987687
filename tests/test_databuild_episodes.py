"""Episodes for the data tests, made by the real harness with the scripted policy (plus their own checks)."""

from __future__ import annotations

import json

from agentrig.harness import HarnessConfig, PolicyReply, ScriptedPolicy, run_episode
from agentrig.harness.tools import ToolSet, tool
from agentrig.harness.trajectory import Episode, TaskSpec, ToolResult


@tool
def stock_level(sku: str, warehouse: str = "main") -> dict:
    """Units of a SKU in stock.

    Args:
        sku: the stock-keeping unit
        warehouse: which warehouse
    """
    return {"sku": sku, "warehouse": warehouse, "units": 7 if sku == "A-1" else 0}


@tool
def reorder(sku: str, qty: int) -> str:
    """Order more units of a SKU.

    Args:
        sku: the stock-keeping unit
        qty: how many units
    """
    return f"ordered {qty} x {sku}"


def call(name: str, **args) -> str:
    """A Hermes tool-call block as a model would write it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def toolset() -> ToolSet:
    """The two test tools."""
    return ToolSet([stock_level, reorder])


def make_episode(replies, task_id="t1", prompt="How many A-1 are in stock? Reorder 5 if fewer than 10.",
                 success=True, hook=None, config=None, family="stock", **meta) -> Episode:
    """Run the scripted replies through the harness and mark the outcome."""
    task = TaskSpec(id=task_id, prompt=prompt, env="testdesk", family=family, split="train")
    ep = run_episode(task, toolset(), ScriptedPolicy(list(replies)), config or HarnessConfig(memory=False), tool_hook=hook,
                     episode_id=meta.pop("episode_id", None) or f"{task_id}-{len(replies)}-{success}")
    ep.success = success
    ep.metadata.update(meta)
    return ep


def timeout_once():
    """A tool hook that makes the first call time out (an injected fault)."""
    state = {"n": 0}

    def hook(c, execute):
        state["n"] += 1
        if state["n"] == 1:
            return ToolResult(c.id, c.name, f"Tool execution failed: '{c.name}' timed out after 10 s", ok=False,
                              fault="timeout", error="timeout")
        return execute()

    return hook


SUCCESS = [
    "Let me check the stock." + "\n" + call("stock_level", warehouse="main", sku="A-1"),
    call("reorder", qty=5, sku="A-1"),
    "There are 7 units of A-1; I reordered 5.",
]


def success_episode(**kw) -> Episode:
    """Two calls (arguments out of schema order) and a final answer."""
    return make_episode(SUCCESS, **kw)


def recovered_episode() -> Episode:
    """The first call times out (injected); the retry works."""
    return make_episode([call("stock_level", sku="A-1"), call("stock_level", sku="A-1"),
                         "There are 7 units of A-1."], task_id="t2", hook=timeout_once())


def detour_episode() -> Episode:
    """A wrong tool call marked as a detour (weight 0), then the right path."""
    replies = [PolicyReply(call("reorder", sku="A-1", qty=1), weight=0.0), call("stock_level", sku="A-1"),
               "There are 7 units of A-1."]
    return make_episode(replies, task_id="t3")


def parallel_episode() -> Episode:
    """Text plus two calls in one turn (two results in a row)."""
    return make_episode(["Checking both.\n" + call("stock_level", sku="A-1") + "\n" + call("stock_level", sku="B-2"),
                         "A-1: 7, B-2: 0."], task_id="t4", prompt="Stock of A-1 and B-2?")


def long_episode(n: int = 8) -> Episode:
    """Many turns (for windows): n stock look-ups, then an answer."""
    replies = [call("stock_level", sku=f"S-{i}", warehouse="main") for i in range(n)] + ["All zero."]
    return make_episode(replies, task_id="t5", prompt="Check S-0 to S-7.", config=HarnessConfig(memory=False, max_steps=20))


def note_episode() -> Episode:
    """The model saves a note, so later prompts carry the memory area."""
    replies = [call("stock_level", sku="A-1"), call("note", summary="A-1 has 7 units"), call("reorder", sku="A-1", qty=5),
               "Done: 7 in stock, 5 ordered."]
    return make_episode(replies, task_id="t6", config=HarnessConfig(memory=True))


def test_helpers_make_what_the_tests_expect():
    ep = success_episode()
    assert [m["role"] for m in ep.messages_full] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert recovered_episode().recovered
    assert detour_episode().detours == 1
    assert len(note_episode().memory_events) == 1
