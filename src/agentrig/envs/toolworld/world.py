"""Worlds generated from parts: one entity kind, its records, and the naming and description styles of its API.

A world is a pure function of `(split, index)`: `world(split, k)`. Its entity kind (a noun) comes from the
split's share of `NOUNS`, which are hashed into train (70 %), dev (15 %) and test (15 %), so a test world's
domain and every tool name built from it (names always contain the noun) never occur in a training world.
The rest is drawn from parts: 5-7 attributes out of `ATTRIBUTES` (enums, integers and numbers with ranges,
booleans, ISO dates), the enum values' spelling, 24-40 records with IDs in the world's own format, a related
entity kind (a noun of the split's share of `PARENT_NOUNS`: sites, depots, wards, ...) whose 4-8 records each
record belongs to (`<parent>_id`), the tool
naming style (snake_case, camelCase, dotted namespaces, noun_verb), the parameter naming style, the verbs,
the description style (one line, Google docstring, OpenAPI-like) and which distractor tools exist.

Nothing here is executed by the model; `tools.py` turns a world into tools bound to an episode's state.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import random
import re
from dataclasses import dataclass, field
from typing import Any

# (singular, plural). Kept clear of datadesk's domain (customers, products, orders, tickets, regions,
# stock, sales), so datadesk's own held-out tools stay unseen by any toolworld split.
NOUNS: tuple[tuple[str, str], ...] = (
    ("patient", "patients"), ("vehicle", "vehicles"), ("book", "books"), ("sensor", "sensors"),
    ("shipment", "shipments"), ("room", "rooms"), ("flight", "flights"), ("course", "courses"),
    ("employee", "employees"), ("invoice", "invoices"), ("parcel", "parcels"), ("recipe", "recipes"),
    ("plant", "plants"), ("animal", "animals"), ("device", "devices"), ("server", "servers"),
    ("contract", "contracts"), ("vessel", "vessels"), ("truck", "trucks"), ("album", "albums"),
    ("track", "tracks"), ("painting", "paintings"), ("exhibit", "exhibits"), ("tenant", "tenants"),
    ("property", "properties"), ("lease", "leases"), ("machine", "machines"), ("workshop", "workshops"),
    ("volunteer", "volunteers"), ("donation", "donations"), ("grant", "grants"), ("specimen", "specimens"),
    ("experiment", "experiments"), ("telescope", "telescopes"), ("satellite", "satellites"), ("drone", "drones"),
    ("locomotive", "locomotives"), ("bicycle", "bicycles"), ("scooter", "scooters"), ("locker", "lockers"),
    ("badge", "badges"), ("camera", "cameras"), ("printer", "printers"), ("router", "routers"),
    ("license", "licenses"), ("permit", "permits"), ("inspection", "inspections"), ("incident", "incidents"),
    ("claim", "claims"), ("member", "members"), ("athlete", "athletes"), ("fixture", "fixtures"),
    ("tournament", "tournaments"), ("team", "teams"), ("venue", "venues"), ("concert", "concerts"),
    ("festival", "festivals"), ("dish", "dishes"), ("ingredient", "ingredients"), ("batch", "batches"),
    ("barrel", "barrels"), ("hive", "hives"), ("greenhouse", "greenhouses"), ("tractor", "tractors"),
    ("pump", "pumps"), ("turbine", "turbines"), ("reservoir", "reservoirs"), ("bridge", "bridges"),
    ("trail", "trails"), ("campsite", "campsites"), ("cabin", "cabins"), ("kayak", "kayaks"),
    ("dock", "docks"), ("crate", "crates"), ("pallet", "pallets"), ("container", "containers"),
    ("student", "students"), ("classroom", "classrooms"), ("lecture", "lectures"), ("thesis", "theses"),
    ("vaccine", "vaccines"), ("ambulance", "ambulances"), ("pharmacy", "pharmacies"), ("clinic", "clinics"),
    ("museum", "museums"), ("gallery", "galleries"), ("studio", "studios"), ("podcast", "podcasts"),
    ("episode", "episodes"), ("channel", "channels"), ("antenna", "antennas"), ("generator", "generators"),
    ("battery", "batteries"), ("charger", "chargers"), ("elevator", "elevators"), ("boiler", "boilers"),
    ("orchard", "orchards"), ("vineyard", "vineyards"), ("stable", "stables"), ("horse", "horses"),
)


# What a record belongs to (the related entity kind), hashed into splits like NOUNS and disjoint from them.
PARENT_NOUNS: tuple[tuple[str, str], ...] = (
    ("site", "sites"), ("depot", "depots"), ("owner", "owners"), ("department", "departments"),
    ("campus", "campuses"), ("district", "districts"), ("supplier", "suppliers"), ("facility", "facilities"),
    ("branch", "branches"), ("fleet", "fleets"), ("division", "divisions"), ("hub", "hubs"), ("ward", "wards"),
    ("workgroup", "workgroups"), ("yard", "yards"), ("terminal", "terminals"), ("agency", "agencies"),
    ("network", "networks"), ("portfolio", "portfolios"), ("collection", "collections"), ("program", "programs"),
    ("league", "leagues"), ("club", "clubs"), ("office", "offices"), ("station", "stations"), ("base", "bases"),
    ("estate", "estates"), ("farm", "farms"), ("lab", "labs"), ("project", "projects"), ("sponsor", "sponsors"),
    ("operator", "operators"), ("vendor", "vendors"), ("carrier", "carriers"), ("council", "councils"),
    ("cooperative", "cooperatives"),
)


def noun_split(noun: str) -> str:
    """train / dev / test for an entity noun (a stable hash, 70/15/15)."""
    h = int(hashlib.sha256(f"toolworld-noun/{noun}".encode()).hexdigest(), 16) % 100
    return "train" if h < 70 else "dev" if h < 85 else "test"


def split_nouns(split: str, pool: tuple[tuple[str, str], ...] = NOUNS) -> list[tuple[str, str]]:
    """The nouns (of `pool`: NOUNS or PARENT_NOUNS) whose worlds belong to `split` (test_unseen_tools: test's)."""
    split = "test" if split == "test_unseen_tools" else split
    return [n for n in pool if noun_split(n[0]) == split]


@dataclass(frozen=True)
class Attribute:
    """One attribute of the entity: a name, a type, its range or values, a unit, and how people say it."""

    name: str
    type: str  # enum | integer | number | boolean | date
    label: str  # as a person says it ("weight", "service date")
    values: tuple[str, ...] = ()  # enum values (base spelling)
    low: float = 0.0
    high: float = 0.0
    unit: str = ""
    decimals: int = 0  # numbers: decimals of stored values


ATTRIBUTES: tuple[Attribute, ...] = (
    Attribute("status", "enum", "status", ("active", "paused", "retired", "pending")),
    Attribute("zone", "enum", "zone", ("north", "south", "east", "west", "central")),
    Attribute("priority", "enum", "priority", ("low", "normal", "high", "urgent")),
    Attribute("tier", "enum", "tier", ("bronze", "silver", "gold", "platinum")),
    Attribute("condition", "enum", "condition", ("new", "good", "worn", "damaged")),
    Attribute("shift", "enum", "shift", ("morning", "afternoon", "night")),
    Attribute("material", "enum", "material", ("steel", "wood", "plastic", "glass", "carbon")),
    Attribute("level", "enum", "level", ("beginner", "intermediate", "advanced", "expert")),
    Attribute("color", "enum", "colour", ("red", "blue", "green", "amber", "grey")),
    Attribute("capacity", "integer", "capacity", low=1, high=500),
    Attribute("floor", "integer", "floor", low=0, high=40),
    Attribute("year_built", "integer", "year built", low=1950, high=2024),
    Attribute("visits", "integer", "number of visits", low=0, high=900),
    Attribute("seats", "integer", "number of seats", low=1, high=120),
    Attribute("weight_kg", "number", "weight", low=0.5, high=480.0, unit="kg", decimals=1),
    Attribute("price_usd", "number", "price", low=5.0, high=4800.0, unit="USD", decimals=2),
    Attribute("temperature_c", "number", "temperature", low=-18.0, high=44.0, unit="°C", decimals=1),
    Attribute("length_m", "number", "length", low=0.2, high=350.0, unit="m", decimals=1),
    Attribute("score", "number", "score", low=0.0, high=100.0, decimals=1),
    Attribute("battery_pct", "number", "battery level", low=1.0, high=100.0, unit="%", decimals=0),
    Attribute("insured", "boolean", "insured"),
    Attribute("certified", "boolean", "certified"),
    Attribute("indoor", "boolean", "indoor"),
    Attribute("verified", "boolean", "verified"),
    Attribute("registered_on", "date", "registration date"),
    Attribute("last_service", "date", "last service date"),
    Attribute("due_date", "date", "due date"),
    Attribute("opened_on", "date", "opening date"),
)

NAMING_STYLES = ("snake", "camel", "dotted", "noun_verb")
PARAM_STYLES = ("snake", "camel")
DESCRIPTION_STYLES = ("line", "google", "openapi")
ENUM_CASES = ("lower", "upper", "title")
DISTRACTOR_KINDS = ("history", "tags", "export", "archive_lookup")
VERBS: dict[str, tuple[str, ...]] = {
    "get": ("get", "fetch", "read", "describe"),
    "search": ("search", "find", "list", "query"),
    "resolve": ("resolve", "lookup", "match", "identify"),
    "count": ("count", "tally"),
    "stats": ("summarize", "aggregate", "compute_stats"),
    "update": ("set", "update", "assign", "change"),
    "schedule": ("schedule", "book", "reserve", "plan"),
}
_SYLLABLES = ("ka", "lo", "mer", "vin", "tor", "sa", "bel", "dru", "fen", "gal", "hol", "ista", "jor", "kem",
              "lun", "mor", "nel", "ost", "pra", "quin", "ros", "sil", "tam", "ul", "vor", "wen", "yar", "zel")


@dataclass
class World:
    """One generated domain: its entity, attributes, records and API styles (see the module docstring)."""

    split: str
    index: int
    noun: str
    plural: str
    id_prefix: str
    id_digits: int
    attributes: list[Attribute]
    enum_case: str
    naming: str
    param_style: str
    description_style: str
    verbs: dict[str, str]
    distractors: list[str]
    records: list[dict[str, Any]] = field(default_factory=list)
    # the related entity: every record belongs to one of these (a relation, e.g. each turbine to one site)
    parent: str = ""
    parent_plural: str = ""
    parent_attributes: list[Attribute] = field(default_factory=list)
    parents: list[dict[str, Any]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.split}/{self.index}"

    def attr(self, name: str) -> Attribute:
        return next(a for a in self.attributes if a.name == name)

    def of_type(self, *types: str) -> list[Attribute]:
        return [a for a in self.attributes if a.type in types]

    def enum_values(self, a: Attribute) -> list[str]:
        """The values of an enum attribute as this world's schema spells them."""
        return [spell_enum(v, self.enum_case) for v in a.values]

    def record(self, rid: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r["id"] == rid), None)

    def parent_attr(self, name: str) -> Attribute:
        return next(a for a in self.parent_attributes if a.name == name)

    def by_name(self, name: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r["name"].lower() == name.strip().lower()), None)

    def id_example(self) -> str:
        return f"{self.id_prefix}-{'0' * (self.id_digits - 1)}7"

    def id_pattern(self) -> str:
        return f"^{self.id_prefix}-[0-9]{{{self.id_digits}}}$"

    def fresh_records(self) -> list[dict[str, Any]]:
        """A deep copy of the records: an episode's own state."""
        return copy.deepcopy(self.records)

    def parent_pattern(self) -> str:
        return f"^{self.parents[0]['id'].split('-')[0]}-[0-9]{{2}}$"


