"""`tool_name_weight` and `decision_weight`: which supervised tokens name a call's tool or open a turn, token by token,
and the loss they are weighted in."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train import synthetic_samples, tiny_config, tiny_model_dir, write_jsonl  # noqa: F401 (fixture)
from test_train_keys import episodes_and_build  # noqa: F401 (fixture)

from agentrig.errors import ConfigError, DataError
from agentrig.train.keytokens import (add_label_weights, decision_positions, figure_positions, piece_function,
                                      tool_name_positions)
from agentrig.train.packing import RowCollator, TokenizedSample, pack_rows, packing_stats


def _groups(positions: list[int]) -> list[list[int]]:
    groups: list[list[int]] = []
    for p in positions:
        if groups and groups[-1][-1] == p - 1:
            groups[-1].append(p)
        else:
            groups.append([p])
    return groups


def test_the_weighted_tokens_of_real_samples_are_exactly_their_supervised_calls_tool_names(episodes_and_build,
                                                                                          smol_tokenizer):
    """Each run of weighted positions decodes to one supervised call's tool name, in the sample's order; a tool
    named in prose ("sales_total failed ...") or in a weight-0 turn, and every unsupervised token, stay at 1."""
    _, build, samples = episodes_and_build
    rows = [json.loads(line) for line in (build / "tokenized.jsonl").read_text().splitlines()]
    by_id = {s.sample_id: s for s in samples}
    piece = piece_function(smol_tokenizer)
    prose_mentions = 0
    for row in rows:
        sample = by_id[row["sample_id"]]
        expected = [call["function"]["name"]
                    for message, weight in zip(sample.messages, sample.weights)
                    if message["role"] == "assistant" and weight > 0 for call in message.get("tool_calls") or []]
        positions = tool_name_positions(row["input_ids"], row["labels"], piece)
        assert all(row["labels"][p] != -100 for p in positions)
        names = [smol_tokenizer.decode([row["input_ids"][p] for p in group]).strip() for group in _groups(positions)]
        assert names == expected, row["sample_id"]
        prose_mentions += sum(m["role"] == "assistant" and any(n in (m.get("content") or "") for n in expected)
                              for m in sample.messages)
    assert prose_mentions > 0  # the detours and retries name tools in prose: those tokens were not weighted


def test_the_decision_tokens_of_real_samples_are_the_first_token_of_each_supervised_turn(episodes_and_build,
                                                                                       smol_tokenizer):
    """One position per supervised assistant turn, in order: the turn's first token, `<` where the turn opens
    with a call and the text's first word where it opens with a sentence or the answer; weight-0 turns have none."""
    _, build, samples = episodes_and_build
    rows = [json.loads(line) for line in (build / "tokenized.jsonl").read_text().splitlines()]
    by_id = {s.sample_id: s for s in samples}
    opens = {"call": 0, "text": 0}
    for row in rows:
        sample = by_id[row["sample_id"]]
        turns = [m for m, w in zip(sample.messages, sample.weights) if m["role"] == "assistant" and w > 0]
        positions = decision_positions(row["labels"])
        assert len(positions) == len(turns), row["sample_id"]
        for position, turn in zip(positions, turns):
            assert row["labels"][position] != -100 and row["labels"][position - 1] == -100
            first = smol_tokenizer.decode([row["input_ids"][position]])
            text = (turn.get("content") or "").strip()
            if text:
                assert text.startswith(first.strip()), (row["sample_id"], first, text[:40])
                opens["text"] += 1
            else:
                assert first == "<" and turn["tool_calls"], row["sample_id"]
                opens["call"] += 1
    assert opens["call"] > 0 and opens["text"] > 0


@pytest.mark.parametrize("text, names", [
    ('<tool_call>\n{"name": "sales_total", "arguments": {"region": "North"}}\n</tool_call>', ["sales_total"]),
    ('<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}', ["get_weather"]),  # Llama 3.1
    ('[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b_c", "arguments": {"x": 1}}]', ["a", "b_c"]),  # Mistral
    ('sales_total failed; {"name": "Ada"} is a customer, not a call.', []),  # prose and plain JSON
    # a plan opening the turn (the expert's plan_first): its items that name a called tool, then the call's name
    ('Plan: sales_total x2, calculator (the sum), answer.\n<tool_call>\n{"name": "sales_total", "arguments": {}}'
     '\n</tool_call> {"name": "calculator", "arguments": {}}', ["sales_total", "calculator", "sales_total", "calculator"]),
    ('Plan: sales_total, answer.', []),  # a plan with no call in the row names nothing that is called
    ('Checking. Plan: sales_total.\n{"name": "sales_total", "arguments": {}}', ["sales_total"]),  # not at the start
])
def test_the_names_of_calls_in_each_template_form_are_found_and_nothing_else(text, names):
    ids = [ord(c) for c in text]  # one character per token
    positions = tool_name_positions(ids, ids, chr)
    assert ["".join(text[p] for p in g) for g in _groups(positions)] == names
    assert tool_name_positions(ids, [-100] * len(ids), chr) == []  # unsupervised text is never weighted


