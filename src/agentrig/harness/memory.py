"""The memory area: finished sub-goals compressed to one-line summaries (seed sections 3.3 and 4.4).

The harness calls these at inference and the data build calls the very same functions for windows,
so a training sample shows the model exactly the memory it will see. The memory lives at the end of
the system prompt; the compressed turns leave the context. When the model wrote no summary (the
context passed its token budget), `extractive_summary` writes a deterministic one from the calls and
results. Not handled: abstractive (model-written) summaries other than the model's own `note` calls.
"""

from __future__ import annotations

import json
from typing import Any

from agentrig.harness.protocol import feedback, result_text

SUMMARY_RESULT_CHARS = 80
SUMMARY_MAX_CHARS = 400


def with_memory(system_prompt: str, summaries: list[str]) -> str:
    """The system prompt with the memory area appended (unchanged when there is nothing to remember)."""
    if not summaries:
        return system_prompt
    lines = "\n".join(f"- {s}" for s in summaries)
    return f"{system_prompt}\n{feedback('memory_header')}\n{lines}"


def extractive_summary(messages: list[dict[str, Any]]) -> str:
    """One line from a finished stretch of conversation: each call with the start of its result."""
    results = {m.get("tool_call_id"): result_text(m) for m in messages if m.get("role") == "tool"}
    parts: list[str] = []
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            if fn["name"] == "note":
                continue
            args = fn["arguments"]
            try:
                args_obj = json.loads(args) if isinstance(args, str) else args
                arg_text = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in args_obj.items())
            except (json.JSONDecodeError, AttributeError):
                arg_text = str(args)
            result = " ".join(results.get(call.get("id"), "").split())
            if len(result) > SUMMARY_RESULT_CHARS:
                result = result[: SUMMARY_RESULT_CHARS - 3] + "..."
            parts.append(f"{fn['name']}({arg_text}) -> {result}")
    line = "; ".join(parts) if parts else "earlier turns had no tool results"
    return line if len(line) <= SUMMARY_MAX_CHARS else line[: SUMMARY_MAX_CHARS - 3] + "..."


def turn_starts(messages: list[dict[str, Any]], start: int) -> list[int]:
    """Indexes of the assistant messages at or after `start`: each opens a turn (assistant + its results)."""
    return [i for i in range(start, len(messages)) if messages[i].get("role") == "assistant"]


def compress_point(messages: list[dict[str, Any]], start: int, keep_last_turns: int) -> int | None:
    """Where to cut so that the last `keep_last_turns` turns stay verbatim; None when nothing can go."""
    starts = turn_starts(messages, start)
    if len(starts) <= keep_last_turns:
        return None
    return starts[-keep_last_turns] if keep_last_turns > 0 else len(messages)
