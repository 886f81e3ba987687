"""Step time of `prompt_no_grad` (each sample's context encoded without gradient) against the ordinary step.

The main job's recipe (r 32 / alpha 64 on every linear module, one packed 2,048-token row a step, lr 1e-3, bf16
autocast where the CPU has it) on the default profile's own data, trained for `--steps` optimizer steps each way in
a fresh process-local run folder. Printed: seconds a step after the first (warm-up) step, tokens/s, the share of
tokens that are context (before each sample's first supervised token), and the ordinary step's time over this
one's: how many more steps the same minutes buy. The peer is the same trainer with the key off (the forward and
backward every other trainer runs); the saving is the context's backward pass and its kept activations.

    python benchmarks/prompt_no_grad.py [--data runs/default/data] [--steps 8] [--torch-compile]

`--torch-compile` compiles each decoder layer on both sides (`torch_compile`, as the main job trains on a CPU);
the first step, where compilation happens, is the warm-up either way.

`--data` is an `agentrig data build` folder (the main job's `RUN/data`); without one, 400 expert episodes are
collected and built into a temporary folder first (about a minute).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from lora_depth import build_default_data, step_arguments, time_steps  # this folder is on sys.path as a script


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


def main() -> None:
    a = step_arguments(__doc__.splitlines()[0], "each way", torch_compile=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = a.data or build_default_data(work)
        print(f"context (tokens before each sample's first supervised target): {context_share(data):.1%} of tokens")
        if a.torch_compile:
            print("both sides with torch_compile (each decoder layer compiled)")
        peer = time_steps(data, a.steps, work / "ordinary", torch_compile=a.torch_compile)
        ours = time_steps(data, a.steps, work / "no-grad", prompt_no_grad=True, torch_compile=a.torch_compile)
        print(f"ordinary step (peer): {peer['seconds_per_step']:.2f} s a step, {peer['tokens_per_s']:.0f} tokens/s, "
              f"first loss {peer['first_loss']:.4f}")
        print(f"prompt_no_grad: {ours['seconds_per_step']:.2f} s a step, {ours['tokens_per_s']:.0f} tokens/s, "
              f"first loss {ours['first_loss']:.4f}; "
              f"{peer['seconds_per_step'] / ours['seconds_per_step']:.2f}x the steps a minute")


if __name__ == "__main__":
    main()
