"""Exports of canonical samples to other trainers' formats: TRL, LLaMA-Factory, Axolotl, OpenAI fine-tuning.

Each export writes its data file(s) plus what its consumer needs to read them, and reports what the format
could not carry. agentrig's own trainer reads `tokenized.jsonl` and needs none of these. Every config names
the model as a folder or hub id its tool loads offline (`config_model`), and its relative data paths mean
"run it inside the export folder" (the header comment of each config says so).

- `trl`: `{"messages"}` rows (no `tools` column: the system prompt lists the tools, and TRL before 1.x refuses
  a JSON-string `tools`), `chat_template.jinja` (agentrig's template with `{% generation %}` marks, so
  `assistant_only_loss=True` masks exactly what agentrig masks) and `sft_config.yaml`, the `SFTConfig`
  settings (`max_length` that fits every row, `assistant_only_loss`, `chat_template_path`). Per-message
  weights do not exist there: weight-0 turns get trained.
- `llamafactory`, layout `chatml` (default): the training text itself, cut into sharegpt turns that
  LLaMA-Factory's `empty` template encodes piece by piece: `human` = each unsupervised stretch (system, user
  and tool turns, weight-0 detours, ChatML glue), `gpt` = one supervised assistant turn up to and including
  its end-of-turn token. Its tokens and labels are agentrig's (checked here; the test runs LLaMA-Factory's
  own loader), except a weight-0 tail after the last supervised turn, which is left out (it trains nothing).
  Layout `sharegpt`: readable roles (`human`, `gpt`, `function_call`, `observation`) for LLaMA-Factory's
  `qwen` template, which renders other tokens: results become `user` turns, the newline after each
  end-of-turn is trained, and so are detours. Its alternation rule cannot express a turn with text and
  calls (one `gpt` turn holding the Hermes body) or several results and notices in a row (merged into one
  observation, joined as LLaMA-Factory's own OpenAI converter joins results).
- `axolotl`: `chat_template` dataset config + JSONL with a per-message `training` flag (weight-0 turns off).
- `openai`: the fine-tuning JSONL with `weight: 0` on detour turns, in the tool format `OpenAIPolicy` is
  then run with (`agentrig.harness.protocol.wire_messages`): `native` (the `tools` list, native
  `tool_calls`, the system prompt without its tool list; detours calling a tool outside `tools`, or
  writing `<tool_call>` text, are left out) or `hermes` (calls as text, results as user turns, no `tools`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agentrig.data.render import IGNORE_INDEX, Renderer, hermes_template
from agentrig.data.samples import Sample
from agentrig.errors import ConfigError, DataError
from agentrig.harness.protocol import wire_messages

FORMATS = ("trl", "llamafactory", "axolotl", "openai")
LLAMAFACTORY_LAYOUTS = ("chatml", "sharegpt")
OPENAI_TOOL_FORMATS = ("native", "hermes")
OBSERVATION_JOIN = "\n</tool_response>\n<tool_response>\n"  # LLaMA-Factory's join of consecutive tool results
DATASET_NAME = "agentrig_agent"
LORA = {"r": 32, "alpha": 64, "targets": ["q_proj", "k_proj", "v_proj", "o_proj"]}  # the seed's section 3.4
SCHEDULE = {"learning_rate": 2.0e-4, "batch_size": 2, "accumulation": 8, "epochs": 3, "scheduler": "cosine"}


@dataclass
class ExportReport:
    """What an export wrote and what the format changed or could not express."""

    format: str
    out_dir: str
    layout: str = ""  # LLaMA-Factory's layout or the OpenAI tool format
    files: list[str] = field(default_factory=list)
    samples: int = 0
    changed: int = 0  # samples rewritten to satisfy the format's rules
    changes: dict[str, int] = field(default_factory=dict)
    weight0_trained: int = 0  # samples whose weight-0 turns the format cannot mask

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)

    def count(self, changes: dict[str, int]) -> None:
        """Add one sample's changes."""
        if changes:
            self.changed += 1
            for k, v in changes.items():
                self.changes[k] = self.changes.get(k, 0) + v


