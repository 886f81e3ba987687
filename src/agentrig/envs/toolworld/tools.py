"""A world's tools: JSON schemas in the world's naming and description styles, executed against an episode's state.

Every world has the same tool *kinds* (`KINDS`), each named and described in the world's own style
(9 kinds; the `get_parent` tool is named after the related entity, e.g. `get_site` in a world of turbines):

- `get`       one record by its ID (a string with the world's ID pattern); it names the related record
- `get_parent` one record of the related entity (each record belongs to one: `<parent>_id`)
- `resolve`   a record's ID from its name
- `search`    records matching optional filters: every enum attribute, a numeric range (minimum/maximum
              within the attribute's range), a boolean flag, a date window (format `date`), `limit` (default 10)
- `count`     records counted per value of an enum or boolean attribute, with an optional nested `where` object
- `stats`     n / mean / min / max / sum of a numeric attribute (an enum of names), optional nested `filter`
- `update`    set one enum attribute of a record (side effect, recorded in the state)
- `schedule`  book a record for an ISO date with a number of slots and an optional boolean (side effect)
- `export`    an array of IDs and a format enum -> a download reference and the row count
- distractors with near-miss names (`history`, `tags`, `archive_lookup`): real tools that answer
  something else.

`ToolworldState` holds the episode's copy of the records and every side effect (`actions`), which the
checker reads. An unknown ID or name returns the text `No result`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable

from agentrig.envs.toolworld.world import Attribute, World, param_name, spell_enum, tool_name, words_to
from agentrig.harness.tools import Tool

NO_RESULT = "No result"
KINDS = ("get", "get_parent", "resolve", "search", "count", "stats", "update", "schedule", "export")
SIDE_EFFECT_KINDS = ("update", "schedule")
EXPORT_FORMATS = ("csv", "json", "xlsx")
# Names BFCL's test data uses that a world would otherwise generate: they get a suffix, so no toolworld tool
# is a BFCL function (tests/test_env_toolworld.py checks every world against the installed BFCL data).
BFCL_NAMES = frozenset({"book_room", "find_recipes", "flights.search"})
_DATE_SCHEMA = {"type": "string", "format": "date", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}


@dataclass
class ToolworldState:
    """One episode's world: its own copy of the records and the side effects the tools performed."""

    world: World
    records: list[dict[str, Any]]
    actions: list[dict[str, Any]] = field(default_factory=list)  # {"kind", "tool", "args"}

    def record(self, rid: Any) -> dict[str, Any] | None:
        return next((r for r in self.records if r["id"] == rid), None)


@dataclass(frozen=True)
class Param:
    """One parameter of a tool kind: its name in the world, its JSON schema, and how people describe it."""

    key: str  # the kind's own name for it (stable across worlds; the teacher and the tasks use it)
    name: str  # as this world spells it
    schema: dict[str, Any]
    text: str  # its description
    required: bool = True


@dataclass
class ToolSpecW:
    """A tool kind as built for one world: name, description, parameters (with their world names)."""

    kind: str
    name: str
    summary: str
    returns: str
    params: list[Param]
    method: str = "GET"
    path: str = ""

    def param(self, key: str) -> Param:
        return next(p for p in self.params if p.key == key)

    def names(self) -> dict[str, str]:
        """kind key -> the world's parameter name."""
        return {p.key: p.name for p in self.params}


def _id_param(w: World, key: str = "id") -> Param:
    return Param(key, param_name(w, w.noun, "id"),
                 {"type": "string", "pattern": w.id_pattern()},
                 f"The {w.noun}'s ID, for example {w.id_example()}.")


def _enum_schema(w: World, a: Attribute) -> dict[str, Any]:
    return {"type": "string", "enum": w.enum_values(a)}


def _filter_object(w: World, desc: str) -> dict[str, Any]:
    """A nested object with one optional property per enum and boolean attribute."""
    props: dict[str, Any] = {}
    for a in w.of_type("enum", "boolean"):
        props[param_name(w, a.name)] = _enum_schema(w, a) if a.type == "enum" else {"type": "boolean"}
    return {"type": "object", "properties": props, "additionalProperties": False, "description": desc}


