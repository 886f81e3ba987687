"""The one JSON-lines reader: objects with their line numbers, blank lines skipped, malformed lines named."""

from __future__ import annotations

import pytest

from agentrig.errors import DataError
from agentrig.jsonl import iter_jsonl, read_jsonl


def test_reads_objects_with_line_numbers(tmp_path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n\n{"b": [2]}\n')
    assert list(iter_jsonl(path)) == [(1, {"a": 1}), (3, {"b": [2]})]
    assert read_jsonl(path) == [{"a": 1}, {"b": [2]}]


@pytest.mark.parametrize("line, message", [('{"a": 1', "a.jsonl:2: not valid JSON"), ("[1, 2]", "a.jsonl:2: expected a JSON object, got list")])
def test_a_malformed_line_names_file_and_line(tmp_path, line: str, message: str) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"ok": true}\n' + line + "\n")
    with pytest.raises(DataError, match=message):
        read_jsonl(path)
