"""`agentrig train --config FILE.yaml [--resume]`: LoRA SFT and DPO, fast on CPU, ready for many GPUs.

Recipe (`run_train`): load the config, the tokenizer and the model; read the pre-tokenized samples (or
preference pairs); pack them; train with TRL's `SFTTrainer` (or the DPO loop) on a PEFT LoRA config;
save the adapter with the resolved config beside it, check that vLLM can serve it, and write the loss
curve. Accelerate runs underneath, so `accelerate launch -m agentrig train --config ...` trains the same
config with DDP, FSDP or DeepSpeed (see docs/training.md).

Where the speed comes from on CPU: best-fit packing with per-sample position ids (no padding, no
cross-sample attention; `packing.py`), causal attention per sample with the fused SDPA kernel instead of
a block-diagonal mask (`attention.py`), the gated MLP's activation saving two tensors instead of three
(`fused.py`), the LM head and loss only at supervised positions (`lmloss.py`),
no gradient checkpointing (it recomputes the forward; CPU RAM is not the limit for small models), and
bf16 mixed precision wherever the hardware has it natively, CPUs with AVX512-BF16 or AMX included (~2x
per step there; `bf16: false` trains in fp32).

Layout of `output_dir`: `adapter/` (PEFT `save_pretrained` + `agentrig_train.yaml`), `checkpoints/`
(every `save_steps`; `--resume` continues from the newest complete one), `loss_curve.json`/`.png`,
`agentrig_train.yaml`, and for DPO `reference_logps.jsonl`.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrig.errors import ConfigError, DataError
from agentrig.jsonl import expect_kind
from agentrig.train.packing import TokenizedSample
from agentrig.train.trainconfig import TrainConfig, load_config


@dataclass
class TrainResult:
    """What a training run produced."""

    adapter_dir: str
    output_dir: str
    stage: str
    loss_history: list[dict[str, float]]
    global_step: int
    train_seconds: float
    tokens: int
    supervised_tokens: int
    vllm_command: str
    stats: dict[str, float] = field(default_factory=dict)


# -- data -----------------------------------------------------------------------------------------

def _dataset_path(dataset: str) -> Path:
    path = Path(dataset)
    if path.is_dir() and (path / "pairs.jsonl").is_file() and not (path / "tokenized.jsonl").is_file():
        return path / "pairs.jsonl"  # a folder of pairs means its pairs.jsonl
    return path


def check_dataset(config: TrainConfig) -> tuple[str, Path]:
    """The dataset's kind and file, refused before anything loads when the stage cannot train on it.

    SFT: ("tokenized", file) for a `data build` folder or its tokenized.jsonl, ("episodes", file) for
    episodes or canonical samples (built on the fly). DPO: ("pairs", file), after checking the SFT adapter.
    """
    path = _dataset_path(config.dataset)
    if config.stage == "dpo":
        if not config.adapter_name_or_path:
            raise ConfigError("stage dpo needs adapter_name_or_path: the SFT adapter to start from (and the reference)")
        if not (Path(config.adapter_name_or_path) / "adapter_config.json").is_file():
            raise ConfigError(f"adapter_name_or_path {config.adapter_name_or_path!r} is not a PEFT adapter folder")
        return expect_kind(path, ("pairs",), "stage dpo dataset:"), path
    kind = expect_kind(path, ("build", "tokenized", "episodes", "samples"), "dataset:")
    if kind == "build":
        return "tokenized", path / "tokenized.jsonl"
    return ("tokenized", path) if kind == "tokenized" else ("episodes", path)


def load_tokenized(path: str | Path) -> list[TokenizedSample]:
    """Read `tokenized.jsonl` (`{"sample_id", "input_ids", "labels"}` per line), validating every line."""
    path = Path(path)
    from agentrig.jsonl import iter_jsonl

    samples = []
    for lineno, row in iter_jsonl(path):
        ids, labels = row.get("input_ids"), row.get("labels")
        if not isinstance(ids, list) or not ids or not isinstance(labels, list) or len(labels) != len(ids):
            raise DataError(f"{path}:{lineno}: needs non-empty input_ids and labels of the same length")
        samples.append(TokenizedSample(str(row.get("sample_id", lineno)), ids, labels))
    if not samples:
        raise DataError(f"{path}: no samples")
    return samples


def _setup_sft_data(config: TrainConfig) -> list[TokenizedSample]:
    kind, path = check_dataset(config)
    if kind == "tokenized":
        return load_tokenized(path)
    # An episodes file: build it on the fly with the data pipeline, beside the run, for this model.
    from agentrig.data.databuild import build_dataset

    built = Path(config.output_dir) / "data"
    if not (built / "tokenized.jsonl").is_file():
        build_dataset([path], built, model=config.model_name_or_path, max_seq_length=config.max_seq_length)
    return load_tokenized(built / "tokenized.jsonl")


def _check_vocab(max_id: int, model: Any, source: str) -> None:
    vocab = model.get_input_embeddings().weight.shape[0]
    if max_id >= vocab:
        raise DataError(f"{source}: token id {max_id} is outside the model's vocabulary ({vocab}); "
                        "was the data tokenized for another model?")


# -- model ----------------------------------------------------------------------------------------

def _setup_model(config: TrainConfig) -> Any:
    """The base model (fp32 on CPU, bf16 on capable GPUs) with the supervised-position head."""
    from agentrig.train.attention import use_packed_attention
    from agentrig.train.fused import fuse_gated_mlps
    from agentrig.train.lmloss import add_supervised_head
    from agentrig.models import load_model

    try:
        model = load_model(config.model_name_or_path)
    except OSError as exc:
        raise ConfigError(f"cannot load model {config.model_name_or_path!r} offline: {exc}") from None
    model.config.use_cache = False
    use_packed_attention(model, config.max_seq_length)
    fuse_gated_mlps(model)
    return add_supervised_head(model)


def _lora_config(config: TrainConfig) -> Any:
    from peft import LoraConfig

    # No modules_to_save and no DoRA: vLLM refuses both (export.check_vllm_adapter).
    return LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=config.target_modules(), bias="none", task_type="CAUSAL_LM")


def _training_kwargs(config: TrainConfig, checkpoints: Path) -> dict[str, Any]:
    """Arguments shared by the SFT and DPO `TrainingArguments`."""
    import torch
    import transformers

    bf16 = config.use_bf16()
    return dict(
        output_dir=str(checkpoints), per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps, learning_rate=config.learning_rate,
        num_train_epochs=config.num_train_epochs, max_steps=config.max_steps or -1,
        lr_scheduler_type=config.lr_scheduler_type, **_warmup(config.warmup_ratio, transformers.__version__),
        seed=config.seed, data_seed=config.seed, save_strategy="steps", save_steps=config.save_steps, save_total_limit=2,
        logging_steps=1, report_to="none", disable_tqdm=True, log_level="warning", bf16=bf16, fp16=False,
        # transformers accepts bf16 without a GPU only when told the CPU is meant (autocast on the CPU).
        **({"use_cpu": True} if bf16 and not torch.cuda.is_available() else {}),
        remove_unused_columns=False, gradient_checkpointing=False, ddp_find_unused_parameters=False,
        dataloader_num_workers=0, dataloader_pin_memory=torch.cuda.is_available(),
    )


def _warmup(ratio: float, transformers_version: str) -> dict[str, float]:
    """The warmup share in the form the installed transformers reads.

    transformers 5 removed `warmup_ratio` and reads a float `warmup_steps` below 1 as a share of the steps;
    4.x (which pyproject allows from 4.57) has `warmup_ratio` and reads `warmup_steps` as a step count, so
    0.1 there would mean almost no warmup.
    """
    return {"warmup_steps": ratio} if int(transformers_version.split(".")[0]) >= 5 else {"warmup_ratio": ratio}


# -- trainers -------------------------------------------------------------------------------------

def _sft_trainer_class() -> type:
    from trl import SFTTrainer

    class PackedSFTTrainer(SFTTrainer):
        """SFTTrainer whose loss runs the LM head only at supervised positions (see lmloss.py)."""

        def __init__(self, *args: Any, meter: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.meter = meter

        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            import torch

            out = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"],
                        supervised_labels=inputs["labels"])
            n_supervised = out["mask"].sum()
            # Same normalisation as TRL's own compute_loss: by the tokens of the whole accumulated batch.
            denominator = n_supervised if num_items_in_batch is None else num_items_in_batch
            loss = -out["token_logps"].sum() / torch.as_tensor(denominator).clamp(min=1)
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes
            if model.training:
                self.meter.add(int(inputs["num_tokens"]), int(n_supervised))
            return (loss, out) if return_outputs else loss

    return PackedSFTTrainer


def _build_sft(config: TrainConfig, tokenizer: Any, meter: Any, checkpoints: Path) -> tuple[Any, dict[str, float]]:
    from datasets import Dataset
    from trl import SFTConfig

    from agentrig.train.attention import NAME as PACKED_ATTENTION
    from agentrig.train.packing import RowCollator, pack_rows, packing_stats

    samples = _setup_sft_data(config)
    truncated = sum(len(s.input_ids) > config.max_seq_length for s in samples)
    rows = pack_rows(samples, config.max_seq_length, packing=config.packing)
    stats = packing_stats(rows, config.max_seq_length)
    if stats["supervised_tokens"] == 0:
        raise DataError(f"{config.dataset}: no supervised tokens (every label is -100)")
    stats.update(samples=len(samples), truncated=truncated)
    model = _setup_model(config)
    _check_vocab(max(max(r["input_ids"]) for r in rows), model, config.dataset)
    # Rows of a batch are joined without padding when attention already keeps samples apart by position.
    per_sample_attention = model.config._attn_implementation == PACKED_ATTENTION
    args = SFTConfig(**_training_kwargs(config, checkpoints), dataset_kwargs={"skip_prepare_dataset": True},
                     packing=False, padding_free=False, max_length=None)
    trainer = _sft_trainer_class()(
        model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        data_collator=RowCollator(tokenizer.pad_token_id, padding_free=per_sample_attention),
        peft_config=_lora_config(config), meter=meter)
    return trainer, stats


def _build_dpo(config: TrainConfig, tokenizer: Any, meter: Any, checkpoints: Path,
               output_dir: Path) -> tuple[Any, dict[str, float]]:
    from datasets import Dataset
    from peft import PeftModel
    from transformers import TrainingArguments

    from agentrig.train.dpo import PairCollator, compute_logps, dpo_trainer_class, load_pairs
    from agentrig.train.trainlog import progress_bar

    _, path = check_dataset(config)
    pairs = load_pairs(path, tokenizer)
    available = len(pairs)
    pairs = pairs_for_run(pairs, config)
    from agentrig.models import quiet_loading

    with quiet_loading():  # PEFT's is_gradient_checkpointing deprecation on every adapter load
        model = PeftModel.from_pretrained(_setup_model(config), config.adapter_name_or_path, is_trainable=True)
    _check_vocab(max(max(p.prompt_ids + p.chosen_ids + p.rejected_ids) for p in pairs), model, config.dataset)
    # The reference: the SFT adapter exactly as loaded, before any update (a frozen copy by construction).
    with progress_bar(f"dpo reference log-probs of {len(pairs)} pairs", len(pairs)) as advance:
        reference = compute_logps(model, pairs, config.max_seq_length, tokenizer.pad_token_id, on_batch=advance,
                                  bf16=config.use_bf16())
    with (output_dir / "reference_logps.jsonl").open("w") as fh:
        for pair, (chosen, rejected) in zip(pairs, reference):
            fh.write(json.dumps({"pair_id": pair.pair_id, "chosen": chosen, "rejected": rejected}) + "\n")
    rows = [{"prompt_ids": p.prompt_ids, "chosen_ids": p.chosen_ids, "rejected_ids": p.rejected_ids,
             "ref_chosen": c, "ref_rejected": r} for p, (c, r) in zip(pairs, reference)]
    trainer = dpo_trainer_class()(
        model=model, args=TrainingArguments(**_training_kwargs(config, checkpoints)),
        train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
        data_collator=PairCollator(tokenizer.pad_token_id, config.max_seq_length), beta=config.pref_beta, ftx=config.pref_ftx, meter=meter)
    return trainer, {"pairs": len(pairs), "pairs_available": available}


def pairs_for_run(pairs: list[Any], config: TrainConfig) -> list[Any]:
    """The pairs a DPO run with `max_steps` will see: a seeded sample of steps x batch x accumulation x processes.

    Without this, a pair file much larger than the run (all ~2,800 pairs of the main job for 24 steps of 2)
    would have every pair's reference log-probs computed before the first step, hours on a CPU, for pairs
    never trained on. The sample depends only on the seed, so a resumed run gets the same pairs (and the
    same references). `max_steps` unset, or a run that covers the whole file: every pair, in file order.
    The sample is uniform and knows nothing of where a pair came from; to choose the pairs (the policy's
    own first), write the round's file beforehand: `agentrig data pairs --limit N` (`pairs.mix_pairs`),
    as the main job does.
    """
    import os
    import random

    if not config.max_steps:
        return pairs
    world = int(os.environ.get("WORLD_SIZE", "1"))
    need = config.max_steps * config.per_device_train_batch_size * config.gradient_accumulation_steps * world
    if need >= len(pairs):
        return pairs
    keep = sorted(random.Random(config.seed).sample(range(len(pairs)), need))
    return [pairs[i] for i in keep]


# -- checkpoints ----------------------------------------------------------------------------------

def last_complete_checkpoint(checkpoints: Path) -> Path | None:
    """The newest `checkpoint-N` whose trainer_state.json (written last by `Trainer`) is complete JSON."""
    found = []
    for path in checkpoints.glob("checkpoint-*"):
        state = path / "trainer_state.json"
        if not path.name.split("-")[-1].isdigit() or not state.is_file():
            continue
        try:
            json.loads(state.read_text())
        except json.JSONDecodeError:
            continue  # killed while writing the state: the checkpoint is incomplete, use an older one
        found.append((int(path.name.split("-")[-1]), path))
    return max(found)[1] if found else None


# -- the stage ------------------------------------------------------------------------------------

def run_train(config: TrainConfig, resume: bool = False, callbacks: list[Any] | None = None) -> TrainResult:
    """Train a LoRA adapter (SFT or DPO) as `config` says; returns the adapter folder and the loss history.

    With `resume`, continue from the newest complete checkpoint in `output_dir/checkpoints` (start fresh if
    there is none). Without it, an `output_dir` holding checkpoints is an error, so a finished run is never
    silently overwritten. `callbacks` are extra `transformers.TrainerCallback`s.
    """
    check_dataset(config)  # a wrong file fails here, before torch, the tokenizer or the model load
    import transformers
    from transformers import PrinterCallback

    from agentrig.train.export import check_vllm_adapter
    from agentrig.models import load_tokenizer
    from agentrig.train.trainlog import ProgressCallback, TokenMeter, loss_history, save_loss_curve

    # transformers 5 warns about its own renamed flags on every run; nothing for our users to act on.
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers\..*")
    transformers.set_seed(config.seed)
    output_dir = Path(config.output_dir)
    checkpoints = output_dir / "checkpoints"
    checkpoint = last_complete_checkpoint(checkpoints) if checkpoints.is_dir() else None
    if checkpoint is not None and not resume:
        raise ConfigError(f"{output_dir} already holds checkpoints: pass --resume to continue that run, "
                          "or set another output_dir")
    output_dir.mkdir(parents=True, exist_ok=True)
    config.save(output_dir)
    try:
        tokenizer = load_tokenizer(config.model_name_or_path)
    except OSError as exc:
        raise ConfigError(f"cannot load the tokenizer of {config.model_name_or_path!r} offline: {exc}") from None
    meter = TokenMeter()
    if config.stage == "sft":
        trainer, stats = _build_sft(config, tokenizer, meter, checkpoints)
    else:
        trainer, stats = _build_dpo(config, tokenizer, meter, checkpoints, output_dir)
    trainer.remove_callback(PrinterCallback)  # the progress bar shows the loss; no dict per step
    trainer.add_callback(ProgressCallback(meter, f"{config.stage} {Path(config.model_name_or_path).name}"))
    for callback in callbacks or []:
        trainer.add_callback(callback)

    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    seconds = time.perf_counter() - started

    adapter_dir = output_dir / "adapter"
    trainer.save_model(str(adapter_dir))
    history = loss_history(trainer.state.log_history)
    command = ""
    if trainer.is_world_process_zero():
        config.save(adapter_dir)
        check = check_vllm_adapter(adapter_dir, config.model_name_or_path)
        print(check.report())
        command = check.serve_command() if check.ok else ""
        save_loss_curve(history, output_dir, f"{config.stage} loss: {Path(config.model_name_or_path).name}")
    return TrainResult(str(adapter_dir), str(output_dir), config.stage, history, trainer.state.global_step,
                       seconds, meter.tokens, meter.supervised_tokens, command, stats)


# -- command line ---------------------------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `agentrig train`."""
    parser.add_argument("--config", required=True, help="YAML training config (see examples/lora_agent.yaml)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the newest complete checkpoint in output_dir/checkpoints")


def main(args: argparse.Namespace) -> int:
    """Run `agentrig train`."""
    result = run_train(load_config(args.config), resume=args.resume)
    last = result.loss_history[-1]["loss"] if result.loss_history else float("nan")
    print(f"{result.stage}: {result.global_step} steps in {result.train_seconds:.0f} s, final loss {last:.4f}; "
          f"adapter in {result.adapter_dir}; loss curve in {result.output_dir}/loss_curve.png")
    return 0
