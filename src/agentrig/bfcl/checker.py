"""BFCL's AST checker for single-turn categories, written for agentrig from BFCL's published rules.

Rules (bfcl_eval/eval_checker/ast_eval/ast_checker.py, Python language only):

- simple / live_simple: exactly one call; `multiple`: exactly one call, checked against the expected
  function; `parallel*`: as many calls as expected, matched in any order (each expected call, in turn,
  takes the first unmatched model call that passes; the same greedy matching BFCL uses).
- A call passes when its name is the expected one, every required parameter is given, every given
  parameter is documented and in the answer key, each value has the documented type (an int is accepted
  for a float; a value of the answer key's own type is accepted as a "variable"), each value is one of the
  allowed values, and every parameter the key does not mark optional (`""`) is given.
- Strings compare after standardization: lower case, spaces and `,./-_*^` removed, `'` read as `"`.
  Lists compare element-wise with their strings standardized; dicts key by key; lists of dicts in order.
- irrelevance: success when the model makes no call.

One deliberate difference: two live_simple keys (106-63-0, 112-68-0) write a required list's value as `[]`,
which under BFCL's code no answer can match; agentrig reads an empty option list for an array as "the
empty list", so those two entries are passable (BFCL scores them 0 for every model).

Not handled: Java and JavaScript entries (their string-encoded values need BFCL's converters), and names
rewritten `.`->`_` for APIs that forbid dots (agentrig offers the names as BFCL writes them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from agentrig.harness.trajectory import ToolCall

# BFCL type name -> the Python type a value must have (PYTHON_TYPE_MAPPING in BFCL).
PYTHON_TYPES: dict[str, type] = {
    "string": str,
    "integer": int,
    "float": float,
    "boolean": bool,
    "array": list,
    "tuple": list,
    "dict": dict,
    "any": str,
}

_STANDARDIZE = re.compile(r"[ ,./\-_*^]")


@dataclass(frozen=True)
class CheckResult:
    """The verdict on one entry: `error_type` is BFCL's label for the first failed rule."""

    valid: bool
    error_type: str = ""
    error: str = ""


PASS = CheckResult(True)


def standardize_string(text: str) -> str:
    """BFCL's string normalization: drop spaces and `,./-_*^`, lower-case, read `'` as `"`."""
    return _STANDARDIZE.sub("", text).lower().replace("'", '"')


def _standardize_items(values: Any) -> list[Any]:
    # Iterating "" (the optional marker) gives [], exactly as BFCL's index loop does.
    return [standardize_string(v) if type(v) is str else v for v in values]


def _answer_type(allowed: list[Any]) -> type | None:
    for value in allowed:
        if value != "":
            return type(value)
    return None


def _type_ok(value: Any, allowed: list[Any], expected: type, nested: type | None) -> tuple[bool, bool]:
    """(valid, is_variable) per BFCL's type_checker, one level of nesting."""
    answer_type = _answer_type(allowed)
    is_variable = answer_type is not None and answer_type is not expected
    if type(value) is expected:
        if nested is None:
            return True, is_variable
        for option in allowed:
            items_ok = True
            if type(option) is list:
                items_ok = all(_type_ok(item, option, nested, None)[0] for item in value)
            if items_ok:
                return True, is_variable
    # A value of the answer key's type (a variable name written as a string, say) is accepted.
    if answer_type is not None and type(value) is answer_type:
        return True, True
    return False, is_variable


def _dict_ok(value: Any, allowed: list[Any]) -> bool:
    # BFCL assumes a dict here; a list element of another type (possible after an optional "" answer) fails.
    if type(value) is not dict:
        return False
    for option in allowed:
        if option == "":
            continue
        keys_ok = all(
            key in option and (standardize_string(item) if type(item) is str else item) in _standardize_items(option[key])
            for key, item in value.items()
        )
        if keys_ok and all(key in value or "" in values for key, values in option.items()):
            return True
    return False


def _list_of_dicts_ok(value: list[Any], allowed: list[Any]) -> bool:
    for option in allowed:
        if len(value) == len(option) and all(_dict_ok(item, [expected]) for item, expected in zip(value, option)):
            return True
    return False


def _value_ok(value: Any, allowed: list[Any], expected: type, nested: type | None, is_variable: bool) -> bool:
    if not is_variable:
        if expected is dict:
            return _dict_ok(value, allowed)
        if expected is list and nested is dict:
            return _list_of_dicts_ok(value, allowed)
        if expected is str:
            return standardize_string(value) in [standardize_string(v) for v in allowed if type(v) is str]
        if expected is list:
            return _standardize_items(value) in [_standardize_items(option) for option in allowed]
    return value in allowed


