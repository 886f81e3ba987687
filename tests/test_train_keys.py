"""The training keys LLaMA-Factory, Axolotl and TRL users reach for: each key's effect on a tiny random Llama.

Config: a LLaMA-Factory glaive-style YAML is refused on exactly the keys agentrig does not read, each with
what to write instead; bad values name their key. Data: mixtures (concat, interleave under/over), their
proportions in the data card, `max_samples`, exports read back as the samples they came from, a mixture of
a build, an export and an episodes file trained on. Validation: held-out samples, the loss in the progress
line, the curve and TensorBoard, the adapter chosen by it. Memory and hardware: gradient checkpointing
recomputes and trains the same, attention choices train the same, QLoRA/fp16/flash-attention/DeepSpeed
refused on this CPU with the reason. Resuming from a named checkpoint; pushing to the hub with the hub's
calls replaced (no hub is reachable here). A QLoRA run needs a CUDA GPU and bitsandbytes: skipped without.
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
import yaml
from test_train import REPO, synthetic_samples, tiny_config, tiny_model_dir, weight_snapshots, write_jsonl  # noqa: F401
from test_train_dpo import sft_adapter, synthetic_pairs  # noqa: F401 (fixture)

from agentrig.errors import ConfigError, DataError
from agentrig.train.trainconfig import FIELDS, FOREIGN_KEYS, config_from_dict, load_config

GLAIVE = REPO / "examples" / "llamafactory_glaive_lora.yaml"
GLAIVE_UNSUPPORTED = ["trust_remote_code", "do_train", "template", "cutoff_len", "overwrite_cache",
                      "preprocessing_num_workers", "dataloader_num_workers", "logging_steps", "plot_loss",
                      "overwrite_output_dir", "save_only_model", "eval_strategy"]


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _adapter(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(Path(folder) / "adapter_model.safetensors")


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def mixed_config(model_dir: Path, datasets: list, out: Path, **overrides):
    """`tiny_config` training on several datasets."""
    return config_from_dict({**tiny_config(model_dir, datasets[0], out).to_dict(), **overrides,
                             "dataset": [str(d) for d in datasets]})


def _shifted(samples: list[dict], by: int) -> list[dict]:
    """The same samples on other token ids: a distribution the training data does not teach."""
    return [{"sample_id": f"{s['sample_id']}+{by}", "input_ids": [t + by for t in s["input_ids"]],
             "labels": [t if t == -100 else t + by for t in s["labels"]]} for s in samples]


# -- config: LLaMA-Factory's YAML, and every new key's bad values ---------------------------------

def test_a_llamafactory_glaive_yaml_is_refused_on_exactly_the_keys_agentrig_does_not_read(tmp_path):
    with pytest.raises(ConfigError) as caught:
        load_config(GLAIVE)
    text = str(caught.value)
    named = re.findall(r"^  - '(\w+)' is not an agentrig key: (.+)$", text, flags=re.M)
    assert [k for k, _ in named] == GLAIVE_UNSUPPORTED
    assert f"{len(GLAIVE_UNSUPPORTED)} keys agentrig does not read" in text
    assert dict(named)["cutoff_len"] == "LLaMA-Factory's cutoff_len is `max_seq_length` here"
    assert all(advice for _, advice in named)
    # Done as told (cutoff_len becomes max_seq_length, the rest dropped), it loads and means what it meant there.
    data = yaml.safe_load(GLAIVE.read_text())
    data["max_seq_length"] = data.pop("cutoff_len")
    for key in GLAIVE_UNSUPPORTED:
        data.pop(key, None)
    config = config_from_dict(data)
    assert (config.lora_rank, config.lora_alpha, config.target_modules()) == (8, 16, "all-linear")  # alpha 2 x rank
    assert (config.max_samples, config.val_size, config.eval_steps, config.per_device_eval_batch_size) == (1000, 0.1, 500, 1)
    assert (config.max_seq_length, config.warmup_ratio, config.ddp_timeout, config.bf16) == (2048, 0.1, 180000000, True)
    assert config.reporters() == [] and config.resume_from_checkpoint is None
    # Its dataset is a LLaMA-Factory dataset name, which agentrig cannot read: said before anything loads.
    from agentrig.train.train import run_train

    config = config_from_dict({**data, "output_dir": str(tmp_path / "run")})
    with pytest.raises(DataError, match=r"glaive_toolcall_en_demo: there is no such file.*not dataset names"):
        run_train(config)
    assert not (tmp_path / "run").exists()


def test_foreign_keys_and_misspellings_each_get_their_own_line():
    with pytest.raises(ConfigError) as caught:
        config_from_dict({"dataset": "d", "lora_r": 8, "sequence_len": 512, "max_length": 512, "val_szie": 0.1})
    lines = str(caught.value).splitlines()[1:]
    assert lines == ["  - 'lora_r' is not an agentrig key: use `lora_rank`",
                     "  - 'sequence_len' is not an agentrig key: Axolotl's sequence_len is `max_seq_length` here",
                     "  - 'max_length' is not an agentrig key: TRL's max_length is `max_seq_length` here",
                     "  - unknown key 'val_szie'; did you mean 'val_size'?"]
    assert not set(FOREIGN_KEYS) & set(FIELDS)
    # Every piece of advice that names a key (`max_seq_length`, `quantization_bit: 4`) names a real one.
    for key, advice in FOREIGN_KEYS.items():
        for named in re.findall(r"`([a-z0-9]+_[a-z0-9_]+)(?::[^`]*)?`", advice):
            assert named in FIELDS, (key, named)


LF_PYTHON = REPO / ".venv-lf" / "bin" / "python"  # LLaMA-Factory's own environment (`make llamafactory-env`)
# LLaMA-Factory's defaults where docs/training.md says they differ from agentrig's.
LF_DEFAULTS = {"lora_rank": 8, "lora_target": "all", "learning_rate": 5e-5, "per_device_train_batch_size": 8,
               "per_device_eval_batch_size": 8, "num_train_epochs": 3.0, "lr_scheduler_type": "linear",
               "save_steps": 500, "bf16": False, "cutoff_len": 2048, "lora_alpha": None, "ddp_timeout": 1800,
               "report_to": "none", "flash_attn": "auto", "quantization_type": "nf4", "double_quantization": True,
               "mix_strategy": "concat", "val_size": 0.0, "gradient_checkpointing": False,
               "disable_gradient_checkpointing": False}


@pytest.mark.skipif(not LF_PYTHON.exists(), reason="needs LLaMA-Factory's environment (make llamafactory-env)")
def test_every_key_is_llamafactorys_name_and_the_documented_defaults_are_its_own():
    import subprocess

    script = ("import dataclasses, enum, json\n"
              "from llamafactory.hparams import DataArguments, FinetuningArguments, ModelArguments, TrainingArguments\n"
              "out = {}\n"
              "for c in (ModelArguments, DataArguments, FinetuningArguments, TrainingArguments):\n"
              "    for f in dataclasses.fields(c):\n"
              "        d = f.default\n"
              "        d = d.value if isinstance(d, enum.Enum) else d\n"
              "        out.setdefault(f.name, d if isinstance(d, (str, int, float, bool, type(None))) else repr(d))\n"
              "print(json.dumps(out))\n")
    done = subprocess.run([str(LF_PYTHON), "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lf = json.loads(done.stdout.splitlines()[-1])
    from agentrig.train.trainconfig import LLAMAFACTORY_KEYS

    # the seed's name for cutoff_len, and LoRA's depth (mlx-lm's --num-layers), the tool-name and turn-opening
    # tokens' loss weights (train/keytokens.py) and the stop-gradient context (train/context.py), which LLaMA-Factory
    # has no key for
    assert [k for k in FIELDS if k not in lf] == ["lora_num_layers", "tool_name_weight", "decision_weight",
                                                  "figure_weight", "max_seq_length", "prompt_no_grad"]
    assert [k for k in LLAMAFACTORY_KEYS if k not in lf] == []
    assert {k: lf[k] for k in LF_DEFAULTS} == LF_DEFAULTS


@pytest.mark.parametrize("data, message", [
    ({"mix_strategy": "mix"}, r"mix_strategy 'mix' is not one of concat, interleave_under, interleave_over"),
    ({"dataset": "a,b", "interleave_probs": "0.5,0.5"}, r"interleave_probs needs mix_strategy interleave_"),
    ({"dataset": "a,b", "mix_strategy": "interleave_under", "interleave_probs": [1.0]}, r"1 values for 2 datasets"),
    ({"dataset": "a,b", "mix_strategy": "interleave_under", "interleave_probs": "0.5,0.4"}, r"sum to 1"),
    ({"dataset": "a,b", "mix_strategy": "interleave_over", "interleave_probs": "1,0"}, r"never finishes"),
    ({"interleave_probs": "a,b"}, r"'interleave_probs' must be numbers"),
    ({"max_samples": 0}, r"max_samples must be at least 1"),
    ({"val_size": 1.0}, r"val_size must be a fraction in \[0, 1\) or a count"),
    ({"val_size": 0.1, "eval_dataset": "e"}, r"val_size and eval_dataset are both set"),
    ({"eval_steps": 5}, r"eval_steps needs validation data: set val_size or eval_dataset"),
    ({"load_best_model_at_end": True}, r"load_best_model_at_end needs validation data"),
    ({"val_size": 4, "eval_steps": 3, "save_steps": 10, "load_best_model_at_end": True}, r"multiple of eval_steps \(3\)"),
    ({"report_to": "swanlab"}, r"report_to 'swanlab' is not one of none, tensorboard, wandb, mlflow"),
    ({"report_to": "none,wandb"}, r"`none` cannot be listed with others"),
    ({"flash_attn": "fa4"}, r"flash_attn 'fa4' is not one of auto, sdpa, disabled, fa2, fa3"),
    ({"bf16": True, "fp16": True}, r"bf16 and fp16 are both true"),
    ({"quantization_bit": 3}, r"quantization_bit must be 4 or 8"),
    ({"quantization_type": "int4"}, r"quantization_type 'int4' is not one of nf4, fp4"),
    ({"quantization_method": "gptq"}, r"quantization_method 'gptq' is not one of bnb"),
    ({"ddp_timeout": 0}, r"ddp_timeout must be at least 1"),
    ({"lora_num_layers": 0}, r"lora_num_layers must be at least 1 \(or unset for every layer\)"),
    ({"push_to_hub": True}, r"push_to_hub needs hub_model_id"),
    ({"resume_from_checkpoint": 3}, r"'resume_from_checkpoint' must be a path or true/false"),
    ({"gradient_checkpointing": "yes"}, r"'gradient_checkpointing' must be true or false"),
])
def test_bad_values_name_the_key_and_what_to_do(data, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict({"dataset": "d", **data})


def test_new_keys_default_to_what_the_seed_config_meant_and_round_trip(tmp_path):
    from transformers import TrainingArguments

    from agentrig.train.train import _training_kwargs

    seed = load_config(REPO / "examples" / "lora_agent.yaml")
    assert (seed.lora_alpha, seed.mix_strategy, seed.val_size, seed.reporters(), seed.quantization_bit) == \
        (64, "concat", 0.0, [], None)
    assert not (seed.gradient_checkpointing or seed.fp16 or seed.load_best_model_at_end or seed.push_to_hub)
    args = TrainingArguments(**_training_kwargs(seed, tmp_path / "ck"))
    assert (args.report_to, args.eval_strategy.value, args.gradient_checkpointing, args.ddp_timeout) == ([], "no", False, 1800)
    full = config_from_dict({"dataset": "a, b", "mix_strategy": "interleave_over", "interleave_probs": "0.25, 0.75",
                             "max_samples": 50, "val_size": 10, "eval_steps": 5, "save_steps": 10,
                             "load_best_model_at_end": True, "report_to": ["tensorboard", "wandb"], "run_name": "r",
                             "gradient_checkpointing": True, "flash_attn": "sdpa", "ddp_timeout": 7200,
                             "quantization_bit": 4, "double_quantization": False, "resume_from_checkpoint": True,
                             "push_to_hub": True, "hub_model_id": "me/agent"})
    assert full.datasets() == ["a", "b"] and full.interleave_probs == [0.25, 0.75] and full.val_size == 10
    assert full.reporters() == ["tensorboard", "wandb"]
    assert load_config(full.save(tmp_path)) == full
    args = TrainingArguments(**_training_kwargs(full, tmp_path / "ck", evaluate=True))
    assert args.report_to == ["wandb"]  # TensorBoard is attached by run_train itself, writing to logging_dir
    assert (args.eval_steps, args.load_best_model_at_end, args.metric_for_best_model, args.greater_is_better) == \
        (5, True, "eval_loss", False)
    assert (args.gradient_checkpointing, args.ddp_timeout, args.run_name, args.prediction_loss_only) == (True, 7200, "r", True)


# -- data: mixtures, max_samples, exports ----------------------------------------------------------

def _mix_config(**over):
    return config_from_dict({"dataset": "a,b", "seed": 3, **over})


def test_interleaving_draws_the_requested_proportions_and_stops_as_llamafactory_does():
    from agentrig.train.mixture import hold_out, mix

    parts = [list(range(400)), list(range(400))]
    under = mix(parts, _mix_config(mix_strategy="interleave_under", interleave_probs="0.8,0.2"))
    share = sum(k == 0 for k, _ in under) / len(under)
    assert abs(share - 0.8) < 0.04
    assert sum(k == 0 for k, _ in under) == 400 and len(set(under)) == len(under)  # until the first runs out, no repeats
    # In turn without probabilities; undersampling keeps as many of each as the smaller has.
    turns = mix([list(range(10)), list(range(30))], _mix_config(mix_strategy="interleave_under"))
    assert [k for k, _ in turns] == [0, 1] * 10
    # Oversampling uses every item of every source, repeating the smaller until the larger is done.
    over = mix([list(range(10)), list(range(30))], _mix_config(mix_strategy="interleave_over"))
    assert {(1, i) for i in range(30)} <= set(over) and {(0, i) for i in range(10)} <= set(over)
    assert len(over) == 60 and sum(k == 0 for k, _ in over) == 30
    assert mix([list(range(3)), list(range(2))], _mix_config()) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]  # concat
    # A held-out item leaves training with all its copies: no validation sample is trained on.
    train, val = hold_out(over, 5, seed=0)
    assert len(val) == 5 and not set(val) & set(train) and len(set(train)) == 40 - 5
    assert len(hold_out(over, 0.25, seed=0)[1]) == 10
    with pytest.raises(ConfigError, match="leaving none to train on"):
        hold_out([(0, 0), (0, 1)], 2, seed=0)


@pytest.fixture(scope="module")
def episodes_and_build(tmp_path_factory, smol_tokenizer):
    """Real episodes (detours included), their `data build` folder and its exports in every format and layout."""
    from agentrig.data.collect import CollectConfig, run_collect
    from agentrig.data.databuild import build_dataset
    from agentrig.data.exports import export_samples
    from agentrig.data.render import Renderer
    from agentrig.data.samples import Sample
    from agentrig.jsonl import read_jsonl

    root = tmp_path_factory.mktemp("mixdata")
    episodes = root / "episodes.jsonl"
    run_collect(CollectConfig(episodes=6, out=str(episodes), workers=1, detours=0.5), progress=False)
    build = root / "build"
    renderer = Renderer(smol_tokenizer)
    build_dataset(episodes, build, renderer=renderer, max_seq_length=2048)
    samples = [Sample.from_dict(r) for r in read_jsonl(build / "samples.jsonl")]
    exports = {"trl": {}, "axolotl": {}, "openai-native": {"openai_tools": "native"},
               "openai-hermes": {"openai_tools": "hermes"}, "llamafactory-chatml": {"llamafactory_layout": "chatml"},
               "llamafactory-sharegpt": {"llamafactory_layout": "sharegpt"}}
    for name, how in exports.items():
        export_samples(samples, name.split("-")[0], build / "exports" / name, max_seq_length=2048, renderer=renderer,
                       **how)
    return episodes, build, samples


def _tokens(path: Path) -> list[tuple[list[int], list[int]]]:
    return [(row["input_ids"], row["labels"]) for row in map(json.loads, path.read_text().splitlines())]


def test_exports_read_back_as_the_samples_they_came_from(episodes_and_build, smol_tokenizer):
    """Every export agentrig writes trains, through `agentrig.data.imports`, on the build's own tokens: its
    labels too where the format carries the detours' weight 0 (OpenAI, Axolotl, LLaMA-Factory chatml)."""
    from agentrig.data.imports import chatml_tokens, is_chatml_layout, read_export
    from agentrig.data.render import Renderer

    _, build, samples = episodes_and_build
    renderer = Renderer(smol_tokenizer)
    built = _tokens(build / "tokenized.jsonl")
    assert any(w == 0 for s in samples for m, w in zip(s.messages, s.weights) if m["role"] == "assistant")
    every_turn = [[float(m["role"] == "assistant") for m in s.messages] for s in samples]
    for name in ("trl", "axolotl", "openai-hermes", "llamafactory-sharegpt"):
        folder = build / "exports" / name
        assert not is_chatml_layout(folder, renderer.end_of_turn), name
        back = read_export(folder)
        assert len(back) == len(samples), name
        if name in ("trl", "axolotl"):
            assert [b.messages for b in back] == [s.messages for s in samples], name
        weighted = name in ("axolotl", "openai-hermes")
        # sharegpt merges a harness notice into the observation before it (LLaMA-Factory's alternation rule):
        # those samples come back with fewer messages; every other one gives the same tokens (new call ids aside).
        kept = [(s, b, turns) for s, b, turns in zip(samples, back, every_turn) if len(b.messages) == len(s.messages)]
        assert len(kept) == len(samples) if name != "llamafactory-sharegpt" else len(kept) >= len(samples) // 2, name
        for s, b, turns in kept:
            assert b.weights == (s.weights if weighted else turns), name
            ours = renderer.sample_turns(s.messages, s.weights if weighted else turns)
            theirs = renderer.sample_turns(b.messages, b.weights)
            assert (theirs.input_ids, theirs.labels) == (ours.input_ids, ours.labels), name
    chatml = build / "exports" / "llamafactory-chatml"
    assert is_chatml_layout(chatml, renderer.end_of_turn)
    for (ids, labels), (ours, our_labels) in zip([(r["input_ids"], r["labels"]) for r in chatml_tokens(chatml, renderer)],
                                                 built, strict=True):
        # The same tokens, but a weight-0 tail after the last supervised turn, which the layout leaves out.
        assert ours[:len(ids)] == ids and our_labels[:len(ids)] == labels and set(our_labels[len(ids):]) <= {-100}
    with pytest.raises(DataError, match=r"train.jsonl:1: its tools are only in the `tools` column \(OpenAI's native"):
        read_export(build / "exports" / "openai-native")


