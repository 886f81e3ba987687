"""Step time of `prompt_no_grad` (each sample's context encoded without gradient) against the ordinary step.

The main job's recipe (r 32 / alpha 64 on every linear module, one packed 2,048-token row a step, lr 1e-3, bf16
autocast where the CPU has it) on the default profile's own data, trained for `--steps` optimizer steps each way in
a fresh process-local run folder. Printed: seconds a step after the first (warm-up) step, tokens/s, the share of
tokens that are context (before each sample's first supervised token), and the ordinary step's time over this
one's: how many more steps the same minutes buy. The peer is the same trainer with the key off (the forward and
backward every other trainer runs); the saving is the context's backward pass and its kept activations.

    python benchmarks/prompt_no_grad.py [--data runs/default/data] [--steps 8]

`--data` is an `agentrig data build` folder (the main job's `RUN/data`); without one, 400 expert episodes are
collected and built into a temporary folder first (about a minute).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from lora_depth import build_default_data  # this folder is on sys.path when run as a script
from train_throughput import step_clock


def context_share(data: str) -> float:
    """Tokens before each sample's first supervised target, over all tokens (the rows' context share)."""
    context = total = 0
    with open(Path(data) / "tokenized.jsonl", encoding="utf-8") as f:
        for line in f:
            labels = json.loads(line)["labels"]
            first = next((i for i, x in enumerate(labels) if x != -100), len(labels))
            context += max(first - 1, 0)
            total += len(labels)
    return context / total


def time_step(data: str, no_grad: bool, steps: int, work: Path) -> dict[str, float]:
    from agentrig import run
    from agentrig.train.train import run_train
    from agentrig.train.trainconfig import TrainConfig

    prof = run.PROFILES["default"]
    config = TrainConfig(dataset=data, model_name_or_path="smollm2-135m", output_dir=str(work / f"nograd-{no_grad}"),
                         lora_rank=run.LORA_RANK, lora_alpha=run.LORA_ALPHA, lora_target=prof.lora_target,
                         learning_rate=prof.learning_rate, warmup_ratio=0.05, per_device_train_batch_size=1,
                         max_seq_length=prof.max_seq_length, max_steps=steps, save_steps=10_000, packing=True, seed=0,
                         prompt_no_grad=no_grad)
    clock = step_clock()
    result = run_train(config, callbacks=[clock])
    per_step = (clock.marks[-1] - clock.marks[0]) / (len(clock.marks) - 1)
    return {"seconds_per_step": per_step, "tokens_per_s": result.tokens / steps / per_step,
            "first_loss": result.loss_history[0]["loss"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="an `agentrig data build` folder (default: build the default profile's data)")
    ap.add_argument("--steps", type=int, default=8, help="optimizer steps each way (the first is warm-up)")
    a = ap.parse_args()
    if a.steps < 3:
        ap.error("--steps must be at least 3: the first step is warm-up and two more make a step time")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = a.data or build_default_data(work)
        print(f"context (tokens before each sample's first supervised target): {context_share(data):.1%} of tokens")
        peer = time_step(data, False, a.steps, work)
        ours = time_step(data, True, a.steps, work)
        print(f"ordinary step (peer): {peer['seconds_per_step']:.2f} s a step, {peer['tokens_per_s']:.0f} tokens/s, "
              f"first loss {peer['first_loss']:.4f}")
        print(f"prompt_no_grad: {ours['seconds_per_step']:.2f} s a step, {ours['tokens_per_s']:.0f} tokens/s, "
              f"first loss {ours['first_loss']:.4f}; "
              f"{peer['seconds_per_step'] / ours['seconds_per_step']:.2f}x the steps a minute")


if __name__ == "__main__":
    main()
