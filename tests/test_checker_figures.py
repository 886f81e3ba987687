"""Checkers that never count a wrong answer right: figures are matched by kind, and every perturbation of a
right answer fails (issue 17). The right answers are the expert's, from real episodes on the real database."""

from __future__ import annotations

import copy
import re

import pytest

from agentrig.envs import load_env
from agentrig.envs.base import figure_matches, figure_spec, has_figure
from agentrig.harness import HarnessConfig, run_episode

_WRITTEN = re.compile(r"(?<![\w.])-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w])|(?<![\w.])-?\d+(?:\.\d+)?(?![\w])")


def test_figure_kinds_match_only_what_they_should():
    assert figure_matches(1991, 1991, "count") and not figure_matches(1992, 1991, "count")
    assert not figure_matches(124_999, 125_000, "count") and not figure_matches(125_000.4, 125_000, "count")
    assert figure_matches(125_000.004, 125_000.0, "money") and figure_matches(125_000, 125_000.0, "money")
    assert not figure_matches(125_000.01, 125_000.0, "money") and not figure_matches(124_980.01, 125_000.0, "money")
    assert figure_matches(12.3, 12.34, "approx", tol=0.05) and not figure_matches(12.4, 12.34, "approx", tol=0.05)
    assert not figure_matches(12.0, 12.34, "approx", tol=0.05)
    assert figure_matches(3.14159, 3.14) and not figure_matches(3.15, 3.14) and not figure_matches(3, 3.14)
    assert has_figure("about 1,234.50 EUR", 1234.5, "money") and not has_figure("about 1,243.50 EUR", 1234.5, "money")
    with pytest.raises(ValueError, match="tolerance"):
        figure_matches(1.0, 1.0, "approx")
    with pytest.raises(ValueError, match="unknown figure kind"):
        figure_spec({"value": 1, "kind": "roughly"})
    assert figure_spec(7) == (7.0, "exact", None)


@pytest.fixture(scope="module")
def solved():
    """Expert episodes (no faults) of every test task with a figure, each with its env state; all succeed."""
    env = load_env("datadesk")
    out = []
    for task in env.tasks("test", 120, seed=11):
        exp = task.expected
        if not exp.get("figures") and not exp.get("report"):
            continue
        tools, state = env.setup(task)
        ep = run_episode(task, tools, env.expert(), HarnessConfig(), episode_id=task.id)
        res = env.check(task, state, ep)
        assert res.success, (task.id, task.prompt, ep.final_answer, res.reasons)
        out.append((env, task, state, ep))
    families = {t.family for _, t, _, _ in out}
    assert {"single_lookup", "chained_lookup", "currency_aggregation", "comparison", "report", "arithmetic",
            "long_task", "sql_query"} <= families, families
    return out


def _fmt_like(written: str, value: float, kind: str) -> str:
    """`value` written the way `written` is (thousands separators, decimals: at least cents but for counts)."""
    decimals = 0 if kind == "count" else max(2, len(written.split(".")[1]) if "." in written else 0)
    text = f"{value:,.{decimals}f}" if "," in written else f"{value:.{decimals}f}"
    return text


def _perturbations(value: float, kind: str, tol: float | None) -> list[float]:
    if kind == "count":
        return [value + 1, value - 1, value + 10]
    if kind == "money":
        return [value + 0.01, value - 0.01, value + 4.0, value - 1.0]  # a cent, the cheapest item, a unit
    step = 2 * (tol or 0.0) + 0.01
    return [value + step, value - step]


def _swapped(written: str) -> str | None:
    """The written number with its first pair of adjacent distinct digits swapped (12,345 -> 21,345)."""
    chars = list(written)
    digits = [i for i, c in enumerate(chars) if c.isdigit()]
    for a, b in zip(digits, digits[1:]):
        if b == a + 1 and chars[a] != chars[b]:
            chars[a], chars[b] = chars[b], chars[a]
            return "".join(chars)
    return None


def _written_forms(text: str, value: float, kind: str, tol: float | None) -> list[re.Match[str]]:
    return [m for m in _WRITTEN.finditer(text) if figure_matches(float(m.group(0).replace(",", "")), value, kind, tol)]


def _recheck(env, task, state, ep, answer=None, body=None):
    ep2 = copy.copy(ep)
    if answer is not None:
        ep2.final_answer = answer
    st = state
    if body is not None:
        st = copy.copy(state)
        st.reports = [copy.copy(r) for r in state.reports]
        st.reports[0].body = body
    return env.check(task, st, ep2)


