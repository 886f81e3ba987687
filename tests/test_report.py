"""Reports: markdown with tables and plot links, self-contained HTML with inline PNGs, transcripts."""

from __future__ import annotations

import base64
import re

from agentrig.evals.metrics import compute_metrics
from agentrig.evals.report import pick_transcripts, render_transcript, rich_table, write_report
from agentrig.harness.trajectory import Episode, Step, TaskSpec, ToolCall, ToolResult


def _episode(task_id: str, family: str, success: bool, fault: bool = False) -> Episode:
    call = ToolCall(id="c0", name="stock_level", arguments={"sku": "A-17"})
    result = ToolResult(call_id="c0", name="stock_level", content='{"units": 4}' if not fault else "Error: timeout",
                        ok=not fault, fault="timeout" if fault else None)
    steps = [
        Step(index=0, raw_output="", text="Let me check.", calls=[call], results=[result]),
        Step(index=1, raw_output="There are 4 units.", text="There are 4 units.", is_final=True),
    ]
    return Episode(
        episode_id=task_id, task=TaskSpec(id=task_id, prompt=f"units of A-17? ({task_id})", family=family, split="test"),
        protocol="hermes", system_prompt="s", tools=[], steps=steps, success=success, termination="final_answer",
        faults=["timeout"] if fault else [], final_answer="There are 4 units.", check={"reasons": ["figure 4 stated"]},
    )


def _sets() -> tuple[dict, list[Episode]]:
    base_eps = [_episode("t1", "lookup", False), _episode("t2", "summary", False), _episode("t3", "lookup", True)]
    sft_eps = [_episode("t1", "lookup", True), _episode("t2", "summary", True, fault=True), _episode("t3", "lookup", True)]
    return {"base": compute_metrics(base_eps), "sft": compute_metrics(sft_eps)}, sft_eps


def test_write_report_markdown_and_self_contained_html(tmp_path) -> None:
    sets, eps = _sets()
    history = [{"step": s, "loss": 2.0 / s, "stage": "sft"} for s in range(1, 6)] + [
        {"step": s, "loss": 0.7 - s / 100, "stage": "dpo"} for s in range(6, 9)
    ]
    files = write_report(tmp_path, sets, loss_history=history, transcripts=pick_transcripts(eps, 2), title="run 1")
    assert set(files.plots) == {"loss", "metrics", "families", "failures"}  # failures: the base set has some
    for png in files.plots.values():
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    md = files.markdown.read_text()
    assert md.startswith("# run 1")
    assert "| metric | base | sft |" in md
    assert "| task completion | 33.3% [" in md and "(3/3)" in md
    assert "| lookup |" in md and "| summary |" in md
    assert "![loss curve](loss_curve.png)" in md
    assert "-> call stock_level" in md and "FAILED (timeout)" in md

    page = files.html.read_text()
    images = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 4
    assert all(base64.b64decode(i)[:4] == b"\x89PNG" for i in images)
    assert not re.search(r'src="(?!data:)', page), "the HTML page must not reference outside files"
    assert "&lt;- ok: {&quot;units&quot;: 4}" in page  # transcripts are escaped, not injected


def test_report_without_training_has_no_loss_plot(tmp_path) -> None:
    sets, _ = _sets()
    files = write_report(tmp_path, {"base": sets["base"]})
    assert "loss" not in files.plots
    assert "Training loss" not in files.markdown.read_text()


def test_transcript_and_table_show_every_part() -> None:
    sets, eps = _sets()
    picked = pick_transcripts(eps, 3)
    assert picked[0].recovered  # a recovery is the most instructive transcript
    text = render_transcript(picked[0])
    assert "user: units of A-17?" in text and "assistant: There are 4 units." in text
    assert "checker: figure 4 stated" in text
    from rich.console import Console

    console = Console(record=True, width=160)
    console.print(rich_table(sets))
    out = console.export_text()
    assert "task completion" in out and "family: summary" in out
