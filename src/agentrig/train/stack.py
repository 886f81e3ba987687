"""Two LoRA adapters of one base model as one adapter whose update is their sum.

`create_new_adapter` (LLaMA-Factory's key) merges an adapter into the base and trains a new LoRA on top.
LLaMA-Factory then saves only the new adapter, which is right only on the merged base. Here the two are
concatenated instead: for every module, `B1 s1 A1 + B2 s2 A2 = [B1 s1 | B2 s2] [A1 ; A2]`. The result is one plain
PEFT adapter of rank r1 + r2 with `lora_alpha = r1 + r2` (scale 1, the scales folded into B). It loads on the
base model alone in `HFPolicy`, PEFT, vLLM and the server. The result is exact up to float rounding (tested
against the merged model). A module that only one adapter adapts gets zero rows and columns for the other, so
its update is unchanged.

Adapters with per-module ranks or alphas (`rank_pattern`, `alpha_pattern`), rsLoRA or DoRA scaling, LoRA
biases or fully trained modules (`modules_to_save`) are refused with a message; agentrig trains none of them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from agentrig.errors import ConfigError

WEIGHTS = "adapter_model.safetensors"
_A, _B = ".lora_A.weight", ".lora_B.weight"


def _read(folder: Path) -> tuple[dict[str, Any], dict[str, Any], float]:
    from safetensors.torch import load_file

    from agentrig.jsonl import read_adapter_config

    cfg = read_adapter_config(folder)
    refused = [k for k in ("rank_pattern", "alpha_pattern", "use_rslora", "use_dora", "lora_bias",
                           "modules_to_save") if cfg.get(k)]
    if cfg.get("peft_type", "LORA") != "LORA" or refused:
        raise ConfigError(f"{folder}: cannot stack this adapter ({', '.join(refused) or cfg.get('peft_type')}); "
                          "only plain LoRA adapters with one rank and one alpha stack")
    if not (folder / WEIGHTS).is_file():
        raise ConfigError(f"{folder}: no {WEIGHTS} (save the adapter with safe_serialization, PEFT's default)")
    tensors = load_file(str(folder / WEIGHTS))
    other = [k for k in tensors if not k.endswith((_A, _B))]
    if other:
        raise ConfigError(f"{folder}: tensors that are not LoRA A/B ({other[0]}, ...): cannot stack")
    return cfg, tensors, float(cfg["lora_alpha"]) / int(cfg["r"])


def _targets(cfg: dict[str, Any]) -> set[str] | str:
    t = cfg.get("target_modules")
    return t if isinstance(t, str) else set(t or [])


def stack_adapters(first: str | Path, second: str | Path, out: str | Path) -> dict[str, Any]:
    """Write to `out` one adapter whose update is `first`'s plus `second`'s; returns its adapter_config.

    Both must adapt the same base model. `out` may be `second` itself (it is then overwritten); the
    tokenizer and other files of `second` are kept.
    """
    import torch
    from safetensors.torch import save_file

    first, second, out = Path(first), Path(second), Path(out)
    cfg1, t1, s1 = _read(first)
    cfg2, t2, s2 = _read(second)
    r1, r2 = int(cfg1["r"]), int(cfg2["r"])
    modules = sorted({k[: -len(_A)] for k in [*t1, *t2] if k.endswith(_A)})
    merged: dict[str, Any] = {}
    for m in modules:
        a1, b1, a2, b2 = t1.get(m + _A), t1.get(m + _B), t2.get(m + _A), t2.get(m + _B)
        ref_a, ref_b = (a1, b1) if a1 is not None else (a2, b2)
        if ref_b is None:
            raise ConfigError(f"{m}: a lora_A without its lora_B; the adapter file is incomplete")
        dtype = ref_a.dtype
        if a1 is None:
            a1, b1 = torch.zeros(r1, ref_a.shape[1], dtype=dtype), torch.zeros(ref_b.shape[0], r1, dtype=dtype)
        if a2 is None:
            a2, b2 = torch.zeros(r2, ref_a.shape[1], dtype=dtype), torch.zeros(ref_b.shape[0], r2, dtype=dtype)
        if a1.shape[1] != a2.shape[1] or b1.shape[0] != b2.shape[0]:
            raise ConfigError(f"{m}: the adapters' shapes differ ({tuple(b1.shape)}x{tuple(a1.shape)} against "
                              f"{tuple(b2.shape)}x{tuple(a2.shape)}): they are not adapters of one base model")
        merged[m + _A] = torch.cat([a1.float(), a2.float()], dim=0).to(dtype).contiguous()
        merged[m + _B] = torch.cat([b1.float() * s1, b2.float() * s2], dim=1).to(dtype).contiguous()
    targets1, targets2 = _targets(cfg1), _targets(cfg2)
    if isinstance(targets1, str) or isinstance(targets2, str):  # a regex or all-linear: name each module
        targets: Any = sorted({m.rsplit(".", 1)[-1] for m in modules})
    else:
        targets = sorted(targets1 | targets2)
    layers1, layers2 = cfg1.get("layers_to_transform"), cfg2.get("layers_to_transform")
    layers = None if layers1 is None or layers2 is None else sorted(set(layers1) | set(layers2))
    cfg = dict(cfg2, r=r1 + r2, lora_alpha=r1 + r2, target_modules=targets, layers_to_transform=layers,
               inference_mode=True)
    out.mkdir(parents=True, exist_ok=True)
    if out != second:
        for f in second.iterdir():
            if f.is_file() and f.name not in (WEIGHTS, "adapter_config.json"):
                shutil.copy2(f, out / f.name)
    save_file(merged, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return cfg
