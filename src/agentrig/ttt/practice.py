"""Practice tasks built backwards from the calls exploration really made, each with its own assertion.

Learn-by-interact's backward construction: a valid call (or chain of calls) that returned a result is
turned into the request it answers. For each successful exploration call `B(args) -> R`:

- a **single** task asks what `B`'s description says it does, with `args` written as a person would (an
  ISO month as "October 2024", a date as "March 5, 2024"), and asks for one or two values of `R` (a field,
  or how many items a list holds);
- a **chain** task does the same when one of `args` appeared in the result of another call `A(a) -> R_A`
  (at a unique place, not one item of a long list): the request names `a` instead, so answering needs
  `A`, then `B` with the value `A` returned;
- a **missing** task (with `missing_share`) asks the same of a call that found nothing (`B(args)` answered
  "No result", no fault injected): the assertion is datadesk's `impossible` rule, the call made and an
  honest answer that says so, with no number the request did not give. Meant to keep the adapter's
  "not found" answers while the other tasks teach new tools; measured, it teaches the model to stop at the
  first "No result", also where its own wrong argument caused it (docs/ttt.md), so the loop leaves it off.

Every task carries its assertion in `expected` (never an environment checker): the figures and terms the
answer must state (what the tools returned), and the calls that must have succeeded with those
arguments. `PracticeEnv` serves the tasks through the Environment API on the surface's real tools (its
`check` is that assertion), and `PracticeExpert` solves them from the messages alone (the constructed
calls, values read from the live results, a retry on a failed call), so the TTT loop can relabel the
adapter's own episodes with DAgger. A task is kept only when the expert passes its assertion on a fresh
state (`solve`, which returns those episodes: the loop trains on them where it does not roll out).
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

from agentrig.envs.base import (CheckResult, Environment, check_answer, check_no_tool_and_impossible,
                               classify_observation, settle)
from agentrig.harness import HarnessConfig, run_episode
from agentrig.harness.policy import PolicyReply, PolicyRequest
from agentrig.harness.protocol import get_protocol, result_text
from agentrig.harness.tools import ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec, ToolCall
from agentrig.ttt.explore import Exploration, Surface, _setup, at_path, leaves, ok_json, stated_format, user_form

_LONG = 40  # characters: longer argument values (queries, expressions) are not something a user writes


@dataclass
class Call:
    """One successful exploration call and what it returned."""

    name: str
    arguments: dict[str, Any]
    result: Any
    surface: str
    before: list["Call"] | None = None  # successful calls earlier in its episode that put the state in place


def _words(name: str) -> str:
    """`customer_id` / `customerId` / `orders.total` -> "customer id" / "customer id" / "orders total"."""
    name = re.sub(r"([a-z])([A-Z])", r"\1 \2", name)
    return re.sub(r"[_.\-]+", " ", name).strip().lower()


def _first_sentence(text: str) -> str:
    text = (text or "").strip().split("\n")[0]
    sentence = re.split(r"(?<=[.!?])\s", text)[0].rstrip(".!? ")
    return sentence[:1].lower() + sentence[1:] if sentence[:2] != sentence[:2].upper() else sentence


def _phrase_value(name: str, value: Any, schema: dict[str, Any]) -> str:
    fmt = stated_format(schema)
    shown = user_form(value, fmt) if isinstance(value, str) and fmt else value
    if isinstance(shown, bool):
        shown = "yes" if shown else "no"
    if isinstance(shown, list):
        shown = ", ".join(str(v) for v in shown)
    if isinstance(shown, dict):
        shown = ", ".join(f"{_words(k)} {v}" for k, v in shown.items())
    return f"{_words(name)} {shown}"


def _quotes(result: Any, given: set[str], rng: random.Random) -> list[tuple[str, list[Any], Any]]:
    """What to ask about a result: ("count", path of a list, its length) or ("field", path, value), at most two,
    never a value the request already says."""
    out: list[tuple[str, list[Any], Any]] = []
    if isinstance(result, dict):
        lists = [(k, v) for k, v in result.items() if isinstance(v, list) and v and k != "columns"]
        if lists and rng.random() < 0.6:
            k, v = lists[0]
            out.append(("count", [k], len(v)))
        scalars = [(p, v) for p, v in leaves(result) if (len(p) == 1 or (len(p) == 2 and isinstance(result.get(p[0]), dict)))
                   and str(v) not in given and not (isinstance(v, str) and len(v) > 60)]
        if lists and not scalars:
            k, v = lists[0]
            first = v[0]
            if isinstance(first, dict):
                scalars = [([k, 0, fk], fv) for fk, fv in first.items() if isinstance(fv, (str, int, float))
                           and str(fv) not in given][:2] if len(v) == 1 else []
        rng.shuffle(scalars)
        for p, v in scalars[: 2 - len(out)]:
            out.append(("field", p, v))
    return out[:2]


def _question(quotes: list[tuple[str, list[Any], Any]]) -> str:
    parts = []
    for kind, path, _ in quotes:
        if kind == "count":
            parts.append(f"how many {_words(str(path[-1]))} there are")
        else:
            parts.append(f"the {_words(str(path[-1]))}")
    return " and ".join(parts)


def _answer_template(quotes: list[tuple[str, list[Any], Any]]) -> str:
    parts = []
    for i, (kind, path, _) in enumerate(quotes):
        if kind == "count":
            parts.append(f"there are {{q{i}}} {_words(str(path[-1]))}")
        else:
            parts.append(f"the {_words(str(path[-1]))} is {{q{i}}}")
    text = "; ".join(parts)
    return text[:1].upper() + text[1:] + "."


def _expected(quotes: list[tuple[str, list[Any], Any]], calls: list[dict[str, Any]]) -> dict[str, Any]:
    figures, terms = [], []
    for kind, _, value in quotes:
        if kind == "count":
            figures.append({"value": value, "kind": "count"})
        elif isinstance(value, bool):
            terms.append("yes" if value else "no")
        elif isinstance(value, (int, float)):
            figures.append({"value": value, "kind": "exact"})
        else:
            terms.append(str(value))
    return {"figures": figures, "terms": terms, "calls": calls}


def successful_calls(exploration: Exploration) -> list[Call]:
    """Every distinct exploration call that returned an un-faulted JSON result, with that result."""
    seen: set[str] = set()
    out = []
    earlier: dict[str, list[Call]] = {}
    for ep, call, result in exploration.calls():
        value = ok_json(result)
        if value is None:
            continue
        surface = ep.task.metadata.get("surface", "")
        before = list(earlier.get(ep.episode_id, [])) if ep.task.metadata.get("kind") == "state" else None
        here = Call(call.name, dict(call.arguments), value, surface, before or None)
        earlier.setdefault(ep.episode_id, []).append(Call(call.name, dict(call.arguments), value, surface))
        key = json.dumps([surface, call.name, call.arguments, [[c.name, c.arguments] for c in before or []]],
                         sort_keys=True)
        if key not in seen:
            seen.add(key)
            out.append(here)
    return out


_PLAUSIBLE_YEARS = range(1990, 2041)


def _plausible(arguments: dict[str, Any], props: dict[str, Any]) -> bool:
    """Whether a person could ask with these arguments: short values, and an ISO month or date with a month
    of 1-12 and a year of 1990-2040 (a pattern-sampled "9785-75" finds nothing, but nobody asks for it), and
    no free string that is one lower-case word, as the column names and "example" exploration also tries."""
    for k, v in arguments.items():
        if isinstance(v, str) and (len(v) > _LONG or ("enum" not in props.get(k, {}) and re.fullmatch(r"[a-z_]+", v))):
            return False
        if isinstance(v, str) and stated_format(props.get(k, {})) and re.match(r"^\d{4}-\d{2}", v):
            if int(v[:4]) not in _PLAUSIBLE_YEARS or not 1 <= int(v[5:7]) <= 12:
                return False
    return True


def missing_calls(exploration: Exploration) -> list[Call]:
    """Every distinct exploration call with arguments that found nothing: "No result" from the tool itself (no
    fault injected), outside a state-building episode, with arguments a person could ask with."""
    seen: set[str] = set()
    by_surface = {s.key: s for s in exploration.surfaces}
    out = []
    for ep, call, result in exploration.calls():
        if not result.ok or result.fault is not None or classify_observation(result.content) != "empty":
            continue
        surface = ep.task.metadata.get("surface", "")
        if not call.arguments or ep.task.metadata.get("kind") == "state" or surface not in by_surface:
            continue
        props = by_surface[surface].specs[call.name]["function"]["parameters"].get("properties") or {}
        key = json.dumps([surface, call.name, call.arguments], sort_keys=True)
        if key not in seen and _plausible(call.arguments, props):
            seen.add(key)
            out.append(Call(call.name, dict(call.arguments), None, surface))
    return out


def _unique_path(result: Any, value: Any) -> list[Any] | None:
    """Where `value` sits in `result`, when it sits in exactly one place that is not one of many list items."""
    found = [p for p, v in leaves(result) if v == value and type(v) is type(value)]
    if len(found) != 1:
        return None
    path = found[0]
    container: Any = result
    for p in path:
        if isinstance(p, int) and isinstance(container, list) and len(container) > 1:
            return None
        container = container[p] if isinstance(p, (int, str)) and not isinstance(container, (str, int, float)) else container
    return path


def build_practice(exploration: Exploration, n: int, seed: int = 0, distractors: int = 2,
                   prefer: set[str] | None = None, prefer_share: float = 0.75,
                   missing_share: float = 0.0, single_share: float = 0.0) -> list[TaskSpec]:
    """Up to `n` practice tasks (chains first, then singles, each kind shuffled) from the exploration's
    successful calls; `distractors` other tools of the surface join each allowlist. With `prefer` (the tools
    new to the adapter), up to `prefer_share` of the tasks are ones whose last call is one of them. With
    `missing_share`, up to that share of the `n` are missing tasks (module docstring), spread over the tools
    whose calls found nothing; the other shares apply to the rest. With `single_share`, at least that share of
    each tool's tasks (as far as it has singles) are single calls, not chains (`_spread`)."""
    rng = random.Random(f"ttt-practice/{seed}")
    by_surface = {s.key: s for s in exploration.surfaces}
    calls = successful_calls(exploration)
    missing = _missing_tasks(exploration, calls, round(n * missing_share), random.Random(f"ttt-missing/{seed}"),
                             distractors) if missing_share else []  # their own draws: the other tasks stay the same
    n -= len(missing)
    chains: list[TaskSpec] = []
    singles: list[TaskSpec] = []
    for b in calls:
        surface = by_surface[b.surface]
        spec_b = surface.specs[b.name]["function"]
        props_b = spec_b["parameters"].get("properties") or {}
        if any(isinstance(v, str) and len(v) > _LONG for v in b.arguments.values()):
            continue
        given = {str(v) for v in b.arguments.values()}
        quotes = _quotes(b.result, given, rng)
        if not quotes:
            continue
        goal = _first_sentence(spec_b.get("description", "")) or _words(b.name)
        single_args = "; ".join(_phrase_value(k, v, props_b.get(k, {})) for k, v in b.arguments.items())
        plan = [{"name": b.name, "arguments": b.arguments, "links": {}}]
        if b.before:  # a call that needs another first (a cart filled before the checkout)
            firsts = []
            for c in b.before:
                props_c = surface.specs[c.name]["function"]["parameters"].get("properties") or {}
                what = _first_sentence(surface.specs[c.name]["function"].get("description", "")) or _words(c.name)
                args_c = ", ".join(_phrase_value(k, v, props_c.get(k, {})) for k, v in c.arguments.items())
                firsts.append(f"{what}" + (f" ({args_c})" if args_c else ""))
            single_args = "; ".join(filter(None, [single_args, "first " + " and then ".join(firsts)]))
            plan = [{"name": c.name, "arguments": c.arguments, "links": {}} for c in b.before] + plan
            singles.append(_task(surface, plan, goal, single_args, quotes, "practice_state", rng, distractors))
            continue
        singles.append(_task(surface, plan, goal, single_args, quotes, "practice_single", rng, distractors))
        for a in calls:
            if a.surface != b.surface or a.name == b.name:
                continue
            if any(isinstance(v, str) and len(v) > _LONG for v in a.arguments.values()) or not a.arguments:
                continue
            for param, value in b.arguments.items():
                if not isinstance(value, (str, int)) or isinstance(value, bool) or str(value) in {
                        str(v) for v in a.arguments.values()}:
                    continue
                path = _unique_path(a.result, value)
                if path is None:
                    continue
                props_a = surface.specs[a.name]["function"]["parameters"].get("properties") or {}
                entity = _words(param[:-3] if param.endswith("_id") else param)
                whose = " and ".join(f"{_words(k)} is {_phrase_value('', v, props_a.get(k, {})).strip()}"
                                     for k, v in a.arguments.items())
                subject = _subject(a.name)
                if subject and subject != entity:
                    entity = f"{entity} of the {subject}"
                rest = "; ".join(_phrase_value(k, v, props_b.get(k, {})) for k, v in b.arguments.items()
                                 if k != param)
                args_text = f"the {entity} whose {whose}" + (f"; {rest}" if rest else "")
                chain_quotes = [q for q in quotes if str(q[2]) not in {str(v) for v in a.arguments.values()}]
                if not chain_quotes:
                    continue
                chain = [{"name": a.name, "arguments": a.arguments, "links": {}},
                         {"name": b.name, "arguments": b.arguments, "links": {param: [0, path]}}]
                chains.append(_task(surface, chain, goal, args_text, chain_quotes, "practice_chain", rng, distractors))
                break
    rng.shuffle(chains)
    rng.shuffle(singles)
    picked: list[TaskSpec] = []
    if prefer:
        uses = lambda t: t.metadata["plan"][-1]["name"] in prefer  # noqa: E731  (the task is about the new tool)
        picked = _spread([t for t in chains if uses(t)], [t for t in singles if uses(t)], round(n * prefer_share),
                         single_share)
        chains = [t for t in chains if t not in picked]
        singles = [t for t in singles if t not in picked]
    picked += _spread(chains, singles, n - len(picked), single_share)
    picked += missing
    for i, t in enumerate(picked):
        t.id = f"practice-{seed}-{i:04d}"
    return picked


