"""Training configuration: one typed dataclass, loaded from YAML, saved beside every adapter.

The keys are those of LLaMA-Factory-style LoRA configs (the seed's `examples/lora_agent.yaml` loads
unchanged) plus a documented few. Every field's help text lives in its `metadata`, and `docs/training.md`
lists them. An unknown key is an error that names it and the closest valid key, because a misspelled
`lora_rnak` silently falling back to a default costs a whole training run.
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
RESOLVED_CONFIG_NAME = "agentrig_train.yaml"


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class TrainConfig:
    """Everything `agentrig train` needs; YAML keys map one-to-one onto these fields."""

    dataset: str = field(metadata=_help(
        "`agentrig data build` output folder, its tokenized.jsonl, or (stage dpo) a preference-pairs .jsonl"))
    model_name_or_path: str = field(default=DEFAULT_MODEL, metadata=_help(
        "Hugging Face model id or local folder; `smollm2-135m` is the packaged default"))
    finetuning_type: str = field(default="lora", metadata=_help("only `lora` is supported"))
    stage: str = field(default="sft", metadata=_help("`sft` (supervised) or `dpo` (preference pairs)"))
    output_dir: str = field(default="runs/train", metadata=_help(
        "run folder: adapter/, checkpoints/, loss_curve.json/.png"))
    lora_rank: int = field(default=32, metadata=_help("LoRA rank r (vLLM serves it with --max-lora-rank >= r)"))
    lora_alpha: int = field(default=64, metadata=_help("LoRA scaling numerator (scale = alpha / rank)"))
    lora_dropout: float = field(default=0.0, metadata=_help("dropout on the LoRA branch"))
    lora_target: str | list[str] = field(default="q_proj,k_proj,v_proj,o_proj", metadata=_help(
        "comma-separated module names (q_proj,v_proj,...) or `all` for every linear layer but the head"))
    learning_rate: float = field(default=2.0e-4, metadata=_help("peak learning rate (AdamW)"))
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
        "stage dpo: the SFT adapter to start from, also the frozen reference"))
    pref_beta: float = field(default=0.1, metadata=_help("DPO beta (strength of the KL tie to the reference)"))
    pref_ftx: float = field(default=0.0, metadata=_help(
        "DPO: weight of an NLL term on the chosen completion (per token), which keeps the format the chosen "
        "replies share (LLaMA-Factory's pref_ftx, TRL's rpo_alpha)"))

    def target_modules(self) -> str | list[str]:
        """PEFT's `target_modules`: a list of names, or `all-linear` for `all`."""
        names = self.lora_target if isinstance(self.lora_target, list) else self.lora_target.split(",")
        names = [n.strip() for n in names if n.strip()]
        return "all-linear" if names == ["all"] else names

    def use_bf16(self) -> bool:
        """The resolved `bf16`: the key's value, or when unset whether the hardware has native bf16."""
        from agentrig.models import native_bf16

        return native_bf16() if self.bf16 is None else self.bf16

    def to_dict(self) -> dict[str, Any]:
        """Plain dict in field order, as written to YAML."""
        return dataclasses.asdict(self)

    def save(self, folder: str | Path) -> Path:
        """Write the resolved config as `agentrig_train.yaml` into `folder`."""
        path = Path(folder) / RESOLVED_CONFIG_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path


FIELDS: dict[str, dataclasses.Field] = {f.name: f for f in dataclasses.fields(TrainConfig)}


def _coerce(name: str, value: Any) -> Any:
    """Check one value against its field's type; YAML's `1e-4` (a string in YAML 1.1) becomes a float."""
    kind = FIELDS[name].type
    if value is None:
        if "None" in kind:
            return None
        raise ConfigError(f"config key {name!r} needs a value")
    if kind.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {name!r} must be an integer, got {value!r}")
        return value
    if kind == "float":
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
    if kind == "str | list[str]":
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        if isinstance(value, str):
            return value
        raise ConfigError(f"config key {name!r} must be a string or a list of strings, got {value!r}")
    if not isinstance(value, str):
        raise ConfigError(f"config key {name!r} must be a string, got {value!r}")
    return value


def _validate(config: TrainConfig) -> None:
    if config.finetuning_type != "lora":
        raise ConfigError(f"finetuning_type {config.finetuning_type!r} is not supported: use `lora`")
    if config.stage not in STAGES:
        raise ConfigError(f"stage {config.stage!r} is not one of {', '.join(STAGES)}")
    if config.lr_scheduler_type not in SCHEDULERS:
        raise ConfigError(f"lr_scheduler_type {config.lr_scheduler_type!r} is not one of {', '.join(SCHEDULERS)}")
    for name in ("lora_rank", "lora_alpha", "per_device_train_batch_size", "gradient_accumulation_steps",
                 "max_seq_length", "save_steps"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name} must be at least 1, got {getattr(config, name)}")
    if config.max_steps is not None and config.max_steps < 1:
        raise ConfigError(f"max_steps must be at least 1, got {config.max_steps}")
    if not 0.0 <= config.warmup_ratio < 1.0:
        raise ConfigError(f"warmup_ratio must be in [0, 1), got {config.warmup_ratio}")
    if not 0.0 <= config.lora_dropout < 1.0:
        raise ConfigError(f"lora_dropout must be in [0, 1), got {config.lora_dropout}")
    if config.learning_rate <= 0 or config.num_train_epochs <= 0 or config.pref_beta <= 0:
        raise ConfigError("learning_rate, num_train_epochs and pref_beta must be positive")
    if config.pref_ftx < 0:
        raise ConfigError(f"pref_ftx must be >= 0 (0 = plain DPO), got {config.pref_ftx}")
    if not config.target_modules():
        raise ConfigError("lora_target is empty: name the modules (q_proj,v_proj,...) or use `all`")


def config_from_dict(data: dict[str, Any], source: str = "config") -> TrainConfig:
    """Build a validated `TrainConfig`; unknown keys raise `ConfigError` naming the closest valid key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys to values, got {type(data).__name__}")
    for key in data:
        if key not in FIELDS:
            close = difflib.get_close_matches(str(key), FIELDS, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(FIELDS)}"
            raise ConfigError(f"{source}: unknown key {key!r}{hint}")
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