def test_packed_rows_carry_the_weights_through_both_collations(smol_tokenizer):
    text = 'Checking.\n<tool_call>\n{"name": "sales_total", "arguments": {"region": "North"}}\n</tool_call>'
    reply = smol_tokenizer(text, add_special_tokens=False)["input_ids"]
    prompt = smol_tokenizer("Say sales_total for North.", add_special_tokens=False)["input_ids"]
    samples = [TokenizedSample(f"s{i}", prompt + reply, [-100] * len(prompt) + reply) for i in range(3)]
    rows = pack_rows(samples, max_len=3 * len(prompt + reply))
    counts = add_label_weights(rows, smol_tokenizer, 4.0)
    assert len(rows) == 1 and set(rows[0]["label_weights"]) == {1.0, 4.0}
    weighted = [i for i, w in enumerate(rows[0]["label_weights"]) if w == 4.0]
    assert [smol_tokenizer.decode([rows[0]["input_ids"][i] for i in g]).strip() for g in _groups(weighted)] \
        == ["sales_total"] * 3
    assert counts == {"key_tokens": len(weighted), "decision_tokens": 0, "figure_tokens": 0}
    both = pack_rows(samples, max_len=3 * len(prompt + reply))
    assert add_label_weights(both, smol_tokenizer, 4.0, decision_weight=3.0) == {"key_tokens": len(weighted),
                                                                                 "decision_tokens": 3,
                                                                                 "figure_tokens": 0}
    assert [smol_tokenizer.decode([both[0]["input_ids"][i]]) for i, w in enumerate(both[0]["label_weights"])
            if w == 3.0] == ["Che"] * 3  # each sample's reply opens with "Checking."
    assert packing_stats(rows, 3 * len(prompt + reply))["supervised_tokens"] == 3 * len(reply)
    short = {key: rows[0][key][:5] for key in ("input_ids", "labels", "position_ids", "label_weights")}
    for padding_free, shape in ((False, (2, len(rows[0]["input_ids"]))), (True, (1, len(rows[0]["input_ids"]) + 5))):
        batch = RowCollator(0, padding_free=padding_free)(rows + [short])
        assert tuple(batch["label_weights"].shape) == tuple(batch["labels"].shape) == shape
        assert int((batch["label_weights"] == 4.0).sum()) == len(weighted)


def test_figure_weight_is_on_the_supervised_digits_only(smol_tokenizer):
    """Every supervised token holding a digit, and nothing else: not the prompt's figures, not a tool's name."""
    prompt = smol_tokenizer("North sales in 2024-08? Use v2_sales.", add_special_tokens=False)["input_ids"]
    reply = smol_tokenizer('<tool_call>\n{"name": "v2_sales", "arguments": {"month": "2024-08"}}\n</tool_call>',
                           add_special_tokens=False)["input_ids"]
    answer = smol_tokenizer("North sold 40410.30 EUR.", add_special_tokens=False)["input_ids"]
    ids = prompt + reply + [0] + answer
    labels = [-100] * len(prompt) + reply + [-100] + answer
    rows = [{"input_ids": ids, "labels": labels, "position_ids": list(range(len(ids)))}]
    counts = add_label_weights(rows, smol_tokenizer, 5.0, decision_weight=1.0, figure_weight=3.0)
    by_weight: dict[float, str] = {}
    for t, w in zip(ids, rows[0]["label_weights"]):
        by_weight[w] = by_weight.get(w, "") + smol_tokenizer.decode([t])
    assert by_weight[3.0] == "2024084041030"  # the month sent, the total answered, digit by digit
    assert by_weight[5.0].strip() == "v2_sales"  # the tool's name keeps its own weight, its digit included
    assert counts == {"key_tokens": rows[0]["label_weights"].count(5.0), "decision_tokens": 0, "figure_tokens": 13}
    assert "2024" in smol_tokenizer.decode([t for t, w in zip(ids, rows[0]["label_weights"]) if w == 1.0])  # prompt's


def _hermes_samples(tokenizer, n: int) -> list[dict]:
    tools = ["sales_total", "find_customer", "stock_level", "exchange_rate"]
    samples = []
    for i in range(n):
        prompt = tokenizer(f"Request {i}: which tool?", add_special_tokens=False)["input_ids"]
        reply = tokenizer(f'<tool_call>\n{{"name": "{tools[i % 4]}", "arguments": {{"n": {i}}}}}\n</tool_call>',
                          add_special_tokens=False)["input_ids"]
        samples.append({"sample_id": f"s{i}", "input_ids": prompt + reply, "labels": [-100] * len(prompt) + reply})
    return samples


