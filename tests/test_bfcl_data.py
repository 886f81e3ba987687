"""BFCL data loading from the installed bfcl-eval package, and the contamination check."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from agentrig.bfcl import data

EXPECTED_COUNTS = {
    "simple_python": 400,
    "multiple": 200,
    "parallel": 200,
    "parallel_multiple": 200,
    "irrelevance": 240,
    "live_simple": 258,
    "multi_turn_base": 200,
}


@pytest.mark.parametrize("category", data.CATEGORIES)
def test_each_category_loads_every_entry_with_its_answer(category):
    entries = data.load_category(category)
    assert len(entries) == EXPECTED_COUNTS[category]
    assert len({e.id for e in entries}) == len(entries)
    for entry in entries:
        assert entry.category == category and entry.functions and entry.turns
        if category == "irrelevance":
            assert entry.answer == []
        else:
            assert entry.answer, entry.id
    if category == "multi_turn_base":
        first = entries[0]
        assert first.is_multi_turn and len(first.answer) == len(first.turns)
        assert first.involved_classes and first.initial_config
        assert {"cd", "mv", "post_tweet"} <= {f["name"] for f in first.functions}


def test_limit_takes_the_first_entries_in_file_order():
    entries = data.load_category("simple_python", limit=3)
    assert [e.id for e in entries] == ["simple_python_0", "simple_python_1", "simple_python_2"]


def test_loading_does_not_import_bfcl_eval_modules():
    code = (
        "import sys; from agentrig.bfcl import data; data.load_category('parallel', limit=1); data.bfcl_questions(); "
        "print([m for m in sys.modules if m.startswith('bfcl_eval')])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_unknown_category_is_a_user_error():
    with pytest.raises(data.AgentrigError, match="unknown BFCL category"):
        data.load_category("simple_rust")


def test_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(data.BfclNotInstalled, match="--no-deps"):
        data.data_dir()


def test_bfcl_questions_cover_all_categories_normalized():
    questions = data.bfcl_questions()
    assert len(questions) > 4000
    first = data.load_category("simple_python", limit=1)[0].turns[0][0]["content"]
    assert data.normalize_question(first) in questions
    # a multi-turn later turn, a live question and a category not run by the bench are covered too
    assert data.normalize_question(data.load_category("multi_turn_base", limit=1)[0].turns[2][0]["content"]) in questions
    assert data.is_bfcl_question(data.load_category("live_simple", limit=1)[0].turns[0][-1]["content"])
    java = data.read_jsonl(data.data_dir() / "BFCL_v4_simple_java.json")[0]["question"][0][0]["content"]
    assert data.is_bfcl_question(java)


def test_is_bfcl_question_ignores_case_and_spacing_but_not_content():
    text = "Find the area of a triangle with a base of 10 units and height of 5 units."
    assert data.is_bfcl_question(text)
    assert data.is_bfcl_question("  FIND the area of a triangle with a base of 10 units\n and height of 5 units. ")
    assert not data.is_bfcl_question("Find the area of a triangle with a base of 11 units and height of 5 units.")
    assert not data.is_bfcl_question("How many SKUs are below their reorder level?")


def test_bfcl_questions_returns_a_copy():
    questions = data.bfcl_questions()
    questions.clear()
    assert data.bfcl_questions()
