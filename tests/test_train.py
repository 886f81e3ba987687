"""LoRA SFT on a tiny random Llama: config loading, packing, supervised-position loss, training behaviour.

Also holds the helpers the other training tests import (tiny model folder, synthetic tokenized data).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from agentrig.errors import ConfigError
from agentrig.train.trainconfig import TrainConfig, config_from_dict, load_config

REPO = Path(__file__).resolve().parents[1]


# -- helpers shared with test_train_*.py and test_export.py ---------------------------------------

@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, smol_tokenizer) -> Path:
    """A tiny random Llama with the default tokenizer, saved as a local model folder.

    initializer_range 0.2 (not 0.02): with a 64-wide hidden state and the final norm frozen, embeddings
    at 0.02 bound the logits near +-1, so no adapter could bring the loss far below log(vocab).
    """
    from agentrig.models import tiny_random_model

    folder = tmp_path_factory.mktemp("tiny-llama")
    tiny_random_model(len(smol_tokenizer), initializer_range=0.2).save_pretrained(folder)
    smol_tokenizer.save_pretrained(folder)
    return folder


def synthetic_samples(n: int, seed: int = 0, low: int = 24, high: int = 72, vocab: int = 2800) -> list[dict]:
    """Tokenized samples shaped like chat data: an unsupervised prompt, then a supervised reply.

    A small `vocab` (ids 200..200+vocab) makes the set quick to memorize.
    """
    rng = random.Random(seed)
    samples = []
    for i in range(n):
        length = rng.randint(low, high)
        ids = [rng.randrange(200, 200 + vocab) for _ in range(length)]
        cut = rng.randint(length // 3, 2 * length // 3)
        samples.append({"sample_id": f"s{i}", "input_ids": ids, "labels": [-100] * cut + ids[cut:]})
    return samples


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    """Write rows as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def tiny_config(model_dir: Path, dataset: Path, out: Path, **overrides) -> TrainConfig:
    """A config that trains the tiny model in seconds."""
    data = dict(model_name_or_path=str(model_dir), dataset=str(dataset), output_dir=str(out), lora_rank=8,
                lora_alpha=16, learning_rate=5e-3, max_seq_length=128, per_device_train_batch_size=2,
                max_steps=6, save_steps=3, lr_scheduler_type="constant")
    data.update(overrides)
    return config_from_dict(data)


# -- config ---------------------------------------------------------------------------------------

def test_seed_yaml_loads_unchanged():
    config = load_config(REPO / "examples" / "lora_agent.yaml")
    assert config.model_name_or_path == "deepseek-ai/DeepSeek-V2-Lite"
    assert (config.lora_rank, config.lora_alpha, config.learning_rate) == (32, 64, 2.0e-4)
    assert config.target_modules() == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert (config.per_device_train_batch_size, config.gradient_accumulation_steps) == (2, 8)
    assert (config.max_seq_length, config.num_train_epochs, config.lr_scheduler_type) == (8192, 3.0, "cosine")


def test_misspelled_key_names_the_closest(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("dataset: d\nlora_rnak: 8\n")
    with pytest.raises(ConfigError, match=r"unknown key 'lora_rnak'.*did you mean 'lora_rank'"):
        load_config(path)


def test_bad_values_are_config_errors():
    with pytest.raises(ConfigError, match="finetuning_type"):
        config_from_dict({"dataset": "d", "finetuning_type": "full"})
    with pytest.raises(ConfigError, match="lora_rank.*integer"):
        config_from_dict({"dataset": "d", "lora_rank": "eight"})
    assert config_from_dict({"dataset": "d", "learning_rate": "1e-4"}).learning_rate == 1e-4
    assert config_from_dict({"dataset": "d", "lora_target": "all"}).target_modules() == "all-linear"
    # Defaults are the seed's LoRA knobs.
    default = config_from_dict({"dataset": "d"})
    assert (default.lora_rank, default.lora_alpha, default.learning_rate, default.lr_scheduler_type) == (32, 64, 2e-4, "cosine")
    assert default.target_modules() == ["q_proj", "k_proj", "v_proj", "o_proj"]


def test_bf16_key_resolves_to_the_hardware_unless_set(monkeypatch):
    import agentrig.models

    with pytest.raises(ConfigError, match="bf16.*true or false"):
        config_from_dict({"dataset": "d", "bf16": "yes"})
    unset = config_from_dict({"dataset": "d"})
    assert unset.bf16 is None
    for native in (True, False):
        monkeypatch.setattr(agentrig.models, "native_bf16", lambda native=native: native)
        assert unset.use_bf16() is native
        assert config_from_dict({"dataset": "d", "bf16": False}).use_bf16() is False
        assert config_from_dict({"dataset": "d", "bf16": True}).use_bf16() is True


def test_bf16_training_follows_the_fp32_loss(tmp_path, tiny_model_dir):
    """bf16 autocast (the default on CPUs with native bf16) trains the same curve as fp32, within rounding."""
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "data" / "tokenized.jsonl", synthetic_samples(4, seed=1, vocab=12))
    runs = {}
    for bf16 in (True, False):
        config = tiny_config(tiny_model_dir, data.parent, tmp_path / f"run_{bf16}", max_steps=8, learning_rate=1e-2,
                             save_steps=100, bf16=bf16)
        runs[bf16] = [h["loss"] for h in run_train(config).loss_history]
    assert runs[True] != runs[False]  # bf16 really ran: its rounding shows in the losses
    assert runs[True] == pytest.approx(runs[False], rel=0.05)
    assert runs[True][-1] < 0.8 * runs[True][0]