def _missing_tasks(exploration: Exploration, calls: list[Call], n: int, rng: random.Random,
                   distractors: int) -> list[TaskSpec]:
    """Up to `n` missing tasks, at most one per tool until every tool has one (then a second, ...): the request
    a successful call of the same tool would answer (its fields), about arguments that found nothing."""
    by_surface = {s.key: s for s in exploration.surfaces}
    per_tool: dict[str, list[TaskSpec]] = {}
    for b in missing_calls(exploration):
        surface = by_surface[b.surface]
        spec_b = surface.specs[b.name]["function"]
        props_b = spec_b["parameters"].get("properties") or {}
        fields: list[tuple[str, list[Any], Any]] = []
        for ok in calls:
            if ok.name == b.name and ok.surface == b.surface:
                fields = [q for q in _quotes(ok.result, set(), rng) if q[0] == "field"]
                if fields:
                    break
        goal = _first_sentence(spec_b.get("description", "")) or _words(b.name)
        args_text = "; ".join(_phrase_value(k, v, props_b.get(k, {})) for k, v in b.arguments.items())
        plan = [{"name": b.name, "arguments": b.arguments, "links": {}}]
        task = _task(surface, plan, goal, args_text, fields or [("field", ["details"], "")], "practice_missing",
                     rng, distractors)
        question = _question(fields) if fields else "the details"
        task.expected = {"figures": [], "terms": [], "calls": [{"name": b.name, "arguments": b.arguments}],
                         "impossible": True}
        task.metadata.update(quotes=[], impossible=True, missing=True,
                             answer=f"There is no record for {args_text}: {b.name} found nothing, so I cannot "
                                    f"give {question}.")
        per_tool.setdefault(b.name, []).append(task)
    for tasks_ in per_tool.values():
        rng.shuffle(tasks_)
    out: list[TaskSpec] = []
    rank = 0
    while len(out) < n and any(len(v) > rank for v in per_tool.values()):
        out += [v[rank] for _, v in sorted(per_tool.items()) if len(v) > rank][: n - len(out)]
        rank += 1
    return out


