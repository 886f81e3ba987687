"""Harness overhead per step: parse, validate, dispatch, record (policy and tool time excluded).

Runs 10,000 scripted steps through `EpisodeRunner` with trivial tools (a mix of valid calls, repaired
calls, schema violations and final answers) and reports the median time of `submit()` minus the time
spent inside the tool functions. The peer is the floor a hand-rolled loop pays for the same steps:
`json.loads` + `jsonschema` validation + a direct function call, no records, no timeout, no feedback.
Target: at most 0.5 ms per step on one core. Run: `taskset -c 0 python benchmarks/harness_overhead.py`.
"""

from __future__ import annotations

import json
import re
import statistics
import time

from jsonschema import Draft202012Validator

from agentrig.harness import EpisodeRunner, HarnessConfig
from agentrig.harness.tools import ToolSet, tool
from agentrig.harness.trajectory import TaskSpec

TOOL_TIME = [0.0]


@tool
def lookup(name: str, limit: int = 3) -> dict:
    """Look a name up.

    Args:
        name: the name
        limit: how many rows
    """
    t = time.perf_counter()
    out = {"name": name, "rows": list(range(limit))}
    TOOL_TIME[0] += time.perf_counter() - t
    return out


OUTPUTS = [
    'Looking it up.\n<tool_call>\n{"name": "lookup", "arguments": {"name": "Ada", "limit": 2}}\n</tool_call>',
    "<tool_call>\n{'name': 'lookup', 'arguments': {'name': 'Bob'}}\n</tool_call>",
    '<tool_call>\n{"name": "lookup", "arguments": {"name": 7}}\n</tool_call>',
    '<tool_call>\n{"name": "lookup", "arguments": {"name": "Cy", "limit": 1}}\n</tool_call>\n<tool_call>\n{"name": "lookup", "arguments": {"name": "Di"}}\n</tool_call>',
    "Ada has 2 rows.",
]


def agentrig_steps(n: int) -> list[float]:
    """Per-step harness time in seconds for n steps."""
    times: list[float] = []
    tools = ToolSet([lookup])
    config = HarnessConfig(max_steps=10**9, stuck_repeats=10**9, memory=False)
    runner = None
    for i in range(n):
        if runner is None or runner.done:
            runner = EpisodeRunner(TaskSpec(id=f"b{i}", prompt="Find Ada."), tools, config, episode_id=f"b{i}")
        runner.request()
        TOOL_TIME[0] = 0.0
        t = time.perf_counter()
        runner.submit(OUTPUTS[i % len(OUTPUTS)])
        times.append(time.perf_counter() - t - TOOL_TIME[0])
    return times


def peer_steps(n: int) -> list[float]:
    """The hand-rolled floor: regex + json.loads + jsonschema + direct call."""
    validator = Draft202012Validator(lookup.parameters)
    block = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
    times: list[float] = []
    for i in range(n):
        out = OUTPUTS[i % len(OUTPUTS)]
        TOOL_TIME[0] = 0.0
        t = time.perf_counter()
        for m in block.finditer(out):
            try:
                obj = json.loads(m.group(1))
            except json.JSONDecodeError:
                continue
            if not any(True for _ in validator.iter_errors(obj["arguments"])):
                json.dumps(lookup.fn(**obj["arguments"]))
        times.append(time.perf_counter() - t - TOOL_TIME[0])
    return times


def main() -> None:
    """Print both medians and the ratio."""
    n = 10_000
    agentrig_steps(500)  # warm up
    ours = statistics.median(agentrig_steps(n)) * 1e3
    peer = statistics.median(peer_steps(n)) * 1e3
    print(f"steps: {n}")
    print(f"agentrig harness, median per step: {ours:.3f} ms (target <= 0.5 ms)")
    print(f"hand-rolled floor (parse+validate+call, no records/timeouts/feedback): {peer:.3f} ms")
    print(f"ratio agentrig/floor: {ours / peer:.2f}x")


if __name__ == "__main__":
    main()
