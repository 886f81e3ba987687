"""Preference pairs: shared prefix + one differing assistant step; synthetic rejected steps; output formats."""

from __future__ import annotations

import json

from test_databuild_episodes import SUCCESS, call, make_episode, recovered_episode, success_episode
from test_exports import llamafactory_accepts

from agentrig.harness import PolicyReply
from agentrig.harness.transcript import assistant_message, context_at
from agentrig.data.pairs import GIVE_UP_TEXT, Pair, build_pairs, episode_pairs, mix_pairs, synthetic_pairs
from agentrig.data.render import Renderer


def test_pair_is_shared_prefix_plus_first_differing_step():
    good = success_episode()
    longer = make_episode(["Let me check the stock.\n" + call("stock_level", sku="A-1", warehouse="main"),
                           PolicyReply(call("stock_level", sku="A-1"), weight=0.0), call("reorder", sku="A-1", qty=5),
                           "7 in stock; 5 reordered."], episode_id="detour")
    failed = make_episode([call("reorder", sku="A-1", qty=50), "Reordered."], success=False, episode_id="failed")
    pairs, skipped = episode_pairs([longer, good, failed])
    assert {p.pair_id for p in pairs} == {"t1-3-True|detour@1", "t1-3-True|failed@0"}
    for p in pairs:
        step = int(p.pair_id.rsplit("@", 1)[1])
        assert p.prompt == context_at(good, step)  # everything before is shared
        assert p.chosen == assistant_message(good.steps[step])
        assert p.chosen["role"] == p.rejected["role"] == "assistant"  # never a tool message in a completion
        assert p.kind == "episodes" and json.loads(p.tools)[0]["function"]["name"] == "stock_level"
    detour = next(p for p in pairs if "detour" in p.pair_id)
    assert json.loads(detour.rejected["tool_calls"][0]["function"]["arguments"]) == {"sku": "A-1"}


def test_no_pair_when_contexts_diverge_or_nothing_differs():
    good = success_episode()
    same_but_failed = make_episode(SUCCESS, success=False, episode_id="same")
    pairs, skipped = episode_pairs([good, same_but_failed])
    assert pairs == [] and skipped == {"no_difference": 1}
    _, skipped = episode_pairs([make_episode(SUCCESS, success=False, episode_id="only-bad")])
    assert skipped == {"no_chosen": 1}


def test_synthetic_pairs_from_chosen_steps():
    ep = recovered_episode()  # step 0 timed out (injected fault), step 1 retried
    pairs = {p.kind: p for p in synthetic_pairs(ep)}
    assert set(pairs) == {"wrong_tool", "bad_argument", "invented_result", "gave_up"}
    assert pairs["wrong_tool"].rejected["tool_calls"][0]["function"]["name"] == "reorder"
    assert json.loads(pairs["bad_argument"].rejected["tool_calls"][0]["function"]["arguments"]) == {}
    assert "<tool_response>" in pairs["invented_result"].rejected["content"]
    assert pairs["invented_result"].rejected["content"].startswith("<tool_call>\n{\"name\": \"stock_level\"")
    gave_up = pairs["gave_up"]
    assert gave_up.rejected == {"role": "assistant", "content": GIVE_UP_TEXT}
    assert gave_up.prompt == context_at(ep, 1) and gave_up.prompt[-1]["role"] == "tool"  # right after the fault
    mistyped = {p.kind: p for p in synthetic_pairs(make_episode([call("reorder", sku="A-1", qty=5), "ok"], task_id="m"))}
    assert json.loads(mistyped["bad_argument"].rejected["tool_calls"][0]["function"]["arguments"]) == {"sku": 0, "qty": 5}


def _fake_pairs(counts: dict[str, int]) -> list[Pair]:
    msg = {"role": "assistant", "content": "x"}
    return [Pair(f"{kind}-{i}", kind, [], msg, msg, "[]") for kind, n in counts.items() for i in range(n)]


