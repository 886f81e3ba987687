"""Exploration: an environment's tools called with no teacher and no task answers, every call really executed.

For each *surface* (a set of tools some tasks of the split share: datadesk's unseen-tools split has one, a
toolworld split one per world) the explorer plans calls from what the tools say about themselves:

- **arguments from each schema**: enums, booleans, integers and numbers inside their ranges (defaults
  first), strings from the description's examples (`e.g. "C1004"`, quoted values), from a pattern
  (`^T\\d{4}$` sampled) or a stated format (ISO dates), arrays and nested objects built from their items;
- **values from other tools' results**: every scalar of every successful result goes into a value pool with
  its provenance (tool, arguments, field path); a parameter whose name or pattern fits a pooled value gets
  it, and the call is then made right after the call that produced the value, in one episode, so a *chain*
  is recorded (`find_customer` -> `customer_id` -> `list_tickets`);
- **deliberately invalid values**: each probe first sends one broken variant of its valid arguments (a
  wrong type, a value outside the enum or the range, a string in another form than its pattern, a
  missing required field, an unknown field), so the harness's per-field feedback is recorded, then the
  valid call: an error-then-fix example. Pattern-sampled IDs that do not exist provoke tool errors.

Every probe is a harness episode (`run_episode`) driven by a plan policy on a fresh `setup()` state;
injected faults, when asked for, reach read-only tools only (a side-effect tool always really runs). The
result is an ordinary episodes file plus a per-tool summary (`Exploration.summary`).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from agentrig.envs.base import Environment, classify_observation
from agentrig.harness import HarnessConfig, run_episode
from agentrig.harness.faults import FaultConfig
from agentrig.harness.policy import PolicyReply, PolicyRequest
from agentrig.harness.protocol import get_protocol
from agentrig.harness.tools import Tool
from agentrig.harness.trajectory import Episode, TaskSpec, ToolCall, ToolResult

# -- surfaces ----------------------------------------------------------------------------------------


@dataclass
class Surface:
    """Tools that some tasks of a split share: one base task to set them up, and every name any task offers."""

    base: TaskSpec
    tools: list[str]
    specs: dict[str, dict[str, Any]]  # name -> OpenAI spec
    key: str = ""


def surfaces(env: Any, tasks: list[TaskSpec]) -> list[Surface]:
    """Group `tasks` by the tools their `setup` binds (same names and specs), with the union of their allowlists."""
    groups: dict[str, Surface] = {}
    for task in tasks:
        tools, state = env.setup(task)
        try:
            specs = {name: t.spec() for name, t in tools.tools.items()}
        finally:
            env.close(state)
        key = json.dumps(specs, sort_keys=True)
        group = groups.setdefault(key, Surface(task, [], specs, key=f"s{len(groups)}"))
        for name in task.allowed_tools:
            if name not in group.tools and name in specs:
                group.tools.append(name)
    return list(groups.values())


# -- values ------------------------------------------------------------------------------------------

_EXAMPLE = re.compile(r'(?:e\.g\.|for example|such as|like)\s*[:,]?\s*"([^"]{1,60})"', re.I)
_QUOTED = re.compile(r'"([^"]{1,40})"')
_FORMAT_WORDS = {"YYYY-MM-DD": "date", "YYYY-MM": "month", "ISO date": "date", "ISO 8601": "date"}
_RANGE = re.compile(r"\b(\d+)\s*(?:-|to|\u2013)\s*(\d+)\b")
_SQL = re.compile(r"\bSQL\b|\bSELECT\b")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
_MONTH = re.compile(r"^\d{4}-\d{2}$")


@dataclass
class Pooled:
    """A value seen in a successful result, and where: which call, which field."""

    value: Any
    tool: str
    arguments: dict[str, Any]
    path: list[Any]
    episode: str


class ValuePool:
    """Scalars of successful results, by field name, with their provenance."""

    def __init__(self) -> None:
        self.by_key: dict[str, list[Pooled]] = {}

    def add_result(self, tool: str, arguments: dict[str, Any], value: Any, episode: str) -> int:
        """Pool every scalar leaf of a parsed result (a table's cells under their column's name); returns
        how many were new."""
        added = 0
        for path, leaf in leaves(value):
            key = next((str(p) for p in reversed(path) if isinstance(p, str)), "")
            columns = value.get("columns") if isinstance(value, dict) else None
            if (key == "rows" and isinstance(columns, list) and len(path) == 3 and isinstance(path[2], int)
                    and path[2] < len(columns)):
                key = str(columns[path[2]])
            bucket = self.by_key.setdefault(key, [])
            if len(bucket) < 40 and not any(p.value == leaf and p.tool == tool for p in bucket):
                bucket.append(Pooled(leaf, tool, dict(arguments), list(path), episode))
                added += 1
        return added

    def for_param(self, name: str, schema: dict[str, Any], exclude_tool: str) -> list[Pooled]:
        """Pooled values that fit a parameter: a field of the same name (or `x_id` for `id`, `id` for
        `x_id`), of the schema's type, matching its pattern, from another tool."""
        keys = {name, name.lower()}
        if name.endswith("_id") or name.endswith("Id"):
            keys.add("id")
        out = []
        for key, bucket in self.by_key.items():
            if key not in keys and not (key.endswith("_id") and name in ("id",)):
                continue
            for p in bucket:
                if p.tool != exclude_tool and fits(p.value, schema):
                    out.append(p)
        return out

    def values(self) -> Iterator[Pooled]:
        """Every pooled value."""
        for bucket in self.by_key.values():
            yield from bucket


