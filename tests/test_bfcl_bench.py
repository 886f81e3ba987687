"""`agentrig bench bfcl` through the harness: an oracle policy scores 100%, outputs and the CLI behave."""

from __future__ import annotations

import json

import pytest

from agentrig import cli
from agentrig.bfcl import data
from agentrig.bfcl.bench import BenchConfig, run_bfcl
from agentrig.bfcl.checker import reference_calls
from agentrig.bfcl.multi_turn import BackendSession, parse_call
from agentrig.bfcl.report import PUBLISHED_LABEL, wilson_interval
from agentrig.harness import ScriptedPolicy
from agentrig.harness.protocol import get_protocol
from agentrig.harness.trajectory import ToolCall

HERMES = get_protocol("hermes")
LIMIT = 6


class OraclePolicy:
    """Answers every entry with its ground truth in Hermes format, then replies "Done." (per turn)."""

    def __init__(self, entries: dict[str, list[data.BfclEntry]]):
        self.by_id = {e.id: e for group in entries.values() for e in group}
        self.requests = []

    def generate(self, request):
        self.requests.append(request)
        entry = self.by_id[request.task.metadata["bfcl_id"]]
        if request.step > 0:
            return "Done."
        if not entry.is_multi_turn:
            calls = reference_calls(entry.functions, entry.answer) if entry.answer else []
        else:
            session = BackendSession(entry.involved_classes, entry.initial_config)
            texts = entry.answer[request.task.metadata["turn"]]
            calls = [ToolCall(f"c{i}", c.name, c.kwargs) for i, c in enumerate(session.as_keywords(parse_call(t)) for t in texts)]
        return HERMES.format_calls(calls) if calls else "None of the tools can do that."


@pytest.fixture(scope="module")
def sample():
    return {c: data.load_category(c, LIMIT) for c in data.CATEGORIES}


def test_oracle_through_the_harness_scores_100_percent_everywhere(sample, tmp_path):
    policy = OraclePolicy(sample)
    result = run_bfcl(BenchConfig(model="oracle", out=tmp_path, limit=LIMIT), policy, sample)
    assert [(s.category, s.n, s.correct) for s in result.scores] == [(c, LIMIT, LIMIT) for c in data.CATEGORIES]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["categories"]["parallel"]["accuracy"] == 1.0
    assert results["published"]["label"] == PUBLISHED_LABEL
    assert results["published"]["figures"]["Qwen3-0.6B"]["simple_python"] == "86.5"
    report = (tmp_path / "report.md").read_text()
    assert PUBLISHED_LABEL in report and "| multi_turn_base | 6 | 6 | 100.0 |" in report
    assert len((tmp_path / "episodes.jsonl").read_text().splitlines()) == 6 * LIMIT + sum(len(e.turns) for e in sample["multi_turn_base"])


def test_multi_turn_context_carries_earlier_turns(sample, tmp_path):
    entry = sample["multi_turn_base"][0]
    policy = OraclePolicy({"multi_turn_base": [entry]})
    run_bfcl(BenchConfig(model="oracle", out=tmp_path, categories=["multi_turn_base"]), policy, {"multi_turn_base": [entry]})
    turn1 = next(r for r in policy.requests if r.task.metadata["turn"] == 1 and r.step == 0)
    roles = [m["role"] for m in turn1.messages]
    assert roles[:3] == ["system", "user", "assistant"] and roles[-1] == "user"
    assert turn1.messages[1]["content"] == entry.turns[0][0]["content"]
    assert turn1.messages[-1]["content"] == entry.turns[1][0]["content"]
    tool_texts = [m["content"] for m in turn1.messages if m["role"] == "tool"]
    assert len(tool_texts) == len(entry.answer[0]) and "current_working_directory" in tool_texts[0]
    assert [t["function"]["name"] for t in turn1.tools if t["function"]["name"] == "note"] == []


def test_a_policy_that_never_calls_passes_only_irrelevance(sample, tmp_path):
    result = run_bfcl(BenchConfig(model="silent", out=tmp_path, limit=LIMIT), lambda request: "I cannot help.", sample)
    assert {s.category: s.correct for s in result.scores} == {c: (LIMIT if c == "irrelevance" else 0) for c in data.CATEGORIES}