def test_mix_pairs_puts_the_policys_own_pairs_first_then_synthetic_kinds_in_turn():
    pairs = _fake_pairs({"wrong_tool": 40, "episodes": 5, "bad_argument": 40, "invented_result": 3, "gave_up": 40})
    mixed = mix_pairs(pairs, 20, seed=0)
    kinds = [p.kind for p in mixed]
    assert len(mixed) == 20 and kinds.count("episodes") == 5  # every on-policy pair
    # 15 synthetic: 4 rounds over the kinds, invented_result runs out at 3
    assert {k: kinds.count(k) for k in ("wrong_tool", "bad_argument", "invented_result", "gave_up")} == {
        "wrong_tool": 4, "bad_argument": 4, "invented_result": 3, "gave_up": 4}
    assert [pairs.index(p) for p in mixed] == sorted(pairs.index(p) for p in mixed)  # file order kept
    assert mixed == mix_pairs(pairs, 20, seed=0) and mixed != mix_pairs(pairs, 20, seed=1)  # seeded
    # more on-policy pairs than the round needs: a sample of them, nothing synthetic
    assert {p.kind for p in mix_pairs(pairs, 3, seed=0)} == {"episodes"}
    assert len(mix_pairs(pairs, 1000)) == len(pairs)  # a round larger than the file takes everything


def test_pairs_render_with_the_renderer_and_export_to_llamafactory(smol_tokenizer):
    pairs, summary = build_pairs([success_episode(), recovered_episode(),
                                  make_episode([call("reorder", sku="A-1", qty=50), "Reordered."], success=False,
                                               episode_id="failed")])
    assert summary["kinds"]["episodes"] == 1 and summary["pairs"] == len(pairs)
    r = Renderer(smol_tokenizer)
    for p in pairs:
        row = p.trl()
        assert set(row) >= {"prompt", "chosen", "rejected", "tools"} and len(row["chosen"]) == len(row["rejected"]) == 1
        assert r.prompt_ids(row["prompt"]) and r.assistant_ids(row["chosen"][0])[-1] == r.eot_id
        assert r.assistant_ids(row["chosen"][0]) != r.assistant_ids(row["rejected"][0])
        lf = p.llamafactory()
        assert llamafactory_accepts(lf["conversations"], ranking=True)
        assert "tools" not in lf and "<tools>" in lf["system"]  # one tool list, in the system prompt
        assert lf["chosen"]["from"] in ("gpt", "function_call") and lf["rejected"]["from"] in ("gpt", "function_call")


def test_cli_pairs(tmp_path, capsys):
    from agentrig.cli import main
    from agentrig.harness.trajectory import write_episodes

    src = tmp_path / "e.jsonl"
    write_episodes(src, [success_episode(), make_episode([call("reorder", sku="A-1", qty=50), "Reordered."], success=False,
                                                         episode_id="failed")])
    assert main(["data", "pairs", "--in", str(src), "--out", str(tmp_path / "p.jsonl")]) == 0
    rows = [json.loads(line) for line in open(tmp_path / "p.jsonl")]
    assert rows[0]["kind"] == "episodes" and isinstance(rows[0]["tools"], str)
    assert main(["data", "pairs", "--in", str(src), "--out", str(tmp_path / "lf" / "p.jsonl"), "--format", "llamafactory"]) == 0
    info = json.loads((tmp_path / "lf" / "dataset_info.json").read_text())
    assert info["agentrig_agent_pairs"]["ranking"] is True and "tools" not in info["agentrig_agent_pairs"]["columns"]
    # --limit: the main job's mix, the real-episode pair first
    assert main(["data", "pairs", "--in", str(src), "--out", str(tmp_path / "one.jsonl"), "--limit", "2"]) == 0
    kinds = [json.loads(line)["kind"] for line in open(tmp_path / "one.jsonl")]
    assert len(kinds) == 2 and kinds.count("episodes") == 1 and len(rows) > 2
    assert main(["data", "pairs", "--in", str(src), "--out", str(tmp_path / "x.jsonl"), "--limit", "0"]) == 2
    assert "--limit must be at least 1" in capsys.readouterr().err