def _spread(chains: list[TaskSpec], singles: list[TaskSpec], n: int, single_share: float = 0.0) -> list[TaskSpec]:
    """Up to `n` tasks, chains first, spread over the tool each ends with: no tool takes more than its share
    of `n` (counted over chains and singles together), and what is left over fills up in the same order.
    With `single_share` > 0 each tool's own tasks are interleaved instead, a single call whenever fewer than
    that share of its tasks so far are singles, and the tools take turns (so the last tools are not the ones
    `n` cuts): how many singles a tool gets no longer depends on how many chains the exploration happened to
    find for it."""
    tools = {t.metadata["plan"][-1]["name"] for t in chains + singles}
    cap = max(1, -(-n // max(1, len(tools))))
    order = chains + singles if single_share <= 0 else _interleave(chains, singles, single_share)
    picked: list[TaskSpec] = []
    per_tool: dict[str, int] = {}
    for t in order:
        last = t.metadata["plan"][-1]["name"]
        if per_tool.get(last, 0) < cap and len(picked) < n:
            per_tool[last] = per_tool.get(last, 0) + 1
            picked.append(t)
    for t in order:
        if len(picked) >= n:
            break
        if t not in picked:
            picked.append(t)
    return picked


def _interleave(chains: list[TaskSpec], singles: list[TaskSpec], share: float) -> list[TaskSpec]:
    """Per tool (the one each task ends with), its chains and singles in one list with a single wherever fewer
    than `share` of the tasks so far are singles; then the tools in turn, one task each, in sorted order."""
    last = lambda t: t.metadata["plan"][-1]["name"]  # noqa: E731
    lists: dict[str, list[TaskSpec]] = {}
    for tool in sorted({last(t) for t in chains + singles}):
        c = [t for t in chains if last(t) == tool]
        s = [t for t in singles if last(t) == tool]
        out: list[TaskSpec] = []
        taken = 0  # singles so far
        while c or s:
            if s and (taken < share * (len(out) + 1) or not c):
                out.append(s.pop(0))
                taken += 1
            else:
                out.append(c.pop(0))
        lists[tool] = out
    order: list[TaskSpec] = []
    for rank in range(max((len(v) for v in lists.values()), default=0)):
        order += [v[rank] for v in lists.values() if len(v) > rank]
    return order


_VERB_TEMPLATES = (
    "{Goal} for {args}. Tell me {question}.",
    "Please {goal}: {args}. What is {question}?",
    "I need {question}. Use the tools to {goal} ({args}).",
    "{Question_cap}? This is about: {args}.",
)
_NOUN_TEMPLATES = (
    "{Goal}, for {args}: tell me {question}.",
    "I need {question}. Look up {goal} ({args}).",
    "{Question_cap}? This is about: {args}.",
)
_VERBS = {"list", "find", "get", "look", "count", "run", "send", "describe", "search", "show", "fetch", "create",
          "update", "add", "set", "schedule", "export", "compute", "calculate", "convert", "check", "return",
          "retrieve", "resolve", "put", "place", "book", "cancel", "delete", "read", "write", "save", "order"}
_NOT_SUBJECTS = {"find", "get", "list", "lookup", "look", "up", "search", "details", "detail", "info", "total",
                 "level", "counts", "count", "by", "id", "fetch", "show", "query", "run"}


def _subject(tool: str) -> str:
    """What a tool is about, from its name: `find_customer` -> "customer", `ticket_details` -> "ticket"."""
    words = [w for w in _words(tool).split() if w not in _NOT_SUBJECTS]
    if not words:
        return ""
    word = words[-1] if len(words) == 1 else words[0]
    return word[:-1] if word.endswith("s") and not word.endswith("ss") else word


def _grammar(text: str) -> str:
    text = re.sub(r"What is how many (\w[\w ]*?) there are\?", r"How many \1 are there?", text)
    text = re.sub(r"How many (\w[\w ]*?) there are([ ?])", r"How many \1 are there\2", text)
    text = re.sub(r"What is how many (\w[\w ]*?) there are and", r"How many \1 are there, and what is", text)
    return text


def _task(surface: Surface, plan: list[dict[str, Any]], goal: str, args_text: str,
          quotes: list[tuple[str, list[Any], Any]], family: str, rng: random.Random, distractors: int) -> TaskSpec:
    question = _question(quotes)
    verb = goal.split(" ")[0].lower() in _VERBS
    template = rng.choice(_VERB_TEMPLATES if verb else _NOUN_TEMPLATES)
    prompt = _grammar(template.format(Goal=goal[:1].upper() + goal[1:], goal=goal, args=args_text or "no details",
                                      question=question, Question_cap=(question[:1].upper() + question[1:])))
    needed = list(dict.fromkeys(step["name"] for step in plan))
    others = [t for t in surface.tools if t not in needed]
    allowed = needed + rng.sample(others, min(distractors, len(others)))
    rng.shuffle(allowed)
    calls = [{"name": step["name"], "arguments": step["arguments"]} for step in plan]
    return TaskSpec(id="", prompt=prompt, env="practice", family=family, split="ttt", allowed_tools=allowed,
                    expected=_expected(quotes, calls),
                    metadata={"surface": surface.key, "base_task": surface.base.id, "plan": plan,
                              "quotes": [[k, p] for k, p, _ in quotes], "answer": _answer_template(quotes),
                              "impossible": False, "no_tool": False})


# -- serving and checking the tasks -------------------------------------------------------------


def _same_arguments(made: dict[str, Any], wanted: dict[str, Any], schema: dict[str, Any]) -> bool:
    props = schema.get("properties") or {}
    for k, v in wanted.items():
        if made.get(k, props.get(k, {}).get("default")) != v:
            return False
    return all(k in wanted or v == props.get(k, {}).get("default") for k, v in made.items())


def check_practice(task: TaskSpec, episode: Episode) -> CheckResult:
    """A practice task's own assertion: a final answer with its figures and terms, and each constructed
    call made and successful with those arguments (defaults may be written or left out); for a missing task
    also datadesk's `impossible` rule (an honest answer, no number the request did not give)."""
    res = CheckResult(success=False)
    answer = check_answer(task.expected, episode, res)
    check_no_tool_and_impossible(task.expected, task.prompt, answer, episode, res)
    specs = {t["function"]["name"]: t["function"].get("parameters", {}) for t in episode.tools}
    made = [(c, r) for s in episode.steps for c in s.calls for r in s.results if r.call_id == c.id]
    for want in task.expected["calls"]:
        if not any(c.name == want["name"] and r.ok and _same_arguments(c.arguments, want["arguments"],
                                                                       specs.get(c.name, {})) for c, r in made):
            res.reasons.append(f"no successful call {want['name']}({json.dumps(want['arguments'])})")
    return settle(res, episode, answer)


class PracticeEnv(Environment):
    """Practice tasks served on the real tools of their surfaces (see the module docstring)."""

    def __init__(self, env: Any, surfaces_: list[Surface], tasks_: list[TaskSpec]):
        self._env = env
        self._surfaces = {s.key: s for s in surfaces_}
        self._tasks = list(tasks_)
        self.name = f"{env.name}-practice"
        self.splits = ("ttt",)
        self.side_effect_tools = tuple(env.side_effect_tools)
        self.drift_names = dict(env.drift_names)
        self.eval_splits = ("ttt",)

    def tasks(self, split: str, n: int, seed: int = 0, start: int = 0,
              family_weights: dict[str, float] | None = None) -> list[TaskSpec]:
        """Tasks start..start+n-1 of the practice list (there is one split, `ttt`)."""
        self.check_split(split)
        return self._tasks[start:start + n]

    def pool_size(self, split: str) -> int | None:
        """How many practice tasks there are."""
        return len(self._tasks)

    def setup(self, task: TaskSpec) -> tuple[ToolSet, Any]:
        """The surface's tools on a fresh state, with the task's allowlist."""
        surface = self._surfaces[task.metadata["surface"]]
        return _setup(self._env, Surface(surface.base, list(task.allowed_tools), surface.specs, surface.key))

    def close(self, state: Any) -> None:
        """Release the state as the surface's environment does."""
        self._env.close(state)

    def check(self, task: TaskSpec, state: Any, episode: Episode) -> CheckResult:
        """The task's own assertion (`check_practice`)."""
        return check_practice(task, episode)

    def expert(self, detour_rate: float = 0.0, seed: int = 0) -> "PracticeExpert":
        """The constructed solution, played from the messages."""
        return PracticeExpert()


def _lookup(value: Any, path: list[Any], drift: dict[str, str]) -> Any:
    """`at_path`, following a drifted field name (the environment's drift names, or a `_v2` suffix)."""
    out = at_path(value, path)
    if out is not None or not path:
        return out
    for i, p in enumerate(path):
        if isinstance(p, str):
            for alt in (drift.get(p), f"{p}_v2"):
                if alt is not None:
                    got = _lookup(value, path[:i] + [alt] + path[i + 1:], {})
                    if got is not None:
                        return got
    return None


class PracticeExpert:
    """Solves a practice task from its plan: each constructed call in turn (a linked argument read from the
    earlier result), a failed call retried once, then the answer quoting the last result; a missing task's
    "No result" is its answer: the honest one, at once."""

    def __init__(self, drift_names: dict[str, str] | None = None):
        self.drift = dict(drift_names or {})

    def generate(self, request: PolicyRequest) -> PolicyReply:
        """The next step, from the messages so far."""
        plan = request.task.metadata["plan"]
        proto = get_protocol(request.protocol)
        results: list[Any] = []
        failures = 0
        for m in request.messages:
            if m.get("role") != "tool" or len(results) >= len(plan):
                continue
            if m.get("name") != plan[len(results)]["name"]:
                continue
            text = result_text(m)
            seen = classify_observation(text)
            if seen == "ok":
                results.append(json.loads(text))
                failures = 0
            elif seen == "empty" and request.task.metadata.get("missing"):
                return PolicyReply(request.task.metadata["answer"])
            else:
                failures += 1
        if failures >= 2:
            return PolicyReply(f"I could not get an answer: {plan[len(results)]['name']} failed twice, so I cannot "
                               "say this now.")
        if len(results) < len(plan):
            step = plan[len(results)]
            args = dict(step["arguments"])
            for param, (source, path) in step.get("links", {}).items():
                got = _lookup(results[source], path, self.drift)
                if got is not None:
                    args[param] = got
            return PolicyReply(proto.assistant_text("", [ToolCall("", step["name"], args)]))
        last = results[-1]
        values = {}
        for i, (kind, path) in enumerate(request.task.metadata["quotes"]):
            got = _lookup(last, path, self.drift)
            values[f"q{i}"] = (len(got) if isinstance(got, list) else "?") if kind == "count" else (
                ("yes" if got else "no") if isinstance(got, bool) else got)
        return PolicyReply(request.task.metadata["answer"].format(**values))


def solve(practice_env: PracticeEnv, tasks_: list[TaskSpec], harness: HarnessConfig) -> list[Episode]:
    """The constructed solution's episodes that pass their task's assertion, each on a fresh state and without
    faults (the tasks whose solution fails are left out)."""
    expert = PracticeExpert(dict(practice_env.drift_names))
    episodes = (_checked(practice_env, task, lambda tools: expert, harness, f"{task.id}+constructed") for task in tasks_)
    return [ep for ep in episodes if ep is not None]


def _checked(practice_env: PracticeEnv, task: TaskSpec, make_policy: Any, harness: HarnessConfig,
             episode_id: str) -> Episode | None:
    """The episode of `make_policy(tools)` on a fresh state of `task`, marked successful, when it passes the task's
    assertion; None when it fails it or `make_policy` gives no policy."""
    tools, state = practice_env.setup(task)
    try:
        policy = make_policy(tools)
        if policy is None:
            return None
        ep = run_episode(task, tools, policy, harness, episode_id=episode_id)
    finally:
        practice_env.close(state)
    result = check_practice(task, ep)
    if not result.success:
        return None
    ep.success, ep.check = True, result.to_dict()
    return ep


def broken_first_call(task: TaskSpec, tools: ToolSet, rng: random.Random) -> tuple[str, dict[str, Any]] | None:
    """(what is broken, arguments): a version of the plan's first call that the harness's schema check rejects,
    drawn from the mistakes a model makes with tools it does not know: a field borrowed from another offered
    tool (`month` on a tool that has none), a value in the user's form or outside its pattern, a required field
    left out (`explore.invalid_variants`). None when no variant is rejected (a linked first call has none)."""
    from agentrig.ttt.explore import invalid_variants

    step = task.metadata["plan"][0]
    tool = tools.get(step["name"])
    if tool is None:
        return None
    args = dict(step["arguments"])
    props = tool.parameters.get("properties") or {}
    variants = [v for v in invalid_variants(args, tool.parameters) if v[0] != "an unknown field"]
    if tool.parameters.get("additionalProperties") is False:
        for other in tools.offered():
            for name, schema in sorted((other.parameters.get("properties") or {}).items()):
                if other.name != tool.name and name not in props:
                    value = (schema.get("enum") or [None])[0] or ("2024-03" if stated_format(schema) == "month"
                                                                  else "x")
                    variants.append((f"{name}: a field borrowed from {other.name}", {**args, name: value}))
    variants = [v for v in variants if tools.validate(tool.name, v[1])]
    return rng.choice(variants) if variants else None


class FixFirstExpert:
    """The practice expert behind one broken first call: `arguments` sent to the plan's first tool with weight
    0 (training never imitates it), the harness's per-field feedback comes back, and the constructed solution
    follows at weight 1 with no sentence about the mistake, so what is learned is the corrected call read
    from the feedback (a sentence before it was learned instead of the fix: docs/training.md rows 6 and 31)."""

    def __init__(self, expert: PracticeExpert, arguments: dict[str, Any]):
        self.expert, self.arguments = expert, arguments

    def generate(self, request: PolicyRequest) -> PolicyReply:
        """The broken call at the first step, the expert's step after it."""
        if any(m.get("role") == "assistant" for m in request.messages):
            return self.expert.generate(request)
        call = ToolCall("", request.task.metadata["plan"][0]["name"], self.arguments)
        return PolicyReply(get_protocol(request.protocol).assistant_text("", [call]), weight=0.0)


def solve_with_fixes(practice_env: PracticeEnv, tasks_: list[TaskSpec], harness: HarnessConfig,
                     seed: int = 0) -> list[Episode]:
    """Fix practice: for each task whose first call has a rejected variant (`broken_first_call`), the episode of
    `FixFirstExpert`, kept when it passes the task's assertion; `metadata["fix"]` names what was broken."""
    rng = random.Random(f"ttt-fix/{seed}")
    expert = PracticeExpert(dict(practice_env.drift_names))
    out = []
    for task in tasks_:
        drawn: list[tuple[str, dict[str, Any]] | None] = []

        def fixer(tools: ToolSet) -> FixFirstExpert | None:
            drawn.append(broken_first_call(task, tools, rng))
            return FixFirstExpert(expert, drawn[0][1]) if drawn[0] else None

        ep = _checked(practice_env, task, fixer, harness, f"{task.id}+fix")
        if ep is not None:
            ep.metadata["fix"] = drawn[0][0]
            out.append(ep)
    return out
