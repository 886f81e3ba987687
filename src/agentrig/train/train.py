"""`agentrig train --config FILE.yaml [--resume]`: LoRA SFT and DPO, fast on CPU, ready for many GPUs.

Recipe (`run_train`): check the config against the machine (`preflight`); load the tokenizer and the
model; read the datasets as pre-tokenized samples (or preference pairs), mixed and with a validation split
(`mixture.py`); pack them; train with TRL's `SFTTrainer` (or the DPO loop) on a PEFT LoRA config, the
validation loss every `eval_steps`; save the adapter (the best checkpoint's with `load_best_model_at_end`)
with the resolved config beside it, check that vLLM can serve it, write the loss curve, and with
`push_to_hub` upload it. Accelerate runs underneath, so `accelerate launch -m agentrig train --config ...` trains the same
config with DDP, FSDP or DeepSpeed (see docs/training.md).

Where the speed comes from on CPU: best-fit packing with per-sample position ids (no padding, no
cross-sample attention; `packing.py`), causal attention per sample with the fused SDPA kernel instead of
a block-diagonal mask (`attention.py`), the gated MLP's activation saving two tensors instead of three
(`fused.py`), LoRA's scale and add inside its second matmul with one input cast (`fused.py`), the LM head
and loss only at supervised positions, chunked, with the logits made again in backward (`lmloss.py`),
no gradient checkpointing by default (it recomputes the forward; CPU RAM is not the limit for small models), and
bf16 mixed precision wherever the hardware has it natively, CPUs with AVX512-BF16 or AMX included (~2x
per step there; `bf16: false` trains in fp32).

For bigger models on GPUs the config can turn on what LLaMA-Factory users expect (docs/training.md):
QLoRA (`quantization_bit`, bitsandbytes), gradient checkpointing, fp16, flash-attention, a DeepSpeed config.
`preflight` checks what those keys need of the machine before anything loads; on a CPU, QLoRA and fp16
are refused with the reason.

Layout of `output_dir`: `adapter/` (PEFT `save_pretrained` + `agentrig_train.yaml`), `checkpoints/`
(every `save_steps`; `--resume` continues from the newest complete one), `loss_curve.json`/`.png`
(training and validation loss), `data_card.json` (the mixture, `mixture.py`), `agentrig_train.yaml`,
`logs/` with `report_to: tensorboard`, `data/` for sources built on the fly, and for DPO
`reference_logps.jsonl`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrig.errors import ConfigError, DataError
from agentrig.train.mixture import Mixture, build_folders, build_mixture, check_sources, tokenized_file, write_card
from agentrig.train.packing import IGNORE, TokenizedSample
from agentrig.train.trainconfig import TrainConfig, load_config

# flash_attn values (LLaMA-Factory's) as transformers' attention implementations; `auto` is agentrig's choice.
ATTENTION_IMPLEMENTATIONS = {"sdpa": "sdpa", "disabled": "eager", "fa2": "flash_attention_2", "fa3": "flash_attention_3"}
# report_to integrations and the package each needs.
REPORTER_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


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
    hub_url: str = ""  # the pushed commit, with push_to_hub


# -- data -----------------------------------------------------------------------------------------

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


def _supervised(sample: TokenizedSample) -> int:
    return sum(x != IGNORE for x in sample.labels)


def _read_sft(sources: list[Any], folders: list[Path],
              config: TrainConfig) -> tuple[list[list[TokenizedSample]], list[int]]:
    """Each source's samples (the first `max_samples`), and how many it had."""
    parts, available = [], []
    for source, folder in zip(sources, folders):
        samples = load_tokenized(tokenized_file(source, config, folder))
        available.append(len(samples))
        parts.append(samples[:config.max_samples] if config.max_samples else samples)
    return parts, available


def _setup_sft_data(config: TrainConfig) -> Mixture:
    train, val = check_sources(config)
    train_dirs, val_dirs = build_folders(config, train, val)
    parts, available = _read_sft(train, train_dirs, config)
    val_samples = [s for part in _read_sft(val, val_dirs, config)[0] for s in part]
    return build_mixture(parts, train, available, config, _supervised, val_samples)