def test_an_export_row_with_tools_only_in_a_column_is_refused(tmp_path):
    from agentrig.data.imports import read_export

    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            {"messages": [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "sunny"}],
             "tools": [{"type": "function", "function": {"name": "weather", "parameters": {}}}]}]
    path = write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(DataError, match=r"train.jsonl:2: its tools are only in the `tools` column"):
        read_export(path)


def test_a_mixture_of_a_build_exports_and_episodes_trains_and_the_card_has_its_shares(tmp_path, tiny_model_dir,
                                                                                    episodes_and_build):
    from agentrig.train.train import run_train

    episodes, build, samples = episodes_and_build
    n = len(samples)
    sources = [build, build / "exports" / "axolotl", build / "exports" / "llamafactory-chatml" / "agentrig_agent.jsonl",
               episodes]
    config = mixed_config(tiny_model_dir, sources, tmp_path / "run", max_seq_length=2048, max_steps=1, save_steps=1,
                          per_device_train_batch_size=1, max_samples=n - 1)
    result = run_train(config)
    assert result.global_step == 1
    card = json.loads((tmp_path / "run" / "data_card.json").read_text())
    assert [s["kind"] for s in card["sources"]] == ["tokenized", "export", "export", "episodes"]
    assert [s["available"] for s in card["sources"]] == [n] * 4  # each export and the episodes built again, alike
    assert [s["read"] for s in card["sources"]] == [n - 1] * 4  # max_samples: the first n - 1 of each
    assert card["train_items"] == result.stats["samples"] == 4 * (n - 1)
    assert [s["share"] for s in card["sources"]] == [0.25] * 4
    assert sum(s["supervised_tokens"] for s in card["sources"]) == card["supervised_tokens"] == result.stats["supervised_tokens"]
    # The Axolotl export (detour weights kept) and the episodes were built on the fly to the build's tokens.
    for k in (1, 3):
        assert _tokens(tmp_path / "run" / "data" / str(k) / "tokenized.jsonl") == _tokens(build / "tokenized.jsonl"), k