def spell_enum(value: str, case: str) -> str:
    return value.upper() if case == "upper" else value.title() if case == "title" else value


def _name(rng: random.Random) -> str:
    first = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).title()
    last = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).title()
    return f"{first} {last}"


def _value(a: Attribute, rng: random.Random, case: str) -> Any:
    if a.type == "enum":
        return spell_enum(rng.choice(a.values), case)
    if a.type == "integer":
        return rng.randint(int(a.low), int(a.high))
    if a.type == "number":
        return round(rng.uniform(a.low, a.high), a.decimals) if a.decimals else float(rng.randint(int(a.low), int(a.high)))
    if a.type == "boolean":
        return rng.random() < 0.5
    if a.type == "date":
        return f"{rng.randint(2021, 2025)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    raise ValueError(a.type)


@functools.lru_cache(maxsize=512)
def _world_cached(split: str, index: int) -> World:
    nouns = split_nouns(split)
    if not nouns:
        raise ValueError(f"no toolworld nouns in split {split!r}")
    rng = random.Random(f"toolworld/{split}/{index}")
    noun, plural = nouns[index % len(nouns)]
    prefix = re.sub(r"[^A-Z]", "", noun.upper())[: rng.choice((2, 3))] or "ID"
    enums = [a for a in ATTRIBUTES if a.type == "enum"]
    numeric = [a for a in ATTRIBUTES if a.type in ("integer", "number")]
    flags = [a for a in ATTRIBUTES if a.type == "boolean"]
    dates = [a for a in ATTRIBUTES if a.type == "date"]
    attrs = (rng.sample(enums, 1) + rng.sample(numeric, rng.choice((2, 2, 3))) + rng.sample(flags, 1)
             + rng.sample(dates, 1))
    if rng.random() < 0.4:
        attrs.append(rng.choice([a for a in enums if a not in attrs]))
    w = World(split=split, index=index, noun=noun, plural=plural, id_prefix=prefix, id_digits=rng.choice((3, 4)),
              attributes=attrs, enum_case=rng.choice(ENUM_CASES), naming=rng.choice(NAMING_STYLES),
              param_style=rng.choice(PARAM_STYLES), description_style=rng.choice(DESCRIPTION_STYLES),
              verbs={k: rng.choice(v) for k, v in VERBS.items()},
              distractors=rng.sample(DISTRACTOR_KINDS, rng.randint(2, 3)))
    n, ids, names = rng.randint(24, 40), set(), set()
    while len(ids) < n:
        ids.add(f"{prefix}-{rng.randint(1, 10 ** w.id_digits - 1):0{w.id_digits}d}")
    for rid in sorted(ids):
        name = _name(rng)
        while name.lower() in names:
            name = _name(rng)
        names.add(name.lower())
        w.records.append({"id": rid, "name": name, **{a.name: _value(a, rng, w.enum_case) for a in attrs}})
    _add_parents(w, split_nouns(split, PARENT_NOUNS))
    return w