def _check_vocab(max_id: int, model: Any, source: str) -> None:
    vocab = model.get_input_embeddings().weight.shape[0]
    if max_id >= vocab:
        raise DataError(f"{source}: token id {max_id} is outside the model's vocabulary ({vocab}); "
                        "was the data tokenized for another model?")


# -- model ----------------------------------------------------------------------------------------

def _setup_model(config: TrainConfig) -> Any:
    """The base model (fp32 on CPU, bf16 on capable GPUs; quantized with QLoRA) with the supervised-position head."""
    from agentrig.train.attention import use_packed_attention
    from agentrig.train.fused import fuse_gated_mlps
    from agentrig.train.lmloss import add_supervised_head
    from agentrig.models import load_model

    kwargs: dict[str, Any] = {}
    if config.flash_attn != "auto":
        kwargs["attn_implementation"] = ATTENTION_IMPLEMENTATIONS[config.flash_attn]
    dtype = "auto"
    if config.quantization_bit:
        # Each process holds a whole quantized copy on its own GPU (QLoRA with DDP).
        kwargs.update(quantization_config=bnb_config(config), device_map={"": int(os.environ.get("LOCAL_RANK", "0"))})
        dtype = _compute_dtype(config)
    try:
        model = load_model(config.model_name_or_path, dtype=dtype, **kwargs)
    except OSError as exc:
        raise ConfigError(f"cannot load model {config.model_name_or_path!r} offline: {exc}") from None
    model.config.use_cache = False
    packed = config.flash_attn == "auto" and use_packed_attention(model, config.max_seq_length)
    if config.prompt_no_grad and not packed:
        raise ConfigError(f"prompt_no_grad: {config.model_name_or_path}'s attention is not plain causal attention "
                          "(a sliding window, soft-capping or other layer types), so agentrig's packed attention "
                          "cannot take it; drop prompt_no_grad for this model")
    # A quantized base keeps its other weights (embeddings, norms, head) in the compute dtype, as LLaMA-Factory
    # does, rather than PEFT's prepare_model_for_kbit_training, which casts them to fp32: for a 7B model with a
    # 152k vocabulary that is ~4 GB more on a 24 GB card. The norms compute in fp32 anyway, the head's
    # log-softmax too (lmloss.py).
    fuse_gated_mlps(model)
    return add_supervised_head(model, prompt_no_grad=config.prompt_no_grad)


def _compute_dtype(config: TrainConfig) -> str:
    return "bfloat16" if config.use_bf16() else "float16" if config.fp16 else "float32"


def bnb_config(config: TrainConfig) -> Any:
    """The bitsandbytes `BitsAndBytesConfig` of `quantization_bit` / `quantization_type` / `double_quantization`."""
    import torch
    from transformers import BitsAndBytesConfig

    if config.quantization_bit == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=config.quantization_type,
                              bnb_4bit_use_double_quant=config.double_quantization,
                              bnb_4bit_compute_dtype=getattr(torch, _compute_dtype(config)))


def _lora_config(config: TrainConfig, model: Any) -> Any:
    """PEFT's LoraConfig for `model`: `lora_num_layers` becomes the indices of its last N decoder layers."""
    from peft import LoraConfig

    targets, layers = config.target_modules(), None
    if config.lora_num_layers is not None:
        total = model.config.get_text_config().num_hidden_layers
        if config.lora_num_layers > total:
            raise ConfigError(f"lora_num_layers {config.lora_num_layers}: the model has {total} decoder layers; "
                              f"give at most {total}, or leave it unset for every layer")
        layers = list(range(total - config.lora_num_layers, total))
        if targets == "all-linear":  # PEFT takes layers_to_transform with a list of names only
            targets = _linear_names(model)
    # No modules_to_save and no DoRA: vLLM refuses both (export.check_vllm_adapter).
    return LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=targets, layers_to_transform=layers, bias="none", task_type="CAUSAL_LM")