def test_interleave_probs_set_the_trained_mixture_and_the_card_records_it(tmp_path, tiny_model_dir):
    from agentrig.train.train import run_train

    a = write_jsonl(tmp_path / "a" / "tokenized.jsonl", synthetic_samples(60, seed=1, low=8, high=16))
    b = write_jsonl(tmp_path / "b.jsonl", _shifted(synthetic_samples(60, seed=2, low=8, high=16), 3000))
    config = mixed_config(tiny_model_dir, [a.parent, b], tmp_path / "run", max_steps=1, save_steps=1,
                          mix_strategy="interleave_under", interleave_probs="0.75,0.25")
    result = run_train(config)
    card = json.loads((tmp_path / "run" / "data_card.json").read_text())
    drawn = [s["drawn"] for s in card["sources"]]
    assert drawn[0] == 60 and result.stats["samples"] == sum(drawn)  # stopped when `a` ran out
    assert card["sources"][0]["share"] == pytest.approx(0.75, abs=0.08)
    assert [s["requested"] for s in card["sources"]] == [0.75, 0.25]
    assert card["sources"][0]["share"] == round(drawn[0] / sum(drawn), 4)


# -- validation -----------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="needs tensorboard (the [dev] extra)")
def test_validation_loss_is_logged_to_the_progress_line_the_curve_and_tensorboard(tmp_path, tiny_model_dir, capfd,
                                                                                 monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agentrig.train.train import run_train

    monkeypatch.setenv("AGENTRIG_PROGRESS_INTERVAL", "0")
    data = write_jsonl(tmp_path / "data" / "tokenized.jsonl", synthetic_samples(20, seed=1, vocab=12))
    config = tiny_config(tiny_model_dir, data.parent, tmp_path / "run", max_steps=6, save_steps=3, eval_steps=2,
                         val_size=0.25, report_to="tensorboard", logging_dir=str(tmp_path / "tb"), learning_rate=1e-2)
    result = run_train(config)
    err = capfd.readouterr().err
    assert result.stats["val_samples"] == 5 and result.stats["samples"] == 15
    validated = {h["step"]: h["eval_loss"] for h in result.loss_history if "eval_loss" in h}
    assert sorted(validated) == [2, 4, 6]
    assert validated[6] < validated[2]  # the held-out samples share the training data's 12 tokens
    assert re.search(r": 3/6 \(50%\), .*loss [\d.]+, val [\d.]+", err), err  # step 2's, measured after step 2
    assert f"val {validated[6]:.4f}" in err
    curve = json.loads((tmp_path / "run" / "loss_curve.json").read_text())
    assert {c["step"]: c["eval_loss"] for c in curve if "eval_loss" in c} == validated
    # The events TensorBoard reads: transformers' own tags, the run's losses.
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    train_loss = {e.step: e.value for e in events.Scalars("train/loss")}
    assert train_loss == pytest.approx({h["step"]: h["loss"] for h in result.loss_history}, rel=1e-6)
    assert {e.step: e.value for e in events.Scalars("eval/loss")} == pytest.approx(validated, rel=1e-6)
    assert not (tmp_path / "run" / "logs").exists()  # logging_dir, not the default


def test_the_saved_adapter_is_the_checkpoint_with_the_lowest_validation_loss(tmp_path, tiny_model_dir):
    """Validation samples with the training prompts but replies in tokens training never rewards: training
    raises their loss, so the best checkpoint is an early one, and load_best_model_at_end saves it as adapter/."""
    from agentrig.train.train import run_train

    samples = synthetic_samples(8, seed=1, vocab=12)
    train = write_jsonl(tmp_path / "train.jsonl", samples)
    other = [{**s, "input_ids": [t if lab == -100 else t + 3000 for t, lab in zip(s["input_ids"], s["labels"])],
              "labels": [lab if lab == -100 else lab + 3000 for lab in s["labels"]]} for s in samples[:6]]
    val = write_jsonl(tmp_path / "val" / "tokenized.jsonl", other)
    config = tiny_config(tiny_model_dir, train, tmp_path / "run", max_steps=8, save_steps=2, eval_dataset=str(val.parent),
                         load_best_model_at_end=True, learning_rate=2e-2, bf16=False)
    result = run_train(config)
    validated = {h["step"]: h["eval_loss"] for h in result.loss_history if "eval_loss" in h}
    best = min(validated, key=validated.get)
    assert sorted(validated) == [2, 4, 6, 8] and best != 8
    assert result.stats["best_step"] == best and result.stats["best_eval_loss"] == pytest.approx(validated[best])
    adapter = _adapter(Path(result.adapter_dir))
    checkpoints = tmp_path / "run" / "checkpoints"
    assert _same(adapter, _adapter(checkpoints / f"checkpoint-{best}"))
    assert not _same(adapter, _adapter(checkpoints / "checkpoint-8"))  # the last weights, not saved as the adapter
    card = json.loads((tmp_path / "run" / "data_card.json").read_text())
    assert card["validation"]["from"] == "eval_dataset" and card["validation"]["items"] == 6


def test_dpo_mixes_pair_files_and_scores_held_out_pairs_against_their_own_reference(tmp_path, tiny_model_dir,
                                                                                   sft_adapter):
    import math

    from agentrig.train.train import run_train

    a = write_jsonl(tmp_path / "a.jsonl", synthetic_pairs(8, seed=1))
    b = write_jsonl(tmp_path / "b" / "pairs.jsonl", synthetic_pairs(8, seed=2))
    config = mixed_config(tiny_model_dir, [a, b.parent], tmp_path / "run", stage="dpo", adapter_name_or_path=str(sft_adapter),
                          max_steps=2, save_steps=2, val_size=4, pref_beta=0.5)
    result = run_train(config)
    assert (result.stats["pairs"], result.stats["pairs_available"], result.stats["val_pairs"]) == (4, 12, 4)
    card = json.loads((tmp_path / "run" / "data_card.json").read_text())
    assert [s["available"] for s in card["sources"]] == [8, 8] and sum(s["drawn"] for s in card["sources"]) == 12
    assert card["validation"] == {"items": 4, "from": "val_size", "val_size": 4, "eval_dataset": []}
    # Scored against the SFT adapter's log-probs of those same pairs: two steps from the start, still near log 2.
    eval_loss = next(h["eval_loss"] for h in result.loss_history if "eval_loss" in h)
    assert abs(eval_loss - math.log(2)) < 0.1


# -- memory, precision, attention, hardware ------------------------------------------------------

def _layer_calls():
    """A callback counting calls of the first decoder layer's MLP during training, and the attention in use.

    A pre-hook on the MLP: the layer is checkpointed inside its `forward` (its own hooks run once), and the
    recompute stops after the last tensor backward needs, before a forward hook would run."""
    from transformers import TrainerCallback

    class Count(TrainerCallback):
        calls = 0
        attention = ""

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            layer = next(m for n, m in model.named_modules() if n.endswith("layers.0.mlp"))
            layer.register_forward_pre_hook(lambda *a: setattr(self, "calls", self.calls + 1))
            self.attention = model.config._attn_implementation

    return Count()


def test_gradient_checkpointing_recomputes_the_forward_and_trains_the_same(tmp_path, tiny_model_dir):
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(4, seed=1, vocab=12))
    runs = {}
    for on in (False, True):
        count, snaps = _layer_calls(), weight_snapshots()
        result = run_train(tiny_config(tiny_model_dir, data, tmp_path / f"run_{on}", max_steps=3, save_steps=3,
                                       gradient_checkpointing=on, bf16=False), callbacks=[count, snaps])
        runs[on] = (count.calls, [h["loss"] for h in result.loss_history], _adapter(Path(result.adapter_dir)))
        assert any(".lora_B." in n and not (snaps.begin[n] == snaps.end[n]).all() for n in snaps.begin)
    assert runs[False][0] == 3 and runs[True][0] == 6  # each step's forward runs again in backward
    assert runs[True][1] == pytest.approx(runs[False][1], rel=1e-5)
    import torch

    assert all(torch.allclose(runs[True][2][k], runs[False][2][k], atol=1e-6) for k in runs[False][2])