def _add_parents(w: World, nouns: list[tuple[str, str]]) -> None:
    """The related entity kind (a parent noun of the same split, so held-out names stay held out), 4-8 of its
    records with two attributes of their own, and each record's `<parent>_id` (drawn from its own RNG, so
    the rest of the world does not depend on it)."""
    rng = random.Random(f"toolworld/{w.split}/{w.index}/parent")
    w.parent, w.parent_plural = rng.choice(nouns)
    used = {a.name for a in w.attributes}
    w.parent_attributes = [rng.choice([a for a in ATTRIBUTES if a.type == t and a.name not in used])
                           for t in (rng.choice(("enum", "date")), rng.choice(("integer", "number")))]
    prefix = (re.sub(r"[^A-Z]", "", w.parent.upper())[:2] + "X") if w.parent[:2] == w.noun[:2] else \
        re.sub(r"[^A-Z]", "", w.parent.upper())[:3]
    names: set[str] = {r["name"].lower() for r in w.records}
    for k in rng.sample(range(10, 99), rng.randint(4, 8)):
        name = _name(rng)
        while name.lower() in names:
            name = _name(rng)
        names.add(name.lower())
        w.parents.append({"id": f"{prefix}-{k:02d}", "name": name,
                          **{a.name: _value(a, rng, w.enum_case) for a in w.parent_attributes}})
    for r in w.records:
        r[f"{w.parent}_id"] = rng.choice(w.parents)["id"]


