"""`build_dataset` and `agentrig data build`: cleaning, windows, token-for-token checks, outputs, bad input."""

from __future__ import annotations

import json

import pytest
from test_databuild_episodes import (SUCCESS, call, detour_episode, long_episode, make_episode, note_episode,
                                     parallel_episode, recovered_episode, success_episode)

from agentrig.data.databuild import build_dataset
from agentrig.errors import DataError
from agentrig.harness.transcript import assistant_message, context_at
from agentrig.data.render import IGNORE_INDEX, Renderer
from agentrig.harness.trajectory import dumps_episode, write_episodes


@pytest.fixture(scope="module")
def renderer(smol_tokenizer):
    return Renderer(smol_tokenizer)


def rows(path):
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def build(tmp_path, renderer, episodes, **kw):
    src = tmp_path / "e.jsonl"
    write_episodes(src, episodes)
    return build_dataset(src, tmp_path / "out", renderer=renderer, **kw), tmp_path / "out"


def test_every_turn_equals_the_inference_path_literally(tmp_path, renderer):
    episodes = [success_episode(), recovered_episode(), detour_episode(), parallel_episode(), note_episode()]
    by_id = {e.episode_id: e for e in episodes}
    report, out = build(tmp_path, renderer, episodes)
    samples, tokenized = rows(out / "samples.jsonl"), rows(out / "tokenized.jsonl")
    assert report.samples == len(samples) == len(tokenized) == 6  # the note episode gives two windows
    for s, t in zip(samples, tokenized):
        assert s["sample_id"] == t["sample_id"]
        ep = by_id[s["metadata"]["episode_id"]]
        ids, labels = t["input_ids"], t["labels"]
        pos = 0
        for i in s["metadata"]["window_steps"]:
            prompt = renderer.prompt_ids(context_at(ep, i))  # what the harness shows the model at step i
            gen = renderer.assistant_ids(assistant_message(ep.steps[i]))  # what the policy must generate
            assert ids[: len(prompt)] == prompt
            assert ids[len(prompt): len(prompt) + len(gen)] == gen
            assert gen[-1] == renderer.eot_id
            want = gen if ep.steps[i].weight > 0 else [IGNORE_INDEX] * len(gen)
            assert labels[len(prompt): len(prompt) + len(gen)] == want
            assert all(x == IGNORE_INDEX for x in labels[pos: len(prompt)])  # system, user, tool, earlier turns' glue
            pos = len(prompt) + len(gen)
        assert pos == len(ids)


