"""BFCL type -> JSON Schema mapping: one test per BFCL type, plus every shipped document builds a valid tool."""

from __future__ import annotations

import pytest
from jsonschema import Draft202012Validator

from agentrig.bfcl import data
from agentrig.bfcl.types import BFCL_TO_JSON_TYPE, to_json_schema, tool_spec
from agentrig.errors import DataError
from agentrig.harness.tools import Tool


def _valid(schema, value) -> bool:
    return Draft202012Validator(schema).is_valid(value)


def test_string():
    schema = to_json_schema({"type": "string", "description": "a city", "enum": ["Paris", "Rome"]})
    assert schema == {"type": "string", "description": "a city", "enum": ["Paris", "Rome"]}


def test_integer():
    schema = to_json_schema({"type": "integer", "description": "n", "default": 3})
    assert schema == {"type": "integer", "description": "n", "default": 3}
    assert _valid(schema, 3) and not _valid(schema, 3.5) and not _valid(schema, "3")


def test_float_is_number_and_accepts_int():
    schema = to_json_schema({"type": "float", "description": "x"})
    assert schema["type"] == "number"
    assert _valid(schema, 2.5) and _valid(schema, 2) and not _valid(schema, "2.5")


def test_boolean():
    schema = to_json_schema({"type": "boolean", "description": "flag"})
    assert schema["type"] == "boolean" and _valid(schema, True) and not _valid(schema, 1)


def test_array_maps_items_recursively():
    schema = to_json_schema({"type": "array", "items": {"type": "array", "items": {"type": "float"}}})
    assert schema == {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
    assert _valid(schema, [[1, 2.5]]) and not _valid(schema, [["a"]])


def test_tuple_is_array():
    schema = to_json_schema({"type": "tuple", "items": {"type": "float"}, "description": "(lat, lon)"})
    assert schema == {"type": "array", "items": {"type": "number"}, "description": "(lat, lon)"}
    assert _valid(schema, [48.8, 2.3])


def test_dict_is_object_with_properties_and_required():
    node = {
        "type": "dict",
        "properties": {"a": {"type": "integer", "optional": True}, "b": {"type": "dict", "properties": {"c": {"type": "tuple"}}}},
        "required": ["b"],
    }
    schema = to_json_schema(node)
    assert schema == {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "object", "properties": {"c": {"type": "array"}}}},
        "required": ["b"],
    }
    assert _valid(schema, {"b": {"c": [1, 2]}}) and not _valid(schema, {"a": 1})


def test_any_accepts_any_json_value():
    schema = to_json_schema({"type": "any", "description": "the training data"})
    assert schema == {"description": "the training data"}
    for value in ("x", 1, 2.5, True, None, [1], {"k": "v"}):
        assert _valid(schema, value)


def test_every_bfcl_type_is_mapped_and_tested():
    assert set(BFCL_TO_JSON_TYPE) == {"string", "integer", "float", "boolean", "array", "tuple", "dict", "any"}


def test_unknown_or_missing_type_is_a_data_error():
    with pytest.raises(DataError, match="unknown BFCL type 'HashMap'"):
        to_json_schema({"type": "dict", "properties": {"m": {"type": "HashMap"}}})
    with pytest.raises(DataError, match=r"parameters\.m: BFCL parameter without a `type`"):
        to_json_schema({"type": "dict", "properties": {"m": {"description": "?"}}})


def test_every_shipped_function_document_becomes_a_valid_tool():
    count = 0
    for category in data.CATEGORIES:
        for entry in data.load_category(category):
            for function in entry.functions:
                spec = tool_spec(function)
                Tool.from_schema(spec["name"], spec["description"] or spec["name"], spec["parameters"], lambda **kw: None)
                count += 1
    assert count > 2000
