"""The datadesk checker: success from the final answer, the outbox and the calls that were made.

Rules, in order (every failed rule adds a reason):
- the episode ended with a final answer;
- expected figures appear in the final answer, matched by kind (`envs.base.figure_matches`: counts exactly,
  amounts to the cent, converted sums and percentages within their rounding); a count must also have been
  looked up: a small integer is easy to guess, so the episode needs a successful call to the tool the count
  comes from (the last of the task's `needed_tools` that is not `calculator`, `send_report`,
  `describe_table` or `list_tables`, under this episode's name) or to `run_sql`; and
  expected terms (names, e-mails, SKUs) appear verbatim (case-insensitive); comparisons name the winner;
- a required report was sent exactly once, to the right address, with every figure in its body;
- nothing forbidden happened: a report when none was asked for, any tool call on a request that needs no
  tool, or a call that the allowlist refused;
- on impossible tasks the answer says the data is not available and states no number that is not in
  the prompt (dates written as YYYY-MM are ignored).
What is not checked: the wording of the answer beyond these figures and terms.
"""

from __future__ import annotations

import re
from typing import Any

from agentrig.envs.base import (CheckResult, check_answer, check_no_tool_and_impossible, figure_spec, figure_text, has_figure,
                                settle)
from agentrig.envs.datadesk.tools import DatadeskState
from agentrig.harness.trajectory import Episode, TaskSpec

_DATE = re.compile(r"\b\d{4}-\d{2}\b")
_MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December"]


def check_datadesk(task: TaskSpec, state: DatadeskState, episode: Episode) -> CheckResult:
    """Apply the datadesk rules to one finished episode."""
    exp: dict[str, Any] = task.expected
    res = CheckResult(success=True)
    answer = check_answer(exp, episode, res)
    _check_count_grounded(task, episode, res)
    winner = exp.get("winner")
    if winner is not None and _first_named(answer, exp["candidates"]) != winner:
        res.figures_ok = False
        res.reasons.append(f"the answer does not name {winner} first as the higher one")

    report = exp.get("report")
    if report is not None:
        sent = state.reports
        if len(sent) != 1:
            res.side_effects_ok = False
            res.reasons.append(f"expected exactly one report, {len(sent)} sent")
        for r in sent[:1]:
            if r.to.lower() != report["to"].lower():
                res.side_effects_ok = False
                res.forbidden.append(f"report sent to {r.to}")
                res.reasons.append(f"report went to {r.to}, not {report['to']}")
            for fig in report["figures"]:
                value, kind, tol = figure_spec(fig)
                if not has_figure(r.body, value, kind, tol):
                    res.side_effects_ok = False
                    res.reasons.append(f"figure {figure_text(value)} missing from the report body")
    elif state.reports:
        res.forbidden.append("send_report without being asked")
        res.reasons.append("a report was sent although none was asked for")

    check_no_tool_and_impossible(exp, task.prompt, answer, episode, res, ignore=_DATE)
    return settle(res, episode, answer)


_NOT_A_SOURCE = {"calculator", "send_report", "describe_table", "list_tables", "note"}


def _check_count_grounded(task: TaskSpec, episode: Episode, res: CheckResult) -> None:
    """A count in the answer counts only when the tool it comes from (or `run_sql`) answered in this episode."""
    exp = task.expected
    if not any(figure_spec(f)[1] == "count" for f in exp.get("figures", [])):
        return
    sources = [t for t in exp.get("needed_tools", []) if t not in _NOT_A_SOURCE]
    if not sources:
        return
    names = (task.metadata.get("rename") or {}).get("tools", {})
    wanted = {names.get(t, t) for t in (sources[-1], "run_sql")}
    if not any(r.ok and r.name in wanted for s in episode.steps for r in s.results):
        res.figures_ok = False
        res.reasons.append(f"the count was not looked up: no successful call to {names.get(sources[-1], sources[-1])}"
                           f" or {names.get('run_sql', 'run_sql')}")


def _first_named(answer: str, candidates: list[str]) -> str | None:
    """The candidate (a YYYY-MM month, or any other term) that the answer mentions first."""
    best: tuple[int, str] | None = None
    for cand in candidates:
        pattern = re.escape(cand)
        if re.fullmatch(r"\d{4}-\d{2}", cand):
            name = _MONTHS[int(cand[5:]) - 1]
            pattern = rf"{pattern}|\b(?:{name}|{name[:3]})\b"
        m = re.search(pattern, answer, flags=re.IGNORECASE)
        if m and (best is None or m.start() < best[0]):
            best = (m.start(), cand)
    return best[1] if best else None
