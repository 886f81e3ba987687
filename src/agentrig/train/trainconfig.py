"""Training configuration: one typed dataclass, loaded from YAML, saved beside every adapter.

The keys are LLaMA-Factory's, with its meanings, but `max_seq_length` (the seed's name for its `cutoff_len`;
the seed's `examples/lora_agent.yaml` loads unchanged). Every field's help text lives in its
`metadata`, and `docs/training.md` lists them with their LLaMA-Factory equivalents. An unknown key is an
error that names it and the closest valid key, because a misspelled `lora_rnak` silently falling back to a
default costs a whole training run; a key another trainer uses (LLaMA-Factory, Axolotl, TRL) that agentrig
does not read says what to write instead (`FOREIGN_KEYS`), and every such key of a file is named at once.

Checks here need no hardware: what a key needs of the machine (a GPU for QLoRA or fp16, a package for
TensorBoard or DeepSpeed) is checked by `agentrig.train.train.preflight` when the run starts.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentrig.errors import ConfigError
from agentrig.models import DEFAULT_MODEL

STAGES = ("sft", "dpo")
SCHEDULERS = ("linear", "cosine", "constant", "constant_with_warmup", "cosine_with_restarts", "polynomial")
MIX_STRATEGIES = ("concat", "interleave_under", "interleave_over")  # LLaMA-Factory's mix_strategy values
REPORTERS = ("none", "tensorboard", "wandb", "mlflow")
ATTENTION = ("auto", "sdpa", "disabled", "fa2", "fa3")  # LLaMA-Factory's flash_attn values
QUANTIZATION_TYPES = ("nf4", "fp4")
RESOLVED_CONFIG_NAME = "agentrig_train.yaml"


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class TrainConfig:
    """Everything `agentrig train` needs; YAML keys map one-to-one onto these fields."""

    dataset: str | list[str] = field(metadata=_help(
        "training data, comma-separated or a list for a mixture: `agentrig data build` folders, tokenized.jsonl "
        "files, episodes or samples files and data exports (built on the fly), or (stage dpo) preference-pairs "
        ".jsonl files"))
    model_name_or_path: str = field(default=DEFAULT_MODEL, metadata=_help(
        "Hugging Face model id or local folder; `smollm2-135m` is the packaged default"))
    finetuning_type: str = field(default="lora", metadata=_help("only `lora` is supported"))
    stage: str = field(default="sft", metadata=_help("`sft` (supervised) or `dpo` (preference pairs)"))
    output_dir: str = field(default="runs/train", metadata=_help(
        "run folder: adapter/, checkpoints/, loss_curve.json/.png"))
    lora_rank: int = field(default=32, metadata=_help("LoRA rank r (vLLM serves it with --max-lora-rank >= r)"))
    lora_alpha: int | None = field(default=None, metadata=_help(
        "LoRA scaling numerator (scale = alpha / rank); unset = 2 x lora_rank, as in LLaMA-Factory (64 for the "
        "default rank 32)"))
    lora_dropout: float = field(default=0.0, metadata=_help("dropout on the LoRA branch"))
    lora_target: str | list[str] = field(default="q_proj,k_proj,v_proj,o_proj", metadata=_help(
        "comma-separated module names (q_proj,v_proj,...) or `all` for every linear layer but the head"))
    lora_num_layers: int | None = field(default=None, metadata=_help(
        "LoRA on the last N decoder layers only (PEFT's layers_to_transform; mlx-lm's --num-layers): backward "
        "stops below them, so a step is cheaper (SmolLM2-135M, 30 layers, 2 CPU cores: N=10 trains 1.65x as many "
        "steps a minute, N=20 1.29x; benchmarks/lora_depth.py); unset = every layer"))
    learning_rate: float = field(default=2.0e-4, metadata=_help("peak learning rate (AdamW)"))
    neftune_noise_alpha: float | None = field(default=None, metadata=_help(
        "NEFTune: uniform noise of scale alpha / sqrt(row length x hidden size) added to the input embeddings "
        "while training (transformers' hook; LLaMA-Factory, TRL and Axolotl use this name; the paper's alpha: 5); "
        "unset = off"))
    tool_name_weight: float = field(default=1.0, metadata=_help(
        "SFT: loss weight of the supervised tokens that name the tool in a call's JSON (the tool choice), the "
        "other supervised tokens 1, the sum still divided by their count (TL-Training's key tokens; keytokens.py); "
        "1 = the plain loss"))
    decision_weight: float = field(default=1.0, metadata=_help(
        "SFT: loss weight of each assistant turn's first supervised token, where the model chooses between calling "
        "a tool, a recovery sentence and answering, the sum still divided by the supervised count (keytokens.py); "
        "1 = the plain loss"))
    figure_weight: float = field(default=1.0, metadata=_help(
        "SFT: loss weight of the supervised tokens that hold a digit (the figures arguments and answers copy from the "
        "request and the results: months, ids, totals, rates), the sum still divided by the supervised count "
        "(keytokens.py); 1 = the plain loss"))
    per_device_train_batch_size: int = field(default=2, metadata=_help(
        "rows per device per micro-batch; with packing a row holds several samples"))
    gradient_accumulation_steps: int = field(default=1, metadata=_help("micro-batches per optimizer step"))
    max_seq_length: int = field(default=1024, metadata=_help(
        "tokens per row; longer samples are truncated (and counted in the log)"))
    num_train_epochs: float = field(default=1.0, metadata=_help("passes over the data (ignored if max_steps is set)"))
    max_steps: int | None = field(default=None, metadata=_help("optimizer steps; overrides num_train_epochs"))
    lr_scheduler_type: str = field(default="cosine", metadata=_help("learning-rate schedule: " + ", ".join(SCHEDULERS)))
    warmup_ratio: float = field(default=0.0, metadata=_help("fraction of steps spent warming up the learning rate"))
    save_steps: int = field(default=50, metadata=_help("checkpoint every N optimizer steps (for --resume)"))
    bf16: bool | None = field(default=None, metadata=_help(
        "bf16 mixed precision (LLaMA-Factory's key; weights and optimizer stay fp32): unset = on where the "
        "hardware has native bf16 (a GPU that supports it, or a CPU with AVX512-BF16 or AMX, where it "
        "trains ~2x faster), false = fp32 throughout"))
    packing: bool = field(default=True, metadata=_help(
        "best-fit pack samples into rows; per-sample position ids keep them from attending to each other"))
    seed: int = field(default=42, metadata=_help("seed for LoRA init, data order and dropout"))
    adapter_name_or_path: str | None = field(default=None, metadata=_help(
        "a PEFT adapter to continue training (its LoRA settings replace lora_rank/lora_alpha/lora_target/"
        "lora_num_layers); "
        "stage dpo: the SFT adapter to start from, also the frozen reference"))
    create_new_adapter: bool = field(default=False, metadata=_help(
        "stage sft with adapter_name_or_path: merge that adapter into the base and train a new LoRA "
        "(lora_rank/lora_alpha/lora_target/lora_num_layers) on top, as LLaMA-Factory's key does; the saved "
        "adapter/ is the two concatenated (rank = both ranks summed), so it loads on the base model alone "
        "(train/stack.py)"))
    pref_beta: float = field(default=0.1, metadata=_help("DPO beta (strength of the KL tie to the reference)"))
    pref_ftx: float = field(default=0.0, metadata=_help(
        "DPO: weight of an NLL term on the chosen completion (per token), which keeps the format the chosen "
        "replies share (LLaMA-Factory's pref_ftx, TRL's rpo_alpha)"))
    # -- data mixture and validation (LLaMA-Factory's data_args)
    mix_strategy: str = field(default="concat", metadata=_help(
        "how several datasets mix: `concat` (all of each), `interleave_under` (draw by interleave_probs until the "
        "first source runs out), `interleave_over` (draw until every source has been used whole, repeating the "
        "smaller ones)"))
    interleave_probs: list[float] | None = field(default=None, metadata=_help(
        "interleave_*: the chance of drawing from each dataset, in `dataset` order, summing to 1 (`0.7,0.3`); "
        "unset = one from each in turn"))
    max_samples: int | None = field(default=None, metadata=_help(
        "read at most the first N samples (or pairs) of each dataset, before mixing"))
    eval_dataset: str | list[str] | None = field(default=None, metadata=_help(
        "validation data, read like `dataset` (several are concatenated); excludes val_size"))
    val_size: int | float = field(default=0.0, metadata=_help(
        "hold out validation samples from the mixture: a fraction in [0, 1) or a count (an integer >= 1); "
        "0 = none"))
    eval_steps: int | None = field(default=None, metadata=_help(
        "with validation data: validation loss every N optimizer steps (unset = save_steps)"))
    per_device_eval_batch_size: int | None = field(default=None, metadata=_help(
        "rows per device per validation batch (unset = per_device_train_batch_size)"))
    load_best_model_at_end: bool = field(default=False, metadata=_help(
        "save as adapter/ the checkpoint with the lowest validation loss instead of the last (save_steps must be "
        "a multiple of eval_steps)"))
    # -- logging
    report_to: str | list[str] = field(default="none", metadata=_help(
        "where the training log goes besides loss_curve.json/.png: " + ", ".join(REPORTERS)
        + " (comma-separated or a list)"))
    logging_dir: str | None = field(default=None, metadata=_help(
        "TensorBoard event folder (unset = output_dir/logs)"))
    run_name: str | None = field(default=None, metadata=_help("the run's name in wandb and mlflow"))
    # -- hardware, precision, memory
    fp16: bool = field(default=False, metadata=_help(
        "fp16 mixed precision with loss scaling, for CUDA GPUs without bf16 (excludes bf16)"))
    gradient_checkpointing: bool = field(default=False, metadata=_help(
        "recompute each layer's activations in backward: far less activation memory, one more forward per step "
        "(LLaMA-Factory turns it on unless disable_gradient_checkpointing; here it is off unless set)"))
    flash_attn: str = field(default="auto", metadata=_help(
        "attention: `auto` (agentrig's per-sample SDPA for packed rows where the architecture allows, else "
        "transformers' SDPA), `sdpa` (transformers' SDPA with a block-diagonal mask), `disabled` (eager), "
        "`fa2`/`fa3` (flash-attention 2/3: a CUDA GPU and the flash-attn package)"))
    prompt_no_grad: bool = field(default=False, metadata=_help(
        "encode each sample's context (the tokens before its first supervised one: system prompt, tools, request) "
        "in a pass without gradient and train on the rest, which attends to it (train/context.py): the same "
        "forward, no gradient through the context's keys and values, 1.1-1.27x the steps a minute on the main "
        "job's data (benchmarks/prompt_no_grad.py); needs flash_attn auto on a plain causal-attention model"))
    torch_compile: bool = field(default=False, metadata=_help(
        "compile each decoder layer with torch.compile (regional compilation, dynamic shapes; train/compile.py): "
        "TorchInductor fuses the elementwise passes; the first step pays for compilation (about a minute on 2 CPU "
        "cores for SmolLM2), the next ones are about 1.2x faster on the main job's data "
        "(benchmarks/torch_compile.py); on a CPU it needs a C++ compiler"))
    deepspeed: str | None = field(default=None, metadata=_help(
        "a DeepSpeed JSON config, handed to accelerate through TrainingArguments (launch with `accelerate "
        "launch` or `deepspeed`)"))
    ddp_timeout: int = field(default=1800, metadata=_help(
        "seconds a distributed process waits for the others at a collective (transformers' default)"))
    quantization_bit: int | None = field(default=None, metadata=_help(
        "QLoRA: load the frozen base in 4 or 8 bits with bitsandbytes (a CUDA GPU); the LoRA weights stay "
        "full precision"))
    quantization_method: str = field(default="bnb", metadata=_help("only `bnb` (bitsandbytes, on-the-fly)"))
    quantization_type: str = field(default="nf4", metadata=_help("4-bit data type: `nf4` or `fp4`"))
    double_quantization: bool = field(default=True, metadata=_help(
        "4-bit: quantize the quantization constants too (~0.4 bits a parameter less)"))
    # -- resuming and publishing
    resume_from_checkpoint: str | bool | None = field(default=None, metadata=_help(
        "a `checkpoint-N` folder to continue from (any run's), or true for the newest complete one in "
        "output_dir/checkpoints (as --resume)"))
    push_to_hub: bool = field(default=False, metadata=_help(
        "after training, upload the adapter with PEFT's push_to_hub to hub_model_id (token: HF_TOKEN or "
        "`hf auth login`)"))
    hub_model_id: str | None = field(default=None, metadata=_help("the hub repository, `user/name` or `org/name`"))
    hub_private_repo: bool | None = field(default=None, metadata=_help(
        "create the hub repository private (true) or public (false); unset = the hub's default (public unless "
        "the organization's is private)"))

    def __post_init__(self) -> None:
        if self.lora_alpha is None:  # LLaMA-Factory's default
            self.lora_alpha = 2 * self.lora_rank

    def datasets(self) -> list[str]:
        """The training datasets, in order."""
        return _names(self.dataset)

    def eval_datasets(self) -> list[str]:
        """The validation datasets (none unless `eval_dataset` is set)."""
        return _names(self.eval_dataset) if self.eval_dataset is not None else []

    def reporters(self) -> list[str]:
        """The `report_to` integrations, `none` dropped."""
        return [r for r in _names(self.report_to) if r != "none"]

    def has_validation(self) -> bool:
        """Whether the run holds out or reads validation data."""
        return bool(self.val_size) or self.eval_dataset is not None

    def target_modules(self) -> str | list[str]:
        """PEFT's `target_modules`: a list of names, or `all-linear` for `all`."""
        names = self.lora_target if isinstance(self.lora_target, list) else self.lora_target.split(",")
        names = [n.strip() for n in names if n.strip()]
        return "all-linear" if names == ["all"] else names

    def use_bf16(self) -> bool:
        """The resolved `bf16`: the key's value, or when unset whether the hardware has native bf16 (and fp16 is off)."""
        from agentrig.models import native_bf16

        if self.bf16 is None:
            return not self.fp16 and native_bf16()
        return self.bf16

    def to_dict(self) -> dict[str, Any]:
        """Plain dict in field order, as written to YAML."""
        return dataclasses.asdict(self)

    def save(self, folder: str | Path) -> Path:
        """Write the resolved config as `agentrig_train.yaml` into `folder`."""
        path = Path(folder) / RESOLVED_CONFIG_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path