def _linear_names(model: Any) -> list[str]:
    """The names of `model`'s linear layers but the output head, as PEFT's `all-linear` picks them."""
    import torch

    head = model.get_output_embeddings()
    return sorted({name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                   if isinstance(module, torch.nn.Linear) and module is not head})


def _training_kwargs(config: TrainConfig, checkpoints: Path, evaluate: bool = False) -> dict[str, Any]:
    """Arguments shared by the SFT and DPO `TrainingArguments`; `evaluate` when there is validation data."""
    import torch
    import transformers

    bf16 = config.use_bf16()
    return dict(
        output_dir=str(checkpoints), per_device_train_batch_size=config.per_device_train_batch_size,
        gradient_accumulation_steps=config.gradient_accumulation_steps, learning_rate=config.learning_rate,
        num_train_epochs=config.num_train_epochs, max_steps=config.max_steps or -1,
        lr_scheduler_type=config.lr_scheduler_type, **_warmup(config.warmup_ratio, transformers.__version__),
        neftune_noise_alpha=config.neftune_noise_alpha,
        seed=config.seed, data_seed=config.seed, save_strategy="steps", save_steps=config.save_steps, save_total_limit=2,
        logging_steps=1, disable_tqdm=True, log_level="warning", bf16=bf16, fp16=config.fp16,
        # TensorBoard is attached by run_train (its folder is `logging_dir`, the same on every transformers).
        report_to=[r for r in config.reporters() if r != "tensorboard"] or "none", run_name=config.run_name,
        # transformers accepts bf16 without a GPU only when told the CPU is meant (autocast on the CPU).
        **({"use_cpu": True} if bf16 and not torch.cuda.is_available() else {}),
        remove_unused_columns=False, ddp_find_unused_parameters=False, ddp_timeout=config.ddp_timeout,
        deepspeed=config.deepspeed, **_checkpointing(config.gradient_checkpointing),
        dataloader_num_workers=0, dataloader_pin_memory=torch.cuda.is_available(),
        **(_evaluation(config) if evaluate else {"eval_strategy": "no"}),
    )


def _evaluation(config: TrainConfig) -> dict[str, Any]:
    """Validation loss every `eval_steps` (the loss only: no logits are gathered), and the best-checkpoint choice."""
    best = {"metric_for_best_model": "eval_loss", "greater_is_better": False} if config.load_best_model_at_end else {}
    return dict(eval_strategy="steps", eval_steps=config.eval_steps or config.save_steps, prediction_loss_only=True,
                per_device_eval_batch_size=config.per_device_eval_batch_size or config.per_device_train_batch_size,
                load_best_model_at_end=config.load_best_model_at_end, **best)


def _checkpointing(on: bool) -> dict[str, Any]:
    """Gradient checkpointing under the installed transformers' name for it.

    transformers 5.x renamed `gradient_checkpointing` to `activation_checkpointing` (the old name still works,
    with a FutureWarning on every run); 4.57 knows only the old one. Non-reentrant checkpointing, which
    backpropagates into LoRA weights without the inputs requiring grad.
    """
    import dataclasses

    from transformers import TrainingArguments

    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    name = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return {name: on, f"{name}_kwargs": {"use_reentrant": False} if on else None}


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
            token_logps = out["token_logps"]
            if "label_weights" in inputs:  # tool_name_weight, decision_weight (keytokens.py); order of token_logps
                token_logps = token_logps * inputs["label_weights"][:, 1:][out["mask"]].to(token_logps.dtype)
            loss = -token_logps.sum() / torch.as_tensor(denominator).clamp(min=1)
            if self.args.average_tokens_across_devices and num_items_in_batch is not None:
                loss = loss * self.accelerator.num_processes
            if model.training:
                self.meter.add(int(inputs["num_tokens"]), int(n_supervised))
            return (loss, out) if return_outputs else loss

    return PackedSFTTrainer