def leaves(value: Any, path: list[Any] | None = None) -> Iterator[tuple[list[Any], Any]]:
    """(path, scalar) of every leaf of a JSON value; list items by index."""
    path = path or []
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, path + [k])
    elif isinstance(value, list):
        for i, v in enumerate(value[:20]):
            yield from leaves(v, path + [i])
    elif isinstance(value, (str, int, float, bool)) and value != "":
        yield path, value


def at_path(value: Any, path: list[Any]) -> Any:
    """The value at `path` (None when it is not there)."""
    for p in path:
        if isinstance(p, int) and isinstance(value, list) and p < len(value):
            value = value[p]
        elif isinstance(p, str) and isinstance(value, dict) and p in value:
            value = value[p]
        else:
            return None
    return value


def fits(value: Any, schema: dict[str, Any]) -> bool:
    """Whether `value` is of the schema's type, in its enum, its range and its pattern."""
    kind = schema.get("type")
    if "enum" in schema:
        return value in schema["enum"]
    if kind == "string":
        if not isinstance(value, str):
            return False
        pattern = schema.get("pattern")
        return pattern is None or re.search(pattern, value) is not None
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool) and _in_range(value, schema)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and _in_range(value, schema)
    if kind == "boolean":
        return isinstance(value, bool)
    return kind is None and isinstance(value, (str, int, float))


def _in_range(value: float, schema: dict[str, Any]) -> bool:
    lo, hi = schema.get("minimum"), schema.get("maximum")
    return (lo is None or value >= lo) and (hi is None or value <= hi)


def stated_format(schema: dict[str, Any]) -> str | None:
    """`date`, `month` or None: the format a string parameter states (its `format`, pattern or description)."""
    if schema.get("format") in ("date", "date-time"):
        return "date"
    pattern = schema.get("pattern") or ""
    if pattern in (r"^\d{4}-\d{2}-\d{2}$",):
        return "date"
    if pattern in (r"^\d{4}-\d{2}$",):
        return "month"
    text = schema.get("description") or ""
    for word, kind in _FORMAT_WORDS.items():
        if word in text:
            return kind
    return None


