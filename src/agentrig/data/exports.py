"""Exports of canonical samples to other trainers' formats: TRL, LLaMA-Factory (sharegpt), Axolotl, OpenAI.

Each export writes its data file(s) plus what its consumer needs to read them, and reports what the format
could not carry. agentrig's own trainer reads `tokenized.jsonl` and needs none of these.

- `trl`: `{"messages", "tools": JSON string}` rows (TRL's SFTTrainer json-decodes a string `tools`) and
  `chat_template.jinja`: agentrig's template with `{% generation %}` marks, so `assistant_only_loss=True`
  masks exactly what agentrig masks. Per-message weights do not exist there: weight-0 turns get trained.
- `llamafactory`: sharegpt rows (`human`, `gpt`, `function_call`, `observation`; system and tools columns),
  the `dataset_info.json` entry and a LoRA YAML equivalent to the seed's `lora_agent.yaml`. Its alternation
  rule (odd positions human/observation, even positions gpt/function_call) cannot express a turn with text
  and calls (written as one `gpt` turn holding the exact Hermes body) or several results and notices in a
  row (merged into one observation, joined the way LLaMA-Factory's own OpenAI converter joins results).
- `axolotl`: `chat_template` dataset config + JSONL with a per-message `training` flag (weight-0 turns off).
- `openai`: the fine-tuning JSONL (`messages`, `tools` list) with `weight: 0` on detour turns.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentrig.data.render import hermes_template
from agentrig.data.samples import Sample

FORMATS = ("trl", "llamafactory", "axolotl", "openai")
OBSERVATION_JOIN = "\n</tool_response>\n<tool_response>\n"  # LLaMA-Factory's join of consecutive tool results
DATASET_NAME = "agentrig_agent"


@dataclass
class ExportReport:
    """What an export wrote and what the format changed or could not express."""

    format: str
    out_dir: str
    files: list[str] = field(default_factory=list)
    samples: int = 0
    changed: int = 0  # samples rewritten to satisfy the format's rules
    changes: dict[str, int] = field(default_factory=dict)
    weight0_trained: int = 0  # samples whose weight-0 turns the format cannot mask

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)


def _has_weight0(sample: Sample) -> bool:
    return any(m["role"] == "assistant" and w == 0 for m, w in zip(sample.messages, sample.weights))


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


# -- TRL -------------------------------------------------------------------------------------


def trl_training_template() -> str:
    """agentrig's Hermes template with `{% generation %}` around each assistant body and its end-of-turn token.

    Renders exactly the same text as the plain template; the marks only let TRL/transformers compute
    `assistant_masks`. Kept out of the served template because some Jinja engines lack the tag.
    """
    text = hermes_template()
    head = "{{- '<|im_start|>assistant\\n' + content -}}"
    tail = "{{- '<|im_end|>' + '\\n' -}}"
    if text.count(head) != 1 or text.count(tail) != 1:
        raise RuntimeError("the Hermes template changed: update trl_training_template's marks")
    text = text.replace(head, "{{- '<|im_start|>assistant\\n' -}}{%- generation -%}{{- content -}}")
    return text.replace(tail, "{{- '<|im_end|>' -}}{%- endgeneration -%}{{- '\\n' -}}")


def trl_row(sample: Sample) -> dict[str, Any]:
    """One TRL conversational row: messages plus tools as a JSON string."""
    return {"messages": sample.messages, "tools": sample.tools}


# -- LLaMA-Factory ---------------------------------------------------------------------------


def _call_content(message: dict[str, Any]) -> str:
    calls = [{"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
             for c in message["tool_calls"]]
    return json.dumps(calls[0] if len(calls) == 1 else calls, ensure_ascii=False)


def _hermes_body(message: dict[str, Any]) -> str:
    blocks = [
        "<tool_call>\n" + json.dumps({"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])},
                                     ensure_ascii=False) + "\n</tool_call>"
        for c in message.get("tool_calls") or []
    ]
    text = message.get("content") or ""
    return "\n".join(([text] if text else []) + blocks)


def sharegpt_conversation(messages: list[dict[str, Any]]) -> tuple[list[dict[str, str]], dict[str, int]]:
    """OpenAI messages (system excluded) to sharegpt turns that follow LLaMA-Factory's alternation rule.

    Returns the turns and the merges made (`text_and_calls`, `consecutive_observations`, `notice_into_observation`,
    `consecutive_user`).
    """
    turns: list[dict[str, str]] = []
    changes: dict[str, int] = {}
    for msg in messages:
        role = msg["role"]
        if role == "assistant":
            if msg.get("tool_calls") and msg.get("content"):
                turns.append({"from": "gpt", "value": _hermes_body(msg)})
                changes["text_and_calls"] = changes.get("text_and_calls", 0) + 1
            elif msg.get("tool_calls"):
                turns.append({"from": "function_call", "value": _call_content(msg)})
            else:
                turns.append({"from": "gpt", "value": msg.get("content") or ""})
            continue
        tag = "observation" if role == "tool" else "human"
        value = msg.get("content") or ""
        if turns and turns[-1]["from"] in ("human", "observation"):
            prev = turns[-1]
            if prev["from"] == "observation" and tag == "observation":
                prev["value"] += OBSERVATION_JOIN + value
                kind = "consecutive_observations"
            else:
                prev["value"] += "\n" + value
                kind = "notice_into_observation" if prev["from"] == "observation" else "consecutive_user"
            changes[kind] = changes.get(kind, 0) + 1
            continue
        turns.append({"from": tag, "value": value})
    return turns, changes


def sharegpt_violations(turns: list[dict[str, str]], ranking: bool = False) -> list[str]:
    """LLaMA-Factory's sharegpt rules: odd positions human/observation, even gpt/function_call, and the count."""
    accept = (("human", "observation"), ("gpt", "function_call"))
    problems = [f"turn {i} is {t['from']!r}" for i, t in enumerate(turns) if t["from"] not in accept[i % 2]]
    if (not ranking and len(turns) % 2 != 0) or (ranking and len(turns) % 2 == 0):
        problems.append(f"{len(turns)} turns")
    return problems