def _build_sft(config: TrainConfig, tokenizer: Any, meter: Any,
               checkpoints: Path) -> tuple[Any, dict[str, float], dict[str, Any]]:
    from datasets import Dataset
    from trl import SFTConfig

    from agentrig.train.attention import NAME as PACKED_ATTENTION
    from agentrig.train.compile import compile_layers
    from agentrig.train.fused import fuse_lora_linears
    from agentrig.train.packing import RowCollator, pack_rows, packing_stats

    data = _setup_sft_data(config)
    samples = data.train
    truncated = sum(len(s.input_ids) > config.max_seq_length for s in samples)
    rows = pack_rows(samples, config.max_seq_length, packing=config.packing)
    stats = packing_stats(rows, config.max_seq_length)
    if stats["supervised_tokens"] == 0:
        raise DataError(f"{config.dataset}: no supervised tokens (every label is -100)")
    val_rows = pack_rows(data.val, config.max_seq_length, packing=config.packing)
    stats.update(samples=len(samples), truncated=truncated, val_samples=len(data.val))
    if config.tool_name_weight != 1.0 or config.decision_weight != 1.0 or config.figure_weight != 1.0:
        from agentrig.train.keytokens import add_label_weights  # (validation keeps the plain loss)

        counts = add_label_weights(rows, tokenizer, config.tool_name_weight, config.decision_weight,
                                   config.figure_weight)
        if config.tool_name_weight != 1.0 and counts["key_tokens"] == 0:
            raise DataError(f"{config.dataset}: tool_name_weight {config.tool_name_weight} but no supervised token "
                            "names a tool in a call's JSON ({\"name\": ..., \"arguments\": ...}): leave "
                            "tool_name_weight at 1 for data without tool calls")
        if config.figure_weight != 1.0 and counts["figure_tokens"] == 0:
            raise DataError(f"{config.dataset}: figure_weight {config.figure_weight} but no supervised token holds a "
                            "digit: leave figure_weight at 1 for data without figures")
        stats.update({k: v for k, v in counts.items() if v})
    model = _setup_model(config)
    peft_config = None if config.adapter_name_or_path else _lora_config(config, model)
    if config.adapter_name_or_path:  # continue training an adapter (LLaMA-Factory's meaning for stage sft)
        from peft import PeftModel

        from agentrig.models import quiet_loading

        with quiet_loading():
            model = PeftModel.from_pretrained(model, config.adapter_name_or_path,
                                              is_trainable=not config.create_new_adapter)
        if config.create_new_adapter:  # the old adapter into the weights, a new one on top (stack.py saves both)
            model = model.merge_and_unload()
            peft_config = _lora_config(config, model)
    _check_vocab(max(max(r["input_ids"]) for r in rows + val_rows), model, config.dataset)
    # Rows of a batch are joined without padding when attention already keeps samples apart by position.
    per_sample_attention = model.config._attn_implementation in (PACKED_ATTENTION, "flash_attention_2",
                                                                 "flash_attention_3")
    args = SFTConfig(**_training_kwargs(config, checkpoints, evaluate=bool(val_rows)),
                     dataset_kwargs={"skip_prepare_dataset": True}, packing=False, padding_free=False, max_length=None)
    trainer = _sft_trainer_class()(
        model=model, args=args, train_dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(val_rows) if val_rows else None, processing_class=tokenizer,
        data_collator=RowCollator(tokenizer.pad_token_id, padding_free=per_sample_attention),
        peft_config=peft_config, meter=meter)
    fuse_lora_linears(trainer.model)  # SFTTrainer has wrapped the model in PEFT by now
    if config.torch_compile:
        compile_layers(trainer.model)  # after the fusing above, so the compiled graphs trace the fused forward
    return trainer, stats, data.card


def _completion_tokens(pair: Any) -> int:
    return len(pair.chosen_ids) + len(pair.rejected_ids)