def sample_pattern(pattern: str, rng: random.Random) -> str | None:
    """A random string matching a simple regular expression (literals, classes, \\d \\w, repeats,
    alternatives, groups), or None for one this sampler does not know."""
    try:
        import re._parser as sre_parse  # type: ignore[import-not-found]
    except ImportError:  # Python < 3.11
        import sre_parse  # type: ignore[no-redef]
    try:
        parsed = sre_parse.parse(pattern)
    except re.error:
        return None
    try:
        text = _sample(parsed, rng)
    except (ValueError, KeyError):
        return None
    return text if re.search(pattern, text) else None


def _sample(items: Any, rng: random.Random) -> str:
    import re._constants as c  # type: ignore[import-not-found]

    digits, word = "0123456789", "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"
    out = []
    for op, av in items:
        if op == c.LITERAL:
            out.append(chr(av))
        elif op == c.AT:
            continue
        elif op == c.IN:
            choices: list[str] = []
            for sub_op, sub_av in av:
                if sub_op == c.LITERAL:
                    choices.append(chr(sub_av))
                elif sub_op == c.RANGE:
                    choices += [chr(x) for x in range(sub_av[0], sub_av[1] + 1)]
                elif sub_op == c.CATEGORY:
                    choices += list(digits if sub_av == c.CATEGORY_DIGIT else word)
                elif sub_op == c.NEGATE:
                    raise ValueError("negated class")
            if not choices:
                raise ValueError("empty class")
            out.append(rng.choice(choices))
        elif op == c.CATEGORY:
            out.append(rng.choice(digits if av == c.CATEGORY_DIGIT else word))
        elif op in (c.MAX_REPEAT, c.MIN_REPEAT):
            lo, hi, sub = av
            hi = min(hi, lo + 3) if hi != c.MAXREPEAT else lo + 3
            out.extend(_sample(sub, rng) for _ in range(rng.randint(lo, max(lo, hi))))
        elif op == c.SUBPATTERN:
            out.append(_sample(av[-1], rng))
        elif op == c.BRANCH:
            out.append(_sample(rng.choice(av[1]), rng))
        elif op == c.ANY:
            out.append(rng.choice(word))
        else:
            raise ValueError(f"unsupported regex piece {op}")
    return "".join(out)


def description_examples(schema: dict[str, Any]) -> list[str]:
    """String values a parameter's description offers: `e.g. "C1004"` first, then other quoted values."""
    text = schema.get("description") or ""
    found = _EXAMPLE.findall(text) + [q for q in _QUOTED.findall(text)]
    out: list[str] = []
    for v in found:
        if v not in out:
            out.append(v)
    examples = schema.get("examples")
    if isinstance(examples, list):
        out += [str(e) for e in examples if isinstance(e, str) and str(e) not in out]
    return out


@dataclass
class Candidate:
    """One value for a parameter, and the pooled result it came from (None: the schema or description)."""

    value: Any
    source: Pooled | None = None