def sharegpt_row(sample: Sample) -> tuple[dict[str, Any], dict[str, int]]:
    """One sharegpt row (conversations, system, tools) and the merges it needed."""
    system = sample.messages[0]["content"] if sample.messages[0]["role"] == "system" else ""
    rest = sample.messages[1:] if sample.messages[0]["role"] == "system" else sample.messages
    turns, changes = sharegpt_conversation(rest)
    return {"conversations": turns, "system": system, "tools": sample.tools}, changes


def dataset_info(file_name: str, ranking: bool = False) -> dict[str, Any]:
    """The `dataset_info.json` entry that registers an exported file."""
    columns: dict[str, str] = {"messages": "conversations", "system": "system", "tools": "tools"}
    entry: dict[str, Any] = {"file_name": file_name, "formatting": "sharegpt", "columns": columns}
    if ranking:
        entry["ranking"] = True
        columns.update(chosen="chosen", rejected="rejected")
    return {DATASET_NAME + ("_pairs" if ranking else ""): entry}


def llamafactory_yaml(model: str, max_seq_length: int, dataset: str = DATASET_NAME) -> dict[str, Any]:
    """A LoRA SFT config equivalent to the seed's `lora_agent.yaml` (section 3.4), in LLaMA-Factory's keys."""
    return {
        "model_name_or_path": model,
        "stage": "sft",
        "do_train": True,
        "dataset": dataset,
        "dataset_dir": ".",
        "template": "qwen",  # its tool format is the Hermes <tool_call> JSON block agentrig trains
        "finetuning_type": "lora",
        "lora_rank": 32,
        "lora_alpha": 64,
        "lora_target": "q_proj,k_proj,v_proj,o_proj",
        "learning_rate": 2.0e-4,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 8,
        "cutoff_len": max_seq_length,  # LLaMA-Factory's name for the seed's max_seq_length
        "num_train_epochs": 3,
        "lr_scheduler_type": "cosine",
        "mask_history": False,  # supervise every assistant turn, not only the last
        "output_dir": "saves/agentrig-lora",
    }


# -- Axolotl and OpenAI ----------------------------------------------------------------------


