"""Why an episode failed: each failed episode gets one class, its first decisive cause, with a detail line.

The classes (`FailureClass`) are read from the recorded steps, the task's flags (`no_tool`, `impossible`)
and the checker's verdict (`CheckResult` fields), so they work for any environment:

- `call_on_no_tool`   a tool call on a request that needs none;
- `no_honest_answer`  an impossible task answered without saying it cannot be done (or with invented numbers);
- `wrong_tool`        a call to a tool that does not exist or is outside the task's allowlist, or to a permitted
                      tool the task's solution does not use (`expected["needed_tools"]`), made while every call
                      so far had worked (a choice, not a fallback after a failure); decided before `stuck` and
                      `budget`, which are how such an episode often ends, not why;
- `stuck`             the identical call resent until the harness stopped the episode (after an error,
                      or after a result that was fine);
- `budget`            the step, token or wall-clock budget ran out;
- `schema_violation`  a call whose arguments broke the schema and was never fixed (field, expected, given);
- `unparseable_call`  a call the protocol parser could not read, never written again correctly;
- `no_call`           a final answer without any tool call on a task that needs tools;
- `gave_up`           a final answer right after a tool failed while an allowed tool was still untried;
- `wrong_value`       a valid call whose argument is not grounded in the request or earlier results
                      (an invented id, another month, a figure in a calculation that no result gave), or that
                      the tool itself rejected or found nothing for;
- `side_effect`       a side effect went wrong (a report not sent, sent twice, to the wrong address, or unasked);
- `answer_figure`     the calls were fine but the final answer misses an expected figure or term;
- `other`             none of the above (the checker's reasons say what).

The order above is the order of decision: a later class is only considered when no earlier one applies.
What is not covered: several causes of one episode (only the first decisive one is reported).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Iterable, Literal, get_args

from agentrig.envs.base import ungrounded_figures
from agentrig.harness.trajectory import Episode, ToolCall, ToolResult

FailureClass = Literal[
    "call_on_no_tool", "no_honest_answer", "wrong_tool", "stuck", "budget", "schema_violation",
    "unparseable_call", "no_call", "gave_up", "wrong_value", "side_effect", "answer_figure", "other",
]
FAILURE_CLASSES: tuple[str, ...] = get_args(FailureClass)
BUDGET_ENDS = ("max_steps", "token_budget", "wall_clock")
_MONTHS = ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december"]
_MONTH_YEAR = re.compile(r"\b(" + "|".join(m[:3] for m in _MONTHS) + r")[a-z]*\.?,?\s+(\d{4})\b", re.IGNORECASE)
_MAX_GROUNDED_WORDS = 4  # longer strings (SQL, report bodies, free text) are composed, not copied
_COMPOSED = re.compile(r"[+*/()=<>%^]")
_ARITHMETIC = re.compile(r"[\d\s.,+\-*/()%^]+")  # figures and operators only: a calculator expression
_OPERATION = re.compile(r"[+*/()^%]|\s-\s|\d\.\d")  # not a bare date or id such as 2024-08


@dataclass(frozen=True)
class Failure:
    """One failed episode's class and a one-line detail naming what went wrong."""

    kind: FailureClass
    detail: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form (stored as `episode.metadata["failure"]`)."""
        return {"kind": self.kind, "detail": self.detail}


def classify_failure(episode: Episode) -> Failure | None:
    """The first decisive cause of a failed, checked episode; None for a success or an unchecked episode."""
    if episode.success is not False:
        return None
    for rule in _RULES:
        found = rule(episode)
        if found is not None:
            return found
    reasons = "; ".join(r for r in episode.check.get("reasons", []) if r != "all requirements met")
    return Failure("other", reasons or f"ended by {episode.termination or 'nothing'}")


def classify_episodes(episodes: Iterable[Episode]) -> Counter[str]:
    """Classify every failed episode (stored as `episode.metadata["failure"]`); counts per class, all classes present."""
    counts: Counter[str] = Counter({k: 0 for k in FAILURE_CLASSES})
    for ep in episodes:
        failure = classify_failure(ep)
        if failure is None:
            ep.metadata.pop("failure", None)
            continue
        ep.metadata["failure"] = failure.to_dict()
        counts[failure.kind] += 1
    return counts


# -- the rules, in order of decision ----------------------------------------------------------


def _call_on_no_tool(ep: Episode) -> Failure | None:
    calls = _calls(ep)
    if ep.task.metadata.get("no_tool") and calls:
        return Failure("call_on_no_tool", f"{len(calls)} call(s) on a request that needs no tool, first {_show(calls[0][0])}")
    return None


def _no_honest_answer(ep: Episode) -> Failure | None:
    if not ep.task.metadata.get("impossible") or ep.termination != "final_answer":
        return None
    invented = ep.check.get("invented_numbers") or []
    if invented:
        return Failure("no_honest_answer", f"invented number(s) {invented} instead of saying it cannot be done")
    return Failure("no_honest_answer", "the answer does not say that the request cannot be done")


def _stuck(ep: Episode) -> Failure | None:
    if ep.termination != "stuck" or not ep.steps:
        return None
    last = ep.steps[-1]
    call = last.calls[-1] if last.calls else None
    if call is None:
        return Failure("stuck", "the same call repeated")
    before = _previous_result(ep, call)
    if before is None:
        after = "its first result"
    elif before.ok:
        after = "a result that was fine"
    else:
        after = f"an error ({_first_line(before.content)})"
    return Failure("stuck", f"{_show(call)} resent after {after}")


def _budget(ep: Episode) -> Failure | None:
    if ep.termination not in BUDGET_ENDS:
        return None
    return Failure("budget", f"{ep.termination.replace('_', ' ')} reached after {len(ep.steps)} step(s)")


def _wrong_tool(ep: Episode) -> Failure | None:
    for step in ep.steps:
        for d in step.defects:
            if d.kind in ("unknown_tool", "not_permitted"):
                what = "does not exist" if d.kind == "unknown_tool" else "is not permitted for this task"
                return Failure("wrong_tool", f"called {d.tool!r}, which {what}")
    return _unneeded_tool(ep)


def _unneeded_tool(ep: Episode) -> Failure | None:
    """A permitted tool the task's solution does not use (`expected["needed_tools"]`), chosen while every call so far
    had worked: a choice, not a fallback after a failure (switching to another tool then is recovery)."""
    needed = (ep.task.expected or {}).get("needed_tools") or []
    offered = {t.get("function", {}).get("name") for t in ep.tools}
    if not needed or not set(needed) <= offered:  # no solution recorded, or renamed tools: names cannot be compared
        return None
    for call, result in _calls(ep):
        if call.name not in needed and call.name in offered:
            return Failure("wrong_tool", f"called {call.name}, which this task does not need (it needs "
                                         f"{', '.join(needed)}), while every call so far had worked")
        if result is None or not result.ok or result.fault or result.content.startswith("No result"):
            return None
    return None


def _schema_violation(ep: Episode) -> Failure | None:
    for tool, (step_index, defect) in _unresolved(ep, "schema_violation").items():
        fields = "; ".join(f"{f.path}: expected {f.expected}, got {f.given}" for f in defect.fields) or defect.message
        return Failure("schema_violation", f"{tool} at step {step_index}: {fields}")
    return None


def _unparseable(ep: Episode) -> Failure | None:
    bad = [s for s in ep.steps if any(d.kind == "unparseable_call" for d in s.defects)]
    if bad and not any(s.calls for s in ep.steps[bad[-1].index + 1 :]):
        return Failure("unparseable_call", f"step {bad[-1].index}: {_first_line(bad[-1].raw_output)}")
    return None


def _no_call(ep: Episode) -> Failure | None:
    if _calls(ep) or ep.task.metadata.get("no_tool"):
        return None
    return Failure("no_call", "answered without calling any tool")


def _gave_up(ep: Episode) -> Failure | None:
    if ep.termination != "final_answer":
        return None
    results = [(c, r) for c, r in _calls(ep) if r is not None]
    if not results or results[-1][1].ok:
        return None
    failed = results[-1][0].name
    tried = {c.name for c, _ in results}
    offered = [t["function"]["name"] for t in ep.tools if t.get("function", {}).get("name") not in ("note",)]
    allowed = [t for t in offered if not ep.task.allowed_tools or t in ep.task.allowed_tools]
    untried = [t for t in allowed if t not in tried]
    if not untried:
        return None
    return Failure("gave_up", f"answered after {failed} failed, with {', '.join(untried)} untried")


def _wrong_value(ep: Episode) -> Failure | None:
    seen = [ep.task.prompt] + [str(m.get("content") or "") for m in ep.messages_full[1:2]]
    for step in ep.steps:
        for call, result in zip(step.calls, step.results):
            if result.error in (None, "exception") and not result.fault:
                ungrounded = _ungrounded(call, " \n".join(seen))
                if ungrounded:
                    return Failure("wrong_value", f"{_show(call)}: {ungrounded} appears neither in the request nor in a result")
                if not result.ok or result.content.startswith("No result"):
                    return Failure("wrong_value", f"{_show(call)}: the tool answered {_first_line(result.content)}")
        seen += [r.content for r in step.results]
    return None


def _answer_figure(ep: Episode) -> Failure | None:
    if ep.check.get("figures_ok", True):
        return None
    missing = [r for r in ep.check.get("reasons", []) if "missing from the answer" in r or "does not name" in r]
    return Failure("answer_figure", "; ".join(missing) or "the answer's figures are wrong")


def _side_effect(ep: Episode) -> Failure | None:
    if ep.check.get("side_effects_ok", True) and not ep.check.get("forbidden"):
        return None
    wrong = ep.check.get("forbidden") or [r for r in ep.check.get("reasons", []) if "report" in r]
    return Failure("side_effect", "; ".join(wrong) or "a side effect went wrong")


_RULES = (_call_on_no_tool, _no_honest_answer, _wrong_tool, _stuck, _budget, _schema_violation, _unparseable,
          _no_call, _gave_up, _wrong_value, _side_effect, _answer_figure)


# -- helpers -----------------------------------------------------------------------------------


def _calls(ep: Episode) -> list[tuple[ToolCall, ToolResult | None]]:
    out: list[tuple[ToolCall, ToolResult | None]] = []
    for step in ep.steps:
        results = {r.call_id: r for r in step.results}
        out += [(c, results.get(c.id)) for c in step.calls if c.name != "note"]
    return out


def _previous_result(ep: Episode, call: ToolCall) -> ToolResult | None:
    """The result of the identical call the step before the last (what the model reacted to by resending)."""
    key = json.dumps([call.name, call.arguments], sort_keys=True, default=repr)
    for step in reversed(ep.steps[:-1]):
        for c, r in zip(step.calls, step.results):
            if json.dumps([c.name, c.arguments], sort_keys=True, default=repr) == key:
                return r
    return None


def _unresolved(ep: Episode, kind: str) -> dict[str, tuple[int, Any]]:
    """Tool -> (step, defect) for tools whose last attempt had a defect of `kind` (no valid call came after)."""
    last: dict[str, tuple[int, Any]] = {}
    for step in ep.steps:
        bad = {d.call_id: d for d in step.defects if d.kind == kind and d.call_id is not None}
        for call in step.calls:
            if call.id in bad:
                last[call.name] = (step.index, bad[call.id])
            else:
                last.pop(call.name, None)
    return last


def _haystack(text: str) -> str:
    """Lower-cased text plus the YYYY-MM form of every "Month YYYY" it names."""
    extra = [f"{year}-{[m[:3] for m in _MONTHS].index(mon[:3].lower()) + 1:02d}" for mon, year in _MONTH_YEAR.findall(text)]
    return (text + " " + " ".join(extra)).lower()


def _ungrounded(call: ToolCall, context: str) -> str | None:
    """The first argument value found nowhere in the context, as `key=value` (or the figure), or None.

    Short strings (an id, a name, a date) must appear in the context; month names are matched in their
    YYYY-MM form too, so a correct conversion of "August 2024" counts as grounded. Longer strings and
    queries are composed, not copied, and are not checked, except an arithmetic expression: each of its
    figures (a number with decimals or of 1,000 or more) must be one the request or a result gave, to the
    precision the expression writes it. Number arguments are not checked: they are often computed or defaulted.
    """
    hay = _haystack(context)
    for key, value in call.arguments.items():
        if not isinstance(value, str) or not value.strip():
            continue
        if _ARITHMETIC.fullmatch(value) and _OPERATION.search(value):
            figures = ungrounded_figures(value, context)
            if figures:
                return f"the figure {figures[0]} in {key}"
            continue
        if len(value.split()) > _MAX_GROUNDED_WORDS or _COMPOSED.search(value):
            continue  # free text, queries: composed from the context, not copied
        if value.strip().lower() not in hay:
            return f"{key}={value!r}"
    return None


def _show(call: ToolCall) -> str:
    args = json.dumps(call.arguments, ensure_ascii=False, default=repr)
    return f"{call.name}({args if len(args) <= 80 else args[:77] + '...'})"


def _first_line(text: str, limit: int = 90) -> str:
    line = (text or "").strip().splitlines()[0] if (text or "").strip() else "(empty)"
    return line if len(line) <= limit else line[: limit - 3] + "..."
