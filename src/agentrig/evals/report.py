"""Evaluation reports: a markdown page, a self-contained HTML page, PNG plots and a terminal table.

Input is a dict of named metric sets in display order (e.g. `{"base": ..., "sft": ..., "sft+dpo": ...}`),
optionally the training loss history (`[{"step": int, "loss": float, "stage": "sft"}, ...]`, the rows
`agentrig.train.trainlog.loss_history` produces, with an optional `stage` per row) and a few episodes to show
as transcripts, and further `Section`s (e.g. another environment's metric sets, shown as tables without
plots). The plots are: the loss curve (one line per stage), the headline metrics of every named set side
by side with their 95% Wilson intervals, and task completion per family. The HTML page inlines the PNGs as
base64 so it can be mailed or attached as one file. matplotlib is imported inside the plotting functions.
Not covered: interactive plots; plots of the further sections.
"""

from __future__ import annotations

import base64
import html
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrig.evals.metrics import MetricSet, Rate
from agentrig.harness.trajectory import Episode

# The headline rates, in display order: (attribute, label, higher is better).
HEADLINE: tuple[tuple[str, str, bool], ...] = (
    ("completion", "task completion", True),
    ("tool_call_success", "tool-call success", True),
    ("invalid_calls", "invalid calls", False),
    ("recovery", "recovery (faults)", True),
    ("honest_failure", "honest failure (impossible)", True),
)


@dataclass
class Section:
    """A further block of the page: a heading, a line of text, and its own named metric sets (tables only)."""

    title: str
    metric_sets: dict[str, MetricSet]
    note: str = ""


@dataclass
class ReportFiles:
    """What `write_report` wrote."""

    markdown: Path
    html: Path
    plots: dict[str, Path] = field(default_factory=dict)


# -- plots -----------------------------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt: Any, fig: Any, path: Path) -> Path:
    """Lay out, write and close a figure; returns its path."""
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_loss(history: list[dict[str, Any]], path: Path) -> Path:
    """The training loss per optimizer step, one line per `stage` (rows without one are "train")."""
    plt = _pyplot()
    stages: dict[str, list[dict[str, Any]]] = {}
    for row in history:
        stages.setdefault(str(row.get("stage", "train")), []).append(row)
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for stage, rows in stages.items():
        ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=stage, marker="." if len(rows) < 60 else None)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title("training loss")
    ax.grid(alpha=0.3)
    if len(stages) > 1:
        ax.legend()
    return _save(plt, fig, path)


def _bars(ax: Any, groups: list[str], series: dict[str, list[Rate]]) -> None:
    """Grouped bars (one group per label, one bar per named set) with Wilson error bars."""
    width = 0.8 / max(1, len(series))
    for k, (name, rates) in enumerate(series.items()):
        xs = [g + (k - (len(series) - 1) / 2) * width for g in range(len(groups))]
        values = [r.value or 0.0 for r in rates]
        # max(0, ...): at 0% or 100% the Wilson bound equals the value up to rounding
        lows = [max(0.0, v - r.interval[0]) if r.total else 0.0 for v, r in zip(values, rates)]
        highs = [max(0.0, r.interval[1] - v) if r.total else 0.0 for v, r in zip(values, rates)]
        ax.bar(xs, values, width, yerr=[lows, highs], capsize=3, label=name)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20, ha="right")
    ax.set_ylim(0, 1.05)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize="small")