def candidates(name: str, schema: dict[str, Any], pool: ValuePool, tool: str, rng: random.Random) -> list[Candidate]:
    """Valid-looking values for one parameter, the most useful first (pooled results, examples, schema)."""
    kind = schema.get("type")
    out: list[Candidate] = []
    pooled = pool.for_param(name, schema, tool)
    rng.shuffle(pooled)
    out += [Candidate(p.value, p) for p in pooled[:4]]
    if "enum" in schema:
        values = list(schema["enum"])
        if "default" in schema and schema["default"] in values:
            values.remove(schema["default"])
            values.insert(0, schema["default"])
        return out + [Candidate(v) for v in values]
    if kind == "boolean":
        return out + [Candidate(v) for v in ([schema["default"]] if isinstance(schema.get("default"), bool) else [])
                      + [True, False]]
    if kind in ("integer", "number"):
        stated = _RANGE.search(schema.get("description") or "")  # "How many units (1-20)."
        lo = schema.get("minimum", schema["exclusiveMinimum"] + 1 if "exclusiveMinimum" in schema
                        else int(stated.group(1)) if stated else 1)
        hi = schema.get("maximum", int(stated.group(2)) if stated else lo + 10)
        picks = [schema["default"]] if "default" in schema else []
        picks += [lo, (lo + hi) // 2 if kind == "integer" else round((lo + hi) / 2, 2), hi]
        return out + [Candidate(int(v) if kind == "integer" else float(v)) for v in dict.fromkeys(picks)]
    if kind == "array":
        items = schema.get("items") or {"type": "string"}
        inner = candidates(name.rstrip("s"), items, pool, tool, rng)
        if inner:
            out.append(Candidate([inner[0].value], inner[0].source))
            if len(inner) > 1:
                out.append(Candidate([inner[0].value, inner[1].value], inner[0].source))
        return out
    if kind == "object":
        props = schema.get("properties") or {}
        required = schema.get("required") or list(props)[:1]
        value = {}
        for key in required:
            inner = candidates(key, props.get(key, {}), pool, tool, rng)
            if inner:
                value[key] = inner[0].value
        return out + [Candidate(value)]
    # a string
    if _SQL.search(schema.get("description") or ""):  # a query parameter: read a few rows of each table
        tables = [p.value for k in ("tables", "table", "table_name") for p in pool.by_key.get(k, [])]
        out += [Candidate(f"SELECT * FROM {t} LIMIT 5") for t in dict.fromkeys(tables)
                if isinstance(t, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", t)]
    fmt = stated_format(schema)
    pattern = schema.get("pattern")
    for example in description_examples(schema):
        if fits(example, {"type": "string", **({"pattern": pattern} if pattern else {})}):
            out.append(Candidate(example))
    if fmt in ("date", "month"):  # dates (and for a month, months) other results showed, a few distinct ones
        seen_dates = [p.value for p in pool.values() if isinstance(p.value, str)
                      and (_DATE.match(p.value) or (fmt == "month" and _MONTH.match(p.value)))]
        shown = list(dict.fromkeys(d if fmt == "date" else d[:7] for d in seen_dates if fmt == "month" or _DATE.match(d)))
        rng.shuffle(shown)
        for d in shown[:4] or (["2024-03-05"] if fmt == "date" else ["2024-03"]):
            out.append(Candidate(d))
    if pattern:
        sampled = sample_pattern(pattern, rng)
        if sampled is not None:
            out.append(Candidate(sampled))
    if "default" in schema and isinstance(schema["default"], str) and schema["default"]:
        out.append(Candidate(schema["default"]))
    if not out and not pattern:
        out.append(Candidate("example"))
    return out


# -- invalid variants ---------------------------------------------------------------------------------


def invalid_variants(args: dict[str, Any], parameters: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(what is broken, arguments) for broken versions of valid `args`: each breaks one field."""
    props = parameters.get("properties") or {}
    required = parameters.get("required") or []
    out: list[tuple[str, dict[str, Any]]] = []
    for name, value in args.items():
        schema = props.get(name, {})
        kind = schema.get("type")
        if "enum" in schema:
            wrong = str(value).upper() if str(value).upper() not in schema["enum"] else f"not_{value}"
            out.append((f"{name}: a value outside the enum", {**args, name: wrong}))
        elif kind == "string":
            fmt = stated_format(schema)
            if fmt == "month" and isinstance(value, str) and _MONTH.match(value):
                out.append((f"{name}: the month as a user writes it", {**args, name: user_form(value, "month")}))
            elif fmt == "date" and isinstance(value, str) and _DATE.match(value):
                out.append((f"{name}: the date as a user writes it", {**args, name: user_form(value, "date")}))
            elif schema.get("pattern"):
                out.append((f"{name}: a string outside the pattern", {**args, name: f"{str(value).lower()} x"}))
            out.append((f"{name}: a number for a string", {**args, name: 12345}))
        elif kind in ("integer", "number"):
            out.append((f"{name}: a string for a number", {**args, name: str(value) + " units"}))
            if "maximum" in schema:
                out.append((f"{name}: above the maximum", {**args, name: schema["maximum"] + 1}))
        elif kind == "boolean":
            out.append((f"{name}: a string for a boolean", {**args, name: "yes"}))
        elif kind in ("array", "object"):
            out.append((f"{name}: a string for an {kind}", {**args, name: str(value)}))
    for name in required:
        if name in args:
            out.append((f"{name}: a required field left out", {k: v for k, v in args.items() if k != name}))
    if parameters.get("additionalProperties") is False:
        out.append(("an unknown field", {**args, "extra_field": "x"}))
    return out


_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
           "November", "December"]


def user_form(value: str, fmt: str) -> str:
    """How a person writes an ISO month or date: "October 2024", "March 5, 2024" (a month number outside 1-12,
    as a pattern-sampled "2024-13", stays as it is)."""
    if (_MONTH.match(value) or _DATE.match(value)) and not 1 <= int(value[5:7]) <= 12:
        return value
    if fmt == "month" and _MONTH.match(value):
        return f"{_MONTHS[int(value[5:7]) - 1]} {value[:4]}"
    if fmt == "date" and _DATE.match(value):
        return f"{_MONTHS[int(value[5:7]) - 1]} {int(value[8:10])}, {value[:4]}"
    return value


# -- probes -----------------------------------------------------------------------------------------


@dataclass
class Probe:
    """One planned exploration episode: calls in order (a broken one first, then its valid version)."""

    surface: Surface
    tool: str
    calls: list[ToolCall]
    kind: str  # "single" | "chain" | "error"
    broken: str = ""  # what the first call breaks, when it is an invalid variant


def _valid_args(t: Tool, pool: ValuePool, rng: random.Random, want_optional: bool,
                prefer_pooled: bool = True, avoid: set[str] | None = None) -> tuple[dict[str, Any], dict[str, Pooled]] | None:
    """Arguments that pass the tool's schema, and which came from pooled results; None if none found.
    Arguments whose canonical JSON is in `avoid` (already probed) are drawn again."""
    params = t.parameters
    props = params.get("properties") or {}
    required = params.get("required") or []
    for attempt in range(8):
        args: dict[str, Any] = {}
        sources: dict[str, Pooled] = {}
        for name, schema in props.items():
            if name not in required and not (want_optional and rng.random() < 0.5):
                continue
            options = candidates(name, schema, pool, t.name, rng)
            if not prefer_pooled or attempt > 3:
                options = [o for o in options if o.source is None] or options
            if not options:
                break
            pick = options[0] if attempt == 0 else rng.choice(options)
            args[name] = pick.value
            if pick.source is not None:
                sources[name] = pick.source
        else:
            if not t.validate(args) and json.dumps(args, sort_keys=True) not in (avoid or ()):
                return args, sources
    return None


def plan_probes(surface: Surface, tools: dict[str, Tool], pool: ValuePool, rng: random.Random,
                per_tool: int, round_index: int, needs_state: set[str] | None = None,
                prefixes: list[ToolCall] | None = None) -> list[Probe]:
    """The probes of one round: per tool, calls from the schema and the pool, chains where a pooled value
    feeds a parameter, each probe's broken variant first in every other probe, and for a tool that never
    succeeded on a fresh state (`needs_state`), calls after a successful side-effect call (`prefixes`)."""
    needs_state = needs_state or set()
    prefixes = prefixes or []
    probes: list[Probe] = []
    for name in surface.tools:
        t = tools[name]
        seen: set[str] = set()
        for k in range(per_tool):
            found = _valid_args(t, pool, rng, want_optional=k % 2 == 1, prefer_pooled=round_index > 0, avoid=seen)
            if found is None:
                continue
            args, sources = found
            seen.add(json.dumps(args, sort_keys=True))
            calls = []
            kind = "single"
            src = next(iter(sources.values()), None)
            if src is not None and src.tool in tools and src.tool != name:
                calls.append(ToolCall("", src.tool, dict(src.arguments)))
                kind = "chain"
            broken = ""
            variants = invalid_variants(args, t.parameters)
            if variants and k % 2 == 0:
                broken, bad = variants[(k // 2 + round_index) % len(variants)]
                if t.validate(bad):
                    calls.append(ToolCall("", name, bad))
                else:
                    broken = ""
            calls.append(ToolCall("", name, args))
            probes.append(Probe(surface, name, calls, kind, broken))
        if round_index > 0 and name in needs_state and prefixes:
            # every call of this tool failed on a fresh state: try it after another tool changed the state
            found = _valid_args(t, pool, rng, want_optional=False, prefer_pooled=True)
            if found is not None:
                for prefix in rng.sample(prefixes, min(2, len(prefixes))):
                    if prefix.name != name:
                        probes.append(Probe(surface, name, [ToolCall("", prefix.name, dict(prefix.arguments)),
                                                            ToolCall("", name, found[0])], "state"))
        pattern_ids = [(p, s) for p, s in (t.parameters.get("properties") or {}).items()
                       if s.get("type") == "string" and s.get("pattern") and not stated_format(s)]
        if pattern_ids and round_index == 0:  # an ID that fits the pattern but likely names nothing: a tool error
            found = _valid_args(t, ValuePool(), rng, want_optional=False, prefer_pooled=False)
            if found is not None:
                args = dict(found[0])
                p, s = pattern_ids[0]
                sampled = sample_pattern(s["pattern"], rng)
                if sampled is not None:
                    args[p] = sampled
                    if not t.validate(args):
                        probes.append(Probe(surface, name, [ToolCall("", name, args)], "error"))
    return probes


class PlanPolicy:
    """Writes each probe's planned calls, one per step, then a short closing answer (no model)."""

    def __init__(self, plans: dict[str, list[ToolCall]]):
        self.plans = plans

    def generate(self, request: PolicyRequest) -> PolicyReply:
        """The planned call of this step, or the end of the probe."""
        plan = self.plans[request.task.id]
        if request.step < len(plan):
            proto = get_protocol(request.protocol)
            return PolicyReply(proto.assistant_text("", [plan[request.step]]))
        return PolicyReply("Exploration of this tool finished.")


def read_only_hook(faults: FaultConfig | None, key: str, tools: Any,
                   side_effect_tools: tuple[str, ...]) -> Callable[[ToolCall, Callable[[], ToolResult]], ToolResult] | None:
    """The fault hook of an exploration episode: faults on read-only tools only."""
    if faults is None:
        return None
    inner = faults.injector(key, None, tools)

    def hook(call: ToolCall, run: Callable[[], ToolResult]) -> ToolResult:
        if call.name in side_effect_tools:
            return run()
        return inner(call, run)

    return hook


# -- the exploration --------------------------------------------------------------------------------


@dataclass
class Exploration:
    """What exploration recorded: the episodes, the pool, per-tool counts."""

    episodes: list[Episode] = field(default_factory=list)
    surfaces: list[Surface] = field(default_factory=list)
    summary: dict[str, dict[str, int]] = field(default_factory=dict)

    def calls(self) -> Iterator[tuple[Episode, ToolCall, ToolResult]]:
        """(episode, call, its result) of every exploration call; an invalid call's result is the harness's
        feedback (`result.error` "schema", "unknown_tool" or "not_permitted")."""
        for ep in self.episodes:
            for step in ep.steps:
                results = {r.call_id: r for r in step.results}
                for call in step.calls:
                    if call.id in results:
                        yield ep, call, results[call.id]


def explore(env: Environment, surfaces_: list[Surface], harness: HarnessConfig, seed: int = 0,
            per_tool: int = 6, rounds: int = 3, faults: float = 0.0,
            on_episode: Callable[[Episode], None] | None = None) -> Exploration:
    """Explore every tool of every surface (see the module docstring); `rounds` passes, each using the
    values earlier passes pooled; `faults`: injected-fault rate on read-only tools."""
    rng = random.Random(f"ttt-explore/{seed}")
    fault_cfg = FaultConfig.from_total(faults, no_mutate=tuple(env.side_effect_tools),
                                       drift_names=dict(env.drift_names)) if faults > 0 else None
    result = Exploration(surfaces=list(surfaces_))
    n = 0
    for surface in surfaces_:
        pool = ValuePool()
        tools_, state = _setup(env, surface)
        try:
            tool_objs = dict(tools_.tools)
        finally:
            env.close(state)
        for round_index in range(rounds):
            ok_tools = {name for name, row in result.summary.items() if row["ok"]}
            needs_state = {name for name in surface.tools if name in result.summary and name not in ok_tools}
            prefixes = _side_effect_calls(result.episodes, tool_objs)
            probes = plan_probes(surface, tool_objs, pool, rng, per_tool, round_index, needs_state, prefixes)
            for probe in probes:
                task = TaskSpec(id=f"explore-{surface.key}-{n:04d}", prompt=f"Explore the tool {probe.tool}.",
                                env=env.name, family=f"explore_{probe.kind}", split="ttt",
                                allowed_tools=list(surface.tools),
                                metadata={"surface": surface.key, "base_task": surface.base.id, "tool": probe.tool,
                                          "kind": probe.kind, "broken": probe.broken, "round": round_index})
                n += 1
                tools, state = _setup(env, surface)
                try:
                    hook = read_only_hook(fault_cfg, f"ttt-explore/{seed}/{task.id}", tools,
                                          tuple(env.side_effect_tools))
                    ep = run_episode(task, tools, PlanPolicy({task.id: probe.calls}), harness, tool_hook=hook,
                                     episode_id=task.id)
                finally:
                    env.close(state)
                _pool_episode(ep, pool)
                _count(result.summary, ep)
                result.episodes.append(ep)
                if on_episode is not None:
                    on_episode(ep)
    return result


def _side_effect_calls(episodes: list[Episode], tools: dict[str, Tool]) -> list[ToolCall]:
    """Distinct successful calls of side-effect tools so far (what may put a state in place)."""
    out: dict[str, ToolCall] = {}
    for ep in episodes:
        for step in ep.steps:
            results = {r.call_id: r for r in step.results}
            for call in step.calls:
                t = tools.get(call.name)
                if t is not None and t.side_effects and ok_json(results.get(call.id)) is not None:
                    out.setdefault(json.dumps([call.name, call.arguments], sort_keys=True),
                                   ToolCall("", call.name, dict(call.arguments)))
    return list(out.values())


def _setup(env: Any, surface: Surface) -> tuple[Any, Any]:
    setup_allowing = getattr(env, "setup_allowing", None)
    if setup_allowing is not None:
        return setup_allowing(surface.base, list(surface.tools))
    from dataclasses import replace

    return env.setup(replace(surface.base, allowed_tools=list(surface.tools)))


def ok_json(result: ToolResult | None) -> Any | None:
    """The parsed content of a successful, un-faulted JSON result, else None."""
    if result is None or not result.ok or result.fault is not None or result.truncated:
        return None
    if classify_observation(result.content) != "ok":
        return None
    try:
        return json.loads(result.content)
    except json.JSONDecodeError:
        return None


def _pool_episode(ep: Episode, pool: ValuePool) -> None:
    for step in ep.steps:
        results = {r.call_id: r for r in step.results}
        for call in step.calls:
            value = ok_json(results.get(call.id))
            if value is not None:
                pool.add_result(call.name, call.arguments, value, ep.episode_id)


INVALID = ("schema", "unknown_tool", "not_permitted")


def _count(summary: dict[str, dict[str, int]], ep: Episode) -> None:
    for step in ep.steps:
        results = {r.call_id: r for r in step.results}
        for call in step.calls:
            row = summary.setdefault(call.name, {"calls": 0, "ok": 0, "tool_error": 0, "invalid": 0, "faulted": 0})
            row["calls"] += 1
            r = results.get(call.id)
            if r is None or r.error in INVALID:
                row["invalid"] += 1
            elif r.fault is not None:
                row["faulted"] += 1
            elif ok_json(r) is not None:
                row["ok"] += 1
            else:
                row["tool_error"] += 1
