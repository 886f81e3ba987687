"""Toolworld's task families: seeded requests over one generated world each, with the checker's expectations.

Task i of (split, seed) draws a world out of the split's pool (`WORLD_POOL`), a family, and the family's
values from that world's records, so every expected figure is what the real tools return. The allowlist
(the tools the model is shown) is the tools the family needs plus 2-4 others of the world, near-miss
distractors among them, so the model must pick the one that fits. Families:

- `lookup`        one call (`get`), the answer quotes one field
- `chain`         a call whose argument comes from another call's result (`resolve` a name, then `get`)
- `relation`      a field of the related record a record belongs to (`get`, then `get_parent` with its `<parent>_id`)
- `parallel`      2-3 independent `get` calls answered together (written in one turn)
- `search`        1-3 optional filters combined (enum, numeric range, boolean, date window): count and names
- `count`         `count` grouped by an attribute, sometimes with a nested `where` object
- `stats`         `stats` of a numeric field (mean/min/max/sum), sometimes with a nested `filter`
- `update`        a side effect: set an enum field (written by the user in another spelling than the schema's)
- `schedule`      a side effect with an ISO date the user writes as "March 5, 2024" and an optional flag
- `export`        an array argument (IDs) and an enum format; the answer names the file and the row count
- `irrelevant`    a request no tool serves: answer without calling (BFCL's irrelevance)
- `missing_value` a request without a required value: ask for it, call nothing
- `not_found`     an ID or name that does not exist: say so, invent nothing

`params` (in `task.metadata`) is what the teacher reads; `task.expected` is the checker's.
"""

from __future__ import annotations

import random
from typing import Any

from agentrig.envs.toolworld.tools import EXPORT_FORMATS, matches, specs
from agentrig.envs.toolworld.world import World, spell_enum, world
from agentrig.harness.trajectory import TaskSpec

FAMILIES: dict[str, float] = {"lookup": 1.0, "chain": 1.0, "relation": 0.8, "parallel": 1.0, "search": 1.0, "count": 0.8,
                              "stats": 0.8, "update": 0.8, "schedule": 0.8, "export": 0.6, "irrelevant": 0.6,
                              "missing_value": 0.6, "not_found": 0.6}
# worlds per split: train draws from many, the held-out splits from fewer (each still a distinct noun set)
WORLD_POOL = {"train": 600, "dev": 80, "test": 80, "test_unseen_tools": 80}
FAMILY_KINDS: dict[str, list[str]] = {
    "lookup": ["get"], "chain": ["resolve", "get"], "relation": ["get", "get_parent"], "parallel": ["get"], "search": ["search"], "count": ["count"],
    "stats": ["stats"], "update": ["update"], "schedule": ["schedule"], "export": ["export"], "irrelevant": [],
    "missing_value": [], "not_found": ["get"],
}
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
STAT_WORDS = {"mean": "average", "min": "lowest", "max": "highest", "sum": "total"}

# Requests no tool of any world serves, each with the answer the teacher gives (no call).
IRRELEVANT: tuple[tuple[str, str], ...] = (
    ("Translate 'good night' into Spanish.", "'Good night' in Spanish is 'buenas noches'."),
    ("Write a two-line poem about the sea.", "The sea rolls in with silver light,\nand hums the harbour into night."),
    ("What is the capital of Japan?", "The capital of Japan is Tokyo."),
    ("Hi! Who are you?", "Hello! I am an assistant with access to a few {plural} tools. What would you like to know?"),
    ("Can you recommend a good name for a cat?", "How about Miso, Pepper or Juniper?"),
    ("Spell 'necessary' backwards.", "Backwards, 'necessary' is 'yrassecen'."),
    ("What does the abbreviation 'ETA' mean?", "ETA means 'estimated time of arrival'."),
    ("Thanks, that's all for today.", "You're welcome! Have a good day."),
)
# Requests that sound like the domain but that no tool can do: say so honestly, call nothing.
UNSUPPORTED: tuple[tuple[str, str], ...] = (
    ("Delete the {noun} {id} permanently.",
     "I cannot delete records: none of my tools removes a {noun}. I can look it up, change its {target}, book it "
     "or export it."),
    ("Rename the {noun} {id} to 'Blue Harbor'.",
     "I cannot rename a {noun}: no tool here changes names. I can change its {target}, book it or export it."),
    ("E-mail the owner of {noun} {id} that it is ready.",
     "I cannot send e-mails: none of my tools does that. I can book the {noun} with a notification to its owner instead."),
)


