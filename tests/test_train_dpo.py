"""DPO on top of an SFT adapter: the reference is that adapter, and the chosen-rejected margin grows."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from test_train import synthetic_samples, tiny_config, tiny_model_dir, write_jsonl  # noqa: F401 (fixture)


def synthetic_pairs(n: int, seed: int = 0) -> list[dict]:
    """Tokenized pairs: a shared prompt, a chosen and a rejected completion of a few tokens."""
    rng = random.Random(seed)
    pairs = []
    for i in range(n):
        prompt = [rng.randrange(200, 3000) for _ in range(rng.randint(10, 30))]
        chosen = [rng.randrange(200, 260) for _ in range(rng.randint(4, 10))] + [2]
        rejected = [rng.randrange(300, 360) for _ in range(rng.randint(4, 10))] + [2]
        pairs.append({"pair_id": f"p{i}", "prompt_ids": prompt, "chosen_ids": chosen, "rejected_ids": rejected})
    return pairs


@pytest.fixture(scope="module")
def sft_adapter(tmp_path_factory, tiny_model_dir) -> Path:
    """A short SFT run on the tiny model: the adapter DPO starts from."""
    from agentrig.train.train import run_train

    tmp = tmp_path_factory.mktemp("sft")
    data = write_jsonl(tmp / "tokenized.jsonl", synthetic_samples(4, seed=7))
    return Path(run_train(tiny_config(tiny_model_dir, data, tmp / "run", max_steps=4, save_steps=4)).adapter_dir)


def _logps(model_dir: Path, adapter: Path | None, pairs: list[dict], **kwargs) -> list[tuple[float, float]]:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from agentrig.train.dpo import PreferencePair, compute_logps
    from agentrig.train.lmloss import add_supervised_head

    model = add_supervised_head(AutoModelForCausalLM.from_pretrained(model_dir))
    if adapter is not None:
        model = PeftModel.from_pretrained(model, str(adapter))
    items = [PreferencePair(p["pair_id"], p["prompt_ids"], p["chosen_ids"], p["rejected_ids"]) for p in pairs]
    return compute_logps(model, items, max_len=128, pad_id=2, **kwargs)


def test_reference_pass_reports_progress_per_batch_without_changing_the_logps(tiny_model_dir, sft_adapter):
    pairs = synthetic_pairs(6)
    seen: list[int] = []
    assert _logps(tiny_model_dir, sft_adapter, pairs, on_batch=seen.append) == _logps(tiny_model_dir, sft_adapter, pairs)
    assert seen == [4, 2]  # batches of 4 pairs: the bar reaches 6 of 6


def test_dpo_margin_grows_and_reference_is_the_sft_adapter(tmp_path, tiny_model_dir, sft_adapter):
    from agentrig.train.train import run_train

    pairs = synthetic_pairs(6)
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    config = tiny_config(tiny_model_dir, data, tmp_path / "dpo", stage="dpo", adapter_name_or_path=str(sft_adapter),
                         max_steps=12, save_steps=12, learning_rate=1e-2, pref_beta=0.5,
                         bf16=False)  # compared below with fp32 log-probs
    result = run_train(config)

    # The reference log-probs are those of the SFT adapter, not of the raw base model.
    stored = [json.loads(line) for line in (tmp_path / "dpo" / "reference_logps.jsonl").read_text().splitlines()]
    sft = _logps(tiny_model_dir, sft_adapter, pairs)
    base = _logps(tiny_model_dir, None, pairs)
    for row, (chosen, rejected), (base_chosen, _) in zip(stored, sft, base):
        assert row["chosen"] == pytest.approx(chosen, rel=1e-5)
        assert row["rejected"] == pytest.approx(rejected, rel=1e-5)
        assert abs(row["chosen"] - base_chosen) > 1e-3

    # The policy's chosen-minus-rejected margin grows from the SFT adapter's.
    after = _logps(tiny_model_dir, Path(result.adapter_dir), pairs)
    margin_before = sum(c - r for c, r in sft) / len(sft)
    margin_after = sum(c - r for c, r in after) / len(after)
    assert margin_after > margin_before + 1.0
    # Logged per batch: compare the first and last epoch (3 batches of 2 pairs each), the same pairs.
    logged = [h["margin"] for h in result.loss_history]
    losses = [h["loss"] for h in result.loss_history]
    assert len(logged) == 12
    assert sum(logged[-3:]) > sum(logged[:3])
    assert sum(losses[-3:]) < sum(losses[:3])


def test_dpo_scores_only_the_pairs_the_run_uses(tmp_path, tiny_model_dir, sft_adapter, monkeypatch):
    from agentrig.train.train import pairs_for_run, run_train

    pairs = synthetic_pairs(10)
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    config = tiny_config(tiny_model_dir, data, tmp_path / "dpo", stage="dpo", adapter_name_or_path=str(sft_adapter),
                         max_steps=2, save_steps=2)  # 2 steps x 2 pairs: 4 of the 10 pairs are ever used
    chosen = pairs_for_run(list(range(10)), config)
    assert len(chosen) == 4 and chosen == sorted(set(chosen))
    assert pairs_for_run(list(range(10)), config) == chosen  # seeded: a resumed run gets the same pairs
    monkeypatch.setenv("WORLD_SIZE", "2")  # two processes consume twice as many
    assert len(pairs_for_run(list(range(10)), config)) == 8
    monkeypatch.delenv("WORLD_SIZE")
    assert pairs_for_run(list(range(10)), tiny_config(tiny_model_dir, data, tmp_path / "x", max_steps=5)) == list(range(10))

    run_train(config)
    stored = [json.loads(line)["pair_id"] for line in (tmp_path / "dpo" / "reference_logps.jsonl").read_text().splitlines()]
    assert stored == [pairs[i]["pair_id"] for i in chosen]


def test_pref_ftx_adds_the_chosen_nll_and_raises_chosen_logps(tmp_path, tiny_model_dir, sft_adapter):
    from agentrig.errors import ConfigError
    from agentrig.train.train import run_train

    pairs = synthetic_pairs(6)
    data = write_jsonl(tmp_path / "pairs.jsonl", pairs)
    config = tiny_config(tiny_model_dir, data, tmp_path / "dpo", stage="dpo", adapter_name_or_path=str(sft_adapter),
                         max_steps=6, save_steps=6, learning_rate=1e-2, pref_beta=0.5, pref_ftx=1.0)
    result = run_train(config)
    logged = [h["chosen_nll"] for h in result.loss_history]
    assert len(logged) == 6 and logged[-1] < logged[0]
    # The NLL term is in the loss: at step 1 (policy == reference, DPO term log 2) loss = log 2 + chosen NLL.
    assert result.loss_history[0]["loss"] == pytest.approx(0.6931 + logged[0], abs=2e-3)
    before = _logps(tiny_model_dir, sft_adapter, pairs)
    after = _logps(tiny_model_dir, Path(result.adapter_dir), pairs)
    assert sum(c for c, _ in after) > sum(c for c, _ in before)
    with pytest.raises(ConfigError, match="pref_ftx"):
        tiny_config(tiny_model_dir, data, tmp_path / "x", pref_ftx=-1.0)


def test_dpo_needs_the_sft_adapter(tmp_path, tiny_model_dir):
    from agentrig.errors import ConfigError
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "pairs.jsonl", synthetic_pairs(2))
    with pytest.raises(ConfigError, match="adapter_name_or_path"):
        run_train(tiny_config(tiny_model_dir, data, tmp_path / "dpo", stage="dpo"))


def test_dpo_loss_is_log2_at_the_reference():
    import math

    import torch

    from agentrig.train.dpo import dpo_loss

    logps = torch.tensor([-3.0, -5.0])
    loss, metrics = dpo_loss(logps, logps - 1, logps, logps - 1, beta=0.1)
    assert loss.item() == pytest.approx(math.log(2))
    assert metrics["margin"].item() == pytest.approx(1.0)
