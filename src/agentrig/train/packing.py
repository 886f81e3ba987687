"""Packing tokenized samples into rows without letting them attend to each other.

Best-fit decreasing puts samples into rows of at most `max_len` tokens. Each sample keeps its own
position ids (0, 1, 2, ... restarting per sample); transformers (>= 4.56, 5.x) reads a restart in
`position_ids` with no `attention_mask` as a sequence boundary and builds a block-diagonal causal mask
(`masking_utils.find_packed_sequence_indices`), for eager, SDPA and flash-attention alike. The first
label of every sample is masked: in a packed row the token before it belongs to another sample, and
unpacked it has no predecessor at all, so masking it makes packed and unpacked losses identical.

Padding at the end of a batch is one more "sample" (positions restart at 0, labels -100), so rows of
different lengths batch without an attention mask. Not handled: a sample longer than `max_len` is cut
to `max_len` (the caller reports how many were cut).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from agentrig.data.render import IGNORE_INDEX as IGNORE


@dataclass
class TokenizedSample:
    """One training sample: token ids and labels (-100 where not supervised)."""

    sample_id: str
    input_ids: list[int]
    labels: list[int]


def best_fit_bins(lengths: list[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: indices of `lengths` grouped into bins whose sums stay <= `capacity`.

    Each item goes into the fullest bin it still fits in (ties broken by bin age), largest items first;
    deterministic for a given input order.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    free: list[tuple[int, int]] = []  # sorted (remaining capacity, bin index)
    for i in order:
        size = min(lengths[i], capacity)
        pos = bisect.bisect_left(free, (size, -1))
        if pos < len(free):
            remaining, b = free.pop(pos)
            bins[b].append(i)
            bisect.insort(free, (remaining - size, b))
        else:
            bins.append([i])
            bisect.insort(free, (capacity - size, len(bins) - 1))
    return bins


def _row(samples: list[TokenizedSample], max_len: int) -> dict[str, list[int]]:
    input_ids: list[int] = []
    labels: list[int] = []
    position_ids: list[int] = []
    for s in samples:
        ids, labs = s.input_ids[:max_len], s.labels[:max_len]
        input_ids += ids
        labels += [IGNORE] + labs[1:]
        position_ids += list(range(len(ids)))
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}


def pack_rows(samples: list[TokenizedSample], max_len: int, packing: bool = True) -> list[dict[str, list[int]]]:
    """Rows of `input_ids`, `labels`, `position_ids`: best-fit packed, or one sample per row."""
    if not packing:
        return [_row([s], max_len) for s in samples]
    bins = best_fit_bins([len(s.input_ids) for s in samples], max_len)
    # Keep the samples of a row in their input order, so a row reads like the data file.
    return [_row([samples[i] for i in sorted(b)], max_len) for b in bins]


def collate_rows(rows: list[dict[str, list[Any]]], pad_id: int) -> dict[str, Any]:
    """Pad rows to the longest into tensors; the pad tail is its own segment (positions from 0, labels -100).

    Rows with `label_weights` (per-token loss weights, `keytokens.py`) get them as a float tensor too.
    """
    import torch

    width = max(len(r["input_ids"]) for r in rows)
    input_ids, labels, position_ids, weights = [], [], [], []
    for r in rows:
        pad = width - len(r["input_ids"])
        input_ids.append(r["input_ids"] + [pad_id] * pad)
        labels.append(r["labels"] + [IGNORE] * pad)
        position_ids.append(r["position_ids"] + list(range(pad)))
        if "label_weights" in r:
            weights.append(r["label_weights"] + [0.0] * pad)
    batch = {
        "input_ids": torch.tensor(input_ids, dtype=torch.long),
        "labels": torch.tensor(labels, dtype=torch.long),
        "position_ids": torch.tensor(position_ids, dtype=torch.long),
    }
    if weights:
        batch["label_weights"] = torch.tensor(weights, dtype=torch.float32)
    return batch


class RowCollator:
    """`Trainer` data collator over rows; also reports the real (unpadded) token count as `num_tokens`.

    `padding_free=True` joins the batch's rows into one row instead of padding them to the longest: the
    position ids still restart per sample, so with per-sample attention (`attention.py`) nothing changes
    but the pad tokens, which are no longer computed (~11% of a batch of two 2048-token rows).
    """

    def __init__(self, pad_id: int, padding_free: bool = False) -> None:
        self.pad_id = pad_id
        self.padding_free = padding_free

    def __call__(self, rows: list[dict[str, list[int]]]) -> dict[str, Any]:
        """Collate rows (dicts with `input_ids`, `labels`, `position_ids`, and optionally `label_weights`)."""
        import torch

        if self.padding_free and len(rows) > 1:
            rows = [{key: [x for r in rows for x in r[key]] for key in rows[0]}]
        batch = collate_rows(rows, self.pad_id)
        batch["num_tokens"] = torch.tensor(sum(len(r["input_ids"]) for r in rows))
        return batch


def packing_stats(rows: list[dict[str, list[int]]], max_len: int) -> dict[str, float]:
    """How full the rows are: tokens, supervised tokens, rows and fill ratio."""
    tokens = sum(len(r["input_ids"]) for r in rows)
    supervised = sum(sum(1 for x in r["labels"] if x != IGNORE) for r in rows)
    return {"rows": len(rows), "tokens": tokens, "supervised_tokens": supervised,
            "fill": tokens / (len(rows) * max_len) if rows else 0.0}
