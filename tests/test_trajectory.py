"""Episode records: exact JSONL round trips, errors that name file and line, torn tails, the flat view."""

from __future__ import annotations

import json

import pytest

from agentrig.harness.demo import run_demo
from agentrig.harness.trajectory import RecordError, flat_view, read_episodes, write_episodes


def test_round_trip_is_exact(tmp_path):
    ep = run_demo(tmp_path / "a.jsonl")
    write_episodes(tmp_path / "b.jsonl", [ep, ep])
    back = read_episodes(tmp_path / "b.jsonl")
    assert [e.to_dict() for e in back] == [ep.to_dict(), ep.to_dict()]
    write_episodes(tmp_path / "c.jsonl", back)
    assert (tmp_path / "b.jsonl").read_bytes() == (tmp_path / "c.jsonl").read_bytes()


def test_bad_lines_name_file_and_line(tmp_path):
    ep = run_demo(tmp_path / "a.jsonl")
    good = json.dumps(ep.to_dict())
    bad = tmp_path / "bad.jsonl"
    bad.write_text(good + "\n{not json\n")
    with pytest.raises(RecordError, match=r"bad.jsonl:2: "):
        read_episodes(bad)
    wrong_version = tmp_path / "v.jsonl"
    wrong_version.write_text(json.dumps({**ep.to_dict(), "schema_version": 99}) + "\n")
    with pytest.raises(RecordError, match="v.jsonl:1: unknown episode schema version 99"):
        read_episodes(wrong_version)


def test_failure_kinds_outside_their_literal_are_refused_on_the_way_in(tmp_path):
    ep = run_demo(tmp_path / "a.jsonl").to_dict()
    failed = next(r for s in ep["steps"] for r in s["results"] if r["error"])
    failed["error"] = "gremlins"
    bad = tmp_path / "kinds.jsonl"
    bad.write_text(json.dumps(ep) + "\n")
    with pytest.raises(RecordError, match="kinds.jsonl:1: .*results.error 'gremlins' is not one of 'exception'"):
        read_episodes(bad)
    ep = run_demo(tmp_path / "a.jsonl").to_dict()
    ep["termination"] = "tired"
    bad.write_text(json.dumps(ep) + "\n")
    with pytest.raises(RecordError, match="termination 'tired'"):
        read_episodes(bad)


def test_torn_last_line_can_be_skipped(tmp_path):
    ep = run_demo(tmp_path / "a.jsonl")
    torn = tmp_path / "torn.jsonl"
    line = json.dumps(ep.to_dict())
    torn.write_text(line + "\n" + line[: len(line) // 2])
    with pytest.raises(RecordError, match="torn.jsonl:2"):
        read_episodes(torn)
    assert len(read_episodes(torn, skip_truncated_tail=True)) == 1


def test_flat_view(tmp_path):
    view = flat_view(run_demo(tmp_path / "a.jsonl"))
    assert set(view) == {"system", "user", "observation", "action", "result", "final"}
    assert view["action"][0] == 'get_weather({"city": "Paris"})'
    assert view["final"].startswith("It is 18")