def test_attention_choices_use_that_implementation_and_train_the_same(tmp_path, tiny_model_dir):
    from agentrig.train.attention import NAME
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(6, seed=4))
    losses = {}
    for choice, implementation in (("auto", NAME), ("sdpa", "sdpa"), ("disabled", "eager")):
        count = _layer_calls()
        result = run_train(tiny_config(tiny_model_dir, data, tmp_path / choice, max_steps=3, save_steps=3,
                                       flash_attn=choice, bf16=False), callbacks=[count])
        assert count.attention == implementation
        losses[choice] = [h["loss"] for h in result.loss_history]
    # Packed rows keep their samples apart in every implementation: the same losses.
    assert losses["sdpa"] == pytest.approx(losses["auto"], rel=1e-4)
    assert losses["disabled"] == pytest.approx(losses["auto"], rel=1e-4)


@pytest.mark.skipif(_cuda(), reason="the refusals are for a machine without a CUDA GPU")
@pytest.mark.parametrize("key, says", [
    ({"quantization_bit": 4}, ["quantization_bit 4 (QLoRA) needs a CUDA GPU", "this machine has none",
                               "remove quantization_bit to train LoRA on the full-precision base here"]),
    ({"quantization_bit": 8, "quantization_type": "fp4"}, ["quantization_bit 8 (QLoRA) needs a CUDA GPU"]),
    ({"fp16": True}, ["fp16 needs a CUDA GPU", "bf16: false"]),
    ({"flash_attn": "fa2"}, ["flash_attn fa2 needs a CUDA GPU and the flash-attn package", "flash_attn: auto"]),
])
def test_gpu_only_keys_are_validated_then_refused_on_this_cpu_with_the_reason(tmp_path, key, says):
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(4))
    config = config_from_dict({"dataset": str(data), "output_dir": str(tmp_path / "run"), **key})  # a valid config
    assert load_config(config.save(tmp_path)) == config
    with pytest.raises(ConfigError) as caught:
        run_train(config)
    for words in says:
        assert words in str(caught.value)
    assert not (tmp_path / "run").exists()  # refused before anything loads or is written


