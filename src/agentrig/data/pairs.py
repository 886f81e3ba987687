"""Preference pairs for DPO: one differing assistant step after a shared prefix, from episodes or synthesized.

From several episodes of the same task, chosen is a verified success with no detour and the fewest steps;
each failure or detour episode is rejected at the first step where the two differ, provided everything
the model saw before it is identical (`context_at` equal). A pair's completion is one assistant message on
each side, never a tool message (a tool message inside a completion is trained as if the model wrote it).

Synthetic pairs take a chosen step of a successful episode (the teacher's call) and make the rejected side
by hand, so they need nothing of the teacher's internals: another offered tool, a required argument
dropped or mistyped, a self-written `<tool_response>`, or giving up right after a fault. Output is TRL's
`{"prompt", "chosen", "rejected", "tools"}` (plus `pair_id`, `kind`) or LLaMA-Factory's ranking format.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from agentrig.data.exports import sharegpt_conversation, sharegpt_violations
from agentrig.harness.trajectory import Episode

SYNTHETIC_KINDS = ("wrong_tool", "bad_argument", "invented_result", "gave_up")
GIVE_UP_TEXT = "I could not do this: the tool failed."


@dataclass
class Pair:
    """A preference pair in TRL's conversational form."""

    pair_id: str
    kind: str  # "episodes" or one of SYNTHETIC_KINDS
    prompt: list[dict[str, Any]]
    chosen: dict[str, Any]
    rejected: dict[str, Any]
    tools: str

    def trl(self) -> dict[str, Any]:
        """TRL's preference row (prompt messages, one-message chosen/rejected, tools as JSON string)."""
        return {"pair_id": self.pair_id, "kind": self.kind, "prompt": self.prompt, "chosen": [self.chosen],
                "rejected": [self.rejected], "tools": self.tools}

    def llamafactory(self) -> dict[str, Any]:
        """LLaMA-Factory's sharegpt ranking row; raises ValueError when its rules cannot hold the pair. No `tools`
        column: the system prompt already lists the tools, and a tools column makes LLaMA-Factory's templates
        append a second list (as the SFT export found)."""
        system = self.prompt[0]["content"] if self.prompt[0]["role"] == "system" else ""
        turns, _ = sharegpt_conversation(self.prompt[1:] if system else self.prompt)
        sides = [sharegpt_conversation([m])[0][0] for m in (self.chosen, self.rejected)]
        problems = sharegpt_violations(turns, ranking=True)
        if problems:
            raise ValueError(f"pair {self.pair_id}: {problems}")
        return {"conversations": turns, "chosen": sides[0], "rejected": sides[1], "system": system}


def _tools_json(episode: Episode) -> str:
    return json.dumps(episode.tools, ensure_ascii=False)


def _prefer(ep: Episode) -> bool:
    return bool(ep.success) and ep.detours == 0 and all(s.weight > 0 for s in ep.steps)


def episode_pairs(episodes: list[Episode]) -> tuple[list[Pair], dict[str, int]]:
    """Pairs from episodes grouped by task; also counts of why groups gave none."""
    from agentrig.harness.transcript import assistant_message, context_at

    by_task: dict[str, list[Episode]] = defaultdict(list)
    for ep in episodes:
        by_task[ep.task.id].append(ep)
    pairs: list[Pair] = []
    skipped: dict[str, int] = defaultdict(int)
    for task_id, group in by_task.items():
        good = sorted((e for e in group if _prefer(e)), key=lambda e: len(e.steps))
        bad = [e for e in group if not e.success or e.detours > 0]
        if not good or not bad:
            skipped["no_chosen" if not good else "no_rejected"] += 1
            continue
        chosen = good[0]
        for rej in bad:
            for i in range(min(len(chosen.steps), len(rej.steps))):
                if context_at(chosen, i) != context_at(rej, i):
                    skipped["contexts_diverge"] += 1
                    break
                a, b = assistant_message(chosen.steps[i]), assistant_message(rej.steps[i])
                if a != b:
                    pairs.append(Pair(f"{chosen.episode_id}|{rej.episode_id}@{i}", "episodes", context_at(chosen, i), a, b,
                                      _tools_json(chosen)))
                    break
            else:
                skipped["no_difference"] += 1
    return pairs, dict(skipped)


def _wrong_tool(message: dict[str, Any], tool_names: list[str]) -> dict[str, Any] | None:
    call = message["tool_calls"][0]
    others = [n for n in tool_names if n not in (call["function"]["name"], "note")]
    if not others:
        return None
    swapped = {**call, "function": {**call["function"], "name": others[0]}}
    return {**message, "tool_calls": [swapped] + message["tool_calls"][1:]}


