"""What the policy may generate and what it is fed, checked against the training data itself.

Teacher episodes (datadesk and toolworld: injected faults, detours, parallel calls, datadesk's memory notes) are turned into training
samples exactly as `agentrig data build` does; then
- every supervised assistant turn, replayed token by token through `HFPolicy`'s stopping rules, runs to its
  own end-of-turn token and decodes to the same text (so the turns training teaches, several tool calls
  included, are turns the policy can produce);
- the token ids `HFPolicy` feeds the model at step i (the plain path's `generate` input, and the ids the
  prefix cache holds keys/values for) equal the training sample's tokens before that step's turn.
"""

from __future__ import annotations

import pytest

from agentrig.data.collect import CollectConfig, run_collect
from agentrig.harness import PolicyRequest
from agentrig.harness.transcript import context_at
from agentrig.data.samples import episode_samples
from agentrig.harness.trajectory import read_episodes


@pytest.fixture(scope="module", params=["datadesk", "toolworld"])
def teacher_episodes(tmp_path_factory, request):
    out = tmp_path_factory.mktemp("replay") / "train.jsonl"
    datadesk = request.param == "datadesk"
    run_collect(CollectConfig(env=request.param, episodes=40 if datadesk else 60, faults=0.25, detours=0.2,
                              rename=0.2 if datadesk else 0.0, seed=3, out=str(out)), progress=False)
    episodes = read_episodes(out)
    assert any(len(s.calls) > 1 for e in episodes for s in e.steps), "the fixture must hold parallel calls"
    if datadesk:
        assert any(e.memory_events for e in episodes), "the fixture must hold memory compressions"
    return episodes


def _samples(episodes, renderer):
    """(episode, step index, training prompt ids, generated ids) for every assistant turn of every sample."""
    for ep in episodes:
        for sample, steps in episode_samples(ep, "success", context_at=context_at):
            rendered = renderer.sample_turns(sample.messages, sample.weights)
            by_message = {k: (start, end) for k, start, end in rendered.turns}
            offset = len(context_at(ep, steps[0])) - ep.metadata["step_message_index"][steps[0]]
            for i in steps:
                start, end = by_message[ep.metadata["step_message_index"][i] + offset]
                yield ep, i, rendered.input_ids[:start], rendered.input_ids[start:end]


def test_every_trained_turn_survives_the_stopping_rules(teacher_episodes, tiny_model, smol_tokenizer):
    from agentrig.policies.hf_policy import HFPolicy

    policy = HFPolicy(tiny_model, smol_tokenizer)
    turns = parallel = 0
    for ep, i, _, generated in _samples(teacher_episodes, policy.renderer):
        stops = [j for j in range(1, len(generated) + 1) if policy.finished(generated[:j])]
        assert stops and stops[0] == len(generated), f"{ep.episode_id} step {i} would stop at token {stops[:1]}"
        text, used = policy.reply_text(generated)
        assert text == ep.steps[i].raw_output and used == len(generated)
        turns += 1
        parallel += len(ep.steps[i].calls) > 1
    assert turns > 100 and parallel > 5


def test_a_self_written_tool_response_still_stops_the_reply(tiny_model, smol_tokenizer):
    from agentrig.policies.hf_policy import HFPolicy

    policy = HFPolicy(tiny_model, smol_tokenizer)
    ids = smol_tokenizer.encode('<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_response>\n{"x": 1}',
                                add_special_tokens=False)
    stop = next(j for j in range(1, len(ids) + 1) if policy.finished(ids[:j]))
    assert policy.reply_text(ids[:stop])[0].endswith("</tool_call>\n<tool_response>")


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_the_ids_fed_at_each_step_are_the_training_prompt(teacher_episodes, tiny_model, smol_tokenizer, prefix_cache):
    from agentrig.policies.hf_policy import HFPolicy

    policy = HFPolicy(tiny_model, smol_tokenizer, max_new_tokens=2, prefix_cache=prefix_cache)
    fed: list[list[int]] = []
    generate = policy.model.generate

    def recording_generate(input_ids, attention_mask, **kwargs):
        fed.extend([ids[mask.bool()].tolist() for ids, mask in zip(input_ids, attention_mask)])
        return generate(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    policy.model.generate = recording_generate
    checked = 0
    for ep, i, prompt, _ in list(_samples(teacher_episodes, policy.renderer))[:40]:
        request = PolicyRequest(context_at(ep, i), ep.tools, ep.task, i, ep.episode_id)
        policy.generate_batch([request])
        if prefix_cache:
            held = policy._prefixes[(ep.episode_id, "base")].ids  # what the cache computed keys/values for
            assert held[: len(prompt)] == prompt and len(held) >= len(prompt)
        else:
            assert fed[-1] == prompt
        checked += 1
    assert checked == 40
