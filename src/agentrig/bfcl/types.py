"""BFCL parameter types to JSON Schema, and BFCL function documents to agentrig tool specs.

BFCL documents use Python-flavoured type names (`dict`, `float`, `tuple`, `any`, ...). The offered tool
schema is plain JSON Schema so the harness validates arguments like any other tool's. The mapping:

| BFCL | JSON Schema | note |
|---|---|---|
| string | string | |
| integer | integer | |
| float | number | an integer is a valid number, as BFCL accepts int for float |
| boolean | boolean | |
| array | array | `items` mapped recursively |
| tuple | array | JSON has no tuple; BFCL's checker compares tuples as lists |
| dict | object | `properties` / `required` mapped recursively |
| any | (no `type`) | any JSON value; the checker still applies BFCL's rule (a string, or the answer's type) |

Unknown type names raise `DataError`: a new `bfcl-eval` release with a new type should fail loudly rather
than offer a model a schema it cannot satisfy.
"""

from __future__ import annotations

from typing import Any

from agentrig.errors import DataError

BFCL_TO_JSON_TYPE: dict[str, str | None] = {
    "string": "string",
    "integer": "integer",
    "float": "number",
    "boolean": "boolean",
    "array": "array",
    "tuple": "array",
    "dict": "object",
    "any": None,
}

# JSON Schema keywords carried over as they are. BFCL's own `optional` flag is dropped: `required` says it.
_KEPT_KEYWORDS = ("description", "enum", "default", "format", "minimum", "maximum", "minItems", "maxItems")


def to_json_schema(node: dict[str, Any], where: str = "parameters") -> dict[str, Any]:
    """The JSON Schema of one BFCL parameter node (recursively through `properties` and `items`)."""
    if "type" not in node:
        raise DataError(f"{where}: BFCL parameter without a `type`")
    bfcl_type = node["type"]
    if bfcl_type not in BFCL_TO_JSON_TYPE:
        raise DataError(f"{where}: unknown BFCL type {bfcl_type!r}; known: {', '.join(BFCL_TO_JSON_TYPE)}")
    schema: dict[str, Any] = {}
    json_type = BFCL_TO_JSON_TYPE[bfcl_type]
    if json_type is not None:
        schema["type"] = json_type
    for key in _KEPT_KEYWORDS:
        if key in node:
            schema[key] = node[key]
    if bfcl_type == "dict":
        properties = node.get("properties", {})
        schema["properties"] = {name: to_json_schema(sub, f"{where}.{name}") for name, sub in properties.items()}
        required = node.get("required", [])
        if required:
            schema["required"] = list(required)
    if bfcl_type in ("array", "tuple") and "items" in node:
        schema["items"] = to_json_schema(node["items"], f"{where}[]")
    return schema


def tool_spec(function: dict[str, Any]) -> dict[str, Any]:
    """The OpenAI-style function spec (`name`, `description`, `parameters`) of a BFCL function document."""
    name = function["name"]
    parameters = to_json_schema(function["parameters"], where=f"{name}.parameters")
    parameters.setdefault("properties", {})
    return {"name": name, "description": function.get("description", ""), "parameters": parameters}