def plot_metric_bars(metric_sets: dict[str, MetricSet], path: Path) -> Path:
    """Headline rates of every named set side by side, with 95% Wilson intervals."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.2, 3.8), dpi=100)
    labels = [label for _, label, _ in HEADLINE]
    _bars(ax, labels, {name: [getattr(m, attr) for attr, _, _ in HEADLINE] for name, m in metric_sets.items()})
    ax.set_title("base vs trained (95% Wilson intervals)")
    return _save(plt, fig, path)


def plot_families(metric_sets: dict[str, MetricSet], path: Path) -> Path:
    """Task completion per task family for every named set."""
    plt = _pyplot()
    families = sorted({f for m in metric_sets.values() for f in m.by_family})
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(families) + 2), 3.8), dpi=100)
    series = {
        name: [m.by_family[f].completion if f in m.by_family else Rate(0, 0) for f in families]
        for name, m in metric_sets.items()
    }
    _bars(ax, families, series)
    ax.set_title("task completion per family")
    return _save(plt, fig, path)


def plot_failures(metric_sets: dict[str, MetricSet], path: Path) -> Path:
    """Failed episodes per failure class (horizontal bars, one per named set), classes with any count only."""
    plt = _pyplot()
    classes = failure_classes(metric_sets)
    fig, ax = plt.subplots(figsize=(7.2, max(2.4, 0.45 * len(classes) * max(1, len(metric_sets)) ** 0.5 + 1)), dpi=100)
    height = 0.8 / max(1, len(metric_sets))
    for k, (name, m) in enumerate(metric_sets.items()):
        ys = [c + (k - (len(metric_sets) - 1) / 2) * height for c in range(len(classes))]
        ax.barh(ys, [m.failures.get(c, 0) for c in classes], height, label=name)
    ax.set_yticks(range(len(classes)))
    ax.set_yticklabels(classes)
    ax.invert_yaxis()
    ax.set_xlabel("failed episodes")
    ax.set_title("why episodes failed (first decisive cause)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize="small")
    return _save(plt, fig, path)


def failure_classes(metric_sets: dict[str, MetricSet]) -> list[str]:
    """The failure classes that any named set has, in `failures.FAILURE_CLASSES` order."""
    from agentrig.evals.failures import FAILURE_CLASSES

    return [c for c in FAILURE_CLASSES if any(m.failures.get(c, 0) for m in metric_sets.values())]


def failure_examples(episodes: list[Episode]) -> dict[str, Episode]:
    """The first failed episode of each failure class (classified by `metrics.compute_metrics`)."""
    examples: dict[str, Episode] = {}
    for ep in episodes:
        kind = (ep.metadata.get("failure") or {}).get("kind")
        if kind is not None and kind not in examples:
            examples[kind] = ep
    return examples


def plot_curve(points: list[dict[str, Any]], path: Path) -> Path:
    """Task completion (with its Wilson interval) against training minutes, one point per evaluated snapshot."""
    plt = _pyplot()
    rates = [Rate.from_dict(p["completion"]) for p in points]
    xs = [p["train_minutes"] for p in points]
    ys = [r.value or 0.0 for r in rates]
    low = [max(0.0, y - r.interval[0]) for y, r in zip(ys, rates)]
    high = [max(0.0, r.interval[1] - y) for y, r in zip(ys, rates)]
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    ax.errorbar(xs, ys, yerr=[low, high], marker="o", capsize=3)
    for x, y, p in zip(xs, ys, points):
        ax.annotate(f"step {p['step']}", (x, y), textcoords="offset points", xytext=(4, 6), fontsize="small")
    ax.set_xlabel("training minutes")
    ax.set_ylabel("task completion")
    ax.set_ylim(0, 1.05)
    ax.set_title("what more training buys (the same tasks at every point)")
    ax.grid(alpha=0.3)
    return _save(plt, fig, path)


def curve_rows(points: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """The curve as (step, [training minutes, completion]) rows."""
    return [(str(p["step"]), [f"{p['train_minutes']:.1f}", _fmt(Rate.from_dict(p["completion"]))]) for p in points]


def write_plots(out_dir: Path, metric_sets: dict[str, MetricSet], loss_history: list[dict[str, Any]] | None,
                curve: list[dict[str, Any]] | None = None) -> dict[str, Path]:
    """Write every plot that has data; returns plot name -> PNG path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    plots: dict[str, Path] = {}
    if curve:
        plots["curve"] = plot_curve(curve, out_dir / "completion_curve.png")
    if loss_history:
        plots["loss"] = plot_loss(loss_history, out_dir / "loss_curve.png")
    if metric_sets:
        plots["metrics"] = plot_metric_bars(metric_sets, out_dir / "metrics.png")
        plots["families"] = plot_families(metric_sets, out_dir / "families.png")
        if failure_classes(metric_sets):
            plots["failures"] = plot_failures(metric_sets, out_dir / "failures.png")
    return plots