def test_the_bitsandbytes_config_says_what_the_keys_say():
    import torch

    from agentrig.train.train import bnb_config

    four = bnb_config(config_from_dict({"dataset": "d", "quantization_bit": 4, "bf16": True}))
    assert (four.load_in_4bit, four.bnb_4bit_quant_type, four.bnb_4bit_use_double_quant) == (True, "nf4", True)
    assert four.bnb_4bit_compute_dtype == torch.bfloat16
    fp4 = bnb_config(config_from_dict({"dataset": "d", "quantization_bit": 4, "quantization_type": "fp4",
                                       "double_quantization": False, "bf16": False}))
    assert (fp4.bnb_4bit_quant_type, fp4.bnb_4bit_use_double_quant, fp4.bnb_4bit_compute_dtype) == ("fp4", False, torch.float32)
    assert bnb_config(config_from_dict({"dataset": "d", "quantization_bit": 8})).load_in_8bit


@pytest.mark.skipif(not _cuda() or importlib.util.find_spec("bitsandbytes") is None,
                    reason="QLoRA needs a CUDA GPU and bitsandbytes")
def test_qlora_trains_on_a_gpu_and_its_adapter_passes_the_vllm_check(tmp_path, tiny_model_dir):
    import torch

    from agentrig.train.export import check_vllm_adapter
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(4, seed=1, vocab=12))
    snaps = weight_snapshots()
    result = run_train(tiny_config(tiny_model_dir, data, tmp_path / "run", max_steps=10, learning_rate=1e-2,
                                   quantization_bit=4, gradient_checkpointing=True, save_steps=10), callbacks=[snaps])
    losses = [h["loss"] for h in result.loss_history]
    assert losses[-1] < losses[0]
    moved = [n for n in snaps.begin if ".lora_B." in n and not torch.equal(snaps.begin[n], snaps.end[n])]
    assert moved
    assert check_vllm_adapter(result.adapter_dir).ok and result.vllm_command