def _names(value: str | list[str]) -> list[str]:
    names = value if isinstance(value, list) else value.split(",")
    return [n.strip() for n in names if n.strip()]


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(TrainConfig)}

# Keys of LLaMA-Factory, Axolotl and TRL configs that agentrig does not read, and what to write instead.
LLAMAFACTORY_KEYS: dict[str, str] = {
    "cutoff_len": "LLaMA-Factory's cutoff_len is `max_seq_length` here",
    "template": "the chat template is the model's own, or agentrig's Hermes template when it renders no tools "
                "(agentrig.data.render, the same for training and inference): drop it",
    "tool_format": "tool calls are rendered by agentrig.data.render in the model's format: drop it",
    "do_train": "`agentrig train` always trains: drop it",
    "do_eval": "validation runs when `val_size` or `eval_dataset` is set: drop it",
    "eval_strategy": "validation runs every `eval_steps` when `val_size` or `eval_dataset` is set: drop it",
    "do_predict": "evaluate the adapter with `agentrig eval` (task completion on the environment): drop it",
    "predict_with_generate": "evaluate the adapter with `agentrig eval`: drop it",
    "dataset_dir": "`dataset:` takes paths (folders or files), not dataset_info.json names: drop it",
    "overwrite_cache": "nothing is cached between runs (an episodes or export source is built into "
                       "output_dir/data, reused only by a resumed run): drop it",
    "preprocessing_num_workers": "the data pipeline (`agentrig data build`) runs in one process: drop it",
    "preprocessing_batch_size": "the data pipeline (`agentrig data build`) has no batches: drop it",
    "tokenized_path": "give the tokenized data itself in `dataset:` (a `data build` folder or its tokenized.jsonl)",
    "streaming": "samples are read into memory: drop it",
    "dataloader_num_workers": "rows are tokenized and packed in memory before training: drop it",
    "logging_steps": "every optimizer step is logged (progress line, loss_curve.json, report_to): drop it",
    "plot_loss": "loss_curve.png is always written: drop it",
    "overwrite_output_dir": "an output_dir with checkpoints is refused unless resumed (--resume or "
                            "resume_from_checkpoint): choose a new output_dir",
    "save_only_model": "checkpoints keep the optimizer and RNG state for an exact resume: drop it",
    "save_strategy": "checkpoints are taken every `save_steps`: drop it",
    "save_total_limit": "the newest two checkpoints are kept (and the best with load_best_model_at_end): drop it",
    "trust_remote_code": "models load with transformers' own classes, never a repository's code: drop it",
    "train_on_prompt": "loss masks come from the episodes (`agentrig data build`): drop it",
    "mask_history": "loss masks come from the episodes: every assistant turn with weight > 0 is trained: drop it",
    "neat_packing": "`packing: true` (the default) already packs without cross-attention",
    "additional_target": "vLLM refuses adapters with modules_to_save: train LoRA on `lora_target` only",
    "use_dora": "vLLM serves no DoRA adapters: plain LoRA only",
    "use_rslora": "plain LoRA only (scale lora_alpha / lora_rank)",
    "pissa_init": "plain LoRA only (B starts at zero)",
    "loraplus_lr_ratio": "one learning rate for A and B: use `learning_rate`",
    "use_galore": "AdamW on the LoRA weights only: drop it",
    "use_unsloth": "agentrig's own packed attention and fused MLP run instead: drop it",
    "enable_liger_kernel": "agentrig's own kernels run instead (the LM head only at supervised positions): drop it",
    "disable_gradient_checkpointing": "checkpointing is off unless `gradient_checkpointing: true`",
    "quantization_device_map": "the quantized base loads on this process's GPU: drop it",
    "hf_hub_token": "set HF_TOKEN in the environment (or `hf auth login`); the config is saved beside the adapter",
    "pref_loss": "DPO uses the sigmoid loss only: drop it",
    "export_dir": "merge with `agentrig export --adapter DIR --merge --out DIR`",
    "warmup_steps": "use `warmup_ratio` (a share of the steps)",
    "weight_decay": "AdamW runs with transformers' default weight decay 0: drop it",
    "max_grad_norm": "gradients are clipped at transformers' default norm 1.0: drop it",
    "optim": "the optimizer is AdamW (torch): drop it",
    "cache_dir": "models load from the Hugging Face cache (set HF_HOME) or a local folder: drop it",
}
AXOLOTL_KEYS: dict[str, str] = {
    "base_model": "Axolotl's base_model is `model_name_or_path` here",
    "adapter": "Axolotl's adapter: LoRA is `finetuning_type: lora` (the default); qlora is `quantization_bit: 4`",
    "lora_r": "use `lora_rank`",
    "lora_target_modules": "use `lora_target` (comma-separated names, or `all`)",
    "peft_layers_to_transform": "use `lora_num_layers: N` (LoRA on the last N decoder layers)",
    "sequence_len": "Axolotl's sequence_len is `max_seq_length` here",
    "micro_batch_size": "Axolotl's micro_batch_size is `per_device_train_batch_size` here",
    "num_epochs": "use `num_train_epochs`",
    "lr_scheduler": "use `lr_scheduler_type`",
    "datasets": "use `dataset:` (paths, comma-separated or a list)",
    "val_set_size": "use `val_size`",
    "sample_packing": "use `packing`",
    "load_in_4bit": "use `quantization_bit: 4`",
    "load_in_8bit": "use `quantization_bit: 8`",
    "flash_attention": "use `flash_attn: fa2`",
    "wandb_project": "use `report_to: wandb` and the WANDB_PROJECT environment variable",
    "chat_template": "the chat template is the model's own or agentrig's Hermes template (agentrig.data.render): drop it",
}
TRL_KEYS: dict[str, str] = {
    "max_length": "TRL's max_length is `max_seq_length` here",
    "use_peft": "LoRA is always on (`finetuning_type: lora`): drop it",
    "bnb_4bit_quant_type": "use `quantization_type`",
    "use_bnb_nested_quant": "use `double_quantization`",
    "attn_implementation": "use `flash_attn` (auto, sdpa, disabled, fa2, fa3)",
    "dataset_name": "use `dataset:` (paths)",
    "dataset_text_field": "samples are rendered from their messages: drop it",
    "assistant_only_loss": "loss masks come from the episodes (assistant turns only): drop it",
    "completion_only_loss": "loss masks come from the episodes (assistant turns only): drop it",
    "beta": "use `pref_beta`",
    "rpo_alpha": "use `pref_ftx`",
}
FOREIGN_KEYS = {**LLAMAFACTORY_KEYS, **AXOLOTL_KEYS, **TRL_KEYS}