def _has_weight0(sample: Sample) -> bool:
    return any(m["role"] == "assistant" and w == 0 for m, w in zip(sample.messages, sample.weights))


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def config_model(model: str) -> str:
    """The model as a config file should name it: the local folder agentrig loads it from, or the hub id given.

    An agentrig alias (`smollm2-135m`) means nothing to another tool, which would look it up on a hub.
    """
    from agentrig.models import resolve_model

    resolved = resolve_model(model)
    return str(Path(resolved).resolve()) if Path(resolved).exists() else resolved


def _config_text(header: list[str], data: dict[str, Any]) -> str:
    return "".join(f"# {line}\n" for line in header) + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def seq_limit(samples: list[Sample], max_seq_length: int | None) -> int:
    """The length every exported row fits: `max_seq_length`, or the longest sample's tokens when None."""
    longest = max((int(s.metadata.get("tokens", 0)) for s in samples), default=0)
    if max_seq_length is None:
        if longest == 0:
            raise ConfigError("the samples carry no token counts (metadata 'tokens'): pass max_seq_length "
                              "(--max-seq-length), the length the exported configs should allow")
        return longest
    over = next((s for s in samples if int(s.metadata.get("tokens", 0)) > max_seq_length), None)
    if over is not None:
        raise ConfigError(f"sample {over.sample_id} has {over.metadata['tokens']} tokens, more than max_seq_length "
                          f"{max_seq_length}: the exported configs would cut it; build with --max-seq-length "
                          f"{max_seq_length} (it windows long episodes) or export with a larger limit")
    return max_seq_length


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
    """One TRL conversational row: the messages (the system prompt lists the tools)."""
    return {"messages": sample.messages}


def trl_sft_config(limit: int) -> dict[str, Any]:
    """The `SFTConfig` keyword arguments that train on the export as agentrig does (the seed's schedule)."""
    return {
        "max_length": limit + 1,  # TRL renders the newline after the last end-of-turn token too; none is cut
        "assistant_only_loss": True,  # the template's {% generation %} marks: exactly agentrig's supervised tokens
        "chat_template_path": "chat_template.jinja",
        "packing": False,
        "learning_rate": SCHEDULE["learning_rate"],
        "per_device_train_batch_size": SCHEDULE["batch_size"],
        "gradient_accumulation_steps": SCHEDULE["accumulation"],
        "num_train_epochs": SCHEDULE["epochs"],
        "lr_scheduler_type": SCHEDULE["scheduler"],
        "output_dir": "outputs/agentrig-lora",
    }


def _trl_header(model: str) -> list[str]:
    return [
        "TRL SFTConfig settings for train.jsonl (TRL >= 0.24). Run inside this folder (the paths are relative):",
        "  import yaml; from datasets import load_dataset; from peft import LoraConfig",
        "  from trl import SFTConfig, SFTTrainer",
        "  args = SFTConfig(**yaml.safe_load(open('sft_config.yaml')))",
        "  lora = LoraConfig(r=32, lora_alpha=64, target_modules=['q_proj', 'k_proj', 'v_proj', 'o_proj'],"
        " task_type='CAUSAL_LM')",
        f"  SFTTrainer(model={model!r}, args=args, peft_config=lora,",
        "             train_dataset=load_dataset('json', data_files='train.jsonl', split='train')).train()",
    ]


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
    """One sharegpt row (conversations, system) and the merges it needed.

    No `tools` column: the system prompt already lists the tools, and LLaMA-Factory's templates would append
    a second list to it.
    """
    system = sample.messages[0]["content"] if sample.messages[0]["role"] == "system" else ""
    rest = sample.messages[1:] if sample.messages[0]["role"] == "system" else sample.messages
    turns, changes = sharegpt_conversation(rest)
    return {"conversations": turns, "system": system}, changes