def test_parallel_calls_scored_on_the_first_response_and_on_the_whole_episode(sample, tmp_path):
    """The scripted policy answers parallel entries with every call in one turn (several <tool_call> blocks),
    with one call per step, one call short, or every call in one turn and then one of them again. BFCL's verdict
    reads the first response (one_turn and resend pass); the whole episode's reads every call (one_turn and
    one_per_step pass)."""
    categories = ["parallel", "parallel_multiple"]
    modes = ["one_turn", "one_per_step", "one_short", "resend"]
    passes = {"one_turn": (True, True), "one_per_step": (False, True), "one_short": (False, False),
              "resend": (True, False)}
    entries = {c: sample[c] for c in categories}
    script, mode_of, expected = {}, {}, {}
    for i, entry in enumerate(e for c in categories for e in entries[c]):
        calls = reference_calls(entry.functions, entry.answer)
        assert len(calls) >= 2, entry.id
        mode_of[entry.id] = mode = modes[i % len(modes)]
        steps = {"one_turn": [calls], "one_per_step": [[c] for c in calls], "one_short": [calls[:-1]],
                 "resend": [calls, calls[:1]]}[mode]
        script[entry.id] = [HERMES.format_calls(step) for step in steps] + ["Done."]
        expected[entry.id] = [[{"name": c.name, "arguments": c.arguments} for c in step] for step in steps]
    result = run_bfcl(BenchConfig(model="scripted", out=tmp_path, categories=categories), ScriptedPolicy(script),
                      entries)

    for outcome in result.outcomes:
        mode = mode_of[outcome.id]
        assert outcome.calls == [expected[outcome.id]], outcome.id  # one turn; its steps as the policy wrote them
        (episode,) = outcome.episodes
        assert [len(s.calls) for s in episode.steps] == [len(step) for step in expected[outcome.id]] + [0]
        assert [len(s.results) for s in episode.steps[:-1]] == [len(step) for step in expected[outcome.id]]
        assert (outcome.valid, outcome.episode_valid) == passes[mode], (outcome.id, mode, outcome.error)
        if not outcome.valid:
            assert outcome.error_type == "wrong_count", outcome.id
        if mode == "resend":
            assert outcome.episode_error_type == "wrong_count", outcome.id
    results = json.loads((tmp_path / "results.json").read_text())
    for category in categories:
        n = len(entries[category])
        first = sum(passes[mode_of[e.id]][0] for e in entries[category])
        whole = sum(passes[mode_of[e.id]][1] for e in entries[category])
        assert results["categories"][category]["accuracy"] == pytest.approx(first / n)
        assert results["categories"][category]["episode"]["accuracy"] == pytest.approx(whole / n)
        row = next(line for line in (tmp_path / "report.md").read_text().splitlines() if line.startswith(f"| {category} |"))
        assert row.endswith(f"| {100 * whole / n:.1f} |") and f"| {n} | {first} |" in row
    assert {m for m in mode_of.values()} == set(modes)
    by_id = {r["id"]: r for r in results["entries"]}
    assert all((by_id[i]["valid"], by_id[i]["episode_valid"]) == passes[m] for i, m in mode_of.items())


def test_wilson_interval():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    low, high = wilson_interval(10, 20)
    assert low == pytest.approx(0.2993, abs=1e-3) and high == pytest.approx(0.7007, abs=1e-3)
    assert wilson_interval(20, 20)[1] == 1.0 and wilson_interval(0, 20)[0] == 0.0


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--categories", "simple_rust"], "--categories: unknown simple_rust"),
        (["--limit", "0"], "--limit must be at least 1"),
        (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1"),
        (["--adapter", "/nonexistent/adapter"], "not a PEFT adapter folder"),
    ],
)
def test_cli_user_errors_exit_2_with_a_message(tmp_path, capsys, argv, message):
    code = cli.main(["bench", "bfcl", "--model", "smollm2-135m", "--out", str(tmp_path), *argv])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_cli_requires_the_benchmark_name(tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["bench", "--model", "smollm2-135m", "--out", str(tmp_path)])


@pytest.mark.slow
def test_default_model_runs_end_to_end(tmp_path):
    # The base model rambles to the token limit at every step now that a turn runs to its end (several calls
    # may follow one another), so the smoke run keeps steps short.
    code = cli.main(["bench", "bfcl", "--model", "smollm2-135m", "--limit", "2", "--max-new-tokens", "48", "--out", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "results.json").read_text())
    assert set(results["categories"]) == set(data.CATEGORIES)
    assert all(results["categories"][c]["n"] == 2 for c in data.CATEGORIES)
    assert json.loads((tmp_path / "config.json").read_text())["max_new_tokens"] == 48