def check_call(function: dict[str, Any], call: ToolCall, expected: dict[str, dict[str, list[Any]]]) -> CheckResult:
    """Check one call against one expected call `{name: {param: [allowed values]}}` and its BFCL document."""
    name = function["name"]
    allowed_by_param = next(iter(expected.values()))
    if call.name != name:
        return CheckResult(False, "simple_function_checker:wrong_func_name", f"expected {name!r}, got {call.name!r}")
    documented = function["parameters"]["properties"]
    for param in function["parameters"].get("required", []):
        if param not in call.arguments:
            return CheckResult(False, "simple_function_checker:missing_required", f"missing required parameter {param!r}")
    for param, value in call.arguments.items():
        if param not in documented or param not in allowed_by_param:
            return CheckResult(False, "simple_function_checker:unexpected_param", f"unexpected parameter {param!r}")
        bfcl_type = documented[param]["type"]
        expected_type = PYTHON_TYPES[bfcl_type]
        nested = None
        if bfcl_type in ("array", "tuple") and "items" in documented[param]:
            nested = PYTHON_TYPES[documented[param]["items"]["type"]]
        if bfcl_type == "tuple" and type(value) is tuple:
            value = list(value)
        if bfcl_type == "float" and type(value) is int:
            value = float(value)
        allowed = allowed_by_param[param]
        if allowed == [] and expected_type is list:
            allowed = [[]]  # the key's way of writing "the empty list" (see module docstring)
        type_ok, is_variable = _type_ok(value, allowed, expected_type, nested)
        if not type_ok:
            return CheckResult(False, "type_error:simple", f"{param!r}: expected {bfcl_type}, got {type(value).__name__}")
        if not _value_ok(value, allowed, expected_type, nested, is_variable):
            return CheckResult(False, "value_error", f"{param!r}: {value!r} is not one of {allowed!r}")
    for param, allowed in allowed_by_param.items():
        if param not in call.arguments and "" not in allowed:
            return CheckResult(False, "simple_function_checker:missing_optional", f"parameter {param!r} is not optional here")
    return PASS


def _first_value(allowed: list[Any]) -> Any:
    return next(option for option in allowed if option != "")


def _reference_value(schema: dict[str, Any], allowed: list[Any]) -> Any:
    value = _first_value(allowed)
    if schema["type"] == "dict" and type(value) is dict:  # a dict answer lists allowed values per key
        return {key: _first_value(values) for key, values in value.items() if any(v != "" for v in values)}
    if schema["type"] == "array" and schema.get("items", {}).get("type") == "dict":
        return [_reference_value(schema["items"], [item]) for item in value]
    return value


def reference_calls(functions: list[dict[str, Any]], answer: list[Any]) -> list[ToolCall]:
    """One passing answer built from the key: per parameter its first allowed value, omitted when only optional."""
    calls: list[ToolCall] = []
    for index, expected in enumerate(answer):
        name, allowed_by_param = next(iter(expected.items()))
        documented = _document(functions, name)["parameters"]["properties"]
        arguments = {
            param: [] if allowed == [] else _reference_value(documented[param], allowed)
            for param, allowed in allowed_by_param.items()
            # A few keys list an optional parameter the document lacks; a passing answer leaves it out.
            if param in documented and (allowed == [] or any(option != "" for option in allowed))
        }
        calls.append(ToolCall(id=f"ref{index}", name=name, arguments=arguments))
    return calls


def _document(functions: list[dict[str, Any]], name: str) -> dict[str, Any]:
    for function in functions:
        if function["name"] == name:
            return function
    raise KeyError(f"the answer key names {name!r}, which the entry does not document")


def check_entry(category: str, functions: list[dict[str, Any]], calls: list[ToolCall], answer: list[Any]) -> CheckResult:
    """Score a single-turn answer: the model's `calls` against BFCL's possible `answer` for `category`."""
    if category.endswith("irrelevance"):
        if calls:
            return CheckResult(False, "irrelevance:called", f"expected no call, got {len(calls)}")
        return PASS
    if len(calls) != len(answer):
        return CheckResult(False, "wrong_count", f"expected {len(answer)} call(s), got {len(calls)}")
    if "parallel" not in category:
        expected = answer[0]
        return check_call(_document(functions, next(iter(expected))), calls[0], expected)
    matched: set[int] = set()
    for expected in answer:
        function = _document(functions, next(iter(expected)))
        last = CheckResult(False, "parallel:no_match", "no call left to match")
        for index, call in enumerate(calls):
            if index in matched:
                continue
            last = check_call(function, call, expected)
            if last.valid:
                matched.add(index)
                break
        if not last.valid:
            return CheckResult(False, "parallel:no_match", f"no call matches {next(iter(expected))!r}: {last.error}")
    return PASS
