"""Key-token loss weights: a call's tool name counts `tool_name_weight` times, a turn's first token `decision_weight`,
a digit `figure_weight`.

In an agent's SFT sample the choice of tool is a handful of tokens (`"name": "sales_total"` is 4 of SmolLM2's
tokens) among the ~200 supervised ones of the call's JSON, the retry sentences and the answer, so under the plain
mean its gradient is a few percent of a step's, while choosing a tool the request does not need is the adapter's
most frequent failure (`wrong_tool`, docs/evaluation.md). TL-Training (Ye et al., EMNLP Findings 2025) measured
that token importance in tool-use SFT is that uneven and reweights the key tokens; `tool_name_weight` is the
narrow, fixed form of that: every supervised token whose text overlaps the `"name"` value of a tool call's JSON
(`{"name": ..., "arguments": ...}`; `"parameters"` in Llama 3.1's form) is weighted `w` in the loss, the others 1,
and the sum is still divided by the number of supervised tokens, so `w = 1` is exactly the plain loss and the other
tokens' gradients are unchanged.

`decision_weight` weights the other key token of a turn the same way: the first supervised token of each assistant
turn, where the model chooses between calling a tool (`<`, the start of `<tool_call>`), a recovery sentence
("sales_total failed ...") and the final answer. Answering before a needed call (the calculator's percent change
written from memory, a customer's orders never listed) is one of the adapter's frequent failures, and that choice is
one token of the ~66 a turn supervises in the main job's data. A turn is a maximal run of supervised tokens (the
tool results and the role headers between turns are never supervised), so the run's first position is the turn's
first token.

`figure_weight` weights the supervised tokens that hold a digit: the figures a call's arguments and the answer
copy from the request and the tool results (a month, a customer id, a total, a rate, a calculator expression's
operands). A figure copied wrong or bound to the wrong region (`answer_figure`, `wrong_value`) is the adapter's
other frequent failure, and SmolLM2's tokenizer writes one token per digit, so they are about a fifth of the main
job's supervised tokens. A tool name or a turn's first token keeps its own weight.

The tool names are found in the token ids themselves, not by tokenizing again: each supervised run of tokens is
decoded piece by piece, the call pattern is matched in the joined pieces, and the tokens under a matched name get
the weight; a tool named in prose ("sales_total failed ...") is not a call and keeps weight 1. A plan that opens
the turn ("Plan: sales_total x2, calculator (the percent change), answer.", the expert's `plan_first`) chooses
the tools before the calls copy them, so its items that name a tool called in the row (this turn or a later one:
the calculator of a percent change) are weighted too; its closing "answer" is not. Data in which no
supervised token names a tool is refused by the trainer, so a key that would weight nothing says so.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from typing import Any

from agentrig.data.render import IGNORE_INDEX

# a call's JSON as chat templates write it: Hermes' `<tool_call>{"name": ..., "arguments": ...}`, Llama 3.1's
# `{"name": ..., "parameters": ...}`, Mistral's `[TOOL_CALLS][{"name": ..., "arguments": ...}]`
NAME_PATTERN = re.compile(r'\{\s*"name"\s*:\s*"([^"]+)"\s*,\s*"(?:arguments|parameters)"\s*:')
# a plan that opens a turn (the datadesk expert's `plan_first`: "Plan: sales_total x2, calculator (the sum), answer."):
# each item's leading name is a choice of tool, made before the call that then copies it
PLAN_PATTERN = re.compile(r"\A\s*Plan: ([^\n]*)")
PLAN_ITEM = re.compile(r"(?:\A|, )([A-Za-z_][\w.-]*)")


def _supervised_runs(labels: list[int]) -> list[tuple[int, int]]:
    """Maximal [start, end) spans of positions whose label is supervised."""
    runs, start = [], 0
    for supervised, group in itertools.groupby(labels, key=lambda label: label != IGNORE_INDEX):
        end = start + sum(1 for _ in group)
        if supervised:
            runs.append((start, end))
        start = end
    return runs


def tool_name_positions(input_ids: list[int], labels: list[int], piece: Callable[[int], str]) -> list[int]:
    """Supervised positions whose token overlaps the tool name of a call written in the position's run.

    `piece(token_id)` is the token's text (the tokenizer's decode of that one id).
    """
    found: list[int] = []
    runs = []
    for start, end in _supervised_runs(labels):
        pieces = [piece(t) for t in input_ids[start:end]]
        offsets, text = [], ""
        for p in pieces:
            offsets.append(len(text))
            text += p
        runs.append((start, pieces, offsets, text, [m.span(1) for m in NAME_PATTERN.finditer(text)]))
    called = {text[lo:hi] for _, _, _, text, spans in runs for lo, hi in spans}
    for start, pieces, offsets, text, spans in runs:
        if called and (plan := PLAN_PATTERN.match(text)):
            # the plan's items that name a tool the row calls (not its closing "answer", nor other words)
            base = plan.start(1)
            spans = spans + [(base + m.start(1), base + m.end(1)) for m in PLAN_ITEM.finditer(plan.group(1))
                             if m.group(1) in called]
        for lo, hi in spans:
            for k, begin in enumerate(offsets):
                if begin < hi and begin + len(pieces[k]) > lo:
                    found.append(start + k)
    return sorted(set(found))


def figure_positions(input_ids: list[int], labels: list[int], piece: Callable[[int], str]) -> list[int]:
    """Supervised positions whose token holds a digit."""
    return [i for i, (t, label) in enumerate(zip(input_ids, labels))
            if label != IGNORE_INDEX and any(c.isdigit() for c in piece(t))]


def decision_positions(labels: list[int]) -> list[int]:
    """The first supervised position of each assistant turn: the call-or-answer choice."""
    return [start for start, _ in _supervised_runs(labels)]


def piece_function(tokenizer: Any) -> Callable[[int], str]:
    """A cached one-token decode for `tool_name_positions`."""
    cache: dict[int, str] = {}

    def piece(token_id: int) -> str:
        text = cache.get(token_id)
        if text is None:
            text = cache[token_id] = tokenizer.decode([token_id])
        return text

    return piece


def add_label_weights(rows: list[dict[str, list[Any]]], tokenizer: Any, weight: float,
                      decision_weight: float = 1.0, figure_weight: float = 1.0) -> dict[str, int]:
    """Give each packed row `label_weights`: 1.0, `weight` at tool-name tokens, `decision_weight` at each turn's first,
    `figure_weight` at the other tokens that hold a digit.

    Returns how many tokens each weight was put on (`key_tokens`, `decision_tokens`, `figure_tokens`; a weight of 1
    puts none). The row's first label of every sample is already -100 (`packing._row`), so no run crosses two samples.
    """
    piece = piece_function(tokenizer)
    counts = {"key_tokens": 0, "decision_tokens": 0, "figure_tokens": 0}
    for row in rows:
        weights = [1.0] * len(row["input_ids"])
        taken: set[int] = set()
        if weight != 1.0:
            for i in tool_name_positions(row["input_ids"], row["labels"], piece):
                weights[i] = weight
                counts["key_tokens"] += 1
                taken.add(i)
        if decision_weight != 1.0:
            for i in decision_positions(row["labels"]):
                weights[i] = decision_weight  # a turn opens with text or `<`, never inside a call's name
                counts["decision_tokens"] += 1
                taken.add(i)
        if figure_weight != 1.0:
            for i in figure_positions(row["input_ids"], row["labels"], piece):
                if i not in taken:  # a digit in a tool's name (`v2_lookup`) is the tool choice
                    weights[i] = figure_weight
                    counts["figure_tokens"] += 1
        row["label_weights"] = weights
    return counts