# -- text -------------------------------------------------------------------------------------


def _fmt(rate: Rate) -> str:
    if rate.value is None:
        return "n/a"
    low, high = rate.interval
    return f"{rate.value:.1%} [{low:.0%}-{high:.0%}] ({rate.hits}/{rate.total})"


def _turns(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def metric_rows(metric_sets: dict[str, MetricSet]) -> list[tuple[str, list[str]]]:
    """The comparison table as (metric label, one cell per named set) rows, shared by markdown, HTML and rich."""
    sets = list(metric_sets.values())
    rows: list[tuple[str, list[str]]] = [("episodes (tasks)", [f"{m.episodes} ({m.tasks})" for m in sets])]
    for attr, label, _ in HEADLINE:
        rows.append((label, [_fmt(getattr(m, attr)) for m in sets]))
    rows.append(("avg turns (successes)", [_turns(m.avg_turns) for m in sets]))
    for kind in sorted({k for m in sets for k in m.invalid_by_kind}):
        cells = [_fmt(m.invalid_by_kind.get(kind, Rate(0, m.invalid_calls.total))) for m in sets]
        rows.append((f"  invalid: {kind}", cells))
    for split in sorted({s for m in sets for s in m.by_split}):
        cells = [_fmt(m.by_split[split].completion) if split in m.by_split else "n/a" for m in sets]
        rows.append((f"completion on {split}", cells))
    for k in sorted({k for m in sets for k in m.pass_hat_k}):
        rows.append((f"pass^{k}", [f"{m.pass_hat_k[k]:.3f}" if k in m.pass_hat_k else "n/a" for m in sets]))
    rows.append(("avg tokens in / out", [f"{m.avg_prompt_tokens:.0f} / {m.avg_completion_tokens:.0f}" for m in sets]))
    for kind in failure_classes(metric_sets):
        rows.append((f"failed: {kind}", [str(m.failures.get(kind, 0)) for m in sets]))
    return rows


def family_rows(metric_sets: dict[str, MetricSet]) -> list[tuple[str, list[str]]]:
    """Per-family completion as (family, one cell per named set) rows."""
    families = sorted({f for m in metric_sets.values() for f in m.by_family})
    return [
        (f, [_fmt(m.by_family[f].completion) if f in m.by_family else "n/a" for m in metric_sets.values()])
        for f in families
    ]


def render_transcript(episode: Episode) -> str:
    """A plain-text transcript: the user's request, each step's text, calls, results, defects and notices."""
    lines = [f"task {episode.task.id} ({episode.task.family or 'no family'}) - "
             f"{'SUCCESS' if episode.success else 'FAILURE'}, {len(episode.steps)} steps, ended by {episode.termination}",
             f"user: {episode.task.prompt}"]
    for step in episode.steps:
        if step.text:
            lines.append(f"assistant: {step.text}")
        results = {r.call_id: r for r in step.results}
        for call in step.calls:
            lines.append(f"  -> call {call.name}({json.dumps(call.arguments, ensure_ascii=False)})")
            result = results.get(call.id)
            if result is not None:
                flag = "ok" if result.ok else f"FAILED ({result.fault or result.error})"
                lines.append(f"  <- {flag}: {_clip(result.content)}")
        for defect in step.defects:
            if defect.call_id is None:
                lines.append(f"  !! {defect.kind}: {_clip(step.raw_output)}")
        for notice in step.notices:
            lines.append(f"  [harness] {_clip(notice)}")
    reasons = episode.check.get("reasons") if episode.check else None
    if reasons:
        lines.append("checker: " + "; ".join(str(r) for r in reasons))
    failure = episode.metadata.get("failure")
    if failure:
        lines.append(f"failure class: {failure['kind']} ({failure['detail']})")
    return "\n".join(lines)


def _clip(text: str, limit: int = 300) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def pick_transcripts(episodes: list[Episode], n: int = 3) -> list[Episode]:
    """A few instructive episodes: a recovery, a success, a failure, then the rest in order."""
    chosen: list[Episode] = []
    for want in (lambda e: e.recovered, lambda e: bool(e.success), lambda e: not e.success):
        for ep in episodes:
            if want(ep) and ep not in chosen:
                chosen.append(ep)
                break
    chosen += [e for e in episodes if e not in chosen]
    return chosen[:n]


def _md_table(header: list[str], rows: list[tuple[str, list[str]]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join([label.strip(), *cells]) + " |" for label, cells in rows]
    return "\n".join(out)


def markdown_report(
    metric_sets: dict[str, MetricSet],
    plots: dict[str, Path],
    transcripts: list[Episode],
    title: str = "agentrig evaluation",
    notes: list[str] | None = None,
    failures: dict[str, Episode] | None = None,
    curve: list[dict[str, Any]] | None = None,
    sections: list[Section] | None = None,
) -> str:
    """The markdown page; plots are referenced by file name (they sit next to the page).

    `failures`: one example episode per failure class (`failure_examples`), shown under its class;
    `sections`: further metric tables (e.g. other environments), after the per-family table.
    """
    failures = failures or {}
    names = list(metric_sets)
    parts = [f"# {title}", ""]
    parts += [f"- {n}" for n in notes or []]
    if notes:
        parts.append("")
    if "loss" in plots:
        parts += ["## Training loss", "", f"![loss curve]({plots['loss'].name})", ""]
    if curve:
        parts += ["## Completion against training minutes", "",
                  _md_table(["step", "training minutes", "completion"], curve_rows(curve)), ""]
        if "curve" in plots:
            parts += [f"![completion curve]({plots['curve'].name})", ""]
    parts += ["## Metrics", "", "Rates show the value, the 95% Wilson interval and hits/total.", "",
              _md_table(["metric", *names], metric_rows(metric_sets)), ""]
    if "metrics" in plots:
        parts += [f"![metrics]({plots['metrics'].name})", ""]
    parts += ["## Per family", "", _md_table(["family", *names], family_rows(metric_sets)), ""]
    if "families" in plots:
        parts += [f"![families]({plots['families'].name})", ""]
    for sec in sections or []:
        sec_names = list(sec.metric_sets)
        parts += [f"## {sec.title}", ""] + ([sec.note, ""] if sec.note else [])
        parts += [_md_table(["metric", *sec_names], metric_rows(sec.metric_sets)), "",
                  _md_table(["family", *sec_names], family_rows(sec.metric_sets)), ""]
    if "failures" in plots or failures:
        parts += ["## Why episodes failed", "", "Each failed episode counts once, under its first decisive cause.", ""]
        if "failures" in plots:
            parts += [f"![failures]({plots['failures'].name})", ""]
        for kind, ep in failures.items():
            parts += [f"### {kind}", "", "```text", render_transcript(ep), "```", ""]
    if transcripts:
        parts += ["## Transcripts", ""]
        for ep in transcripts:
            parts += ["```text", render_transcript(ep), "```", ""]
    return "\n".join(parts)


def _html_table(header: list[str], rows: list[tuple[str, list[str]]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in [label.strip(), *cells]) + "</tr>" for label, cells in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


_CSS = (
    "body{font-family:system-ui,sans-serif;max-width:980px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}"
    "th{background:#f3f3f3}pre{background:#f7f7f7;padding:1em;overflow-x:auto;white-space:pre-wrap}"
    "img{max-width:100%}"
)


def html_report(
    metric_sets: dict[str, MetricSet],
    plots: dict[str, Path],
    transcripts: list[Episode],
    title: str = "agentrig evaluation",
    notes: list[str] | None = None,
    failures: dict[str, Episode] | None = None,
    curve: list[dict[str, Any]] | None = None,
    sections: list[Section] | None = None,
) -> str:
    """One self-contained HTML page: tables, the plots inlined as base64 PNGs, further sections, transcripts."""
    failures = failures or {}
    names = list(metric_sets)
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>"]
    if notes:
        parts.append("<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    if "loss" in plots:
        parts += ["<h2>Training loss</h2>", _img(plots["loss"], "loss curve")]
    if curve:
        parts += ["<h2>Completion against training minutes</h2>",
                  _html_table(["step", "training minutes", "completion"], curve_rows(curve))]
        if "curve" in plots:
            parts.append(_img(plots["curve"], "completion curve"))
    parts += ["<h2>Metrics</h2><p>Rates show the value, the 95% Wilson interval and hits/total.</p>",
              _html_table(["metric", *names], metric_rows(metric_sets))]
    if "metrics" in plots:
        parts.append(_img(plots["metrics"], "metrics"))
    parts += ["<h2>Per family</h2>", _html_table(["family", *names], family_rows(metric_sets))]
    if "families" in plots:
        parts.append(_img(plots["families"], "per-family completion"))
    for sec in sections or []:
        sec_names = list(sec.metric_sets)
        parts.append(f"<h2>{html.escape(sec.title)}</h2>" + (f"<p>{html.escape(sec.note)}</p>" if sec.note else ""))
        parts += [_html_table(["metric", *sec_names], metric_rows(sec.metric_sets)),
                  _html_table(["family", *sec_names], family_rows(sec.metric_sets))]
    if "failures" in plots or failures:
        parts.append("<h2>Why episodes failed</h2><p>Each failed episode counts once, under its first decisive cause.</p>")
        if "failures" in plots:
            parts.append(_img(plots["failures"], "failure classes"))
        for kind, ep in failures.items():
            parts += [f"<h3>{html.escape(kind)}</h3>", f"<pre>{html.escape(render_transcript(ep))}</pre>"]
    if transcripts:
        parts.append("<h2>Transcripts</h2>")
        parts += [f"<pre>{html.escape(render_transcript(ep))}</pre>" for ep in transcripts]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_report(
    out_dir: str | Path,
    metric_sets: dict[str, MetricSet],
    loss_history: list[dict[str, Any]] | None = None,
    transcripts: list[Episode] | None = None,
    title: str = "agentrig evaluation",
    notes: list[str] | None = None,
    failures: dict[str, Episode] | None = None,
    curve: list[dict[str, Any]] | None = None,
    sections: list[Section] | None = None,
) -> ReportFiles:
    """Write the PNG plots, `report.md` and the self-contained `report.html` into `out_dir`.

    `failures`: one example episode per failure class of the trained policy (`failure_examples`);
    `curve`: completion of adapter snapshots against training minutes (`agentrig run`'s curve stage);
    `sections`: further metric tables, e.g. `agentrig run`'s mixed-in environments (no plots of their own).
    """
    out = Path(out_dir)
    plots = write_plots(out, metric_sets, loss_history, curve)
    md_path, html_path = out / "report.md", out / "report.html"
    md_path.write_text(markdown_report(metric_sets, plots, transcripts or [], title, notes, failures, curve, sections),
                       encoding="utf-8")
    html_path.write_text(html_report(metric_sets, plots, transcripts or [], title, notes, failures, curve, sections),
                         encoding="utf-8")
    return ReportFiles(markdown=md_path, html=html_path, plots=plots)


def rich_table(metric_sets: dict[str, MetricSet], title: str = "evaluation") -> Any:
    """The comparison table as a `rich.table.Table` for the terminal."""
    from rich.table import Table

    table = Table(title=title)
    table.add_column("metric")
    for name in metric_sets:
        table.add_column(name, justify="right")
    for label, cells in metric_rows(metric_sets):
        table.add_row(label, *cells)
    for family, cells in family_rows(metric_sets):
        table.add_row(f"family: {family}", *cells)
    return table