def test_deepspeed_ddp_timeout_and_reporters_are_checked_and_passed_on(tmp_path):
    from transformers import TrainingArguments

    from agentrig.train.train import _training_kwargs, preflight

    with pytest.raises(ConfigError, match=r"deepspeed .*no_such.json: there is no such file"):
        preflight(config_from_dict({"dataset": "d", "deepspeed": str(tmp_path / "no_such.json")}))
    ds = tmp_path / "ds_z2.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}))
    config = config_from_dict({"dataset": "d", "deepspeed": str(ds), "ddp_timeout": 7200})
    assert _training_kwargs(config, tmp_path)["deepspeed"] == str(ds)  # TrainingArguments hands it to accelerate
    if importlib.util.find_spec("deepspeed") is None:
        with pytest.raises(ConfigError, match=r"deepspeed needs the deepspeed package \(pip install deepspeed\)"):
            preflight(config)
    args = TrainingArguments(**{**_training_kwargs(config, tmp_path), "deepspeed": None})
    assert args.ddp_timeout == 7200 and args.ddp_timeout_delta.total_seconds() == 7200
    for reporter in ("wandb", "mlflow"):
        if importlib.util.find_spec(reporter) is None:
            with pytest.raises(ConfigError, match=f"report_to {reporter} needs the {reporter} package: pip install {reporter}"):
                preflight(config_from_dict({"dataset": "d", "report_to": reporter}))