def test_resolved_config_round_trips(tmp_path):
    config = config_from_dict({"dataset": "d", "lora_rank": 4, "stage": "dpo", "adapter_name_or_path": "a"})
    assert load_config(config.save(tmp_path)) == config


# -- packing and the supervised-position loss ----------------------------------------------------

def test_warmup_ratio_is_a_share_of_the_steps_on_either_transformers(tmp_path):
    from transformers import TrainingArguments

    from agentrig.train.train import _training_kwargs, _warmup

    kwargs = _training_kwargs(TrainConfig(dataset="d", warmup_ratio=0.1), tmp_path / "ck")
    assert TrainingArguments(**kwargs).get_warmup_steps(200) == 20  # the installed version: 20 of 200 steps
    assert _warmup(0.1, "4.57.1") == {"warmup_ratio": 0.1}  # 4.x would read warmup_steps=0.1 as a step count
    assert _warmup(0.1, "5.0.0") == {"warmup_steps": 0.1}


def test_best_fit_packing_fills_rows_without_overflow():
    from agentrig.train.packing import best_fit_bins

    lengths = [70, 60, 50, 40, 30, 20, 10, 128, 5]
    bins = best_fit_bins(lengths, 128)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= 128 for b in bins)
    assert len(bins) == -(-sum(lengths) // 128)  # as few rows as the total allows


def test_packed_loss_equals_unpacked_loss(tiny_model):
    import torch

    from agentrig.train.lmloss import add_supervised_head, full_logits_loss
    from agentrig.train.packing import TokenizedSample, collate_rows, pack_rows

    model = add_supervised_head(tiny_model).eval()
    samples = [TokenizedSample(s["sample_id"], s["input_ids"], s["labels"]) for s in synthetic_samples(7)]
    packed, unpacked = pack_rows(samples, 256), pack_rows(samples, 256, packing=False)
    assert len(packed) < len(unpacked)

    def summed(rows):
        batch = collate_rows(rows, pad_id=0)
        with torch.no_grad():
            out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                        supervised_labels=batch["labels"])
        return out["token_logps"].sum().item(), int(out["mask"].sum())

    (packed_sum, n_packed), (unpacked_sum, n_unpacked) = summed(packed), summed(unpacked)
    one_by_one = sum(summed([row])[0] for row in unpacked)
    assert n_packed == n_unpacked
    assert packed_sum == pytest.approx(unpacked_sum, rel=1e-5)
    assert packed_sum == pytest.approx(one_by_one, rel=1e-5)
    # The head-at-supervised-positions loss equals the ordinary full-logits loss.
    with torch.no_grad():
        full = full_logits_loss(model, collate_rows(packed, pad_id=0)).item()
    assert -packed_sum / n_packed == pytest.approx(full, rel=1e-5)


def test_packing_keeps_samples_apart(tiny_model):
    """Changing one packed sample must not change another sample's log-probs."""
    import torch

    from agentrig.train.lmloss import add_supervised_head
    from agentrig.train.packing import TokenizedSample, collate_rows, pack_rows

    model = add_supervised_head(tiny_model).eval()
    a, b = synthetic_samples(2, seed=3)
    b2 = dict(b, input_ids=[t + 1 for t in b["input_ids"]])

    def logps_of_second(first):
        rows = pack_rows([TokenizedSample("a", first["input_ids"], first["labels"]),
                          TokenizedSample("b", a["input_ids"], a["labels"])], 512)
        assert len(rows) == 1
        batch = collate_rows(rows, 0)
        with torch.no_grad():
            out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"],
                        supervised_labels=batch["labels"])
        return out["token_logps"][-sum(x != -100 for x in a["labels"]):]

    assert torch.allclose(logps_of_second(b), logps_of_second(b2), atol=1e-6)


