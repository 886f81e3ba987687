"""DPO on preference pairs, starting from an SFT adapter that is also the frozen reference.

LLaMA-Factory's DPO after SFT-LoRA scores the reference with the raw base model (LLaMA-Factory #8459), so
the KL tie pulls the policy back towards the untrained model. Here the reference is the SFT adapter
itself: its log-probabilities of every chosen and rejected completion are computed once, before the
first update, with the adapter exactly as SFT saved it (eval mode, no grad). That is a frozen copy by
construction, and it halves the forward passes per step. A resumed run recomputes them from the same
SFT adapter, so they do not depend on the checkpoint. A run with `max_steps` scores only the pairs it
will train on (`agentrig.train.train.pairs_for_run`).

Pairs come in two forms, one a line: TRL's `{"prompt": [messages], "chosen": [assistant message],
"rejected": [assistant message], "tools": "JSON string"}` (rendered through `agentrig.data.render.Renderer`,
the renderer used for inference), or already tokenized `{"prompt_ids", "chosen_ids", "rejected_ids"}`.
The completion of a pair is a single assistant step (the shared prefix is the prompt), so tool results
are never inside the scored completion. The loss is the sigmoid DPO loss,
-log sigma(beta * ((pi_c - ref_c) - (pi_r - ref_r))), over summed completion log-probabilities, plus
`pref_ftx` times the chosen completion's NLL per token when set (LLaMA-Factory's `pref_ftx`, TRL's
`rpo_alpha`): plain DPO only rewards the gap, so it can lower what chosen replies need too. Which pairs
a round trains on matters more (`agentrig.data.pairs.mix_pairs`, docs/training.md): on a near-uniform sample of
synthetic pairs the main job's adapter stopped closing its calls, with or without this term.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from agentrig.errors import ConfigError, DataError
from agentrig.train.packing import IGNORE


@dataclass
class PreferencePair:
    """One pair: shared prompt tokens, chosen and rejected completion tokens."""

    pair_id: str
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]


def _int_list(value: Any, path: Path, lineno: int, key: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(isinstance(x, int) for x in value):
        raise DataError(f"{path}:{lineno}: {key!r} must be a non-empty list of token ids")
    return value


def load_pairs(path: str | Path, tokenizer: Any) -> list[PreferencePair]:
    """Read preference pairs (tokenized, or TRL format rendered with `agentrig.data.render.Renderer`)."""
    path = Path(path)
    if path.is_dir():
        path = path / "pairs.jsonl"
    if not path.is_file():
        raise ConfigError(f"DPO dataset {str(path)!r} does not exist (a pairs .jsonl or a folder with pairs.jsonl)")
    from agentrig.jsonl import iter_jsonl

    renderer = None
    pairs = []
    for lineno, row in iter_jsonl(path):
        pair_id = str(row.get("pair_id", row.get("id", lineno)))
        if "prompt_ids" in row:
            pairs.append(PreferencePair(pair_id, *(_int_list(row.get(k), path, lineno, k)
                                                   for k in ("prompt_ids", "chosen_ids", "rejected_ids"))))
            continue
        if not all(k in row for k in ("prompt", "chosen", "rejected")):
            raise DataError(f"{path}:{lineno}: a pair needs prompt/chosen/rejected (or prompt_ids/chosen_ids/rejected_ids)")
        if renderer is None:
            renderer = _renderer(tokenizer)
        if len(row["chosen"]) != 1 or len(row["rejected"]) != 1:
            raise DataError(f"{path}:{lineno}: chosen and rejected must each be one assistant message")
        # The prompt messages carry the system prompt with the tool list already (the harness wrote it),
        # so the `tools` column is informational here.
        pairs.append(PreferencePair(pair_id, renderer.prompt_ids(row["prompt"]), renderer.assistant_ids(row["chosen"][0]),
                                    renderer.assistant_ids(row["rejected"][0])))
    if not pairs:
        raise DataError(f"{path}: no preference pairs")
    return pairs


def _renderer(tokenizer: Any) -> Any:
    """The data pipeline's renderer; TRL-format pairs cannot be tokenized without it."""
    try:
        from agentrig.data.render import Renderer
    except ImportError:
        raise ConfigError("TRL-format preference pairs need agentrig.data.render (the data pipeline's renderer), which "
                          "this install lacks; pass tokenized pairs {prompt_ids, chosen_ids, rejected_ids}") from None
    return Renderer(tokenizer)


def pair_rows(pair: PreferencePair, max_len: int) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """Chosen and rejected rows (prompt + completion, labels on the completion); long prompts lose their start."""
    rows = []
    for completion in (pair.chosen_ids, pair.rejected_ids):
        completion = completion[:max_len - 1]
        prompt = pair.prompt_ids[-(max_len - len(completion)):]
        ids = prompt + completion
        rows.append({"input_ids": ids, "labels": [IGNORE] * len(prompt) + completion,
                     "position_ids": list(range(len(ids)))})
    return rows[0], rows[1]