def _build_dpo(config: TrainConfig, tokenizer: Any, meter: Any, checkpoints: Path,
               output_dir: Path) -> tuple[Any, dict[str, float], dict[str, Any]]:
    from datasets import Dataset
    from peft import PeftModel
    from transformers import TrainingArguments

    from agentrig.train.dpo import PairCollator, compute_logps, dpo_trainer_class, load_pairs
    from agentrig.train.fused import fuse_lora_linears
    from agentrig.train.trainlog import progress_bar

    sources, val_sources = check_sources(config)
    parts, available = [], []
    for source in sources:
        pairs = load_pairs(source.file, tokenizer)
        available.append(len(pairs))
        parts.append(pairs[:config.max_samples] if config.max_samples else pairs)
    val_pairs = [p for s in val_sources for p in load_pairs(s.file, tokenizer)[:config.max_samples or None]]
    data = build_mixture(parts, sources, available, config, _completion_tokens, val_pairs)
    pairs = pairs_for_run(data.train, config)
    from agentrig.models import quiet_loading

    with quiet_loading():  # PEFT's is_gradient_checkpointing deprecation on every adapter load
        model = PeftModel.from_pretrained(_setup_model(config), config.adapter_name_or_path, is_trainable=True)
    fuse_lora_linears(model)  # before the reference log-probs, so they come from the same forward as training's
    _check_vocab(max(max(p.prompt_ids + p.chosen_ids + p.rejected_ids) for p in pairs + data.val), model,
                 config.dataset)
    # The reference: the SFT adapter exactly as loaded, before any update (a frozen copy by construction).
    scored = pairs + data.val
    with progress_bar(f"dpo reference log-probs of {len(scored)} pairs", len(scored)) as advance:
        reference = compute_logps(model, scored, config.max_seq_length, tokenizer.pad_token_id, on_batch=advance,
                                  bf16=config.use_bf16())
    with (output_dir / "reference_logps.jsonl").open("w") as fh:
        for pair, (chosen, rejected) in zip(pairs, reference):
            fh.write(json.dumps({"pair_id": pair.pair_id, "chosen": chosen, "rejected": rejected}) + "\n")
    if config.torch_compile:
        from agentrig.train.compile import compile_layers

        compile_layers(model)  # after the reference log-probs (a no-grad pass), before the first step
    rows = [{"prompt_ids": p.prompt_ids, "chosen_ids": p.chosen_ids, "rejected_ids": p.rejected_ids,
             "ref_chosen": c, "ref_rejected": r} for p, (c, r) in zip(scored, reference)]
    train_rows, val_rows = rows[:len(pairs)], rows[len(pairs):]
    trainer = dpo_trainer_class()(
        model=model, args=TrainingArguments(**_training_kwargs(config, checkpoints, evaluate=bool(val_rows))),
        train_dataset=Dataset.from_list(train_rows), eval_dataset=Dataset.from_list(val_rows) if val_rows else None,
        processing_class=tokenizer, data_collator=PairCollator(tokenizer.pad_token_id, config.max_seq_length),
        beta=config.pref_beta, ftx=config.pref_ftx, meter=meter)
    return trainer, {"pairs": len(pairs), "pairs_available": len(data.train), "val_pairs": len(data.val)}, data.card


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

def _complete(checkpoint: Path) -> bool:
    """Whether a checkpoint's trainer_state.json (written last by `Trainer`) is there and complete JSON."""
    state = checkpoint / "trainer_state.json"
    if not state.is_file():
        return False
    try:
        json.loads(state.read_text())
    except json.JSONDecodeError:
        return False  # killed while writing the state: the checkpoint is incomplete
    return True


def last_complete_checkpoint(checkpoints: Path) -> Path | None:
    """The newest complete `checkpoint-N` (an incomplete one, killed mid-write, is skipped for an older one)."""
    found = [(int(path.name.split("-")[-1]), path) for path in checkpoints.glob("checkpoint-*")
             if path.name.split("-")[-1].isdigit() and _complete(path)]
    return max(found)[1] if found else None


def _resume_point(config: TrainConfig, resume: bool, checkpoints: Path) -> Path | None:
    """The checkpoint to continue from: `resume_from_checkpoint`'s folder, or with --resume (or `true`) the newest."""
    if isinstance(config.resume_from_checkpoint, str):
        return Path(config.resume_from_checkpoint)
    newest = last_complete_checkpoint(checkpoints) if checkpoints.is_dir() else None
    if newest is not None and not (resume or config.resume_from_checkpoint):
        raise ConfigError(f"{config.output_dir} already holds checkpoints: pass --resume (or resume_from_checkpoint: "
                          "true) to continue that run, or set another output_dir")
    return newest