# -- training -------------------------------------------------------------------------------------

def weight_snapshots():
    """A trainer callback that copies the trained model's parameters at train begin and at train end."""
    from transformers import TrainerCallback

    class WeightSnapshots(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            self.begin = {n: p.detach().clone() for n, p in model.named_parameters()}
            self.trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)

        def on_train_end(self, args, state, control, model=None, **kwargs):
            self.end = {n: p.detach().clone() for n, p in model.named_parameters()}

    return WeightSnapshots()


def test_lora_changes_and_base_does_not_and_loss_falls(tmp_path, tiny_model_dir):
    """Memorize 4 samples: the loss falls, LoRA weights move, base weights stay bit-identical.

    "Base" is checked on the model object the trainer trains, before and after training: every parameter
    whose name is not a LoRA matrix is bit-identical, and only LoRA matrices were trainable.
    """
    import torch
    from safetensors.torch import load_file

    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "data" / "tokenized.jsonl", synthetic_samples(4, seed=1, vocab=12))
    config = tiny_config(tiny_model_dir, data.parent, tmp_path / "run", max_steps=25, learning_rate=1e-2,
                         lora_rank=16, lora_alpha=32, save_steps=100)
    snapshots = weight_snapshots()
    result = run_train(config, callbacks=[snapshots])

    losses = [h["loss"] for h in result.loss_history]
    assert len(losses) == 25
    assert losses[-1] < 0.5 * losses[0]
    lora_names = {n for n in snapshots.begin if ".lora_A." in n or ".lora_B." in n}
    base_names = set(snapshots.begin) - lora_names
    assert lora_names and len(base_names) > len(lora_names)  # q, k, v, o of both layers; embeddings, norms, MLPs
    assert sorted(snapshots.trainable) == sorted(lora_names)
    for name in base_names:
        assert torch.equal(snapshots.begin[name], snapshots.end[name]), name
    moved = [n for n in lora_names if not torch.equal(snapshots.begin[n], snapshots.end[n])]
    assert sorted(moved) == sorted(lora_names)  # every LoRA matrix moved (B starts at zero)
    # The saved adapter is those LoRA matrices as trained, and nothing else.
    lora = load_file(Path(result.adapter_dir) / "adapter_model.safetensors")
    saved_as = {n.replace(".default.", "."): n for n in lora_names}  # PEFT drops the adapter name on save
    assert set(lora) == set(saved_as)
    for key, value in lora.items():
        assert torch.equal(value, snapshots.end[saved_as[key]]), key
    # Artifacts: resolved config beside the adapter, loss curve, the vllm command.
    assert load_config(Path(result.adapter_dir) / "agentrig_train.yaml") == config
    curve = json.loads((tmp_path / "run" / "loss_curve.json").read_text())
    assert [c["loss"] for c in curve] == losses
    assert (tmp_path / "run" / "loss_curve.png").stat().st_size > 1000
    assert "--max-lora-rank 16" in result.vllm_command and "--enable-lora" in result.vllm_command
    assert result.supervised_tokens > 0 and result.tokens > result.supervised_tokens


def test_existing_checkpoints_need_resume(tmp_path, tiny_model_dir):
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(4))
    config = tiny_config(tiny_model_dir, data, tmp_path / "run", max_steps=3, save_steps=3)
    run_train(config)
    with pytest.raises(ConfigError, match="--resume"):
        run_train(config)


def test_bad_data_is_a_data_error(tmp_path, tiny_model_dir):
    from agentrig.errors import DataError
    from agentrig.train.train import run_train

    data = tmp_path / "tokenized.jsonl"
    data.write_text('{"sample_id": "a", "input_ids": [1, 2], "labels": [1]}\n')
    with pytest.raises(DataError, match=r"tokenized.jsonl:1"):
        run_train(tiny_config(tiny_model_dir, data, tmp_path / "run"))


def test_episodes_file_is_built_on_the_fly(tmp_path, tiny_model_dir):
    """`dataset:` may name an episodes file: it is built with the data pipeline beside the run, then trained on."""
    from agentrig.data.collect import CollectConfig, run_collect
    from agentrig.train.train import run_train

    episodes = tmp_path / "train.jsonl"
    run_collect(CollectConfig(episodes=4, out=str(episodes), workers=1), progress=False)
    config = tiny_config(tiny_model_dir, episodes, tmp_path / "run", max_seq_length=2048, max_steps=1,
                         per_device_train_batch_size=1)
    result = run_train(config)
    built = tmp_path / "run" / "data" / "tokenized.jsonl"
    assert built.is_file() and len(built.read_text().splitlines()) >= 4
    assert result.global_step == 1 and result.supervised_tokens > 0
