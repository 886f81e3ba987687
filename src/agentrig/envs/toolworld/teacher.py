"""Toolworld's expert teacher: a solver per family that acts from any state, reading only the messages.

At every step it rebuilds what is known from the conversation (each call and its observation), works out
which calls the family still needs, and writes all of them that can be made now in one turn (parallel
calls), then the answer from the results. `task.expected` is never read; `task.metadata["params"]` says
what the user asked for, and the world (regenerated from `metadata["world"]`) gives the tool and parameter
names. Because it is a function of the messages, it can also label the states a learner reached (DAgger).

Recovery: a failed call (timeout, 503, 429, cut or broken output, "No result" where a record must exist) is
made once more; a second failure, or a permanent error (permission denied), ends with an honest answer
that says what could not be done. A drifted output field (`schema_drift`) is read under its new name.
Detours (`detour_rate`): the first call is written as the user said it (an enum in the user's spelling, a
date as "March 5, 2024", a numeric string, or a required field left out) with weight 0; the harness
rejects it with per-field feedback, and the next step writes it right.
"""

from __future__ import annotations

import json
import random
from typing import Any

from agentrig.envs.base import classify_observation
from agentrig.envs.toolworld.tasks import STAT_WORDS, natural_date, show
from agentrig.envs.toolworld.tools import ToolSpecW, specs
from agentrig.envs.toolworld.world import World, param_name, world
from agentrig.harness import PolicyReply, PolicyRequest
from agentrig.harness.protocol import get_protocol, result_text
from agentrig.harness.trajectory import ToolCall

_RETRY = {"timeout", "unavailable", "rate_limited", "broken", "empty"}
_REASONS = {"timeout": "it timed out", "unavailable": "the service was unavailable", "rate_limited": "it was rate-limited",
            "broken": "its output was unreadable", "empty": "it found nothing", "error": "it returned an error"}


class _Pending(Exception):
    """The call must be made (or made again) now."""


class _Failed(Exception):
    def __init__(self, tool: str, reason: str):
        super().__init__(reason)
        self.tool, self.reason = tool, reason


class ToolworldExpert:
    """The programmatic policy for toolworld tasks (see the module docstring)."""

    def __init__(self, detour_rate: float = 0.0, seed: int = 0):
        self.detour_rate, self.seed = detour_rate, seed

    def generate(self, request: PolicyRequest) -> PolicyReply:
        task, proto = request.task, get_protocol(request.protocol)
        w = world(task.metadata["world"]["split"], task.metadata["world"]["index"])
        plan = _Plan(w, task.family, task.metadata["params"], _history(request.messages))
        text, calls = plan.next()
        if calls and request.step == 0 and not plan.seen:
            rng = random.Random(f"toolworld-detour/{self.seed}/{task.id}")
            if rng.random() < self.detour_rate:
                wrong = _detour(w, calls[0], task.prompt, rng)
                if wrong is not None:
                    return PolicyReply(proto.assistant_text("", [wrong]), weight=0.0)
        if calls:
            return PolicyReply(proto.assistant_text(text, calls))
        return PolicyReply(text)


def _history(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any], str]]:
    """(tool, arguments, observation) of every executed call, in order."""
    out: list[tuple[str, dict[str, Any], str]] = []
    by_id: dict[str, tuple[str, dict[str, Any]]] = {}
    for m in messages:
        if m["role"] == "assistant":
            for c in m.get("tool_calls") or []:
                try:
                    args = json.loads(c["function"]["arguments"])
                except (ValueError, TypeError):
                    args = {}
                by_id[c["id"]] = (c["function"]["name"], args)
        elif m["role"] == "tool":
            name, args = by_id.get(m.get("tool_call_id", ""), (m.get("name", ""), {}))
            out.append((name, args, result_text(m)))
    return out


def _field(obj: Any, key: str) -> Any:
    """obj[key], or the field a schema_drift renamed it to (`key_v2`, or the one unknown key)."""
    if not isinstance(obj, dict):
        raise KeyError(key)
    if key in obj:
        return obj[key]
    for k, v in obj.items():
        if k.startswith(key):
            return v
    raise KeyError(key)


