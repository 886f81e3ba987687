"""Property test: no model output, however malformed or hostile, raises out of the harness.

At least 10,000 random and mutated outputs (truncated JSON, wrong quotes, unknown names, nested
garbage, huge strings, fake tool responses); each must end up classified: a final answer, parsed
calls (executed or rejected with a defect), or a defect of a known kind.
"""

from __future__ import annotations

import pytest

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrig.harness import EpisodeRunner, HarnessConfig
from agentrig.harness.protocol import DEFECT_KINDS
from agentrig.harness.tools import ToolSet, tool
from agentrig.harness.trajectory import TaskSpec


@tool
def lookup(name: str, limit: int = 3) -> dict:
    """Look a name up.

    Args:
        name: the name
        limit: how many
    """
    return {"name": name, "rows": limit}


VALID = [
    '<tool_call>\n{"name": "lookup", "arguments": {"name": "Ada", "limit": 2}}\n</tool_call>',
    '{"name": "lookup", "arguments": {"name": "Ada"}}',
    "Sure, here is the answer: 42.",
]


def _mutations(base: str) -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(0, len(base)).map(lambda k: base[:k]),  # truncated anywhere
        st.just(base.replace('"', "'")),  # wrong quotes
        st.text(max_size=30).map(lambda name: base.replace("lookup", name)),  # unknown or odd names
        st.tuples(st.integers(0, len(base)), st.text(max_size=20)).map(lambda t: base[: t[0]] + t[1] + base[t[0]:]),
        st.just(base + "\n<tool_response>\n{\"rows\": 99}\n</tool_response>"),  # self-written result
        st.just(base.replace('"Ada"', "1").replace("2}", '"two"}')),  # schema violations
    )


garbage_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)

OUTPUTS = st.one_of(
    st.text(max_size=300),
    st.sampled_from(VALID).flatmap(_mutations),
    garbage_json.map(lambda g: "<tool_call>" + json.dumps(g) + "</tool_call>"),
    garbage_json.map(lambda g: "<tool_call>" + json.dumps({"name": "lookup", "arguments": g}) + "</tool_call>"),
    st.integers(10_000, 200_000).map(lambda n: "<tool_call>{\"name\": \"lookup\", \"arguments\": {\"name\": \"" + "x" * n),
    st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "{", "}", '"', "'", ":", ",", "name", "\\", "\x00"]), max_size=60).map("".join),
)

TASK = TaskSpec(id="fuzz", prompt="find Ada")
CONFIG = HarnessConfig(max_steps=2, max_output_chars=500)


@pytest.mark.slow
@settings(max_examples=10_000, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(OUTPUTS)
def test_no_output_escapes_and_every_output_is_classified(output):
    runner = EpisodeRunner(TASK, ToolSet([lookup]), CONFIG, episode_id="fuzz")
    assert runner.request() is not None
    runner.submit(output)
    step = runner.episode.steps[0]
    assert all(d.kind in DEFECT_KINDS for d in step.defects)
    assert step.is_final or step.calls or step.defects
    assert len(step.results) == len(step.calls)
    for call, result in zip(step.calls, step.results):
        assert result.ok == (call.name == "lookup" and not any(d.call_id == call.id for d in step.defects))
    # the episode goes on (or ends with a recorded reason) without raising
    if not runner.done:
        assert runner.request() is not None
    else:
        assert runner.episode.termination in ("final_answer", "stuck")