def _bad_argument(message: dict[str, Any], schemas: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    call = message["tool_calls"][0]
    schema = schemas.get(call["function"]["name"], {})
    args = json.loads(call["function"]["arguments"])
    required = [k for k in schema.get("required", []) if k in args]
    if not required:
        return None
    key = required[0]
    if len(required) > 1 or not isinstance(args[key], str):
        # mistype: a string where the schema wants something else, or a number where it wants a string
        args[key] = str(args[key]) if not isinstance(args[key], str) else 0
    else:
        del args[key]
    bad = {**call, "function": {**call["function"], "arguments": json.dumps(args, ensure_ascii=False)}}
    return {**message, "tool_calls": [bad] + message["tool_calls"][1:]}


def _invented_result(message: dict[str, Any], body: str) -> dict[str, Any]:
    invented = json.dumps({"result": "ok"})
    return {"role": "assistant", "content": f"{body}\n<tool_response>\n{invented}\n</tool_response>"}


def synthetic_pairs(episode: Episode) -> list[Pair]:
    """At most one pair of each synthetic kind from a successful, detour-free episode's steps."""
    from agentrig.harness.transcript import assistant_message, context_at
    from agentrig.harness.protocol import get_protocol

    if not _prefer(episode):
        return []
    proto = get_protocol(episode.protocol)
    names = [t["function"]["name"] for t in episode.tools]
    schemas = {t["function"]["name"]: t["function"].get("parameters", {}) for t in episode.tools}
    made: dict[str, Pair] = {}
    for i, step in enumerate(episode.steps):
        chosen = assistant_message(step)
        after_fault = i > 0 and any(not r.ok for r in episode.steps[i - 1].results)
        candidates: list[tuple[str, dict[str, Any] | None]] = []
        if chosen.get("tool_calls"):
            candidates += [
                ("wrong_tool", _wrong_tool(chosen, names)),
                ("bad_argument", _bad_argument(chosen, schemas)),
                ("invented_result", _invented_result(chosen, proto.assistant_text(step.text, step.calls))),
            ]
        if after_fault:
            candidates.append(("gave_up", {"role": "assistant", "content": GIVE_UP_TEXT}))
        for kind, rejected in candidates:
            if kind in made or rejected is None or rejected == chosen:
                continue
            made[kind] = Pair(f"{episode.episode_id}@{i}:{kind}", kind, context_at(episode, i), chosen, rejected,
                              _tools_json(episode))
    return [made[k] for k in SYNTHETIC_KINDS if k in made]


def build_pairs(episodes: list[Episode], synthetic: bool = True) -> tuple[list[Pair], dict[str, Any]]:
    """Episode pairs plus (optionally) synthetic pairs, with a report of counts per kind and skips."""
    pairs, skipped = episode_pairs(episodes)
    if synthetic:
        for ep in episodes:
            pairs.extend(synthetic_pairs(ep))
    kinds: dict[str, int] = defaultdict(int)
    for p in pairs:
        kinds[p.kind] += 1
    return pairs, {"pairs": len(pairs), "kinds": dict(kinds), "skipped_groups": skipped}


def mix_pairs(pairs: list[Pair], total: int, seed: int = 0) -> list[Pair]:
    """At most `total` pairs for one DPO round: episode pairs first, synthetic pairs after, kinds in turn.

    Episode pairs hold the policy's own sampled mistakes (the rejected side is a step of its rollout), which
    is what an on-policy DPO round is for; synthetic pairs only fill what is left, one kind after another so
    no single hand-made defect dominates. A uniform sample would not do: the main job builds ~30 episode
    pairs beside ~2,700 synthetic ones, so a round of 48 would hold almost none of the policy's own steps,
    and its adapter learned to stop closing tool calls (docs/training.md). Seeded; the order is the file's.
    """
    import random

    rng = random.Random(seed)
    order = {id(p): i for i, p in enumerate(pairs)}
    own = [p for p in pairs if p.kind == "episodes"]
    if len(own) >= total:
        return sorted(rng.sample(own, total), key=lambda p: order[id(p)])
    queues = {k: rng.sample(q, len(q)) for k in SYNTHETIC_KINDS if (q := [p for p in pairs if p.kind == k])}
    picked = list(own)
    while len(picked) < total and any(queues.values()):
        for queue in queues.values():
            if queue and len(picked) < total:
                picked.append(queue.pop())
    return sorted(picked, key=lambda p: order[id(p)])
