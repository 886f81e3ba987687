"""Exports read back, so `agentrig train` trains on them: rows of another trainer's format as agentrig's data.

The formats are those `agentrig data build --format` writes (`exports.py`), and the same rows written by
hand. Rows with messages become canonical samples (then built like any samples file):

- TRL `{"messages"}` (a `tools` column is informational: the system prompt lists the tools) and
  LLaMA-Factory sharegpt rows (`conversations` of human / gpt / function_call / observation, `system`):
  every assistant turn is trained, as those trainers train them;
- Axolotl rows (`training` on each message) and OpenAI fine-tuning rows (`weight` on assistant messages):
  those flags become the loss weights. OpenAI rows in the `hermes` tool format (calls written as text,
  results as user turns in `<tool_response>` tags) are turned back into calls and tool results.

Calls without ids get `call_<message>_<n>`, a tool result without a call id takes the id and name of the
call it answers, a sharegpt observation that answers several calls is split at LLaMA-Factory's join, and an
assistant turn whose text holds `<tool_call>` blocks is parsed back into text and calls (the Hermes
protocol's parser). LLaMA-Factory rows in the `chatml` layout (human / gpt pieces of the training text
itself) are already tokens in all but name: `chatml_tokens` encodes each piece, labels on the `gpt` ones.

Refused, naming the line: a row with a tool in its `tools` column that its system prompt does not list
(OpenAI's `native` tool format; agentrig renders the tool list from the system prompt, so it would train
without its tools): train on the `data build` folder it came from. Not covered: a sharegpt observation
that LLaMA-Factory's alternation rule merged with a harness notice stays one tool message; JSON array files
(LLaMA-Factory's `.json` datasets): JSON lines only; multimodal content; preference (ranking) rows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from agentrig.data.exports import OBSERVATION_JOIN
from agentrig.data.samples import Sample, validate_messages
from agentrig.errors import DataError
from agentrig.jsonl import first_record, iter_jsonl, read_json

SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "function_call": "assistant", "observation": "tool"}
_TOOL_RESPONSE = re.compile(r"\A<tool_response>\n(.*)\n</tool_response>\Z", re.DOTALL)


def export_file(path: str | Path) -> Path:
    """The data file of an export: the file itself, or the `.jsonl` an export folder's report lists."""
    path = Path(path)
    if not path.is_dir():
        return path
    report = read_json(path / "export_report.json", "`agentrig data build --format`")
    files = [Path(f) for f in report.get("files", []) if str(f).endswith(".jsonl")]
    if len(files) != 1:
        raise DataError(f"{path}: its export_report.json lists {len(files)} data files; give the one to train on")
    return path / files[0].name


# -- message rows ---------------------------------------------------------------------------------