def axolotl_row(sample: Sample) -> dict[str, Any]:
    """Messages with a per-message `training` flag (assistant turns with weight > 0)."""
    msgs = [{**m, "training": m["role"] == "assistant" and w > 0} for m, w in zip(sample.messages, sample.weights)]
    return {"messages": msgs}


def axolotl_config(data_file: str, model: str, max_seq_length: int) -> dict[str, Any]:
    """An Axolotl config reading the export with agentrig's template."""
    return {
        "base_model": model,
        "adapter": "lora",
        "lora_r": 32,
        "lora_alpha": 64,
        "lora_target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"],
        "sequence_len": max_seq_length,
        "learning_rate": 2.0e-4,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 8,
        "num_epochs": 3,
        "lr_scheduler": "cosine",
        "chat_template": "jinja",
        "chat_template_jinja": hermes_template(),
        "datasets": [
            {
                "path": data_file,
                "type": "chat_template",
                "field_messages": "messages",
                "message_property_mappings": {"role": "role", "content": "content"},
                "message_field_training": "training",
                "roles_to_train": [],  # the per-message flag decides
                "train_on_eos": "turn",
            }
        ],
        "output_dir": "./outputs/agentrig-lora",
    }


def openai_row(sample: Sample) -> dict[str, Any]:
    """The OpenAI fine-tuning row: messages (detour turns `weight: 0`) and the tools as a list."""
    msgs = []
    for m, w in zip(sample.messages, sample.weights):
        m = {k: v for k, v in m.items() if v is not None}
        if m["role"] == "assistant":
            m["weight"] = 1 if w > 0 else 0
        msgs.append(m)
    return {"messages": msgs, "tools": json.loads(sample.tools)}


# -- the entry point -------------------------------------------------------------------------


def export_samples(samples: list[Sample], fmt: str, out_dir: str | Path, model: str = "smollm2-135m",
                   max_seq_length: int = 4096) -> ExportReport:
    """Write `samples` in format `fmt` under `out_dir` (created); returns what was written and changed."""
    if fmt not in FORMATS:
        from agentrig.errors import ConfigError

        raise ConfigError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = ExportReport(fmt, str(out), samples=len(samples))
    weight0 = sum(1 for s in samples if _has_weight0(s))

    def write_text(name: str, text: str) -> None:
        (out / name).write_text(text, encoding="utf-8")
        report.files.append(str(out / name))

    if fmt == "trl":
        _write_jsonl(out / "train.jsonl", [trl_row(s) for s in samples])
        report.files.append(str(out / "train.jsonl"))
        write_text("chat_template.jinja", trl_training_template())
        report.weight0_trained = weight0
    elif fmt == "llamafactory":
        rows = []
        for s in samples:
            row, changes = sharegpt_row(s)
            problems = sharegpt_violations(row["conversations"])
            if problems:
                raise RuntimeError(f"sample {s.sample_id}: sharegpt export breaks LLaMA-Factory's rules: {problems}")
            if changes:
                report.changed += 1
                for k, v in changes.items():
                    report.changes[k] = report.changes.get(k, 0) + v
            rows.append(row)
        _write_jsonl(out / "agentrig_agent.jsonl", rows)
        report.files.append(str(out / "agentrig_agent.jsonl"))
        write_text("dataset_info.json", json.dumps(dataset_info("agentrig_agent.jsonl"), indent=2) + "\n")
        write_text("lora_agent.yaml", yaml.safe_dump(llamafactory_yaml(model, max_seq_length), sort_keys=False))
        report.weight0_trained = weight0
    elif fmt == "axolotl":
        _write_jsonl(out / "train.jsonl", [axolotl_row(s) for s in samples])
        report.files.append(str(out / "train.jsonl"))
        write_text("axolotl.yaml", yaml.safe_dump(axolotl_config("train.jsonl", model, max_seq_length), sort_keys=False))
    else:
        _write_jsonl(out / "train.jsonl", [openai_row(s) for s in samples])
        report.files.append(str(out / "train.jsonl"))
    write_text("export_report.json", json.dumps(report.to_dict(), indent=2) + "\n")
    return report