def _coerce(name: str, value: Any) -> Any:
    """Check one value against its field's type; YAML's `1e-4` (a string in YAML 1.1) becomes a float."""
    kind = FIELDS[name].type
    if value is None:
        if "None" in kind:
            return None
        raise ConfigError(f"config key {name!r} needs a value")
    if kind == "int | float":
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {name!r} must be a number, got {value!r}")
        return value
    if kind == "list[float] | None":
        items = value.split(",") if isinstance(value, str) else value
        try:
            if not isinstance(items, list) or any(isinstance(v, bool) for v in items):
                raise ValueError
            return [float(v) for v in items]
        except (TypeError, ValueError):
            raise ConfigError(f"config key {name!r} must be numbers, comma-separated or a list, got {value!r}") from None
    if kind == "str | bool | None":
        if not isinstance(value, (str, bool)):
            raise ConfigError(f"config key {name!r} must be a path or true/false, got {value!r}")
        return value
    if kind.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {name!r} must be an integer, got {value!r}")
        return value
    if kind in ("float", "float | None"):
        if isinstance(value, bool):
            raise ConfigError(f"config key {name!r} must be a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"config key {name!r} must be a number, got {value!r}") from None
    if kind in ("bool", "bool | None"):
        if not isinstance(value, bool):
            raise ConfigError(f"config key {name!r} must be true or false, got {value!r}")
        return value
    if kind.startswith("str | list[str]"):
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        if isinstance(value, str):
            return value
        raise ConfigError(f"config key {name!r} must be a string or a list of strings, got {value!r}")
    if not isinstance(value, str):
        raise ConfigError(f"config key {name!r} must be a string, got {value!r}")
    return value


def _one_of(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{name} {value!r} is not one of {', '.join(allowed)}")


def _validate(config: TrainConfig) -> None:
    if config.finetuning_type != "lora":
        raise ConfigError(f"finetuning_type {config.finetuning_type!r} is not supported: use `lora`")
    _one_of("stage", config.stage, STAGES)
    _one_of("lr_scheduler_type", config.lr_scheduler_type, SCHEDULERS)
    for name in ("lora_rank", "lora_alpha", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "max_seq_length", "save_steps", "ddp_timeout"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(config, name)}")
    for name in ("max_steps", "max_samples", "eval_steps", "per_device_eval_batch_size"):
        if getattr(config, name) is not None and getattr(config, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(config, name)}")
    if not 0.0 <= config.warmup_ratio < 1.0:
        raise ConfigError(f"warmup_ratio must be in [0, 1), got {config.warmup_ratio}")
    if not 0.0 <= config.lora_dropout < 1.0:
        raise ConfigError(f"lora_dropout must be in [0, 1), got {config.lora_dropout}")
    if config.learning_rate <= 0 or config.num_train_epochs <= 0 or config.pref_beta <= 0:
        raise ConfigError("learning_rate, num_train_epochs and pref_beta must be positive")
    if config.pref_ftx < 0:
        raise ConfigError(f"pref_ftx must be >= 0 (0 = plain DPO), got {config.pref_ftx}")
    if config.neftune_noise_alpha is not None and config.neftune_noise_alpha <= 0:
        raise ConfigError(f"neftune_noise_alpha must be positive (or unset for no noise), got {config.neftune_noise_alpha}")
    for key in ("tool_name_weight", "decision_weight", "figure_weight"):  # keytokens.py's loss weights
        value = getattr(config, key)
        if value <= 0:
            raise ConfigError(f"{key} must be positive (1 = the plain loss), got {value}")
        if value != 1.0 and config.stage != "sft":
            raise ConfigError(f"{key} weights SFT's token loss; stage {config.stage!r} has none: leave it at 1")
    if config.lora_num_layers is not None and config.lora_num_layers < 1:
        raise ConfigError(f"lora_num_layers must be at least 1 (or unset for every layer), got {config.lora_num_layers}")
    if not config.target_modules():
        raise ConfigError("lora_target is empty: name the modules (q_proj,v_proj,...) or use `all`")
    if not config.datasets():
        raise ConfigError("dataset is empty: give a `data build` folder, a tokenized.jsonl or an episodes file")
    _validate_mixture(config)
    _validate_evaluation(config)
    for reporter in _names(config.report_to):
        _one_of("report_to", reporter, REPORTERS)
    if "none" in _names(config.report_to) and config.reporters():
        raise ConfigError(f"report_to {config.report_to!r}: `none` cannot be listed with others")
    _one_of("flash_attn", config.flash_attn, ATTENTION)
    if config.prompt_no_grad and config.flash_attn != "auto":
        raise ConfigError(f"prompt_no_grad needs agentrig's packed attention (flash_attn: auto), not flash_attn "
                          f"{config.flash_attn!r}: set flash_attn auto, or drop prompt_no_grad")
    if config.bf16 and config.fp16:
        raise ConfigError("bf16 and fp16 are both true: choose one (bf16 where the GPU has it)")
    _validate_quantization(config)
    if config.push_to_hub and not config.hub_model_id:
        raise ConfigError("push_to_hub needs hub_model_id: the repository to upload the adapter to (`user/name`)")
    if config.create_new_adapter and (config.stage != "sft" or not config.adapter_name_or_path):
        raise ConfigError("create_new_adapter stacks a new LoRA on an existing one: it needs stage sft and "
                          "adapter_name_or_path (the adapter to build on)")
    if config.create_new_adapter and config.quantization_bit:
        raise ConfigError("create_new_adapter merges adapter_name_or_path into the base weights, which a "
                          "quantized base cannot hold exactly: drop quantization_bit, or continue the adapter "
                          "(create_new_adapter: false)")
    if config.resume_from_checkpoint == "":
        raise ConfigError("resume_from_checkpoint is empty: give a checkpoint-N folder, true, or leave it out")


def _validate_mixture(config: TrainConfig) -> None:
    _one_of("mix_strategy", config.mix_strategy, MIX_STRATEGIES)
    probs = config.interleave_probs
    if probs is None:
        return
    if config.mix_strategy == "concat":
        raise ConfigError("interleave_probs needs mix_strategy interleave_under or interleave_over (concat takes "
                          "every sample of every dataset)")
    if len(probs) != len(config.datasets()):
        raise ConfigError(f"interleave_probs has {len(probs)} values for {len(config.datasets())} datasets: one each, "
                          "in `dataset` order")
    if any(p < 0 for p in probs) or abs(sum(probs) - 1.0) > 1e-6:
        raise ConfigError(f"interleave_probs {probs} must be >= 0 and sum to 1")
    if config.mix_strategy == "interleave_over" and min(probs) == 0:
        raise ConfigError("interleave_over with a probability of 0 never finishes that dataset: drop the dataset, "
                          "or use interleave_under")


def _validate_evaluation(config: TrainConfig) -> None:
    size = config.val_size
    if isinstance(size, float) and not 0.0 <= size < 1.0 or isinstance(size, int) and size < 0:
        raise ConfigError(f"val_size must be a fraction in [0, 1) or a count (an integer >= 1), got {size}")
    if size and config.eval_dataset is not None:
        raise ConfigError("val_size and eval_dataset are both set: hold out from the mixture or read "
                          "eval_dataset, not both")
    if not config.has_validation():
        for name in ("eval_steps", "per_device_eval_batch_size"):
            if getattr(config, name) is not None:
                raise ConfigError(f"{name} needs validation data: set val_size or eval_dataset")
        if config.load_best_model_at_end:
            raise ConfigError("load_best_model_at_end needs validation data: set val_size or eval_dataset")
    every = config.eval_steps or config.save_steps
    if config.load_best_model_at_end and config.save_steps % every:
        raise ConfigError(f"load_best_model_at_end picks among the checkpoints, so save_steps ({config.save_steps}) "
                          f"must be a multiple of eval_steps ({every})")


def _validate_quantization(config: TrainConfig) -> None:
    _one_of("quantization_method", config.quantization_method, ("bnb",))
    _one_of("quantization_type", config.quantization_type, QUANTIZATION_TYPES)
    if config.quantization_bit is not None and config.quantization_bit not in (4, 8):
        raise ConfigError(f"quantization_bit must be 4 or 8 (bitsandbytes), got {config.quantization_bit}")


def _key_problem(key: Any) -> str:
    """Why `key` is not read, and what to write instead."""
    if key in FOREIGN_KEYS:
        return f"{key!r} is not an agentrig key: {FOREIGN_KEYS[key]}"
    close = difflib.get_close_matches(str(key), FIELDS, n=1, cutoff=0.5)
    hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(FIELDS)}"
    return f"unknown key {key!r}{hint}"


def config_from_dict(data: dict[str, Any], source: str = "config") -> TrainConfig:
    """Build a validated `TrainConfig`; unknown keys raise `ConfigError`, every one named with what to use instead."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys to values, got {type(data).__name__}")
    problems = [_key_problem(key) for key in data if key not in FIELDS]
    if len(problems) == 1:
        raise ConfigError(f"{source}: {problems[0]}")
    if problems:
        raise ConfigError(f"{source}: {len(problems)} keys agentrig does not read (docs/training.md lists the "
                          "keys and their LLaMA-Factory names):\n" + "\n".join(f"  - {p}" for p in problems))
    if "dataset" not in data:
        raise ConfigError(f"{source}: missing required key 'dataset'")
    config = TrainConfig(**{key: _coerce(key, value) for key, value in data.items()})
    _validate(config)
    return config


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> TrainConfig:
    """Load a YAML config file; `overrides` (already typed) replace keys from the file."""
    from agentrig.jsonl import KINDS, describe, path_kind

    path = Path(path)
    want = "a YAML training config (see examples/lora_agent.yaml)"
    if path.is_dir():
        raise ConfigError(f"--config {path}: it is a folder; expected {want}")
    if not path.is_file():
        raise ConfigError(f"--config {path}: there is no such file; expected {want}")
    kind = path_kind(path)
    if kind == "binary":
        raise ConfigError(f"--config {path}: expected {want}; {describe(kind)}")
    if kind in KINDS:
        raise ConfigError(f"--config {path}: expected {want}; this is {describe(kind)}, which goes under the "
                          "config's `dataset:` key")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({' '.join(str(exc).split())}); see examples/lora_agent.yaml") from None
    if not data and not overrides:
        raise ConfigError(f"--config {path}: the file is empty; expected {want}, with at least `dataset:`")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values")
    data.update(overrides or {})
    return config_from_dict(data, source=str(path))
