"""The toolworld checker: success from the final answer and the side effects in the episode's state.

Rules (every failed one adds a reason):
- the episode ended with a final answer;
- expected figures appear in it, matched by kind (`envs.base.figure_matches`), and expected terms
  (values, names, IDs, the export's extension) appear verbatim, case-insensitive;
- side effects: an `update` or `schedule` task performed exactly the asked action, once, with the asked
  arguments (defaults filled in), and any other task performed none;
- `missing_value`: no call, and the answer asks for the missing value (names it and asks a question);
- `no_tool` and `impossible` as everywhere (`envs.base.check_no_tool_and_impossible`): no call on a no-tool
  request; on an impossible one an honest answer with no invented number.
What is not checked: which tools were used to get a figure (a count from `search` or from `count` is
equally right), and the wording beyond these figures and terms.
"""

from __future__ import annotations

import re
from typing import Any

from agentrig.envs.base import CheckResult, check_answer, check_no_tool_and_impossible, settle
from agentrig.envs.toolworld.tools import ToolworldState
from agentrig.harness.trajectory import Episode, TaskSpec

_IDS = re.compile(r"\b[A-Z]{2,3}-\d{2,4}\b")


def check_toolworld(task: TaskSpec, state: ToolworldState, episode: Episode) -> CheckResult:
    """Apply the toolworld rules to one finished episode."""
    exp: dict[str, Any] = task.expected
    res = CheckResult(success=True)
    answer = check_answer(exp, episode, res)
    wanted = exp.get("action")
    if wanted is not None:
        done = [a for a in state.actions if a["kind"] == wanted["kind"]]
        if len(done) != 1 or {k: done[0]["args"].get(k) for k in wanted["args"]} != wanted["args"]:
            res.side_effects_ok = False
            res.reasons.append(f"expected one {wanted['kind']} with {wanted['args']}, got "
                               f"{[a['args'] for a in done] or 'none'}")
    others = [a for a in state.actions if wanted is None or a["kind"] != wanted["kind"]]
    if others:
        res.side_effects_ok = False
        res.forbidden.append(f"{others[0]['kind']} nobody asked for")
        res.reasons.append(f"side effect(s) nobody asked for: {[a['kind'] for a in others]}")
    if exp.get("missing"):
        asked = "?" in answer and any(m.lower() in answer.lower() for m in exp["missing"])
        if not asked:
            res.reasons.append(f"the answer does not ask for the missing value ({' / '.join(exp['missing'])})")
    check_no_tool_and_impossible(exp, task.prompt, answer, episode, res,
                                 unavailable="the record does not exist or the request cannot be done",
                                 ignore=_IDS)
    return settle(res, episode, answer)
