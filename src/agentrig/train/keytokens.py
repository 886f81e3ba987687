"""Key-token loss weights: the supervised tokens that name the tool of a call count `tool_name_weight` times.

In an agent's SFT sample the choice of tool is a handful of tokens (`"name": "sales_total"` is 4 of SmolLM2's
tokens) among the ~200 supervised ones of the call's JSON, the retry sentences and the answer, so under the plain
mean its gradient is a few percent of a step's, while choosing a tool the request does not need is the adapter's
most frequent failure (`wrong_tool`, docs/evaluation.md). TL-Training (Ye et al., EMNLP Findings 2025) measured
that token importance in tool-use SFT is that uneven and reweights the key tokens; `tool_name_weight` is the
narrow, fixed form of that: every supervised token whose text overlaps the `"name"` value of a tool call's JSON
(`{"name": ..., "arguments": ...}`; `"parameters"` in Llama 3.1's form) is weighted `w` in the loss, the others 1,
and the sum is still divided by the number of supervised tokens, so `w = 1` is exactly the plain loss and the other
tokens' gradients are unchanged.

The tool names are found in the token ids themselves, not by tokenizing again: each supervised run of tokens is
decoded piece by piece, the call pattern is matched in the joined pieces, and the tokens under a matched name get
the weight; a tool named in prose ("sales_total failed ...") is not a call and keeps weight 1. Data in which no
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
    for start, end in _supervised_runs(labels):
        pieces = [piece(t) for t in input_ids[start:end]]
        offsets, text = [], ""
        for p in pieces:
            offsets.append(len(text))
            text += p
        for match in NAME_PATTERN.finditer(text):
            lo, hi = match.span(1)
            for k, begin in enumerate(offsets):
                if begin < hi and begin + len(pieces[k]) > lo:
                    found.append(start + k)
    return found


def piece_function(tokenizer: Any) -> Callable[[int], str]:
    """A cached one-token decode for `tool_name_positions`."""
    cache: dict[int, str] = {}

    def piece(token_id: int) -> str:
        text = cache.get(token_id)
        if text is None:
            text = cache[token_id] = tokenizer.decode([token_id])
        return text

    return piece


def add_label_weights(rows: list[dict[str, list[Any]]], tokenizer: Any, weight: float) -> int:
    """Give each packed row `label_weights` (1.0, or `weight` at tool-name tokens); returns how many were weighted.

    The row's first label of every sample is already -100 (`packing._row`), so no run crosses two samples.
    """
    piece = piece_function(tokenizer)
    weighted = 0
    for row in rows:
        weights = [1.0] * len(row["input_ids"])
        for i in tool_name_positions(row["input_ids"], row["labels"], piece):
            weights[i] = weight
            weighted += 1
        row["label_weights"] = weights
    return weighted