# -- what the keys need of this machine -----------------------------------------------------------

def _missing(package: str) -> bool:
    return importlib.util.find_spec(package) is None


def preflight(config: TrainConfig) -> None:
    """Refuse, before anything loads, a config whose keys this machine cannot run, saying why and what to do."""
    import torch

    from agentrig.jsonl import read_json

    cuda = torch.cuda.is_available()
    if config.quantization_bit and not cuda:
        raise ConfigError(
            f"quantization_bit {config.quantization_bit} (QLoRA) needs a CUDA GPU, and this machine has none: "
            "bitsandbytes' quantized layers train on the GPU, and on a CPU a quantized base only adds "
            "dequantization to every matmul of a model that fits in RAM anyway; remove quantization_bit to train "
            "LoRA on the full-precision base here, or run this config on a GPU machine")
    if config.quantization_bit and _missing("bitsandbytes"):
        raise ConfigError(f"quantization_bit {config.quantization_bit} needs the bitsandbytes package: "
                          "pip install bitsandbytes")
    if config.fp16 and not cuda:
        raise ConfigError("fp16 needs a CUDA GPU (fp16 autocast with loss scaling); on a CPU leave bf16 unset "
                          "(on where the CPU has native bf16) or set bf16: false")
    if config.bf16 and cuda and not torch.cuda.is_bf16_supported():
        raise ConfigError("bf16: true, but this GPU has no bf16: use fp16: true")
    if config.flash_attn in ("fa2", "fa3"):
        from transformers.utils import is_flash_attn_2_available, is_flash_attn_3_available

        if not (is_flash_attn_2_available() if config.flash_attn == "fa2" else is_flash_attn_3_available()):
            package = "flash-attn" if config.flash_attn == "fa2" else "flash-attn 3 (flash_attn_interface)"
            raise ConfigError(f"flash_attn {config.flash_attn} needs a CUDA GPU and the {package} package; "
                              "use flash_attn: auto (or sdpa) here")
    for reporter in config.reporters():
        if _missing(REPORTER_PACKAGES[reporter]):
            raise ConfigError(f"report_to {reporter} needs the {REPORTER_PACKAGES[reporter]} package: "
                              f"pip install {REPORTER_PACKAGES[reporter]}")
    if config.deepspeed:
        if not Path(config.deepspeed).is_file():
            raise ConfigError(f"deepspeed {config.deepspeed}: there is no such file; give a DeepSpeed JSON config")
        read_json(config.deepspeed, "a DeepSpeed config (see docs/training.md)")
        if _missing("deepspeed"):
            raise ConfigError("deepspeed needs the deepspeed package (pip install deepspeed) and GPUs; launch with "
                              "`accelerate launch -m agentrig train` or `deepspeed -m agentrig train`")
    if config.push_to_hub and os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise ConfigError("push_to_hub, but HF_HUB_OFFLINE is set, so the upload would fail after training: unset it, "
                          "or train with push_to_hub: false and upload the adapter folder later (docs/training.md)")
    if isinstance(config.resume_from_checkpoint, str) and not _complete(Path(config.resume_from_checkpoint)):
        raise ConfigError(f"resume_from_checkpoint {config.resume_from_checkpoint}: not a complete checkpoint "
                          "(a checkpoint-N folder with trainer_state.json, from `agentrig train`)")


# -- the stage ------------------------------------------------------------------------------------