def test_lora_num_layers_trains_only_the_last_layers_and_their_adapter_loads(tmp_path, tiny_model_dir):
    """`lora_num_layers: 1` on the tiny model's 2 layers: LoRA on every linear module of layer 1 and nowhere else,
    those weights move, the base does not, and the saved adapter loads back with the same layers."""
    from peft import PeftConfig, PeftModel

    from agentrig.models import load_model
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(6, seed=2))
    snaps = weight_snapshots()
    result = run_train(tiny_config(tiny_model_dir, data, tmp_path / "run", max_steps=2, save_steps=2, lora_num_layers=1,
                                   lora_target="all"),
                       callbacks=[snaps])
    lora = [n for n in snaps.trainable if ".lora_" in n]
    assert lora and all(".layers.1." in n for n in lora) and snaps.trainable == lora
    modules = {n.split(".layers.1.")[1].split(".lora_")[0] for n in lora}
    assert modules == {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                       "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    assert any(not (snaps.begin[n] == snaps.end[n]).all() for n in lora if ".lora_B." in n)
    assert all((snaps.begin[n] == snaps.end[n]).all() for n in snaps.begin if n not in lora)
    saved = _adapter(Path(result.adapter_dir))
    assert saved and all(".layers.1." in k for k in saved)
    assert PeftConfig.from_pretrained(result.adapter_dir).layers_to_transform == [1]
    assert result.vllm_command  # the vLLM check passes: no modules_to_save, no DoRA
    loaded = PeftModel.from_pretrained(load_model(str(tiny_model_dir)), result.adapter_dir)
    assert sorted(n for n, _ in loaded.named_parameters() if ".lora_" in n) == sorted(lora)


def test_lora_num_layers_beyond_the_model_says_how_many_it_has(tmp_path, tiny_model_dir):
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(4, seed=2))
    with pytest.raises(ConfigError, match=r"lora_num_layers 3: the model has 2 decoder layers; give at most 2"):
        run_train(tiny_config(tiny_model_dir, data, tmp_path / "run", lora_num_layers=3))


def test_seed_sets_the_lora_init_and_the_data_order(tmp_path, tiny_model_dir):
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(6, seed=1))
    runs = [run_train(tiny_config(tiny_model_dir, data, tmp_path / f"run{k}", max_steps=2, save_steps=2, seed=seed))
            for k, seed in enumerate((7, 7, 8))]
    same, again, other = (_adapter(Path(r.adapter_dir)) for r in runs)
    assert _same(same, again) and not _same(same, other)


# -- resuming and publishing ---------------------------------------------------------------------

def test_resume_from_checkpoint_continues_from_the_named_checkpoint_or_the_newest(tmp_path, tiny_model_dir):
    from transformers import TrainerCallback

    from agentrig.train.train import run_train

    class StopAt(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:
                control.should_training_stop = True

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(6, seed=2))

    def config(out, **over):
        return tiny_config(tiny_model_dir, data, tmp_path / out, max_steps=6, save_steps=3, lr_scheduler_type="cosine",
                           **over)

    assert run_train(config("first"), callbacks=[StopAt()]).global_step == 3
    named = str(tmp_path / "first" / "checkpoints" / "checkpoint-3")
    elsewhere = run_train(config("second", resume_from_checkpoint=named))  # another run's checkpoint, by path
    newest = run_train(config("first", resume_from_checkpoint=True))  # as --resume
    for result in (elsewhere, newest):
        assert result.global_step == 6 and [h["step"] for h in result.loss_history] == list(range(1, 7))
    import torch

    a, b = _adapter(Path(elsewhere.adapter_dir)), _adapter(Path(newest.adapter_dir))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    with pytest.raises(ConfigError, match=r"resume_from_checkpoint .*checkpoint-9: not a complete checkpoint"):
        run_train(config("third", resume_from_checkpoint=str(tmp_path / "first" / "checkpoints" / "checkpoint-9")))
    with pytest.raises(ConfigError, match=r"already holds checkpoints: pass --resume \(or resume_from_checkpoint: true\)"):
        run_train(config("first"))