class _Plan:
    """What one family needs, evaluated against the calls made so far."""

    def __init__(self, w: World, family: str, params: dict[str, Any], history: list[tuple[str, dict[str, Any], str]]):
        self.w, self.family, self.p, self.history = w, family, params, history
        self.spec = {s.kind: s for s in specs(w)}
        self.seen = bool(history)
        self.pending: list[ToolCall] = []

    # a call by kind with kind-keyed arguments -> the world's call
    def call(self, kind: str, args: dict[str, Any]) -> ToolCall:
        s: ToolSpecW = self.spec[kind]  # arguments in the schema's order: the canonical form training renders
        return ToolCall("", s.name, {p.name: args[p.key] for p in s.params if args.get(p.key) is not None})

    def result(self, kind: str, args: dict[str, Any]) -> Any:
        """The call's parsed result, or raise _Pending (make it now) / _Failed (give up)."""
        c = self.call(kind, args)
        tries = [obs for name, a, obs in self.history if name == c.name and a == c.arguments]
        if tries:
            obs = tries[-1]
            kind_obs = classify_observation(obs)
            if kind_obs == "ok":
                return json.loads(obs)
            if kind_obs == "empty" and len(tries) >= 2:
                return None  # really nothing there
            if kind_obs in _RETRY and len(tries) < 2:
                self.pending.append(c)
                raise _Pending
            raise _Failed(c.name, _REASONS.get(kind_obs, "it failed"))
        self.pending.append(c)
        raise _Pending

    def need(self, kind: str, args: dict[str, Any]) -> Any:
        """Like `result`, but independent calls are collected (so they go out together) before stopping."""
        try:
            return self.result(kind, args)
        except _Pending:
            return _Pending

    def next(self) -> tuple[str, list[ToolCall]]:
        try:
            return getattr(self, f"_{self.family}")(), []
        except _Pending:
            return "", self.pending
        except _Failed as f:
            return (f"I could not finish this: {f.tool} failed ({f.reason}). Please try again later; "
                    "I did not want to guess.", [])

    def _never_empty(self, kind: str, args: dict[str, Any]) -> Any:
        """The result of a tool that always answers something: "No result" twice is a failure, not an answer."""
        res = self.result(kind, args)
        if res is None:
            raise _Failed(self.spec[kind].name, _REASONS["empty"])
        return res

    # -- families -------------------------------------------------------------------------------
    def _record(self, rid: str) -> dict[str, Any] | None:
        return self.result("get", {"id": rid})

    def _lookup(self) -> str:
        w, p = self.w, self.p
        a = w.attr(p["attr"])
        r = self._record(p["id"])
        if r is None:
            return f"There is no {w.noun} {p['id']} in the records, so I cannot tell its {a.label}."
        return f"The {a.label} of {w.noun} {p['id']} is {show(_field(r, a.name), a.unit)}."

    def _chain(self) -> str:
        w, p = self.w, self.p
        a = w.attr(p["attr"])
        found = self.result("resolve", {"name": p["name"]})
        if found is None:
            return f"There is no {w.noun} named {p['name']} in the records, so I cannot tell its {a.label}."
        rid = _field(found, "id")
        r = self._record(rid)
        if r is None:
            return f"There is no {w.noun} {rid} in the records, so I cannot tell its {a.label}."
        return f"The {w.noun} named {p['name']} ({rid}) has {a.label} {show(_field(r, a.name), a.unit)}."

    def _relation(self) -> str:
        w, p = self.w, self.p
        a = w.parent_attr(p["attr"])
        r = self._record(p["id"])
        if r is None:
            return f"There is no {w.noun} {p['id']} in the records, so I cannot tell its {w.parent}."
        pid = _field(r, f"{w.parent}_id")
        parent = self.result("get_parent", {"id": pid})
        if parent is None:
            return f"{w.noun.title()} {p['id']} belongs to {w.parent} {pid}, but I could not find that {w.parent}'s record."
        return (f"{w.noun.title()} {p['id']} belongs to {w.parent} {pid} ({_field(parent, 'name')}), whose {a.label} is "
                f"{show(_field(parent, a.name), a.unit)}.")

    def _parallel(self) -> str:
        w, p = self.w, self.p
        a = w.attr(p["attr"])
        got = [self.need("get", {"id": rid}) for rid in p["ids"]]
        if any(g is _Pending for g in got):
            raise _Pending
        parts = [f"{rid}: {show(_field(r, a.name), a.unit)}" if r else f"{rid}: not found" for rid, r in zip(p["ids"], got)]
        return f"The {a.label} of each {w.noun}: " + "; ".join(parts) + "."

    def _search(self) -> str:
        w, p = self.w, self.p
        res = self._never_empty("search", dict(p["filters"]))
        n = _field(res, "count")
        names = [f"{_field(x, 'name')} ({_field(x, 'id')})" for x in _field(res, "results")]
        if n == 0:
            return f"I found 0 {w.plural} that match."
        if n <= 5:
            return f"I found {n} matching {w.plural if n > 1 else w.noun}: " + ", ".join(names) + "."
        return f"I found {n} matching {w.plural}; that is more than five, so I am not listing them."

    def _count(self) -> str:
        w, p = self.w, self.p
        a = w.attr(p["group_by"])
        where = {param_name(w, k): v for k, v in p["where"].items()} or None
        res = self._never_empty("count", {"group_by": a.name, "where": where})
        n = _field(res, "counts").get(p["value"], 0)
        return f"{n} {w.plural if n != 1 else w.noun} {'have' if n != 1 else 'has'} {a.label} {p['value']}" + \
            (f" (counted among those with {', '.join(f'{k} {v}' for k, v in p['where'].items())})." if p["where"] else ".")

    def _stats(self) -> str:
        w, p = self.w, self.p
        a = w.attr(p["field"])
        where = {param_name(w, k): v for k, v in p["where"].items()} or None
        res = self.result("stats", {"field": a.name, "filter": where})
        if res is None:
            return f"No {w.plural} match that filter, so there is no {STAT_WORDS[p['stat']]} {a.label}; I could not compute it."
        return f"The {STAT_WORDS[p['stat']]} {a.label} is {show(_field(res, p['stat']), a.unit)} (over {_field(res, 'n')} {w.plural})."

    def _update(self) -> str:
        w, p = self.w, self.p
        a = w.of_type("enum")[0]
        res = self.result("update", {"id": p["id"], "value": p["value"], "reason": p.get("reason")})
        if res is None:
            return f"There is no {w.noun} {p['id']}, so I could not change it."
        return f"Done: {w.noun} {p['id']} now has {a.label} {p['value']} (it was {_field(res, 'previous')})."

    def _schedule(self) -> str:
        w, p = self.w, self.p
        res = self.result("schedule", {"id": p["id"], "date": p["date"], "slots": p["slots"] if p["slots"] > 1 else None,
                                       "notify": True if p["notify"] else None})
        if res is None:
            return f"There is no {w.noun} {p['id']}, so I could not book it."
        slots = p["slots"]
        return (f"Booked {w.noun} {p['id']} for {p['date']} ({slots} slot{'s' if slots > 1 else ''}"
                f"{', owner notified' if p['notify'] else ''}); booking {_field(res, 'booking_id')}.")

    def _export(self) -> str:
        p = self.p
        res = self.result("export", {"ids": list(p["ids"]), "format": p["format"]})
        if res is None:
            return "None of those IDs exist, so I could not export anything."
        return f"The export is ready: {_field(res, 'file')} ({_field(res, 'rows')} rows, {p['format']})."

    def _irrelevant(self) -> str:
        return self.p["answer"]

    def _missing_value(self) -> str:
        return self.p["answer"]

    def _not_found(self) -> str:
        """An ID or a name that does not exist: the lookup says "No result", and the answer says so."""
        return self._lookup() if "id" in self.p else self._chain()


def _detour(w: World, call: ToolCall, prompt: str, rng: random.Random) -> ToolCall | None:
    """The call written wrong in a way the schema rejects, or None when no such mistake fits it."""
    args = dict(call.arguments)
    options = []
    for k, v in args.items():
        if isinstance(v, str) and v.isalpha() and v != v.lower() and v.lower() in prompt.lower():
            options.append((k, v.lower()))  # the enum as the user spelled it
        if isinstance(v, str) and len(v) == 10 and v[4] == "-" and v[7] == "-":
            said = natural_date(v, rng)
            if said != v:
                options.append((k, said))  # the date as a person writes it
        if isinstance(v, int) and not isinstance(v, bool):
            options.append((k, str(v)))  # a number as a string
    if options:
        k, bad = rng.choice(options)
        args[k] = bad
        return ToolCall("", call.name, args)
    spec = next(s for s in specs(w) if s.name == call.name)
    required = [p.name for p in spec.params if p.required and p.name in args]
    if required:  # a required field left out
        k = rng.choice(required)
        return ToolCall("", call.name, {x: v for x, v in args.items() if x != k})
    return None
