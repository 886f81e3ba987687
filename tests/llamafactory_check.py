"""An agentrig export through LLaMA-Factory's and TRL's own code, run with the LLaMA-Factory environment's Python.

    .venv-lf/bin/python tests/llamafactory_check.py lf EXPORT_DIR OUT.jsonl
    .venv-lf/bin/python tests/llamafactory_check.py trl EXPORT_DIR MODEL_DIR OUT.jsonl

`lf`: inside EXPORT_DIR, as a user runs `llamafactory-cli train lora_agent.yaml` there, the YAML goes through
LLaMA-Factory's own argument parser (`get_train_args`), then its tokenizer loader, template and `get_dataset`:
the first three steps of its `run_sft`. `trl`: inside EXPORT_DIR, `sft_config.yaml` becomes this TRL's
`SFTConfig` and `SFTTrainer` prepares `train.jsonl` with a tiny random model of MODEL_DIR's vocabulary.
Both write one `{"input_ids", "labels"}` line per row the tool kept, in its order. `tests/test_exports.py`
compares them with agentrig's `tokenized.jsonl`. Imports nothing from agentrig (that environment lacks it).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

IGNORE_INDEX = -100


def llamafactory_rows(export_dir: str, scratch: str) -> list[dict[str, list[int]]]:
    """LLaMA-Factory's input_ids and labels of the export, from its own YAML."""
    import yaml
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    with open("lora_agent.yaml", encoding="utf-8") as fh:
        args = yaml.safe_load(fh)
    args.update(output_dir=os.path.join(scratch, "out"), overwrite_output_dir=True, report_to="none")
    model_args, data_args, training_args, _, _ = get_train_args(args)
    tokenizer_module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
    module = get_dataset(template, model_args, data_args, training_args, stage="sft", **tokenizer_module)
    return [{"input_ids": r["input_ids"], "labels": r["labels"]} for r in module["train_dataset"]]


def trl_rows(model_dir: str, scratch: str) -> list[dict[str, list[int]]]:
    """TRL's input_ids and labels (its assistant mask applied) of the export, from `sft_config.yaml`."""
    import yaml
    from datasets import load_dataset
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    from trl import SFTConfig, SFTTrainer

    with open("sft_config.yaml", encoding="utf-8") as fh:
        settings = yaml.safe_load(fh)
    settings.update(output_dir=os.path.join(scratch, "out"), report_to=[], use_cpu=True, bf16=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1))
    dataset = load_dataset("json", data_files="train.jsonl", split="train")
    trainer = SFTTrainer(model=model, args=SFTConfig(**settings), train_dataset=dataset, processing_class=tokenizer)
    rows = []
    for r in trainer.train_dataset:  # TRL 1.x folds the assistant mask into `labels`; 0.2x keeps `assistant_masks`
        labels = r["labels"] if "labels" in r else [t if m else IGNORE_INDEX
                                                    for t, m in zip(r["input_ids"], r["assistant_masks"])]
        rows.append({"input_ids": r["input_ids"], "labels": labels})
    return rows


def main(argv: list[str]) -> int:
    """Write the rows of the chosen tool; exit 2 on a usage error."""
    if len(argv) < 3 or argv[0] not in ("lf", "trl") or len(argv) != (3 if argv[0] == "lf" else 4):
        print(__doc__, file=sys.stderr)
        return 2
    out = os.path.abspath(argv[-1])
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = os.path.abspath(argv[2]) if argv[0] == "trl" else ""
        os.chdir(argv[1])
        rows = llamafactory_rows(argv[1], scratch) if argv[0] == "lf" else trl_rows(model_dir, scratch)
    with open(out, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
