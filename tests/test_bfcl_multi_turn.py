"""multi_turn_base: ast-only call parsing, dispatch to BFCL's backends, and BFCL's state/response scoring."""

from __future__ import annotations

import builtins

import pytest

from agentrig.bfcl import data
from agentrig.bfcl.multi_turn import BackendCall, BackendSession, UnsafeCall, check_multi_turn, parse_call


@pytest.fixture(scope="module")
def entries():
    return data.load_category("multi_turn_base")


def _truth_turns(entry, keywords=False):
    session = BackendSession(entry.involved_classes, entry.initial_config)
    turns = []
    for calls in entry.answer:
        parsed = [parse_call(text) for text in calls]
        if keywords:
            parsed = [session.as_keywords(c) for c in parsed]
        turns.append([parsed] if parsed else [])
    return turns


def _score(entry, turns):
    return check_multi_turn(entry.involved_classes, entry.initial_config, entry.answer, turns)


def test_parse_call_reads_literal_positional_and_keyword_arguments():
    assert parse_call("sort('final_report.pdf')") == BackendCall("sort", ("final_report.pdf",), {})
    assert parse_call(" tail(file_name='log.txt', lines=-20) ") == BackendCall("tail", (), {"file_name": "log.txt", "lines": -20})
    assert parse_call("f(x=[1, (2, 3)], y={'a': None}, z=True)").kwargs == {"x": [1, (2, 3)], "y": {"a": None}, "z": True}


@pytest.mark.parametrize(
    "text",
    [
        "os.system('rm -rf /')",  # attribute call
        "f(g())",  # nested call
        "f(x)",  # a name, not a literal
        "f(*args)",
        "f(**{'a': 1})",
        "f(x=__import__('os'))",
        "(lambda: 1)()",
        "f(1); g(2)",
        "1 + 1",
        "[f(i) for i in range(3)]",
        "f(",
        "",
    ],
)
def test_parse_call_refuses_anything_but_a_plain_call(text):
    with pytest.raises(UnsafeCall):
        parse_call(text)


def test_dispatch_reaches_only_public_backend_methods(entries):
    session = BackendSession(["GorillaFileSystem", "MathAPI"], entries[0].initial_config)
    assert session.execute(parse_call("__import__('os')")) == "Error during execution: name '__import__' is not defined"
    assert session.execute(BackendCall("_load_scenario", (), {"scenario": {}})).startswith("Error during execution: name")
    assert session.execute(BackendCall("cd", (), {"nope": 1})).startswith("Error during execution: ")
    assert session.execute(BackendCall("pwd")) == '{"current_working_directory": "/workspace"}'
    assert "cd" in session.method_names and "add" in session.method_names


def test_ground_truth_scores_100_percent_and_never_evals(entries, monkeypatch):
    def no_eval(*args, **kwargs):
        raise AssertionError("eval() was called")

    monkeypatch.setattr(builtins, "eval", no_eval)
    assert all(_score(e, _truth_turns(e)).valid for e in entries)


def test_ground_truth_as_json_tool_calls_scores_100_percent(entries):
    # Models send keyword arguments only; positional ground-truth arguments are named first.
    assert all(_score(e, _truth_turns(e, keywords=True)).valid for e in entries)


def _first_entry_with(entries, predicate):
    return next(e for e in entries if predicate(e))


def test_skipping_a_turn_fails(entries):
    entry = entries[0]
    turns = _truth_turns(entry)
    turns[1] = []
    result = _score(entry, turns)
    assert not result.valid and result.error_type == "multi_turn:empty_turn_model_response"


def test_wrong_argument_value_fails_on_state(entries):
    entry = entries[0]  # turn 0 ends with mv(source='final_report.pdf', destination='temp')
    turns = _truth_turns(entry)
    turns[0] = [[parse_call("cd(folder='document')"), parse_call("mkdir(dir_name='tmp')"),
                 parse_call("mv(source='final_report.pdf', destination='tmp')")]]
    result = _score(entry, turns)
    assert not result.valid and result.error_type == "multi_turn:instance_state_mismatch"


def test_wrong_function_fails(entries):
    entry = entries[0]
    turns = _truth_turns(entry)
    turns[1] = [[parse_call("cd(folder='temp')"), parse_call("cat(file_name='final_report.pdf')")]]  # grep expected
    result = _score(entry, turns)
    assert not result.valid and result.error_type == "multi_turn:execution_response_mismatch"


def test_a_missing_turn_is_force_termination(entries):
    entry = entries[0]
    result = _score(entry, _truth_turns(entry)[:-1])
    assert not result.valid and result.error_type == "multi_turn:force_terminated"


def test_known_wrong_classes_score_zero_on_a_sample(entries):
    # Drop the last call of the first turn that has ground-truth calls: every sampled entry must fail.
    failed = 0
    sample = entries[:60]
    for entry in sample:
        turns = _truth_turns(entry)
        k = next(i for i, t in enumerate(turns) if t)
        turns[k] = [turns[k][0][:-1]] if len(turns[k][0]) > 1 else []
        failed += not _score(entry, turns).valid
    assert failed == len(sample)