def chatml_conversation(renderer: Renderer, sample: Sample) -> tuple[list[dict[str, str]], dict[str, int]]:
    """The sample's training text as `human` (unsupervised) / `gpt` (one supervised turn) pieces, and what changed.

    Each `gpt` piece is an assistant turn with weight > 0, from its first token to its end-of-turn token;
    each `human` piece is everything between two of them (weight-0 turns included, `detour_masked`). A
    weight-0 tail after the last supervised turn is left out (`tail_left_out`): nothing is learned from it.
    Raises DataError when encoding the pieces one by one (as LLaMA-Factory does) would not give the tokens
    and labels `Renderer.sample_turns` gives.
    """
    messages, weights = sample.messages, sample.weights
    eot = renderer.end_of_turn
    turns: list[dict[str, str]] = []
    changes: dict[str, int] = {}
    done = pending = ""
    for k, msg in enumerate(messages):
        if msg["role"] != "assistant":
            continue
        prompt = renderer.prompt_text(messages[:k])
        full = renderer.render_text(messages[: k + 1])
        if not prompt.startswith(done) or not full.startswith(prompt) or eot not in full[len(prompt):]:
            raise DataError(f"sample {sample.sample_id}: message {k} does not extend the text before it; "
                            "the chatml layout needs a prefix-stable template (use --llamafactory-layout sharegpt)")
        turn = full[len(prompt): full.index(eot, len(prompt)) + len(eot)]
        pending += prompt[len(done):]
        if weights[k] > 0:
            turns += [{"from": "human", "value": pending}, {"from": "gpt", "value": turn}]
            pending = ""
        else:
            pending += turn
            changes["detour_masked"] = changes.get("detour_masked", 0) + 1
        done = prompt + turn
    if pending:
        changes["tail_left_out"] = 1
    ids: list[int] = []
    labels: list[int] = []
    for t in turns:
        piece = renderer.encode(t["value"])
        ids += piece
        labels += piece if t["from"] == "gpt" else [IGNORE_INDEX] * len(piece)
    ours = renderer.sample_turns(messages, weights)
    if ours.input_ids[: len(ids)] != ids or ours.labels[: len(ids)] != labels or any(
            x != IGNORE_INDEX for x in ours.labels[len(ids):]):
        raise DataError(f"sample {sample.sample_id}: its chatml pieces do not encode to agentrig's tokens; "
                        "use --llamafactory-layout sharegpt")
    return turns, changes


def dataset_info(file_name: str, ranking: bool = False, layout: str = "sharegpt") -> dict[str, Any]:
    """The `dataset_info.json` entry that registers an exported file (`layout` "chatml": the conversations only)."""
    columns: dict[str, str] = {"messages": "conversations"}
    if layout == "sharegpt":
        columns["system"] = "system"
    entry: dict[str, Any] = {"file_name": file_name, "formatting": "sharegpt", "columns": columns}
    if ranking:  # preference pairs (`agentrig data pairs --format llamafactory`); tools live in the system prompt
        entry["ranking"] = True
        columns.update(chosen="chosen", rejected="rejected")
    return {DATASET_NAME + ("_pairs" if ranking else ""): entry}


