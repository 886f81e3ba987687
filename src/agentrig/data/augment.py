"""Augmentation (seed section 4.2): paraphrase, consistent per-episode renaming, tool-frequency balance.

- Paraphrase: an environment's families have their own phrasings (datadesk: `envs/datadesk/tasks.py`);
  `paraphrase` adds environment-independent light rewriting on top (politeness wrappers, casing, punctuation), seeded per episode.
- Renaming: `rename_spec` picks, per episode, new names and descriptions for the offered tools and new
  names for some parameters, from the environment's alias tables (`Environment.tool_aliases`,
  `param_aliases`; datadesk's are in `envs/datadesk/tools.py`); `apply_rename` applies it consistently
  (the allowlist too), and the task records it in `metadata["rename"]` so the expert writes the renamed calls.
- Balance: `tool_frequencies` counts calls in episodes; `flatten_weights` turns the tools each family
  needs into family weights that even out how often each tool is used.
- Detours (a wrong step the harness rejects, weight 0, then the correction) are written by the teacher
  (`ExpertTeacher(detour_rate=...)`); `Augment.detour_rate` carries the setting.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from agentrig.harness.tools import Tool, ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec

_PREFIXES = ["", "", "Please: ", "Quick question. ", "Hi! ", "Could you help? ", "For the weekly review: "]
_SUFFIXES = ["", "", " Thanks!", " Thank you.", " Keep it short.", " ASAP please."]


@dataclass
class Augment:
    """Augmentation settings for collection (all off by default)."""

    paraphrase: float = 0.0  # probability of light rewriting of the prompt
    rename: float = 0.0  # probability of renaming the tools of an episode
    detour_rate: float = 0.0  # probability of a detour (teacher-side)
    balance: bool = False  # flatten tool frequencies by reweighting families
    family_weights: dict[str, float] = field(default_factory=dict)


def paraphrase(prompt: str, rng: random.Random) -> str:
    """Light rewriting: a politeness prefix or suffix, lower-cased start, or a dropped final '?'."""
    out = prompt
    prefix, suffix = rng.choice(_PREFIXES), rng.choice(_SUFFIXES)
    if prefix and rng.random() < 0.5:
        out = out[0].lower() + out[1:] if out[:1].isupper() and out[1:2].islower() else out
    if rng.random() < 0.3 and out.endswith("?"):
        out = out[:-1]
    return f"{prefix}{out}{suffix}".strip()


def rename_spec(tools: Iterable[str], rng: random.Random,
                aliases: Mapping[str, list[tuple[str, str]]]) -> dict[str, Any]:
    """New names/descriptions for the given tools (consistent in one episode); tools without aliases keep theirs.

    An alias that is already the name of another tool offered in the episode (or another tool's new name) is
    never drawn, so renaming cannot make two tools share a name; a tool whose aliases all collide keeps its own.
    """
    tools = list(tools)
    taken = set(tools)
    spec: dict[str, Any] = {"tools": {}, "descriptions": {}, "params": {}}
    for name in tools:
        free = [a for a in aliases.get(name, []) if a[0] not in taken]
        if not free:
            continue
        new, desc = rng.choice(free)
        taken.add(new)
        spec["tools"][name] = new
        spec["descriptions"][name] = desc
    return spec


def _param_map(tool: Tool, rng: random.Random, aliases: Mapping[str, list[str]]) -> dict[str, str]:
    """New names for about half of the tool's parameters that have aliases; never one it already has."""
    names = list(tool.parameters.get("properties", {}))
    taken = set(names)
    out: dict[str, str] = {}
    for p in names:
        if p in aliases and rng.random() < 0.5:
            free = [a for a in aliases[p] if a not in taken]
            if free:
                out[p] = rng.choice(free)
                taken.add(out[p])
    return out


def apply_rename(task: TaskSpec, toolset: ToolSet, rng: random.Random,
                 tool_aliases: Mapping[str, list[tuple[str, str]]],
                 param_aliases: Mapping[str, list[str]]) -> tuple[TaskSpec, ToolSet]:
    """Rename the task's offered tools (and some parameters) consistently; the task records the mapping.

    The aliases are the environment's (`Environment.tool_aliases`, `Environment.param_aliases`).
    """
    spec = rename_spec(task.allowed_tools, rng, tool_aliases)
    renamed: list[Tool] = []
    for name in task.allowed_tools:
        t = toolset.get(name)
        assert t is not None
        if name not in spec["tools"]:
            renamed.append(t)
            continue
        params = _param_map(t, rng, param_aliases)
        if params:
            spec["params"][name] = params
        renamed.append(t.renamed(spec["tools"][name], spec["descriptions"][name], params))
    task = copy.deepcopy(task)
    task.allowed_tools = [spec["tools"].get(n, n) for n in task.allowed_tools]
    task.metadata["rename"] = {"tools": spec["tools"], "params": spec["params"]}
    return task, ToolSet(renamed, allowed=task.allowed_tools, max_output_chars=toolset.max_output_chars)


def tool_frequencies(episodes: Iterable[Episode], canonical: bool = True) -> Counter[str]:
    """How often each tool was called (renamed tools counted under their original names)."""
    counts: Counter[str] = Counter()
    for ep in episodes:
        back = {v: k for k, v in (ep.task.metadata.get("rename") or {}).get("tools", {}).items()} if canonical else {}
        for step in ep.steps:
            for call in step.calls:
                counts[back.get(call.name, call.name)] += 1
    return counts


def flatten_weights(family_tools: dict[str, list[str]], rounds: int = 50, cap: float = 4.0) -> dict[str, float]:
    """Family weights that even out tool usage: repeatedly damp families whose tools are over-used.

    Each round scales the tool-using families' weights to a mean of 1, then clips each to [1/cap, cap] (no
    family vanishes from the data and none takes it over); a family that needs no tool keeps weight 1.0."""
    fams = [f for f, tools in family_tools.items() if tools]
    weights = {f: 1.0 for f in fams}
    for _ in range(rounds if fams else 0):
        usage: Counter[str] = Counter()
        for f in fams:
            for t in family_tools[f]:
                usage[t] += weights[f]
        mean = sum(usage.values()) / len(usage)
        for f in fams:
            load = sum(usage[t] for t in family_tools[f]) / len(family_tools[f])
            weights[f] *= (mean / load) ** 0.5
        total = sum(weights.values())
        weights = {f: min(cap, max(1 / cap, w * len(fams) / total)) for f, w in weights.items()}
    return {f: weights.get(f, 1.0) for f in family_tools}