def world(split: str, index: int) -> World:
    """World `index` of `split` (deterministic; cached). test_unseen_tools means the test worlds."""
    split = "test" if split == "test_unseen_tools" else split
    return _world_cached(split, index)


# -- naming ------------------------------------------------------------------------------------


def words_to(style: str, words: list[str]) -> str:
    """Join words in a naming style: snake_case or camelCase (dotted and noun_verb tool names use snake)."""
    words = [w for part in words for w in part.split("_") if w]
    if style == "camel":
        return words[0] + "".join(w.title() for w in words[1:])
    return "_".join(words)


def param_name(w: World, *words: str) -> str:
    return words_to(w.param_style, list(words))


def tool_name(w: World, verb: str, obj: str) -> str:
    """A tool name in the world's style: get_patient, getPatient, patients.get, patient_get."""
    noun_words = obj.split("_")
    if w.naming == "camel":
        return words_to("camel", verb.split("_") + noun_words)
    if w.naming == "dotted":
        rest = [x for x in noun_words if x not in (w.noun, w.plural)]
        return f"{w.plural}.{verb}" + ("_" + "_".join(rest) if rest else "")
    if w.naming == "noun_verb":
        return "_".join(noun_words + verb.split("_"))
    return "_".join(verb.split("_") + noun_words)
