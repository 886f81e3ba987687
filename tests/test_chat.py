"""`agentrig chat` driven through the CLI with piped stdin and a scripted policy."""

from __future__ import annotations

import io
from pathlib import Path

from agentrig.harness import ScriptedPolicy

ENV = f"{Path(__file__).parent / 'test_evaluate.py'}:make_env"


def test_chat_shows_calls_results_feedback_and_answer(monkeypatch, capsys) -> None:
    import agentrig.evals.chat
    from agentrig.cli import main

    script = ScriptedPolicy([
        'Let me look that up.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "alpha"}}\n</tool_call>',
        "The value of alpha is 11.",
        '<tool_call>\n{"name": "lookup", "arguments": {}}\n</tool_call>',
        "I cannot look that up.",
    ])
    monkeypatch.setattr(agentrig.evals.chat, "build_policy", lambda args: script)
    monkeypatch.setattr("sys.stdin", io.StringIO("What is the value of alpha?\n\nAnd omega?\n/quit\nnever read\n"))
    assert main(["chat", "--env", ENV]) == 0
    out = capsys.readouterr().out
    lines = [line.strip() for line in out.splitlines()]
    assert "1 tools: lookup" in out
    first = lines.index("agent: Let me look that up.")
    assert lines[first + 1] == '-> lookup({"key": "alpha"})'
    assert lines[first + 2] == '<- result: {"value": 11}'
    assert lines[first + 3] == "agent: The value of alpha is 11."
    assert any(line.startswith("harness (schema_violation):") for line in lines)
    assert lines[-1] == "agent: I cannot look that up."