def test_push_to_hub_uploads_the_trained_adapter_through_peft(tmp_path, tiny_model_dir, monkeypatch):
    """PEFT's push_to_hub runs for real (save into a temporary folder, upload what it wrote); only the two hub
    calls (create the repository, commit the files) and the model-card download are replaced."""
    import huggingface_hub
    import transformers.utils.hub as hub

    from agentrig.train.train import run_train

    uploads = {}

    class Hub:
        def create_repo(self, repo_id, private=None, token=None, exist_ok=False):
            uploads["repo"] = (repo_id, private)
            return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

        def create_commit(self, repo_id, operations, commit_message, **kwargs):
            uploads["message"] = commit_message
            uploads["files"] = {op.path_in_repo: Path(op.path_or_fileobj).read_bytes() for op in operations}
            return huggingface_hub.CommitInfo(commit_url=f"https://huggingface.co/{repo_id}/commit/1",
                                              commit_message=commit_message, commit_description="", oid="1")

    monkeypatch.setattr(hub, "hf_api", lambda: Hub())
    card = huggingface_hub.ModelCard("---\nlibrary_name: peft\n---\n")
    monkeypatch.setattr(hub, "create_and_tag_model_card", lambda *a, **k: card)
    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(4, seed=1))
    config = tiny_config(tiny_model_dir, data, tmp_path / "run", max_steps=2, save_steps=2, push_to_hub=True,
                         hub_model_id="me/datadesk-agent", hub_private_repo=True)
    with pytest.raises(ConfigError, match="push_to_hub, but HF_HUB_OFFLINE is set"):
        run_train(config)  # the tests run offline: refused before training, not after
    monkeypatch.delenv("HF_HUB_OFFLINE")
    result = run_train(config)
    assert uploads["repo"] == ("me/datadesk-agent", True)
    assert result.hub_url == "https://huggingface.co/me/datadesk-agent/commit/1"
    assert "2 steps" in uploads["message"]
    adapter = Path(result.adapter_dir)
    assert uploads["files"]["adapter_model.safetensors"] == (adapter / "adapter_model.safetensors").read_bytes()
    assert json.loads(uploads["files"]["adapter_config.json"]) == json.loads((adapter / "adapter_config.json").read_text())


def test_neftune_noise_alpha_puts_noise_on_the_embeddings_while_training(tmp_path, tiny_model_dir):
    """`neftune_noise_alpha`: the input embeddings are noisy in training mode (two passes over the same ids differ)
    and exact in eval mode; the same seed without it trains another adapter."""
    import torch
    from transformers import TrainerCallback

    from agentrig.train.train import run_train

    class Probe(TrainerCallback):
        seen: list[tuple[bool, bool]] = []

        def on_step_end(self, args, state, control, model=None, **kwargs):
            embed = model.get_input_embeddings()
            ids = torch.tensor([[1, 2, 3, 4]])
            was = embed.training
            embed.train()
            noisy = not torch.equal(embed(ids), embed(ids))
            embed.eval()
            exact = torch.equal(embed(ids), embed(ids))
            embed.train(was)
            self.seen.append((noisy, exact))

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(6, seed=3))
    probe = Probe()
    noisy = run_train(tiny_config(tiny_model_dir, data, tmp_path / "noisy", max_steps=2, save_steps=2, seed=5,
                                  neftune_noise_alpha=5.0), callbacks=[probe])
    assert probe.seen == [(True, True), (True, True)]
    plain = run_train(tiny_config(tiny_model_dir, data, tmp_path / "plain", max_steps=2, save_steps=2, seed=5))
    a, b = _adapter(Path(noisy.adapter_dir)), _adapter(Path(plain.adapter_dir))
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)
    assert all(torch.isfinite(v).all() for v in a.values())
    with pytest.raises(ConfigError, match="neftune_noise_alpha must be positive"):
        run_train(tiny_config(tiny_model_dir, data, tmp_path / "bad", neftune_noise_alpha=0.0))


def test_torch_compile_compiles_each_decoder_layer_and_trains_the_eager_adapter(tmp_path, tiny_model_dir, monkeypatch):
    """`torch_compile`: every decoder layer runs compiled (in place: the adapter's keys are the eager run's), and
    the same seed trains the same losses and adapter up to float rounding; refused without a C++ compiler."""
    import shutil

    import torch
    from transformers import TrainerCallback

    from agentrig.train import compile as compile_module
    from agentrig.train.train import run_train

    if not compile_module.has_cpp_compiler():
        pytest.skip("TorchInductor needs a C++ compiler on a CPU, and this machine has none")

    class Probe(TrainerCallback):
        compiled: list[bool] = []

        def on_step_end(self, args, state, control, model=None, **kwargs):
            layers = compile_module.repeated_blocks(model)
            self.compiled.append(len(layers) == 2 and all(b._compiled_call_impl is not None for b in layers))

    data = write_jsonl(tmp_path / "tokenized.jsonl", synthetic_samples(6, seed=3))
    probe = Probe()
    torch._dynamo.reset()
    graphs_before = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled = run_train(tiny_config(tiny_model_dir, data, tmp_path / "compiled", max_steps=3, save_steps=3, seed=5,
                                     torch_compile=True, bf16=False), callbacks=[probe])
    assert probe.compiled == [True, True, True]
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] > graphs_before  # TorchInductor really ran
    eager = run_train(tiny_config(tiny_model_dir, data, tmp_path / "eager", max_steps=3, save_steps=3, seed=5,
                                  bf16=False))
    losses = [row["loss"] for row in compiled.loss_history], [row["loss"] for row in eager.loss_history]
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)
    a, b = _adapter(Path(compiled.adapter_dir)), _adapter(Path(eager.adapter_dir))
    # Fused kernels sum in another order, and Adam scales small gradient differences up: 7.5e-5 measured on
    # weights up to 0.13 after 3 steps at 5e-3.
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=5e-4) for k in a)
    assert any(not torch.equal(v, torch.zeros_like(v)) for k, v in a.items() if "lora_B" in k)  # it trained

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="needs a C\\+\\+ compiler"):
        run_train(tiny_config(tiny_model_dir, data, tmp_path / "no-cc", max_steps=1, torch_compile=True))
    with pytest.raises(ConfigError, match="no repeated layers"):
        compile_module.compile_layers(torch.nn.Sequential(torch.nn.Linear(2, 2)))