def _calls(raw: Any, where: str) -> list[dict[str, Any]]:
    """OpenAI tool calls with ids and JSON-string arguments."""
    if not isinstance(raw, list):
        raise ValueError(f"{where}: 'tool_calls' must be a list")
    calls = []
    for j, call in enumerate(raw):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ValueError(f"{where}, call {j}: expected {{function: {{name, arguments}}}}")
        args = fn.get("arguments", {})
        calls.append({"id": call.get("id") or f"{where.replace('message ', 'call_')}_{j}", "type": "function",
                      "function": {"name": fn["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}})
    return calls


def _hermes_message(body: str) -> dict[str, Any]:
    """An assistant turn written as Hermes text (`<tool_call>` blocks) as text plus calls."""
    from agentrig.harness.protocol import get_protocol

    parsed = get_protocol("hermes").parse(body)
    return {"role": "assistant", "content": parsed.text,
            "tool_calls": [{"function": {"name": c.name, "arguments": c.arguments}} for c in parsed.calls]}


def _messages(raw: Any, flag: str | None) -> tuple[list[dict[str, Any]], list[float]]:
    """Canonical messages (the format's per-message flag dropped, calls and results made whole), and their weights."""
    if not isinstance(raw, list) or not raw:
        raise ValueError("'messages' must be a non-empty list")
    messages, weights = [], []
    waiting: list[dict[str, Any]] = []  # calls of the last assistant message still without a result
    for i, original in enumerate(raw):
        if not isinstance(original, dict):
            raise ValueError(f"message {i} is not an object")
        msg = {k: v for k, v in original.items() if k not in ("weight", "training") and v is not None}
        role = msg.get("role")
        if role == "assistant" and not msg.get("tool_calls") and "<tool_call>" in (msg.get("content") or ""):
            msg = _hermes_message(msg["content"])
        response = _TOOL_RESPONSE.match(msg.get("content") or "") if role == "user" and waiting else None
        if response:  # a result the hermes tool format sent as a user turn
            msg = {"role": "tool", "content": response.group(1)}
            role = "tool"
        if role == "assistant" and msg.get("tool_calls"):
            msg["tool_calls"] = _calls(msg["tool_calls"], f"message {i}")
            waiting = list(msg["tool_calls"])
        elif role == "tool" and waiting:
            call = waiting.pop(0)
            msg.setdefault("tool_call_id", call["id"])
            msg.setdefault("name", call["function"]["name"])
        messages.append(msg)
        trained = original.get(flag, True) if flag else True
        weights.append(1.0 if role == "assistant" and trained not in (False, 0) else 0.0)
    return messages, weights


def _sharegpt_messages(row: dict[str, Any]) -> list[dict[str, Any]]:
    """OpenAI messages from a sharegpt row (its system column first)."""
    turns = row.get("conversations")
    if not isinstance(turns, list) or not turns:
        raise ValueError("'conversations' must be a non-empty list")
    messages: list[dict[str, Any]] = [{"role": "system", "content": row["system"]}] if row.get("system") else []
    for i, turn in enumerate(turns):
        kind = turn.get("from") if isinstance(turn, dict) else None
        if kind not in SHAREGPT_ROLES or not isinstance(turn.get("value"), str):
            raise ValueError(f"turn {i}: expected {{from: human|gpt|function_call|observation, value: text}}")
        value = turn["value"]
        if kind == "function_call":
            try:
                parsed = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"turn {i}: a function_call value is not JSON ({exc.msg})") from None
            calls = parsed if isinstance(parsed, list) else [parsed]
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": c.get("name"), "arguments": c.get("arguments", {})}} for c in calls]})
        elif kind == "observation":
            answered = len(messages[-1].get("tool_calls") or []) if messages else 0
            parts = value.split(OBSERVATION_JOIN)
            messages += [{"role": "tool", "content": part} for part in (parts if len(parts) == answered else [value])]
        else:
            messages.append({"role": SHAREGPT_ROLES[kind], "content": value})
    return messages


def _tools_only_in_a_column(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> bool:
    """Whether some tool of the `tools` column is not in the system prompt (whose tool list names every tool)."""
    names = [t.get("function", {}).get("name") for t in tools if isinstance(t, dict)]
    system = messages[0].get("content") or "" if messages[0].get("role") == "system" else ""
    return any(not n or n not in system for n in names)


def sample_from_row(row: dict[str, Any], sample_id: str) -> Sample:
    """One export row (not the chatml layout) as a canonical sample; ValueError saying what is wrong with it."""
    if "conversations" in row:
        messages, weights = _messages(_sharegpt_messages(row), None)
    else:
        raw = row.get("messages")
        flag = next((f for f in ("weight", "training") if isinstance(raw, list)
                     and any(isinstance(m, dict) and f in m for m in raw)), None)
        messages, weights = _messages(raw, flag)
    tools = row.get("tools") or []
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise ValueError(f"'tools' is not valid JSON ({exc.msg})") from None
    if _tools_only_in_a_column(messages, tools):
        raise ValueError("its tools are only in the `tools` column (OpenAI's native tool format), not in its system "
                         "prompt, which is where agentrig renders them from: train on the `data build` folder it was "
                         "exported from, or export with `--openai-tools hermes`")
    validate_messages(messages)
    return Sample(sample_id, messages, json.dumps(tools, ensure_ascii=False), weights, {"source": "export"})


def read_export(path: str | Path) -> list[Sample]:
    """Every row of an export file (or folder) as a canonical sample; a bad row is a DataError naming its line."""
    file = export_file(path)
    samples = []
    for lineno, row in iter_jsonl(file):
        try:
            samples.append(sample_from_row(row, f"{file.stem}-{lineno}"))
        except ValueError as exc:
            raise DataError(f"{file}:{lineno}: {exc}") from None
    if not samples:
        raise DataError(f"{file}: no rows")
    return samples


# -- LLaMA-Factory's chatml layout: the training text in pieces ----------------------------------

def is_chatml_layout(path: str | Path, end_of_turn: str) -> bool:
    """Whether an export holds LLaMA-Factory chatml-layout rows: human / gpt pieces, each gpt one ending a turn."""
    found = first_record(export_file(path))
    turns = found[1].get("conversations") if found else None
    return (isinstance(turns, list) and bool(turns) and "system" not in found[1]  # type: ignore[index]
            and all(isinstance(t, dict) and t.get("from") in ("human", "gpt") for t in turns)
            and all(str(t.get("value", "")).endswith(end_of_turn) for t in turns if t.get("from") == "gpt"))


def chatml_tokens(path: str | Path, renderer: Any) -> list[dict[str, Any]]:
    """Tokenized rows of a chatml-layout export: each piece encoded by `renderer`, labels on the `gpt` pieces."""
    file = export_file(path)
    rows = []
    for lineno, row in iter_jsonl(file):
        ids: list[int] = []
        labels: list[int] = []
        for turn in row.get("conversations") or []:
            if not isinstance(turn, dict) or turn.get("from") not in ("human", "gpt"):
                raise DataError(f"{file}:{lineno}: a chatml-layout row holds only human and gpt pieces")
            piece = renderer.encode(str(turn.get("value", "")))
            ids += piece
            labels += piece if turn["from"] == "gpt" else [-100] * len(piece)
        if not ids:
            raise DataError(f"{file}:{lineno}: no conversation")
        rows.append({"sample_id": f"{file.stem}-{lineno}", "input_ids": ids, "labels": labels})
    if not rows:
        raise DataError(f"{file}: no rows")
    return rows