def run_train(config: TrainConfig, resume: bool = False, callbacks: list[Any] | None = None) -> TrainResult:
    """Train a LoRA adapter (SFT or DPO) as `config` says; returns the adapter folder and the loss history.

    With `resume` (or `resume_from_checkpoint: true`), continue from the newest complete checkpoint in
    `output_dir/checkpoints` (start fresh if there is none); with a `resume_from_checkpoint` folder, from that
    one. Otherwise an `output_dir` holding checkpoints is an error, so a finished run is never silently
    overwritten. `callbacks` are extra `transformers.TrainerCallback`s.
    """
    check_sources(config)  # a wrong file fails here, before torch, the tokenizer or the model load
    preflight(config)
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
    checkpoint = _resume_point(config, resume, checkpoints)
    output_dir.mkdir(parents=True, exist_ok=True)
    config.save(output_dir)
    try:
        tokenizer = load_tokenizer(config.model_name_or_path)
    except OSError as exc:
        raise ConfigError(f"cannot load the tokenizer of {config.model_name_or_path!r} offline: {exc}") from None
    meter = TokenMeter()
    if config.stage == "sft":
        trainer, stats, card = _build_sft(config, tokenizer, meter, checkpoints)
    else:
        trainer, stats, card = _build_dpo(config, tokenizer, meter, checkpoints, output_dir)
    if trainer.is_world_process_zero():
        write_card(card, config, {"stage": config.stage, "rows": stats})
    trainer.remove_callback(PrinterCallback)  # the progress bar shows the loss; no dict per step
    trainer.add_callback(ProgressCallback(meter, f"{config.stage} {Path(config.model_name_or_path).name}"))
    if "tensorboard" in config.reporters() and trainer.is_world_process_zero():
        trainer.add_callback(_tensorboard(config))
    for callback in callbacks or []:
        trainer.add_callback(callback)

    started = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    seconds = time.perf_counter() - started

    adapter_dir = output_dir / "adapter"
    trainer.save_model(str(adapter_dir))  # with load_best_model_at_end, the best checkpoint's adapter
    if config.create_new_adapter and trainer.is_world_process_zero():
        from agentrig.train.stack import stack_adapters

        stack_adapters(config.adapter_name_or_path, adapter_dir, adapter_dir)
    if config.load_best_model_at_end and trainer.state.best_model_checkpoint:
        stats.update(best_step=int(trainer.state.best_model_checkpoint.rsplit("-", 1)[-1]),
                     best_eval_loss=float(trainer.state.best_metric))
    history = loss_history(trainer.state.log_history)
    command = hub_url = ""
    if trainer.is_world_process_zero():
        config.save(adapter_dir)
        check = check_vllm_adapter(adapter_dir, config.model_name_or_path)
        print(check.report())
        command = check.serve_command() if check.ok else ""
        save_loss_curve(history, output_dir, f"{config.stage} loss: {Path(config.model_name_or_path).name}")
        if config.push_to_hub:
            hub_url = push_adapter(trainer.model, config, trainer.state.global_step)
    return TrainResult(str(adapter_dir), str(output_dir), config.stage, history, trainer.state.global_step,
                       seconds, meter.tokens, meter.supervised_tokens, command, stats, hub_url)


def _tensorboard(config: TrainConfig) -> Any:
    """transformers' own TensorBoard callback (tags `train/loss`, `eval/loss`, ...) writing to `logging_dir`."""
    from torch.utils.tensorboard import SummaryWriter
    from transformers.integrations import TensorBoardCallback

    return TensorBoardCallback(SummaryWriter(log_dir=config.logging_dir or str(Path(config.output_dir) / "logs")))


def push_adapter(model: Any, config: TrainConfig, steps: int) -> str:
    """Upload the trained adapter (adapter_config.json, weights, a model card) with PEFT's `push_to_hub`."""
    print(f"pushing the adapter to the hub: {config.hub_model_id}")
    commit = model.push_to_hub(config.hub_model_id, private=config.hub_private_repo,
                               commit_message=f"agentrig {config.stage} LoRA adapter, {steps} steps")
    return commit.commit_url  # huggingface_hub's CommitInfo


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
    if "best_step" in result.stats:
        print(f"the adapter is step {result.stats['best_step']}'s, the lowest validation loss "
              f"({result.stats['best_eval_loss']:.4f})")
    if result.hub_url:
        print(f"pushed to the hub: {result.hub_url}")
    return 0