class PairCollator:
    """Collates pairs into 2B rows (chosen rows, then rejected rows) plus their reference log-probs."""

    def __init__(self, pad_id: int, max_len: int) -> None:
        self.pad_id = pad_id
        self.max_len = max_len

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        """Each example has prompt_ids/chosen_ids/rejected_ids and, in training, ref_chosen/ref_rejected."""
        import torch

        from agentrig.train.packing import collate_rows

        chosen, rejected = zip(*(pair_rows(PreferencePair("", e["prompt_ids"], e["chosen_ids"], e["rejected_ids"]),
                                           self.max_len) for e in examples))
        batch = collate_rows(list(chosen) + list(rejected), self.pad_id)
        batch["num_tokens"] = torch.tensor(sum(len(r["input_ids"]) for r in chosen + rejected))
        if "ref_chosen" in examples[0]:
            batch["ref_chosen"] = torch.tensor([e["ref_chosen"] for e in examples], dtype=torch.float32)
            batch["ref_rejected"] = torch.tensor([e["ref_rejected"] for e in examples], dtype=torch.float32)
        return batch


def pair_logps(model: Any, batch: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(chosen, rejected) summed completion log-probs, and each row's supervised token count (chosen rows first)."""
    from agentrig.train.lmloss import sequence_logps

    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], supervised_labels=batch["labels"])
    seq = sequence_logps(out["token_logps"], out["mask"])
    half = seq.shape[0] // 2
    return seq[:half], seq[half:], out["mask"].sum(dim=-1)


def compute_logps(model: Any, pairs: list[PreferencePair], max_len: int, pad_id: int, batch_size: int = 4,
                  on_batch: Callable[[int], None] | None = None, bf16: bool = False) -> list[tuple[float, float]]:
    """(chosen, rejected) log-probs of every pair under `model` as it is now (eval mode, no grad);
    `on_batch(n)` is told after each batch of n pairs (a progress bar); `bf16` runs them under the same
    autocast as the training steps, so the reference and the policy's first step agree."""
    import torch

    collator = PairCollator(pad_id, max_len)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[tuple[float, float]] = []
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        for start in range(0, len(pairs), batch_size):
            chunk = [{"prompt_ids": p.prompt_ids, "chosen_ids": p.chosen_ids, "rejected_ids": p.rejected_ids}
                     for p in pairs[start:start + batch_size]]
            batch = {k: v.to(device) for k, v in collator(chunk).items()}
            chosen, rejected, _ = pair_logps(model, batch)
            out += list(zip(chosen.float().tolist(), rejected.float().tolist()))
            if on_batch is not None:
                on_batch(len(chunk))
    model.train(was_training)
    return out


def dpo_loss(policy_chosen: Any, policy_rejected: Any, ref_chosen: Any, ref_rejected: Any,
             beta: float) -> tuple[Any, dict[str, Any]]:
    """Sigmoid DPO loss (mean over pairs) and its metrics: reward margin, accuracy, log-prob margin."""
    import torch.nn.functional as F

    logits = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    loss = -F.logsigmoid(beta * logits).mean()
    metrics = {
        "reward_margin": (beta * logits).detach().mean(),
        "accuracy": (logits > 0).float().detach().mean(),
        "margin": (policy_chosen - policy_rejected).detach().mean(),
    }
    return loss, metrics


def dpo_trainer_class() -> type:
    """A `transformers.Trainer` whose loss is DPO against precomputed reference log-probs.

    Built in a function so that importing this module does not import torch/transformers.
    """
    from transformers import Trainer

    class DPOLoop(Trainer):
        """Trainer with the DPO loss; tokens go into `self.meter`, metrics into the log."""

        def __init__(self, *args: Any, beta: float, meter: Any, ftx: float = 0.0, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.beta = beta
            self.ftx = ftx
            self.meter = meter
            self._dpo_metrics: dict[str, list[float]] = {}

        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            chosen, rejected, lengths = pair_logps(model, inputs)
            loss, metrics = dpo_loss(chosen, rejected, inputs["ref_chosen"], inputs["ref_rejected"], self.beta)
            if self.ftx > 0:
                # NLL per token of the chosen completions: keeps the chosen replies themselves likely, not
                # only more likely than the rejected ones.
                nll = -(chosen / lengths[: chosen.shape[0]].clamp(min=1)).mean()
                loss = loss + self.ftx * nll
                metrics["chosen_nll"] = nll.detach()
            if model.training:
                self.meter.add(int(inputs["num_tokens"]), int(lengths.sum()))
                for key, value in metrics.items():
                    self._dpo_metrics.setdefault(key, []).append(float(value))
            return (loss, {"chosen": chosen, "rejected": rejected}) if return_outputs else loss

        def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
            logs.update({k: sum(v) / len(v) for k, v in self._dpo_metrics.items() if v})
            self._dpo_metrics = {}
            super().log(logs, start_time)

    return DPOLoop