def natural_date(iso: str, rng: random.Random) -> str:
    """An ISO date as a person writes it: "March 5, 2024", "5 Mar 2024", "5th of March 2024" or "2024-03-05"."""
    y, m, d = (int(x) for x in iso.split("-"))
    name = MONTHS[m - 1]
    suffix = "th" if 11 <= d <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(d % 10, "th")
    return rng.choice([f"{name} {d}, {y}", f"{d} {name[:3]} {y}", f"the {d}{suffix} of {name} {y}", iso])


def show(value: Any, unit: str = "") -> str:
    """A value as the teacher writes it in an answer."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float) and value.is_integer() and unit == "%":
        value = int(value)
    return f"{value} {unit}".strip() if unit and unit != "%" else f"{value}{unit}"


def _figure(a_type: str, value: Any) -> dict[str, Any]:
    return {"value": value, "kind": "count" if a_type == "integer" else "exact"}


class TaskFactory:
    """Builds task i of (split, seed); see the module docstring for the families."""

    def task(self, split: str, seed: int, i: int, family_weights: dict[str, float] | None = None) -> TaskSpec:
        rng = random.Random(f"toolworld/task/{split}/{seed}/{i}")
        k = rng.randrange(WORLD_POOL[split])
        w = world(split, k)
        fams = list(FAMILIES)
        weights = [FAMILIES[f] * (family_weights or {}).get(f, 1.0) for f in fams]
        family = rng.choices(fams, weights)[0]
        prompt, params, expected, flags = getattr(self, f"_{family}")(w, rng)
        kinds = {s.kind: s.name for s in specs(w)}
        needed = FAMILY_KINDS[family]
        others = [k for k in kinds if k not in needed]
        offered = set(needed) | set(rng.sample(others, min(len(others), rng.randint(2, 4) + (not needed))))
        tools = [name for kind, name in kinds.items() if kind in offered]  # the world's listing order
        expected = {"figures": [], "terms": [], **expected,
                    "needed_tools": [kinds[x] for x in FAMILY_KINDS[family]],
                    "no_tool": flags.get("no_tool", False), "impossible": flags.get("impossible", False)}
        return TaskSpec(id=f"toolworld-{split}-{seed}-{i}", prompt=prompt, env="toolworld", family=family, split=split,
                        allowed_tools=tools, expected=expected,
                        metadata={"world": {"split": w.split, "index": w.index, "noun": w.noun}, "params": params,
                                  "impossible": expected["impossible"], "no_tool": expected["no_tool"],
                                  "unseen_tools": split != "train", "key": f"{w.key}/{family}/{i}"})

    # -- families ---------------------------------------------------------------------------------
    def _lookup(self, w: World, rng: random.Random):
        r = rng.choice(w.records)
        attr = rng.choice([a for a in w.attributes if a.type != "boolean"])
        prompt = rng.choice([f"What is the {attr.label} of {w.noun} {r['id']}?",
                             f"Look up {w.noun} {r['id']} and tell me its {attr.label}.",
                             f"{r['id']}: what's its {attr.label}?"])
        return prompt, {"id": r["id"], "attr": attr.name}, self._value_expect(attr.type, r[attr.name]), {}

    def _chain(self, w: World, rng: random.Random):
        r = rng.choice(w.records)
        attr = rng.choice([a for a in w.attributes if a.type != "boolean"])
        prompt = rng.choice([f"What is the {attr.label} of the {w.noun} named {r['name']}?",
                             f"I only know the name: {r['name']}. What {attr.label} does that {w.noun} have?",
                             f"Find the {w.noun} called {r['name']} and tell me its {attr.label}."])
        exp = self._value_expect(attr.type, r[attr.name])
        return prompt, {"name": r["name"], "attr": attr.name}, exp, {}

    def _relation(self, w: World, rng: random.Random):
        r = rng.choice(w.records)
        parent = next(p for p in w.parents if p["id"] == r[f"{w.parent}_id"])
        a = rng.choice(w.parent_attributes)
        prompt = rng.choice([f"What is the {a.label} of the {w.parent} that {w.noun} {r['id']} belongs to?",
                             f"{w.noun.title()} {r['id']} belongs to a {w.parent}: what is that {w.parent}'s {a.label}?",
                             f"Which {a.label} does the {w.parent} of {r['id']} have?"])
        return prompt, {"id": r["id"], "attr": a.name}, self._value_expect(a.type, parent[a.name]), {}

    def _parallel(self, w: World, rng: random.Random):
        rs = rng.sample(w.records, rng.choice((2, 2, 3)))
        attr = rng.choice(w.of_type("integer", "number", "date", "enum"))
        ids = [r["id"] for r in rs]
        listed = ", ".join(ids[:-1]) + f" and {ids[-1]}"
        prompt = rng.choice([f"What are the {attr.label} values of the {w.plural} {listed}?",
                             f"Give me the {attr.label} of each of these {w.plural}: {', '.join(ids)}.",
                             f"Compare {listed}: what {attr.label} does each have?"])
        figures, terms = [], list(ids)
        for r in rs:
            e = self._value_expect(attr.type, r[attr.name])
            figures += e["figures"]
            terms += e["terms"]
        return prompt, {"ids": ids, "attr": attr.name}, {"figures": figures, "terms": terms}, {}

    def _search(self, w: World, rng: random.Random):
        anchor = rng.choice(w.records)
        enums, num = w.of_type("enum"), w.of_type("integer", "number")[0]
        flag, date = w.of_type("boolean")[0], w.of_type("date")[0]
        options = ["enum", "min", "max", "flag", "date"]
        chosen = rng.sample(options, rng.choice((1, 2, 2, 3)))
        filters: dict[str, Any] = {}
        words: list[str] = []
        unit = f" {num.unit}" if num.unit and num.unit != "%" else num.unit
        for c in chosen:
            if c == "enum":
                a = rng.choice(enums)
                filters[a.name] = anchor[a.name]
                words.append(f"with {a.label} {anchor[a.name].lower()}")
            elif c == "min":
                v = self._round_down(num, anchor[num.name], rng)
                filters[f"min_{num.name}"] = v
                words.append(f"with a {num.label} of at least {v:g}{unit}")
            elif c == "max" and "min" not in chosen:
                v = self._round_up(num, anchor[num.name], rng)
                filters[f"max_{num.name}"] = v
                words.append(f"with a {num.label} of at most {v:g}{unit}")
            elif c == "flag":
                filters[flag.name] = anchor[flag.name]
                words.append(f"that are {'' if anchor[flag.name] else 'not '}{flag.label}")
            elif c == "date":
                y, m = anchor[date.name][:4], anchor[date.name][5:7]
                filters[f"{date.name}_from"] = f"{y}-{m}-01"
                words.append(f"with a {date.label} in {MONTHS[int(m) - 1]} {y} or later")
        hits = [r for r in w.records if matches(w, r, filters)]
        cond = " and ".join(words)
        prompt = rng.choice([f"How many {w.plural} are there {cond}? Name them if there are at most five.",
                             f"Find the {w.plural} {cond}: how many are there, and which ones (if five or fewer)?",
                             f"Count the {w.plural} {cond}; list their names when there are five or fewer."])
        terms = [r["name"] for r in hits] if len(hits) <= 5 else []
        return prompt, {"filters": filters}, {"figures": [{"value": len(hits), "kind": "count"}], "terms": terms}, {}

    def _count(self, w: World, rng: random.Random):
        attr = rng.choice(w.of_type("enum"))
        value = rng.choice(w.enum_values(attr))
        where: dict[str, Any] = {}
        others = [a for a in w.of_type("enum", "boolean") if a is not attr]
        if others and rng.random() < 0.4:
            o = rng.choice(others)
            where[o.name] = rng.choice(w.enum_values(o)) if o.type == "enum" else rng.random() < 0.5
        n = sum(1 for r in w.records if r[attr.name] == value and all(r[k] == v for k, v in where.items()))
        scope = ""
        if where:
            (k, v), = where.items()
            o = w.attr(k)
            scope = (f" among those with {o.label} {str(v).lower()}" if o.type == "enum"
                     else f" among those that are {'' if v else 'not '}{o.label}")
        prompt = rng.choice([f"How many {w.plural} have {attr.label} {value.lower()}{scope}?",
                             f"Count the {w.plural} whose {attr.label} is {value.lower()}{scope}.",
                             f"What number of {w.plural} are {value.lower()} (by {attr.label}){scope}?"])
        return prompt, {"group_by": attr.name, "value": value, "where": where}, \
            {"figures": [{"value": n, "kind": "count"}]}, {}

    def _stats(self, w: World, rng: random.Random):
        a = rng.choice(w.of_type("integer", "number"))
        stat = rng.choice(list(STAT_WORDS))
        where: dict[str, Any] = {}
        if rng.random() < 0.5:
            o = rng.choice(w.of_type("enum", "boolean"))
            where[o.name] = rng.choice(w.enum_values(o)) if o.type == "enum" else rng.random() < 0.5
        values = [r[a.name] for r in w.records if all(r[k] == v for k, v in where.items())]
        if not values:  # an empty filter: the unfiltered statistic instead
            where, values = {}, [r[a.name] for r in w.records]
        total = sum(values)
        target = {"mean": round(total / len(values), 2), "min": min(values), "max": max(values),
                  "sum": round(total, 2)}[stat]
        scope = ""
        if where:
            (k, v), = where.items()
            o = w.attr(k)
            scope = (f" with {o.label} {str(v).lower()}" if o.type == "enum" else f" that are {'' if v else 'not '}{o.label}")
        prompt = rng.choice([f"What is the {STAT_WORDS[stat]} {a.label} of the {w.plural}{scope}?",
                             f"Across all {w.plural}{scope}, what is the {STAT_WORDS[stat]} {a.label}?"])
        fig = {"value": target, "kind": "approx", "tol": 0.01} if stat in ("mean", "sum") else _figure(a.type, target)
        return prompt, {"field": a.name, "stat": stat, "where": where}, {"figures": [fig]}, {}

    def _update(self, w: World, rng: random.Random):
        r = rng.choice(w.records)
        attr = w.of_type("enum")[0]
        value = rng.choice([v for v in w.enum_values(attr) if v != r[attr.name]])
        reason = rng.choice([None, None, "annual review", "request from the owner"])
        prompt = rng.choice([f"Set the {attr.label} of {w.noun} {r['id']} to {value.lower()}.",
                             f"Please change {r['id']}'s {attr.label} to {value.lower()}"
                             + (f" (reason: {reason})." if reason else "."),
                             f"{w.noun.title()} {r['id']} should now have {attr.label} {value.lower()}; update it."])
        args = {"id": r["id"], "value": value}
        return prompt, {"id": r["id"], "value": value, "reason": reason}, \
            {"action": {"kind": "update", "args": args}, "terms": [value]}, {}

    def _schedule(self, w: World, rng: random.Random):
        r = rng.choice(w.records)
        iso = f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
        slots, notify = rng.choice((1, 1, 2, 3, 4)), rng.random() < 0.4
        said = natural_date(iso, rng)
        extra = (f" for {slots} slots" if slots > 1 else "") + (" and notify the owner" if notify else "")
        prompt = rng.choice([f"Book {w.noun} {r['id']} on {said}{extra}.",
                             f"Please schedule {r['id']} for {said}{extra}.",
                             f"I need {w.noun} {r['id']} booked for {said}{extra}."])
        args = {"id": r["id"], "date": iso, "slots": slots, "notify": notify}
        return prompt, {"id": r["id"], "date": iso, "slots": slots, "notify": notify}, \
            {"action": {"kind": "schedule", "args": args}, "terms": [iso]}, {}

    def _export(self, w: World, rng: random.Random):
        ids = [r["id"] for r in rng.sample(w.records, rng.randint(2, 4))]
        fmt = rng.choice(EXPORT_FORMATS)
        prompt = rng.choice([f"Export {', '.join(ids)} as {fmt.upper()}. Where is the file, and how many rows?",
                             f"I need a {fmt} export of the {w.plural} {' and '.join(ids)}: give me the file and its row count."])
        return prompt, {"ids": ids, "format": fmt}, {"figures": [{"value": len(ids), "kind": "count"}],
                                                     "terms": [f".{fmt}"]}, {}

    def _irrelevant(self, w: World, rng: random.Random):
        target = w.of_type("enum")[0].label
        if rng.random() < 0.4:
            prompt, answer = rng.choice(UNSUPPORTED)
            r = rng.choice(w.records)
            fill = {"noun": w.noun, "id": r["id"], "plural": w.plural, "target": target}
            return prompt.format(**fill), {"answer": answer.format(**fill)}, {}, {"no_tool": True, "impossible": True}
        prompt, answer = rng.choice(IRRELEVANT)
        return prompt, {"answer": answer.format(plural=w.plural)}, {}, {"no_tool": True}

    def _missing_value(self, w: World, rng: random.Random):
        r = rng.choice(w.records)
        attr = w.of_type("enum")[0]
        kind = rng.choice(("date", "id", "ids"))
        if kind == "date":
            prompt = rng.choice([f"Book {w.noun} {r['id']} for me.", f"Please schedule {r['id']}."])
            answer = f"Which day should I book {w.noun} {r['id']} for? I need the date."
            missing = ["date", "day"]
        elif kind == "id":
            value = rng.choice(w.enum_values(attr)).lower()
            prompt = rng.choice([f"Set the {attr.label} of the {w.noun} to {value}.",
                                 f"Change that {w.noun}'s {attr.label} to {value}, please."])
            answer = f"Which {w.noun} do you mean? I need its ID (like {w.id_example()}) to change its {attr.label}."
            missing = ["ID", "which"]
        else:
            prompt = rng.choice([f"Export some {w.plural} as CSV.", f"Make me an export file of {w.plural}."])
            answer = f"Which {w.plural} should I export? Please give me their IDs (and the format if not CSV)."
            missing = ["ID", "which"]
        return prompt, {"answer": answer}, {"missing": missing}, {"no_tool": True}

    def _not_found(self, w: World, rng: random.Random):
        attr = rng.choice([a for a in w.attributes if a.type != "boolean"])
        if rng.random() < 0.6:
            taken = {r["id"] for r in w.records}
            rid = next(f"{w.id_prefix}-{n:0{w.id_digits}d}" for n in
                       (rng.randint(1, 10 ** w.id_digits - 1) for _ in range(1000))
                       if f"{w.id_prefix}-{n:0{w.id_digits}d}" not in taken)
            prompt = f"What is the {attr.label} of {w.noun} {rid}?"
            return prompt, {"id": rid, "attr": attr.name}, {}, {"impossible": True}
        name = "Zed Unknownson"
        prompt = f"What is the {attr.label} of the {w.noun} named {name}?"
        return prompt, {"name": name, "attr": attr.name}, {}, {"impossible": True}

    # -- helpers ----------------------------------------------------------------------------------
    @staticmethod
    def _value_expect(a_type: str, value: Any) -> dict[str, Any]:
        if a_type in ("integer", "number"):
            return {"figures": [_figure(a_type, value)], "terms": []}
        return {"figures": [], "terms": [str(value)]}

    @staticmethod
    def _round_down(a: Any, v: float, rng: random.Random) -> float:
        step = 10 if a.high > 100 else 1
        out = max((v // step) * step, a.low)
        return int(out) if a.type == "integer" else float(out)

    @staticmethod
    def _round_up(a: Any, v: float, rng: random.Random) -> float:
        step = 10 if a.high > 100 else 1
        out = -(-v // step) * step
        return int(min(out, a.high)) if a.type == "integer" else float(min(out, a.high))


__all__ = ["FAMILIES", "FAMILY_KINDS", "IRRELEVANT", "TaskFactory", "UNSUPPORTED", "WORLD_POOL", "natural_date",
           "show", "spell_enum"]