def _first_step_loss_by_hand(model_dir: Path, samples: list[dict], tokenizer, weight: float,
                             decision: float = 1.0, figure: float = 1.0) -> float:
    """sum(w * nll) / supervised tokens at the base model (LoRA's B starts at zero, so step 1 sees the base)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    piece = piece_function(tokenizer)
    total, count = 0.0, 0
    for s in samples:
        ids = torch.tensor([s["input_ids"]])
        with torch.no_grad():
            logps = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
        key = set(tool_name_positions(s["input_ids"], s["labels"], piece))
        first = set(decision_positions(s["labels"]))
        digits = set(figure_positions(s["input_ids"], s["labels"], piece))
        for i in range(1, len(s["input_ids"])):
            if s["labels"][i] != -100:
                w = weight if i in key else decision if i in first else figure if i in digits else 1.0
                total += -float(logps[i - 1, s["input_ids"][i]]) * w
                count += 1
    return total / count


def test_the_first_steps_loss_is_the_weighted_sum_over_the_supervised_count_and_weights_move(tmp_path,
                                                                                          tiny_model_dir,
                                                                                          smol_tokenizer):
    from agentrig.train.train import run_train

    samples = _hermes_samples(smol_tokenizer, 4)
    data = write_jsonl(tmp_path / "tokenized.jsonl", samples)
    losses = {}
    # prompt_no_grad lays the supervised tokens out in a row of its own; its log-probs keep the plain order
    for weight, no_grad, decision, figure in ((1.0, False, 1.0, 1.0), (5.0, False, 1.0, 1.0), (5.0, True, 1.0, 1.0),
                                              (1.0, False, 9.0, 1.0), (1.0, False, 1.0, 9.0)):
        result = run_train(tiny_config(tiny_model_dir, data, tmp_path / f"w{weight}{no_grad}{decision}{figure}",
                                       max_steps=2, save_steps=2, per_device_train_batch_size=4, max_seq_length=512,
                                       seed=3, bf16=False, tool_name_weight=weight, prompt_no_grad=no_grad,
                                       decision_weight=decision, figure_weight=figure))
        losses[weight, no_grad, decision, figure] = result.loss_history[0]["loss"]
        assert result.stats.get("key_tokens", 0) == (0 if weight == 1.0 else sum(
            len(tool_name_positions(s["input_ids"], s["labels"], piece_function(smol_tokenizer))) for s in samples))
        assert result.stats.get("decision_tokens", 0) == (0 if decision == 1.0 else len(samples))  # one turn each
        assert result.stats.get("figure_tokens", 0) == (0 if figure == 1.0 else len(samples))  # {"n": i}: one digit
    for (weight, _, decision, figure), loss in losses.items():
        assert loss == pytest.approx(_first_step_loss_by_hand(tiny_model_dir, samples, smol_tokenizer, weight,
                                                              decision, figure), rel=2e-3)
    assert losses[5.0, False, 1.0, 1.0] > losses[1.0, False, 1.0, 1.0] * 1.05
    assert losses[1.0, False, 9.0, 1.0] > losses[1.0, False, 1.0, 1.0] * 1.05
    assert losses[1.0, False, 1.0, 9.0] > losses[1.0, False, 1.0, 1.0] * 1.05


def test_tool_name_weight_is_refused_where_it_cannot_mean_anything(tmp_path, tiny_model_dir, smol_tokenizer):
    from agentrig.train.train import run_train
    from agentrig.train.trainconfig import config_from_dict

    with pytest.raises(ConfigError, match="tool_name_weight must be positive"):
        config_from_dict({"dataset": "d", "tool_name_weight": 0})
    with pytest.raises(ConfigError, match="stage 'dpo' has none"):
        config_from_dict({"dataset": "d", "stage": "dpo", "adapter_name_or_path": "a", "tool_name_weight": 2})
    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(4, seed=1))
    with pytest.raises(DataError, match="no supervised token names a tool"):
        run_train(tiny_config(tiny_model_dir, data, tmp_path / "out", tool_name_weight=3.0))
    with pytest.raises(ConfigError, match="decision_weight must be positive"):
        config_from_dict({"dataset": "d", "decision_weight": -1})
    with pytest.raises(ConfigError, match="stage 'dpo' has none"):
        config_from_dict({"dataset": "d", "stage": "dpo", "adapter_name_or_path": "a", "decision_weight": 2})
    with pytest.raises(ConfigError, match="figure_weight must be positive"):
        config_from_dict({"dataset": "d", "figure_weight": 0})
    prompt = smol_tokenizer("Say hello.", add_special_tokens=False)["input_ids"]
    reply = smol_tokenizer("Hello there, nice to meet you.", add_special_tokens=False)["input_ids"]
    digitless = write_jsonl(tmp_path / "digitless.jsonl", [
        {"sample_id": f"d{i}", "input_ids": prompt + reply, "labels": [-100] * len(prompt) + reply} for i in range(4)])
    with pytest.raises(DataError, match="no supervised token holds a digit"):
        run_train(tiny_config(tiny_model_dir, digitless, tmp_path / "out2", figure_weight=3.0))