def test_cleaning_reasons_are_counted(tmp_path, renderer):
    failed = make_episode(SUCCESS, task_id="f", success=False, episode_id="failed")
    unverified = make_episode(SUCCESS, task_id="u", success=None, episode_id="unverified")
    honest = make_episode(["The stock service is down, so I cannot check A-1."], task_id="h", success=False,
                          episode_id="honest", label="honest_failure")
    mismatched = success_episode(episode_id="mismatch")
    mismatched.messages_full[3]["tool_call_id"] = "someone_else"
    shuffled = success_episode(episode_id="shuffled", prompt="A-1 stock?")  # a foreign episode: arguments not in schema order, odd spacing
    shuffled.messages_full[2]["tool_calls"][0]["function"]["arguments"] = '{"warehouse":"main","sku":"A-1"}'
    report, out = build(tmp_path, renderer, [success_episode(), success_episode(), failed, unverified, honest, mismatched,
                                             shuffled, detour_episode()])
    assert report.dropped == {"duplicate": 1, "failed": 1, "unverified": 1, "results_mismatch": 1}
    assert report.kept == {"success": 3, "honest_failure": 1}
    assert report.calls_normalized == 1
    norm = next(s for s in rows(out / "samples.jsonl") if s["sample_id"] == "shuffled")
    assert norm["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"sku": "A-1", "warehouse": "main"}'
    card = json.loads((out / "data_card.json").read_text())
    assert card["masks"]["assistant_turns"]["masked_weight_0"] == 1
    assert json.loads((out / "build_report.json").read_text())["dropped"]["duplicate"] == 1


def _renumber_calls(episode, prefix):
    """The same episode with other tool-call ids (as a window starting at another step has): nothing rendered changes."""
    for m in episode.messages_full:
        for c in m.get("tool_calls") or []:
            c["id"] = prefix + c["id"]
        if m["role"] == "tool":
            m["tool_call_id"] = prefix + m["tool_call_id"]
    for step in episode.steps:
        for c in step.calls:
            c.id = prefix + c.id
        for r in step.results:
            r.call_id = prefix + r.call_id
    return episode


def test_duplicates_are_found_by_their_tokens_and_ids_stay_unique(tmp_path, renderer):
    same_tokens = _renumber_calls(success_episode(episode_id="again"), "x")  # other ids, other episode id
    assert same_tokens.messages_full[2]["tool_calls"][0]["id"] != success_episode().messages_full[2]["tool_calls"][0]["id"]
    other_text = success_episode(prompt="How many A-1 do we hold?")  # the same episode id as the first, new content
    report, out = build(tmp_path, renderer, [success_episode(), same_tokens, other_text, other_text])
    assert report.dropped == {"duplicate": 2}
    ids = [s["sample_id"] for s in rows(out / "samples.jsonl")]
    assert ids == [success_episode().episode_id, success_episode().episode_id + "#2"]
    assert [t["sample_id"] for t in rows(out / "tokenized.jsonl")] == ids
    assert report.sample_ids_renamed == 1
    tokens = [t["input_ids"] for t in rows(out / "tokenized.jsonl")]
    assert tokens[0] != tokens[1]


def test_bfcl_questions_are_refused(tmp_path, renderer):
    from agentrig.bfcl.data import bfcl_questions

    question = sorted(bfcl_questions())[0]
    ep = make_episode(["I cannot answer that."], task_id="b", prompt=question, episode_id="bfcl")
    report, _ = build(tmp_path, renderer, [ep, success_episode()])
    assert report.dropped == {"bfcl_contamination": 1} and report.samples == 1 and report.bfcl_check == "on"


def test_samples_offering_a_bfcl_function_are_refused(tmp_path, renderer):
    """A tool with a BFCL function's name and parameters is contamination; the same name with other
    parameters (a user's own `get_weather`, say) is not."""
    from agentrig.bfcl.data import load_category

    fn = load_category("simple_python", limit=1)[0].functions[0]
    copied, own = success_episode(), success_episode()
    own.episode_id += "-own"
    copied.tools = copied.tools + [{"type": "function", "function": fn}]
    own.tools = own.tools + [{"type": "function", "function": {**fn, "parameters": {"type": "object", "properties": {}}}}]
    report, _ = build(tmp_path, renderer, [copied, own])
    assert report.dropped == {"bfcl_contamination": 1} and report.samples == 1


def test_long_episodes_become_windows_made_by_the_harness_memory(tmp_path, renderer):
    ep = long_episode()
    report, out = build(tmp_path, renderer, [ep], max_seq_length=800)
    assert report.episodes_windowed == 1
    samples, tokenized = rows(out / "samples.jsonl"), rows(out / "tokenized.jsonl")
    assert len(samples) > 1 and all(len(t["input_ids"]) <= 800 for t in tokenized)
    steps = [i for s in samples for i in s["metadata"]["window_steps"]]
    assert steps == list(range(len(ep.steps)))  # every step trained exactly once
    later = samples[1]["messages"]
    assert "Memory (finished sub-goals):\n- stock_level(" in later[0]["content"]
    assert later[2]["role"] == "assistant"  # recent turns verbatim after the task


def test_a_turn_too_long_for_the_limit_fails_naming_the_sample(tmp_path, renderer):
    from agentrig.data.databuild import BuildCheckError

    with pytest.raises(BuildCheckError, match="t5-9-True#w.* tokens after windowing"):
        build(tmp_path, renderer, [long_episode()], max_seq_length=600)


def _drops_text_of_earlier_parallel_turns(template: str) -> str:
    """A template like those that drop reasoning from earlier turns: an assistant turn with several calls
    loses its text once a later message follows, so the turn the policy generated is not what later prompts
    show."""
    line = "{%- set content = message['content'] if message['content'] is not none else '' -%}"
    assert template.count(line) == 1
    return template.replace(line, line + "{%- if message['role'] == 'assistant' and not loop.last and "
                            "message['tool_calls'] and message['tool_calls'] | length > 1 -%}"
                            "{%- set content = '' -%}{%- endif -%}")


@pytest.mark.parametrize("how, why", [
    ("template", r"message 5: the inference prompt differs from the training tokens at token \d+"),
    ("policy_message", "the tokens of step 0 differ from what the policy generates"),
], ids=["template", "policy_message"])
def test_a_turn_that_renders_differently_fails_naming_the_sample(tmp_path, smol_tokenizer, monkeypatch, how, why):
    """Only the parallel episode's first turn renders differently: the build stops naming that sample, writes nothing."""
    import agentrig.harness.transcript as transcript
    from agentrig.data.databuild import BuildCheckError

    renderer = Renderer(smol_tokenizer)
    if how == "template":
        renderer = Renderer(smol_tokenizer, chat_template=_drops_text_of_earlier_parallel_turns(renderer.chat_template))
    else:  # the step's message, as the policy wrote it, is not the one the transcript recorded (calls reordered)
        real = transcript.assistant_message

        def assistant_message(step, protocol="hermes"):
            message = real(step, protocol)
            if len(message.get("tool_calls", [])) > 1:
                message["tool_calls"] = message["tool_calls"][::-1]
            return message

        monkeypatch.setattr(transcript, "assistant_message", assistant_message)
    episodes = [success_episode(), recovered_episode(), parallel_episode(), detour_episode()]
    with pytest.raises(BuildCheckError, match=f"^sample {parallel_episode().episode_id}: {why}"):
        build(tmp_path, renderer, episodes)
    assert not (tmp_path / "out" / "tokenized.jsonl").exists()


@pytest.mark.parametrize("line, why", [
    ("{not json", "Expecting property name"),
    (json.dumps({"schema_version": 99}), "unknown episode schema version 99"),
    ("BROKEN_MESSAGES", "message 2 has role 'robot'"),
    ("BAD_TOOLS", "'tools' is not valid JSON"),
    (json.dumps({"kind": "sample", "schema_version": 1, "sample_id": "x", "messages": [{"role": "user", "content": "hi"}],
                 "tools": "[{", "weights": [0]}), "'tools' is not valid JSON"),
])
def test_bad_lines_name_file_and_line(tmp_path, renderer, line, why):
    good = dumps_episode(success_episode())
    if line == "BROKEN_MESSAGES":
        d = json.loads(good)
        d["messages_full"][2]["role"] = "robot"
        line = json.dumps(d)
    elif line == "BAD_TOOLS":
        d = json.loads(good)
        d["tools"] = "[{broken"
        line = json.dumps(d)
    src = tmp_path / "e.jsonl"
    src.write_text(good + "\n" + line + "\n")
    with pytest.raises(DataError, match=f"e.jsonl:2: .*{why}"):
        build_dataset(src, tmp_path / "out", renderer=renderer)
    report = build_dataset(src, tmp_path / "out", renderer=renderer, skip_bad=True)
    assert report.lines_skipped == 1 and report.samples == 1 and "e.jsonl:2" in report.skipped[0]


def test_cli_build_and_bad_input_without_traceback(tmp_path, capsys, smol_tokenizer):
    from agentrig.cli import main

    src = tmp_path / "e.jsonl"
    write_episodes(src, [success_episode(), parallel_episode()])
    assert main(["data", "build", "--in", str(src), "--out", str(tmp_path / "out"), "--format", "openai"]) == 0
    assert (tmp_path / "out" / "exports" / "openai" / "train.jsonl").exists()
    assert main(["data", "inspect", str(tmp_path / "out"), "--n", "1"]) == 0
    assert "supervised (green)" in capsys.readouterr().out
    with open(src, "a") as fh:
        fh.write("{oops\n")
    assert main(["data", "build", "--in", str(src), "--out", str(tmp_path / "o2")]) == 2
    err = capsys.readouterr().err
    assert "e.jsonl:3:" in err and "Traceback" not in err
    assert main(["data", "build", "--in", str(src), "--out", str(tmp_path / "o3"), "--skip-bad"]) == 0
    assert json.loads((tmp_path / "o3" / "build_report.json").read_text())["lines_skipped"] == 1


def test_canonical_samples_are_accepted_as_input(tmp_path, renderer):
    report, out = build(tmp_path, renderer, [parallel_episode()])
    report2 = build_dataset(out / "samples.jsonl", tmp_path / "again", renderer=renderer)
    assert report2.kept == {"sample": 1}
    assert rows(tmp_path / "again" / "tokenized.jsonl") == rows(out / "tokenized.jsonl")


def test_import_datacli_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, agentrig.data.datacli, agentrig.data.databuild, agentrig.data.pairs, agentrig.data.exports; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_calls_written_by_the_model_out_of_order_are_canonical(tmp_path, renderer):
    ep = make_episode([call("reorder", qty=5, sku="A-1"), "Done."], task_id="o")
    report, out = build(tmp_path, renderer, [ep])
    text = renderer.tokenizer.decode(rows(out / "tokenized.jsonl")[0]["input_ids"])
    assert '{"name": "reorder", "arguments": {"sku": "A-1", "qty": 5}}' in text
