"""Paired comparison of two evaluations on the same tasks, and the overlap of a practice set with them.

`agentrig compare A B` reads two episodes files (or an `agentrig eval` folder and a variant: `DIR:NAME`;
a folder with one variant needs no name), matches episodes by id (`TASK_ID#TRIAL`), and per split reports:

- both / only A / only B / neither, the two completion rates and the difference B - A with its 95%
  interval (Newcombe's hybrid score interval for paired proportions, method 10 of Newcombe 1998, built on
  Wilson intervals), and the exact two-sided McNemar p-value (a binomial test on the discordant pairs);
- the task ids that flipped each way, so a reader can open the transcripts.

`--practice FILE` (a TTT run's `practice_tasks.jsonl`) adds the contamination check the TTT loop may not
do itself: how many evaluation prompts appear verbatim among the practice prompts, and how many of the
calls the environment's expert makes on the evaluation tasks (the gold calls, same name and arguments)
appear among the practice tasks' constructed calls.
"""

from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrig.errors import ConfigError
from agentrig.evals.metrics import wilson_interval


@dataclass
class PairedResult:
    """One split's paired outcome of A and B."""

    split: str
    n: int
    both: int
    only_a: int
    only_b: int
    neither: int
    gained: list[str] = field(default_factory=list)  # ids B completed and A did not
    lost: list[str] = field(default_factory=list)  # ids A completed and B did not

    @property
    def rate_a(self) -> float:
        return (self.both + self.only_a) / self.n if self.n else 0.0

    @property
    def rate_b(self) -> float:
        return (self.both + self.only_b) / self.n if self.n else 0.0

    def difference(self) -> tuple[float, float, float]:
        """B - A with its 95% interval (Newcombe's method 10)."""
        return newcombe_paired(self.both, self.only_a, self.only_b, self.neither)

    def p_value(self) -> float:
        """Exact two-sided McNemar p-value."""
        return mcnemar_exact(self.only_a, self.only_b)

    def to_dict(self) -> dict[str, Any]:
        diff, lo, hi = self.difference()
        return {"split": self.split, "n": self.n, "both": self.both, "only_a": self.only_a, "only_b": self.only_b,
                "neither": self.neither, "rate_a": round(self.rate_a, 4), "rate_b": round(self.rate_b, 4),
                "difference": round(diff, 4), "ci95": [round(lo, 4), round(hi, 4)],
                "mcnemar_p": round(self.p_value(), 4), "gained": self.gained, "lost": self.lost}


def mcnemar_exact(b: int, c: int) -> float:
    """Two-sided exact McNemar p-value for `b` and `c` discordant pairs (binomial, p = 1/2)."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def newcombe_paired(both: int, only_a: int, only_b: int, neither: int, z: float = 1.959964) -> tuple[float, float, float]:
    """The paired difference p_B - p_A and its interval (Newcombe 1998, method 10: Wilson limits of each
    margin, combined with the correlation of the pairs)."""
    n = both + only_a + only_b + neither
    if n == 0:
        return 0.0, 0.0, 0.0
    pa, pb = (both + only_a) / n, (both + only_b) / n
    la, ua = wilson_interval(both + only_a, n, z)
    lb, ub = wilson_interval(both + only_b, n, z)
    diff = pb - pa
    # phi: the correlation of the two outcomes; Newcombe sets it to 0 when the denominator vanishes
    den = (both + only_a) * (only_b + neither) * (both + only_b) * (only_a + neither)
    phi = 0.0
    if den > 0:
        num = both * neither - only_a * only_b
        phi = num / math.sqrt(den)
    dl = math.sqrt(max(0.0, (pb - lb) ** 2 - 2 * phi * (pb - lb) * (ua - pa) + (ua - pa) ** 2))
    du = math.sqrt(max(0.0, (ub - pb) ** 2 - 2 * phi * (ub - pb) * (pa - la) + (pa - la) ** 2))
    return diff, max(-1.0, diff - dl), min(1.0, diff + du)


def _episodes_file(spec: str) -> Path:
    """An episodes file from `FILE`, `DIR:NAME` or `DIR` (one variant)."""
    from agentrig.jsonl import expect_kind

    path = Path(spec)
    if path.is_file() or (not path.is_dir() and ":" not in spec):
        expect_kind(path, ("episodes",), "compare")  # a wrong kind of file: what it is and what writes episodes
        return path
    folder, _, name = spec.rpartition(":") if ":" in spec and not Path(spec).exists() else (spec, "", "")
    folder_path = Path(folder)
    if not folder_path.is_dir():
        raise ConfigError(f"{spec}: not an episodes file nor an eval folder (FILE, DIR or DIR:VARIANT)")
    from agentrig.evals.evaluate import episodes_file

    if name:
        found = folder_path / episodes_file(name)
        if not found.is_file():
            raise ConfigError(f"{spec}: no {found.name} in {folder}; variants there: {_variants(folder_path)}")
        return found
    files = sorted(folder_path.glob("episodes_*.jsonl"))
    if len(files) != 1:
        raise ConfigError(f"{spec}: {len(files)} variants there ({_variants(folder_path)}); name one as {spec}:NAME")
    return files[0]


def _variants(folder: Path) -> str:
    return ", ".join(p.stem[len("episodes_"):] for p in sorted(folder.glob("episodes_*.jsonl"))) or "none"


def load_outcomes(spec: str) -> dict[str, tuple[str, bool]]:
    """episode id -> (split, success) of an evaluation's episodes."""
    from agentrig.harness.trajectory import iter_episodes

    return {ep.episode_id: (ep.task.split, bool(ep.success)) for ep in iter_episodes(_episodes_file(spec))}


