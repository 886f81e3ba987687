"""Reading JSON-lines files of objects, with errors that name the file and the line.

Every reader of a JSONL file we did not just write ourselves (tokenized samples, preference pairs, data
exports, BFCL data) goes through `iter_jsonl`, so a malformed file always fails the same way: a
`DataError` with `path:line` and what is wrong there, never a bare `JSONDecodeError` traceback.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from agentrig.errors import DataError


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line number, object)` for each non-blank line; a line that is not a JSON object raises DataError."""
    path = Path(path)
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All objects of a JSON-lines file (see `iter_jsonl`)."""
    return [row for _, row in iter_jsonl(path)]