def test_every_perturbation_of_a_right_answer_fails(solved):
    tried = accepted = 0
    others: dict[str, list[float]] = {}
    for _, task, _, _ in solved:
        for f in task.expected.get("figures", []):
            others.setdefault(task.family, []).append(figure_spec(f)[0])
    for env, task, state, ep in solved:
        exp = task.expected
        targets = [("answer", f) for f in exp.get("figures", [])]
        targets += [("body", f) for f in (exp.get("report") or {}).get("figures", [])]
        for where, fig in targets:
            value, kind, tol = figure_spec(fig)
            text = ep.final_answer if where == "answer" else state.reports[0].body
            forms = _written_forms(text, value, kind, tol)
            assert forms, (task.id, text, fig)
            wrong = [_fmt_like(forms[0].group(0), p, kind) for p in _perturbations(value, kind, tol)]
            swapped = _swapped(forms[0].group(0))
            if swapped is not None and not figure_matches(float(swapped.replace(",", "")), value, kind, tol):
                wrong.append(swapped)
            # the right figure of another task of the same family (the right number for the wrong entity)
            wrong += [_fmt_like(forms[0].group(0), o, kind) for o in others.get(task.family, [])
                      if not figure_matches(o, value, kind, tol)][:2]
            for w in wrong:
                new = text
                for m in reversed(forms):  # every place the right figure is written
                    new = new[:m.start()] + w + new[m.end():]
                res = (_recheck(env, task, state, ep, answer=new) if where == "answer"
                       else _recheck(env, task, state, ep, body=new))
                tried += 1
                accepted += res.success
                assert not res.success, (task.id, kind, text, "->", new)
            # the same right figure written another way still passes
            plain = f"{value:.2f}" if kind != "count" else str(int(value))
            new = text
            for m in reversed(forms):
                new = new[:m.start()] + plain + new[m.end():]
            res = (_recheck(env, task, state, ep, answer=new) if where == "answer"
                   else _recheck(env, task, state, ep, body=new))
            assert res.success, (task.id, new, res.reasons)
    assert tried >= 150 and accepted == 0, (tried, accepted)


def test_a_comparison_that_names_the_wrong_winner_fails(solved):
    env, task, state, ep = next(s for s in solved if s[1].family == "comparison")
    winner, loser = task.expected["winner"], next(c for c in task.expected["candidates"] if c != task.expected["winner"])
    a, b = (figure_spec(f)[0] for f in task.expected["figures"])
    answer = f"{loser} was higher ({a:,.2f} vs {b:,.2f}); {winner} came second."
    assert not _recheck(env, task, state, ep, answer=answer).success


def test_a_right_count_without_its_look_up_fails():
    """A count is a small integer a model can guess: the tool it comes from (or run_sql) must have answered."""
    from agentrig.harness.trajectory import Step, ToolCall, ToolResult

    env = load_env("datadesk")
    task = next(t for t in env.tasks("test_unseen_tools", 40) if t.metadata["variant"] == "open_count")
    tools, state = env.setup(task)
    ep = run_episode(task, tools, env.expert(), HarnessConfig(), episode_id=task.id)
    assert env.check(task, state, ep).success, ep.final_answer
    called = {c.name for s in ep.steps for c in s.calls}
    assert "list_tickets" in called

    def episode(*calls: tuple[str, bool]):
        guess = copy.deepcopy(ep)
        step = Step(index=0, raw_output="", text="")
        for i, (name, ok) in enumerate(calls):
            step.calls.append(ToolCall(f"c{i}", name, {}))
            step.results.append(ToolResult(f"c{i}", name, "{}", ok=ok))
        guess.steps = [step, Step(index=1, raw_output=ep.final_answer, text=ep.final_answer, is_final=True)]
        return guess

    only_customer = env.check(task, state, episode(("find_customer", True)))
    assert not only_customer.success and not only_customer.figures_ok
    assert any("not looked up" in r and "list_tickets" in r for r in only_customer.reasons), only_customer.reasons
    assert not env.check(task, state, episode(("find_customer", True), ("list_tickets", False))).success
    assert env.check(task, state, episode(("find_customer", True), ("list_tickets", True))).success
    assert env.check(task, state, episode(("run_sql", True))).success
