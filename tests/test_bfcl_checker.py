"""The AST checker: ground truth scores 100% in every category, each known-wrong answer class scores 0."""

from __future__ import annotations

import copy

import pytest

from agentrig.bfcl import data
from agentrig.bfcl.checker import check_call, check_entry, reference_calls, standardize_string
from agentrig.harness.trajectory import ToolCall

SINGLE_TURN = [c for c in data.CATEGORIES if c != "multi_turn_base"]
CALLING = [c for c in SINGLE_TURN if c != "irrelevance"]


@pytest.fixture(scope="module")
def entries():
    return {c: data.load_category(c) for c in SINGLE_TURN}


def _score(category, entry_list, make_calls) -> tuple[int, int]:
    scored = passed = 0
    for entry in entry_list:
        calls = make_calls(entry)
        if calls is None:
            continue
        scored += 1
        passed += check_entry(category, entry.functions, calls, entry.answer).valid
    return passed, scored


@pytest.mark.parametrize("category", SINGLE_TURN)
def test_ground_truth_scores_100_percent(entries, category):
    passed, scored = _score(category, entries[category], lambda e: reference_calls(e.functions, e.answer))
    assert scored == len(entries[category]) and passed == scored


def _doc(entry, name):
    return next(f for f in entry.functions if f["name"] == name)


def wrong_function(entry):
    calls = reference_calls(entry.functions, entry.answer)
    calls[0].name = calls[0].name + "_v2"
    return calls


def missing_required(entry):
    calls = reference_calls(entry.functions, entry.answer)
    required = [p for p in _doc(entry, calls[0].name)["parameters"].get("required", []) if p in calls[0].arguments]
    if not required:
        return None
    del calls[0].arguments[required[0]]
    return calls


def _mutated(entry, mutate):
    """Apply `mutate(bfcl_type, value, allowed)` to the first argument of the first call where it gives a value."""
    calls = reference_calls(entry.functions, entry.answer)
    props = _doc(entry, calls[0].name)["parameters"]["properties"]
    allowed_by_param = next(iter(entry.answer[0].values()))
    for param, value in calls[0].arguments.items():
        new = mutate(props[param]["type"], value, allowed_by_param[param])
        if new is not None:
            calls[0].arguments[param] = new
            return calls
    return None


def wrong_type(entry):
    # A dict where a scalar or list is expected, a string where a dict is expected: never a documented or answer type.
    return _mutated(entry, lambda t, v, allowed: "not-a-dict" if t == "dict" else {"wrong": "type"})


def _other_value(bfcl_type, value, allowed):
    if bfcl_type in ("string", "any") and isinstance(value, str):
        new = value + " zzqx"
    elif bfcl_type == "integer":
        new = 987654321
    elif bfcl_type == "float":
        new = 98765.4321
    elif bfcl_type == "boolean":
        new = not value
    elif bfcl_type in ("array", "tuple") and value:
        new = value + value[:1]
    else:
        return None
    return None if new in allowed or standardize_string(str(new)) in [standardize_string(str(a)) for a in allowed] else new


def wrong_value(entry):
    return _mutated(entry, _other_value)


@pytest.mark.parametrize("category", CALLING)
@pytest.mark.parametrize("wrong", [wrong_function, missing_required, wrong_type, wrong_value])
def test_each_known_wrong_answer_class_scores_zero(entries, category, wrong):
    passed, scored = _score(category, entries[category], wrong)
    assert passed == 0
    assert scored >= 0.5 * len(entries[category]), f"{wrong.__name__} applied to only {scored} entries"


def test_irrelevance_fails_on_any_call_and_passes_without_one(entries):
    irrelevance = entries["irrelevance"]
    passed, scored = _score("irrelevance", irrelevance, lambda e: [ToolCall("c0", e.functions[0]["name"], {})])
    assert (passed, scored) == (0, len(irrelevance))
    assert _score("irrelevance", irrelevance, lambda e: []) == (len(irrelevance), len(irrelevance))


# -- individual rules --------------------------------------------------------------------------

FUNCTION = {
    "name": "weather.get",
    "parameters": {
        "type": "dict",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "scale": {"type": "float"},
            "coords": {"type": "tuple", "items": {"type": "float"}},
            "opts": {"type": "dict", "properties": {"unit": {"type": "string"}}},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["city"],
    },
}
KEY = {
    "weather.get": {
        "city": ["New York, NY", "NYC"],
        "days": [3, ""],
        "scale": [2.0, ""],
        "coords": [[40.7, -74.0], ""],
        "opts": [{"unit": ["celsius", ""]}, ""],
        "tags": [["Rain", "wind"], ""],
    }
}


def _check(arguments, name="weather.get"):
    return check_call(FUNCTION, ToolCall("c", name, arguments), KEY)


def test_strings_are_standardized():
    assert _check({"city": "new york ny"}).valid
    assert _check({"city": "N.Y.C."}).valid
    assert not _check({"city": "Boston"}).valid


def test_int_is_accepted_for_float_but_not_float_for_int():
    assert _check({"city": "NYC", "scale": 2}).valid
    result = _check({"city": "NYC", "days": 3.0})
    assert not result.valid and result.error_type == "type_error:simple"


def test_optional_arguments_may_be_omitted_required_ones_not():
    assert _check({"city": "NYC"}).valid
    assert _check({}).error_type == "simple_function_checker:missing_required"
    key = {"weather.get": {"city": ["NYC"], "days": [3]}}
    assert check_call(FUNCTION, ToolCall("c", "weather.get", {"city": "NYC"}), key).error_type == "simple_function_checker:missing_optional"


def test_unexpected_parameter_fails():
    assert _check({"city": "NYC", "country": "US"}).error_type == "simple_function_checker:unexpected_param"


def test_tuples_lists_and_dicts():
    assert _check({"city": "NYC", "coords": [40.7, -74.0], "tags": ["rain", "Wind"], "opts": {"unit": "Celsius"}}).valid
    assert _check({"city": "NYC", "opts": {}}).valid  # the dict's only key is optional
    assert not _check({"city": "NYC", "tags": ["wind", "rain"]}).valid  # list order matters
    assert not _check({"city": "NYC", "opts": {"unit": "kelvin"}}).valid
    assert not _check({"city": "NYC", "opts": {"wind": "x"}}).valid


def test_parallel_matching_ignores_order_but_not_count(entries):
    entry = next(e for e in entries["parallel"] if len(e.answer) >= 3)
    calls = reference_calls(entry.functions, entry.answer)
    assert check_entry("parallel", entry.functions, list(reversed(calls)), entry.answer).valid
    assert check_entry("parallel", entry.functions, calls[:-1], entry.answer).error_type == "wrong_count"
    assert not check_entry("parallel", entry.functions, calls[:-1] + [copy.deepcopy(calls[0])], entry.answer).valid


def test_simple_and_multiple_need_exactly_one_call(entries):
    entry = entries["multiple"][0]
    calls = reference_calls(entry.functions, entry.answer)
    assert check_entry("multiple", entry.functions, calls * 2, entry.answer).error_type == "wrong_count"
    assert check_entry("multiple", entry.functions, [], entry.answer).error_type == "wrong_count"
