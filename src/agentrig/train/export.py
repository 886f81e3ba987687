"""Adapters out: the vLLM load check and `agentrig export --adapter DIR --merge --out DIR`.

vLLM's LoRA loader (`vllm/lora/peft_helper.py`) refuses adapters with `modules_to_save` or DoRA, and
serves ranks up to `--max-lora-rank` (default 16, one of a fixed set of sizes). `check_vllm_adapter`
reads `adapter_config.json` and says what is wrong, or gives the matching `vllm serve` command.

Export merges the LoRA weights into the base model and writes safetensors, the tokenizer and the
tool-calling chat template the training data was rendered with (`agentrig.data.render.Renderer`: the model's
own template when it renders tools, else `templates/hermes_chatml.v1.jinja`), so that
`AutoModelForCausalLM.from_pretrained(OUT)` and `vllm serve OUT` both work with no adapter at all.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from agentrig.errors import ConfigError
from agentrig.jsonl import read_adapter_config

# vLLM accepts these --max-lora-rank values (vllm/config/lora.py, MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass
class VllmCheck:
    """Whether vLLM can serve an adapter, and how."""

    adapter_dir: str
    base_model: str
    rank: int
    max_lora_rank: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when vLLM can load the adapter as it is."""
        return not self.problems

    def serve_command(self, name: str = "agent") -> str:
        """The `vllm serve` command that serves the base model with this adapter."""
        from agentrig.models import resolve_model

        # vLLM needs a folder or hub id: packaged names (smollm2-135m) become their converted cache folder.
        return (f"vllm serve {resolve_model(self.base_model)} --enable-lora --lora-modules {name}={self.adapter_dir} "
                f"--max-lora-rank {self.max_lora_rank}")

    def report(self, name: str = "agent") -> str:
        """One human-readable paragraph: the command, or the problems."""
        if self.ok:
            return f"vLLM check passed (rank {self.rank}); serve with:\n  {self.serve_command(name)}"
        return "vLLM cannot load this adapter:\n" + "\n".join(f"  - {p}" for p in self.problems)


def check_vllm_adapter(adapter_dir: str | Path, base_model: str | None = None) -> VllmCheck:
    """Read `adapter_config.json` and check it against vLLM's LoRA loader rules."""
    adapter_dir = Path(adapter_dir)
    cfg = read_adapter_config(adapter_dir)
    problems = []
    if cfg.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft_type is {cfg.get('peft_type')!r}; vLLM serves LoRA adapters only")
    if cfg.get("modules_to_save"):
        problems.append(f"modules_to_save={cfg['modules_to_save']} (fully trained modules); vLLM rejects them: "
                        "train without modules_to_save")
    if cfg.get("use_dora"):
        problems.append("use_dora=true; vLLM does not support DoRA adapters: train plain LoRA")
    rank = int(cfg.get("r", 0))
    if cfg.get("rank_pattern"):
        rank = max([rank, *map(int, cfg["rank_pattern"].values())])
    if rank < 1:
        problems.append("adapter_config.json states no rank `r`")
    fitting = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fitting:
        problems.append(f"rank {rank} exceeds vLLM's largest --max-lora-rank {VLLM_LORA_RANKS[-1]}")
    base = base_model or _base_model_name(adapter_dir, cfg)
    return VllmCheck(str(adapter_dir), base, rank, fitting[0] if fitting else rank, problems)


def _base_model_name(adapter_dir: Path, cfg: dict) -> str:
    """The base model as the user named it (our resolved config) or as PEFT recorded it."""
    from agentrig.train.trainconfig import RESOLVED_CONFIG_NAME

    resolved = adapter_dir / RESOLVED_CONFIG_NAME
    if resolved.is_file():
        return str(yaml.safe_load(resolved.read_text())["model_name_or_path"])
    return str(cfg.get("base_model_name_or_path") or "")


def export_merged(adapter_dir: str | Path, out_dir: str | Path, base_model: str | None = None) -> Path:
    """Merge an adapter into its base model; write safetensors, tokenizer and the tool-calling chat template."""
    import torch
    from peft import PeftModel

    from agentrig.models import load_model, load_tokenizer, quiet_loading
    from agentrig.data.render import Renderer

    check = check_vllm_adapter(adapter_dir, base_model)
    if not check.base_model:
        raise ConfigError(f"{adapter_dir}: cannot tell the base model; pass --base-model")
    base = load_model(check.base_model, dtype="float32")
    with quiet_loading():
        merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    if torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        merged = merged.to(torch.bfloat16)
    tokenizer = load_tokenizer(check.base_model)
    # The same template (and so the same tokens) that training rendered with; serving must match it.
    tokenizer.chat_template = Renderer(tokenizer).chat_template
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    merged.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `agentrig export`."""
    parser.add_argument("--adapter", required=True, help="PEFT adapter folder (from `agentrig train`)")
    parser.add_argument("--merge", action="store_true", help="merge the adapter into full weights (required)")
    parser.add_argument("--out", help="output folder for the merged model")
    parser.add_argument("--base-model", help="base model name or folder (default: the one the adapter was trained on)")
    parser.add_argument("--name", default="agent", help="LoRA module name in the printed vllm command")


def main(args: argparse.Namespace) -> int:
    """Check the adapter for vLLM; with --merge, write merged weights to --out."""
    check = check_vllm_adapter(args.adapter, args.base_model)
    print(check.report(args.name))
    if not args.merge:
        return 0 if check.ok else 1
    if not args.out:
        raise ConfigError("--merge needs --out DIR")
    out = export_merged(args.adapter, args.out, args.base_model)
    print(f"merged model written to {out}; serve it with:\n  vllm serve {out}")
    return 0