def llamafactory_yaml(model: str, max_seq_length: int, dataset: str = DATASET_NAME,
                      layout: str = "chatml") -> dict[str, Any]:
    """A LoRA SFT config equivalent to the seed's `lora_agent.yaml` (section 3.4), in LLaMA-Factory's keys."""
    return {
        "model_name_or_path": model,
        "stage": "sft",
        "do_train": True,
        "dataset": dataset,
        "dataset_dir": ".",  # this folder: run llamafactory-cli inside it
        # chatml: the rows hold the ChatML text, which `empty` encodes as it is; sharegpt: Qwen's tool format
        "template": "empty" if layout == "chatml" else "qwen",
        "finetuning_type": "lora",
        "lora_rank": LORA["r"],
        "lora_alpha": LORA["alpha"],
        "lora_target": ",".join(LORA["targets"]),
        "learning_rate": SCHEDULE["learning_rate"],
        "per_device_train_batch_size": SCHEDULE["batch_size"],
        "gradient_accumulation_steps": SCHEDULE["accumulation"],
        "cutoff_len": max_seq_length,  # LLaMA-Factory's name for the seed's max_seq_length
        "num_train_epochs": SCHEDULE["epochs"],
        "lr_scheduler_type": SCHEDULE["scheduler"],
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
        "lora_r": LORA["r"],
        "lora_alpha": LORA["alpha"],
        "lora_target_modules": list(LORA["targets"]),
        "sequence_len": max_seq_length,
        "learning_rate": SCHEDULE["learning_rate"],
        "micro_batch_size": SCHEDULE["batch_size"],
        "gradient_accumulation_steps": SCHEDULE["accumulation"],
        "num_epochs": SCHEDULE["epochs"],
        "lr_scheduler": SCHEDULE["scheduler"],
        "chat_template": "jinja",
        "chat_template_jinja": hermes_template(),
        "datasets": [
            {
                "path": data_file,  # relative: run axolotl inside this folder
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


def _native_detour(message: dict[str, Any], weight: float, names: set[str]) -> bool:
    """A weight-0 turn a model with native function calling cannot write: a call outside `tools`, or call markup."""
    if message["role"] != "assistant" or weight > 0:
        return False
    calls = message.get("tool_calls") or []
    return any(c["function"]["name"] not in names for c in calls) or "<tool_call>" in (message.get("content") or "")


def openai_row(sample: Sample, tool_format: str = "native") -> tuple[dict[str, Any], dict[str, int]]:
    """The OpenAI fine-tuning row in `tool_format` (detour turns `weight: 0`), and what changed.

    The messages are `wire_messages(sample.messages, tool_format)`, what `OpenAIPolicy(tool_format=...)`
    sends at inference. `native` leaves out a detour turn it cannot express (`_native_detour`) with the
    results and notices that answered it (`detour_left_out`).
    """
    if tool_format not in OPENAI_TOOL_FORMATS:
        raise ConfigError(f"unknown OpenAI tool format {tool_format!r}; choose one of: {', '.join(OPENAI_TOOL_FORMATS)}")
    tools = json.loads(sample.tools)
    names = {t["function"]["name"] for t in tools}
    keep: list[int] = []
    changes: dict[str, int] = {}
    skipping = False
    for k, (m, w) in enumerate(zip(sample.messages, sample.weights)):
        if m["role"] == "assistant":
            skipping = tool_format == "native" and _native_detour(m, w, names)
            if skipping:
                changes["detour_left_out"] = changes.get("detour_left_out", 0) + 1
        if not skipping:
            keep.append(k)
    try:
        wire = wire_messages([sample.messages[k] for k in keep], tool_format)
    except ValueError as exc:
        raise DataError(f"sample {sample.sample_id}: {exc}; export it with --openai-tools hermes") from None
    msgs = []
    for m, k in zip(wire, keep):
        m = {key: v for key, v in m.items() if v is not None}
        if m["role"] == "assistant":
            m["weight"] = 1 if sample.weights[k] > 0 else 0
        msgs.append(m)
    return ({"messages": msgs, "tools": tools} if tool_format == "native" else {"messages": msgs}), changes


# -- the entry point -------------------------------------------------------------------------


def export_samples(samples: list[Sample], fmt: str, out_dir: str | Path, model: str = "smollm2-135m",
                   max_seq_length: int | None = None, *, llamafactory_layout: str = "chatml",
                   openai_tools: str = "native", renderer: Renderer | None = None) -> ExportReport:
    """Write `samples` in format `fmt` under `out_dir` (created); returns what was written and changed.

    Args:
        model: the model the samples were rendered for; configs name its local folder (`config_model`).
        max_seq_length: the length the configs allow (the build's `--max-seq-length`); None: the longest sample.
        llamafactory_layout: "chatml" (agentrig's tokens) or "sharegpt" (roles, LLaMA-Factory's qwen template).
        openai_tools: "native" or "hermes", the `tool_format` OpenAIPolicy must then be run with.
        renderer: the samples' renderer (the chatml layout renders with it; default `Renderer.for_model(model)`).
    """
    if fmt not in FORMATS:
        raise ConfigError(f"unknown export format {fmt!r}; choose one of: {', '.join(FORMATS)}")
    if llamafactory_layout not in LLAMAFACTORY_LAYOUTS:
        raise ConfigError(f"unknown LLaMA-Factory layout {llamafactory_layout!r}; choose one of: "
                          f"{', '.join(LLAMAFACTORY_LAYOUTS)}")
    if openai_tools not in OPENAI_TOOL_FORMATS:
        raise ConfigError(f"unknown OpenAI tool format {openai_tools!r}; choose one of: {', '.join(OPENAI_TOOL_FORMATS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    report = ExportReport(fmt, str(out), samples=len(samples))
    weight0 = sum(1 for s in samples if _has_weight0(s))
    limit = seq_limit(samples, max_seq_length) if fmt != "openai" else 0
    where = f"Run it inside this folder ({out.resolve()}): its data paths are relative to it."

    def write_text(name: str, text: str) -> None:
        (out / name).write_text(text, encoding="utf-8")
        report.files.append(str(out / name))

    def write_rows(name: str, rows: list[dict[str, Any]]) -> None:
        _write_jsonl(out / name, rows)
        report.files.append(str(out / name))

    if fmt == "trl":
        write_rows("train.jsonl", [trl_row(s) for s in samples])
        write_text("chat_template.jinja", trl_training_template())
        write_text("sft_config.yaml", _config_text(_trl_header(config_model(model)), trl_sft_config(limit)))
        report.weight0_trained = weight0
    elif fmt == "llamafactory":
        report.layout = llamafactory_layout
        rows = []
        if llamafactory_layout == "chatml":
            renderer = renderer or Renderer.for_model(model)
        for s in samples:
            if llamafactory_layout == "chatml":
                turns, changes = chatml_conversation(renderer, s)  # type: ignore[arg-type]
                row: dict[str, Any] = {"conversations": turns}
            else:
                row, changes = sharegpt_row(s)
                report.weight0_trained += int(_has_weight0(s))
            problems = sharegpt_violations(row["conversations"])
            if problems:
                raise RuntimeError(f"sample {s.sample_id}: sharegpt export breaks LLaMA-Factory's rules: {problems}")
            report.count(changes)
            rows.append(row)
        write_rows(f"{DATASET_NAME}.jsonl", rows)
        info = dataset_info(f"{DATASET_NAME}.jsonl", layout=llamafactory_layout)
        write_text("dataset_info.json", json.dumps(info, indent=2) + "\n")
        header = [f"LLaMA-Factory LoRA SFT on agentrig's export (layout {llamafactory_layout}).",
                  f"{where} `dataset_dir: .` is this folder:", "  llamafactory-cli train lora_agent.yaml"]
        cfg = llamafactory_yaml(config_model(model), limit, layout=llamafactory_layout)
        write_text("lora_agent.yaml", _config_text(header, cfg))
    elif fmt == "axolotl":
        write_rows("train.jsonl", [axolotl_row(s) for s in samples])
        header = ["Axolotl LoRA config for train.jsonl, rendered with agentrig's template.",
                  f"{where} `path: train.jsonl` is in this folder:", "  axolotl train axolotl.yaml"]
        write_text("axolotl.yaml", _config_text(header, axolotl_config("train.jsonl", config_model(model), limit)))
    else:
        report.layout = openai_tools
        rows = []
        for s in samples:
            row, changes = openai_row(s, openai_tools)
            report.count(changes)
            rows.append(row)
        write_rows("train.jsonl", rows)
    write_text("export_report.json", json.dumps(report.to_dict(), indent=2) + "\n")
    return report
