"""BFCL figures: per-category accuracy with 95% Wilson intervals, results.json, report.md, published rows.

The comparison rows are the leaderboard's own figures for small models (not measured here) and are
labelled as such wherever they are shown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrig.evals.metrics import wilson_interval  # one Wilson interval for every report

PUBLISHED_LABEL = "published BFCL v4 figures, 2025-12"

# model -> category -> accuracy in percent, as the official leaderboard CSV reports it ("< 4": below 4).
PUBLISHED: dict[str, dict[str, str]] = {
    "Granite-4.0-350m": {"simple_python": "83.0", "irrelevance": "60.8", "multi_turn_base": "< 4"},
    "Hammer2.1-0.5b": {"simple_python": "83.3", "irrelevance": "80.8", "multi_turn_base": "< 4"},
    "Qwen3-0.6B": {"simple_python": "86.5", "irrelevance": "80.8", "multi_turn_base": "< 4"},
    "Llama-3.2-1B": {"simple_python": "75.0", "irrelevance": "51.6", "multi_turn_base": "< 4"},
    "xLAM-2-1b": {"multi_turn_base": "36.0"},
}


@dataclass(frozen=True)
class CategoryScore:
    """Accuracy of one category: entries run, entries passed (BFCL's verdict), the proportion and its 95% interval.

    `episode_correct` counts entries whose whole episode passes (every call until a reply without one).
    """

    category: str
    n: int
    correct: int
    episode_correct: int | None = None  # None: the same as `correct`

    @property
    def accuracy(self) -> float:
        """Passed / run (0 when nothing ran)."""
        return self.correct / self.n if self.n else 0.0

    @property
    def ci95(self) -> tuple[float, float]:
        """The 95% Wilson interval of the accuracy."""
        return wilson_interval(self.correct, self.n)

    def to_dict(self) -> dict[str, Any]:
        """The JSON record of this score."""
        low, high = self.ci95
        return {"n": self.n, "correct": self.correct, "accuracy": self.accuracy, "ci95": [low, high],
                **({} if self.episode_correct is None else {"episode": self.episode().to_dict()})}

    def episode(self) -> "CategoryScore":
        """The whole-episode score of the same entries (the same as this one when it was not counted apart)."""
        whole = self.correct if self.episode_correct is None else self.episode_correct
        return CategoryScore(self.category, self.n, whole)


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def render_report(header: dict[str, Any], scores: list[CategoryScore]) -> str:
    """report.md: what was run, the measured table, and the published comparison rows."""
    lines = [
        "# BFCL (offline, through the agentrig harness)",
        "",
        f"- model: `{header['model']}`" + (f", adapter: `{header['adapter']}`" if header.get("adapter") else ""),
        f"- date: {header['date']}; bfcl-eval data {header['bfcl_eval_version']}; protocol {header['protocol']}",
        f"- limit per category: {header['limit'] if header.get('limit') else 'none (all entries)'}",
        "",
        "Accuracy is BFCL's protocol: a single-turn entry is scored on the model's first response (all the calls",
        "of that one turn). The last column scores the whole harness episode instead: every call until the model",
        "replies without one, so resending an answer after the recorded observation, or spreading a parallel",
        "answer over several turns, fails there.",
        "",
        "| category | n | correct | accuracy % | 95% interval % | whole episode % |",
        "|---|---:|---:|---:|---|---:|",
    ]
    for s in scores:
        low, high = s.ci95
        lines.append(f"| {s.category} | {s.n} | {s.correct} | {_pct(s.accuracy)} | {_pct(low)}-{_pct(high)} "
                     f"| {_pct(s.episode().accuracy)} |")
    shown = [s.category for s in scores]
    lines += ["", f"## Comparison ({PUBLISHED_LABEL}; not measured here)", ""]
    lines.append("| model | " + " | ".join(shown) + " |")
    lines.append("|---|" + "---:|" * len(shown))
    for model, figures in PUBLISHED.items():
        lines.append(f"| {model} (published) | " + " | ".join(figures.get(c, "-") for c in shown) + " |")
    lines += [
        "",
        "Published figures use BFCL's own prompts and a single response per single-turn entry; this run uses",
        "agentrig's protocol and harness (see docs/bfcl.md for the differences).",
        "",
    ]
    return "\n".join(lines)


def write_results(out: Path, header: dict[str, Any], scores: list[CategoryScore], entries: list[dict[str, Any]]) -> None:
    """Write results.json (header, scores, per-entry verdicts, published rows) and report.md into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        **header,
        "categories": {s.category: s.to_dict() for s in scores},
        "published": {"label": PUBLISHED_LABEL, "figures": PUBLISHED},
        "entries": entries,
    }
    (out / "results.json").write_text(json.dumps(payload, indent=2, ensure_ascii=False, default=repr) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_report(header, scores), encoding="utf-8")