def compare(a: dict[str, tuple[str, bool]], b: dict[str, tuple[str, bool]]) -> list[PairedResult]:
    """Per split, the paired outcome of the episodes both evaluations ran (matched by id)."""
    common = sorted(set(a) & set(b))
    if not common:
        raise ConfigError("the two evaluations share no episode id: run them on the same tasks (same --env, "
                          "--split, --limit and --seed)")
    out: dict[str, PairedResult] = {}
    for eid in common:
        split = a[eid][0]
        r = out.setdefault(split, PairedResult(split, 0, 0, 0, 0, 0))
        sa, sb = a[eid][1], b[eid][1]
        r.n += 1
        if sa and sb:
            r.both += 1
        elif sa:
            r.only_a += 1
            r.lost.append(eid)
        elif sb:
            r.only_b += 1
            r.gained.append(eid)
        else:
            r.neither += 1
    return list(out.values())


def practice_overlap(practice_file: str | Path, env: Any, tasks: list[Any], harness: Any = None) -> dict[str, Any]:
    """How much of the evaluation a practice set holds: prompts verbatim, and the expert's gold calls."""
    from agentrig.harness import HarnessConfig, run_episode
    from agentrig.jsonl import read_jsonl

    rows = read_jsonl(practice_file)
    prompts = {r.get("prompt", "").strip() for r in rows}
    calls = {json.dumps([s["name"], s["arguments"]], sort_keys=True) for r in rows for s in r.get("plan", [])}
    prompt_hits = [t.id for t in tasks if t.prompt.strip() in prompts]
    gold: set[str] = set()
    expert = env.expert()
    if expert is not None:
        for task in tasks:
            tools, state = env.setup(task)
            try:
                ep = run_episode(task, tools, expert, harness or HarnessConfig(), episode_id=f"{task.id}#gold")
            finally:
                env.close(state)
            gold |= {json.dumps([c.name, c.arguments], sort_keys=True) for s in ep.steps if s.weight > 0
                     for c in s.calls}
    return {"practice_tasks": len(rows), "eval_tasks": len(tasks), "prompts_verbatim": len(prompt_hits),
            "prompt_ids": prompt_hits, "gold_calls": len(gold), "gold_calls_in_practice": len(gold & calls),
            "shared_calls": sorted(gold & calls)[:20], "expert": expert is not None}


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `agentrig compare`."""
    parser.add_argument("a", help="the first evaluation: an episodes file, an eval folder, or DIR:VARIANT")
    parser.add_argument("b", help="the second evaluation (the difference is B - A)")
    parser.add_argument("--practice", default=None, metavar="FILE",
                        help="a TTT run's practice_tasks.jsonl: also report its overlap with the evaluation tasks")
    parser.add_argument("--env", default="datadesk", help="the environment of the evaluation (for --practice)")
    parser.add_argument("--tasks", default=None, help="tasks file of an MCP environment (for --practice)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the figures as JSON")


def main(args: argparse.Namespace) -> int:
    """Run `agentrig compare`."""
    a, b = load_outcomes(args.a), load_outcomes(args.b)
    results = compare(a, b)
    payload: dict[str, Any] = {"a": args.a, "b": args.b, "splits": [r.to_dict() for r in results]}
    for r in results:
        d = r.to_dict()
        print(f"{r.split}: A {r.both + r.only_a}/{r.n}, B {r.both + r.only_b}/{r.n}; B - A {d['difference']:+.3f} "
              f"[{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}], McNemar exact p = {d['mcnemar_p']:.3f} "
              f"(gained {r.only_b}, lost {r.only_a})")
        if r.gained:
            print(f"  gained: {', '.join(r.gained)}")
        if r.lost:
            print(f"  lost: {', '.join(r.lost)}")
    if args.practice:
        from agentrig.envs import load_env
        from agentrig.harness.trajectory import iter_episodes

        env = load_env(args.env, args.tasks)
        tasks = {ep.episode_id.split("#")[0]: ep.task for ep in iter_episodes(_episodes_file(args.a))}
        overlap = practice_overlap(args.practice, env, list(tasks.values()))
        payload["practice_overlap"] = overlap
        print(f"practice overlap: {overlap['prompts_verbatim']} of {overlap['eval_tasks']} evaluation prompts verbatim "
              f"among {overlap['practice_tasks']} practice tasks; {overlap['gold_calls_in_practice']} of "
              f"{overlap['gold_calls']} gold calls among the practice calls")
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=1), encoding="utf-8")
    return 0