def specs(w: World) -> list[ToolSpecW]:
    """Every tool of the world, in listing order (the kinds, then the distractors)."""
    noun, plural = w.noun, w.plural
    enums, nums = w.of_type("enum"), w.of_type("integer", "number")
    flag, date = w.of_type("boolean")[0], w.of_type("date")[0]
    num = nums[0]
    out: list[ToolSpecW] = []
    fields = ", ".join(["id", "name"] + [a.name for a in w.attributes] + [f"{w.parent}_id"])

    out.append(ToolSpecW("get", tool_name(w, w.verbs["get"], noun), f"Return one {noun} record by its ID",
                         f"a JSON object with the fields {fields}", [_id_param(w)], "GET",
                         f"/{plural}/{{{param_name(w, noun, 'id')}}}"))
    pid = param_name(w, w.parent, "id")
    pfields = ", ".join(["id", "name"] + [a.name for a in w.parent_attributes])
    out.append(ToolSpecW("get_parent", tool_name(w, w.verbs["get"], w.parent), f"Return one {w.parent} record by its ID",
                         f"a JSON object with the fields {pfields}",
                         [Param("id", pid, {"type": "string", "pattern": w.parent_pattern()},
                                f"The {w.parent}'s ID, for example {w.parents[0]['id']}.")], "GET",
                         f"/{w.parent_plural}/{{{pid}}}"))
    out.append(ToolSpecW("resolve", tool_name(w, w.verbs["resolve"], f"{noun}_name"),
                         f"Find the ID of the {noun} with a given name (case-insensitive, exact name)",
                         "a JSON object with id and name", [Param("name", param_name(w, "name"), {"type": "string"},
                                                                   f"The {noun}'s full name.")], "GET",
                         f"/{plural}/by-name"))
    search = [Param(a.name, param_name(w, a.name), _enum_schema(w, a), f"Only {plural} with this {a.label}.", False)
              for a in enums]
    lo, hi = (int(num.low), int(num.high)) if num.type == "integer" else (num.low, num.high)
    ntype = "integer" if num.type == "integer" else "number"
    unit = f" in {num.unit}" if num.unit and num.unit != "%" else ""
    search += [Param(f"min_{num.name}", param_name(w, "min", num.name), {"type": ntype, "minimum": lo, "maximum": hi},
                     f"Smallest {num.label}{unit} to include ({lo}-{hi}).", False),
               Param(f"max_{num.name}", param_name(w, "max", num.name), {"type": ntype, "minimum": lo, "maximum": hi},
                     f"Largest {num.label}{unit} to include ({lo}-{hi}).", False),
               Param(flag.name, param_name(w, flag.name), {"type": "boolean"},
                     f"true: only {flag.label} {plural}; false: only those not {flag.label}.", False),
               Param(f"{date.name}_from", param_name(w, date.name, "from"), _DATE_SCHEMA,
                     f"Earliest {date.label} to include, as YYYY-MM-DD.", False),
               Param(f"{date.name}_to", param_name(w, date.name, "to"), _DATE_SCHEMA,
                     f"Latest {date.label} to include, as YYYY-MM-DD.", False),
               Param("limit", param_name(w, "limit"), {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
                     "How many matches to list at most (the count is always the full count).", False)]
    out.append(ToolSpecW("search", tool_name(w, w.verbs["search"], plural), f"Search {plural} by their attributes; "
                         "every filter is optional and filters combine with AND",
                         "a JSON object with count (all matches) and results (id and name of the first matches)",
                         search, "GET", f"/{plural}"))
    groupable = [a.name for a in w.of_type("enum", "boolean")]
    out.append(ToolSpecW("count", tool_name(w, w.verbs["count"], plural), f"Count {plural} per value of one attribute",
                         "a JSON object with group_by, counts (value -> number) and total",
                         [Param("group_by", param_name(w, "group", "by"), {"type": "string", "enum": groupable},
                                "The attribute to group by."),
                          Param("where", param_name(w, "where"), _filter_object(w, "Optional conditions to count only "
                                f"some {plural}."), "Optional conditions, an object of attribute: value.", False)],
                         "GET", f"/{plural}/counts"))
    out.append(ToolSpecW("stats", tool_name(w, w.verbs["stats"], plural),
                         f"Summary statistics of one numeric attribute over {plural}",
                         "a JSON object with field, n, mean (rounded to 2 decimals), min, max and sum",
                         [Param("field", param_name(w, "field"), {"type": "string", "enum": [a.name for a in nums]},
                                "The numeric attribute."),
                          Param("filter", param_name(w, "filter"), _filter_object(w, f"Optional conditions on the {plural}."),
                                "Optional conditions, an object of attribute: value.", False)],
                         "GET", f"/{plural}/stats"))
    target = enums[0]
    out.append(ToolSpecW("update", tool_name(w, w.verbs["update"], f"{noun}_{target.name}"),
                         f"Change the {target.label} of one {noun}",
                         f"a JSON object with id, {target.name} and previous",
                         [_id_param(w), Param("value", param_name(w, target.name), _enum_schema(w, target),
                                              f"The new {target.label}."),
                          Param("reason", param_name(w, "reason"), {"type": "string", "maxLength": 200},
                                "Why it changes (optional, kept in the log).", False)], "PATCH",
                         f"/{plural}/{{{param_name(w, noun, 'id')}}}"))
    out.append(ToolSpecW("schedule", tool_name(w, w.verbs["schedule"], noun), f"Book one {noun} for a day",
                         "a JSON object with booking_id, id, date, slots and notify",
                         [_id_param(w),
                          Param("date", param_name(w, "date"), _DATE_SCHEMA,
                                "The day, as YYYY-MM-DD."),
                          Param("slots", param_name(w, "slots"), {"type": "integer", "minimum": 1, "maximum": 8,
                                                                  "default": 1}, "How many slots to book (1-8).", False),
                          Param("notify", param_name(w, "notify"), {"type": "boolean", "default": False},
                                "Whether to notify the owner.", False)], "POST", f"/{plural}/bookings"))
    out.append(ToolSpecW("export", tool_name(w, "export", plural), f"Export some {plural} to a file",
                         "a JSON object with file (a download reference), format and rows",
                         [Param("ids", param_name(w, noun, "ids"), {"type": "array", "items": {"type": "string",
                                "pattern": w.id_pattern()}, "minItems": 1, "maxItems": 10},
                                f"The IDs of the {plural} to export."),
                          Param("format", param_name(w, "format"), {"type": "string", "enum": list(EXPORT_FORMATS)},
                                "The file format.")], "POST", f"/{plural}/exports"))
    for kind in w.distractors:
        if kind == "history":
            out.append(ToolSpecW("history", tool_name(w, w.verbs["get"], f"{noun}_history"),
                                 f"The change history of one {noun} (events only, not its current fields)",
                                 "a JSON object with id and events (date, event)", [_id_param(w)], "GET",
                                 f"/{plural}/{{id}}/history"))
        elif kind == "tags":
            out.append(ToolSpecW("tags", tool_name(w, "list", f"{noun}_tags"), f"The free-text tags attached to one {noun}",
                                 "a JSON object with id and tags", [_id_param(w)], "GET", f"/{plural}/{{id}}/tags"))
        elif kind == "archive_lookup":
            out.append(ToolSpecW("archive_lookup", tool_name(w, w.verbs["search"], f"archived_{plural}"),
                                 f"Search the archive of {plural} removed before 2020 by name",
                                 "a JSON object with matches", [Param("name", param_name(w, "name"), {"type": "string"},
                                                                      "A name or part of one.")], "GET",
                                 f"/archive/{plural}"))
    for s in out:
        if s.name.casefold() in BFCL_NAMES:
            s.name = s.name + ("Entry" if w.naming == "camel" else "_entry")
    names = [s.name for s in out]
    if len(set(names)) != len(names):  # a generator bug, never a model mistake
        raise AssertionError(f"toolworld {w.key}: duplicate tool names {names}")
    return out


def describe(w: World, s: ToolSpecW) -> tuple[str, dict[str, Any]]:
    """The tool's description and JSON schema in the world's description style.

    `line`: one sentence, parameter descriptions in the schema. `google`: a docstring with Args and Returns,
    the schema without descriptions. `openapi`: the method and path, a summary and the responses, the
    parameter descriptions in the schema.
    """
    style = w.description_style
    props: dict[str, Any] = {}
    for p in s.params:
        schema = dict(p.schema)
        if style != "google":
            schema["description"] = p.text
        props[p.name] = schema
    parameters = {"type": "object", "properties": props, "required": [p.name for p in s.params if p.required],
                  "additionalProperties": False}
    if style == "line":
        text = f"{s.summary}; returns {s.returns}."
    elif style == "google":
        args = "\n".join(f"    {p.name}: {p.text}" + ("" if p.required else " Optional.") for p in s.params)
        text = f"{s.summary}.\n\nArgs:\n{args}\n\nReturns:\n    {s.returns[0].upper() + s.returns[1:]}."
    else:
        text = f"{s.method} {s.path}\nSummary: {s.summary}.\nResponses: 200 {s.returns}; 404 the text \"{NO_RESULT}\"."
    return text, parameters


def bind(w: World, state: ToolworldState) -> list[Tool]:
    """The world's tools bound to an episode's state."""
    tools = []
    for s in specs(w):
        text, parameters = describe(w, s)
        fn = _IMPLS[s.kind](w, s, state)
        tools.append(Tool(name=s.name, description=text, parameters=parameters, fn=_keyword(s, fn),
                          side_effects=s.kind in SIDE_EFFECT_KINDS))
    return tools


def _keyword(s: ToolSpecW, fn: Callable[[dict[str, Any]], Any]) -> Callable[..., Any]:
    """A keyword-argument callable that maps the world's parameter names back to the kind's keys."""
    back = {p.name: p.key for p in s.params}

    def call(**kwargs: Any) -> Any:
        return fn({back.get(k, k): v for k, v in kwargs.items()})

    return call


# -- implementations (each gets arguments under the kind's own keys) -----------------------------


def _public(w: World, r: dict[str, Any]) -> dict[str, Any]:
    return {"id": r["id"], "name": r["name"], **{a.name: r[a.name] for a in w.attributes},
            f"{w.parent}_id": r[f"{w.parent}_id"]}


def _impl_get(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    def run(a: dict[str, Any]) -> Any:
        r = st.record(a["id"])
        return _public(w, r) if r else NO_RESULT
    return run


def _impl_get_parent(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    def run(a: dict[str, Any]) -> Any:
        p = next((p for p in w.parents if p["id"] == a["id"]), None)
        return dict(p) if p else NO_RESULT
    return run


def _impl_resolve(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    def run(a: dict[str, Any]) -> Any:
        r = next((r for r in st.records if r["name"].lower() == str(a["name"]).strip().lower()), None)
        return {"id": r["id"], "name": r["name"]} if r else NO_RESULT
    return run


def matches(w: World, r: dict[str, Any], a: dict[str, Any]) -> bool:
    """Whether a record passes the search filters `a` (kind keys)."""
    for key, value in a.items():
        if key == "limit":
            continue
        if key.startswith("min_") and r[key[4:]] < value:
            return False
        if key.startswith("max_") and r[key[4:]] > value:
            return False
        if key.endswith("_from") and r[key[:-5]] < value:
            return False
        if key.endswith("_to") and r[key[:-3]] > value:
            return False
        if key in r and r[key] != value:
            return False
    return True


def _impl_search(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    def run(a: dict[str, Any]) -> Any:
        hits = [r for r in st.records if matches(w, r, a)]
        return {"count": len(hits), "results": [{"id": r["id"], "name": r["name"]} for r in hits[: a.get("limit", 10)]]}
    return run


def _where(w: World, where: dict[str, Any] | None) -> dict[str, Any]:
    """A nested filter object (world names) as attribute -> value."""
    names = {param_name(w, a.name): a.name for a in w.attributes}
    return {names.get(k, k): v for k, v in (where or {}).items()}


def _impl_count(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    def run(a: dict[str, Any]) -> Any:
        cond = _where(w, a.get("where"))
        hits = [r for r in st.records if all(r[k] == v for k, v in cond.items())]
        attr = w.attr(a["group_by"])
        keys = w.enum_values(attr) if attr.type == "enum" else [True, False]
        counts = {json.dumps(k) if isinstance(k, bool) else k: sum(1 for r in hits if r[attr.name] == k) for k in keys}
        return {"group_by": attr.name, "counts": counts, "total": len(hits)}
    return run


def _impl_stats(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    def run(a: dict[str, Any]) -> Any:
        cond = _where(w, a.get("filter"))
        values = [r[a["field"]] for r in st.records if all(r[k] == v for k, v in cond.items())]
        if not values:
            return NO_RESULT
        total = sum(values)
        return {"field": a["field"], "n": len(values), "mean": round(total / len(values), 2), "min": min(values),
                "max": max(values), "sum": round(total, 2)}
    return run


def _impl_update(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    attr = w.of_type("enum")[0]

    def run(a: dict[str, Any]) -> Any:
        r = st.record(a["id"])
        if r is None:
            return NO_RESULT
        previous, r[attr.name] = r[attr.name], a["value"]
        st.actions.append({"kind": "update", "tool": s.name, "args": {"id": a["id"], "value": a["value"]}})
        return {"id": r["id"], attr.name: a["value"], "previous": previous}
    return run


def _impl_schedule(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    def run(a: dict[str, Any]) -> Any:
        if st.record(a["id"]) is None:
            return NO_RESULT
        args = {"id": a["id"], "date": a["date"], "slots": a.get("slots", 1), "notify": a.get("notify", False)}
        st.actions.append({"kind": "schedule", "tool": s.name, "args": args})
        return {"booking_id": f"BK-{len(st.actions):03d}", **args}
    return run


def _impl_export(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    def run(a: dict[str, Any]) -> Any:
        found = [i for i in a["ids"] if st.record(i) is not None]
        if not found:
            return NO_RESULT
        digest = hashlib.sha256(json.dumps([found, a["format"]]).encode()).hexdigest()[:8]
        return {"file": f"exports/{w.plural}-{digest}.{a['format']}", "format": a["format"], "rows": len(found),
                "missing": [i for i in a["ids"] if i not in found]}
    return run


def _impl_history(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    def run(a: dict[str, Any]) -> Any:
        r = st.record(a["id"])
        if r is None:
            return NO_RESULT
        h = int(hashlib.sha256(r["id"].encode()).hexdigest(), 16)
        return {"id": r["id"], "events": [{"date": f"202{h % 4 + 1}-0{h % 9 + 1}-1{h % 9}", "event": "created"},
                                          {"date": f"2025-0{h % 9 + 1}-2{h % 8}", "event": "edited"}]}
    return run


def _impl_tags(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    def run(a: dict[str, Any]) -> Any:
        r = st.record(a["id"])
        return {"id": r["id"], "tags": [r["name"].split()[0].lower(), w.noun]} if r else NO_RESULT
    return run


def _impl_archive(w: World, s: ToolSpecW, st: ToolworldState) -> Callable[[dict[str, Any]], Any]:
    def run(a: dict[str, Any]) -> Any:
        return {"matches": []}
    return run


_IMPLS: dict[str, Callable[[World, ToolSpecW, ToolworldState], Callable[[dict[str, Any]], Any]]] = {
    "get": _impl_get, "get_parent": _impl_get_parent, "resolve": _impl_resolve, "search": _impl_search, "count": _impl_count, "stats": _impl_stats,
    "update": _impl_update, "schedule": _impl_schedule, "export": _impl_export, "history": _impl_history,
    "tags": _impl_tags, "archive_lookup": _impl_archive,
}

__all__ = ["KINDS", "NO_RESULT", "SIDE_EFFECT_KINDS", "ToolSpecW", "ToolworldState", "bind", "describe", "matches",
           "specs", "spell_enum", "words_to"]
