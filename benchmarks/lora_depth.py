"""Step time of LoRA on the last N decoder layers (`lora_num_layers`) against LoRA on every layer.

The main job's recipe (r 32 / alpha 64 on every linear module, one packed 2,048-token row a step, bf16 autocast
where the CPU has it) on the default profile's own data, trained for `--steps` optimizer steps once per depth,
each in a fresh process-local run folder. Printed per depth: seconds a step after the first (warm-up) step,
tokens/s, and the ratio of the full-depth step time to this depth's: how many more steps the same minutes buy.
Backward stops below the lowest adapted layer, so the saving is the backward pass (attention's most of all)
of the layers left out; the forward pass is the same at every depth.

    python benchmarks/lora_depth.py [--data runs/default/data] [--steps 8] [--layers 10,15,20]

`--data` is an `agentrig data build` folder (the main job's `RUN/data`); without one, 400 expert episodes are
collected and built into a temporary folder first (about a minute).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from train_throughput import step_clock  # the same step timer (this folder is on sys.path when run as a script)


def build_default_data(work: Path) -> str:
    """The default profile's 400 expert episodes, built (the main job's collect and data stages)."""
    from agentrig import run

    prof, cfg = run.PROFILES["default"], run.RunConfig(out=str(work))
    episodes = run._collect(cfg, prof, work)
    return run._build(cfg, prof, work, [episodes["episodes_file"]])["data_dir"]


def time_steps(data: str, steps: int, folder: Path, **overrides: object) -> dict[str, float]:
    """The main job's SFT recipe (its profile's tool-name loss weight included) on `data` for `steps` steps in
    `folder`, with `overrides` of its TrainConfig:
    seconds a step after the first, the first step's seconds, tokens/s and the first step's loss."""
    from agentrig import run
    from agentrig.train.train import run_train
    from agentrig.train.trainconfig import TrainConfig

    prof = run.PROFILES["default"]
    config = TrainConfig(**{**dict(
        dataset=data, model_name_or_path="smollm2-135m", output_dir=str(folder), lora_rank=run.LORA_RANK,
        lora_alpha=run.LORA_ALPHA, lora_target=prof.lora_target, learning_rate=prof.learning_rate, warmup_ratio=0.05,
        per_device_train_batch_size=1, max_seq_length=prof.max_seq_length, max_steps=steps, save_steps=10_000,
        tool_name_weight=prof.tool_name_weight, packing=True, seed=0), **overrides})
    clock = step_clock()
    result = run_train(config, callbacks=[clock])
    per_step = (clock.marks[-1] - clock.marks[0]) / (len(clock.marks) - 1)
    return {"seconds_per_step": per_step, "first_step": clock.marks[0] - clock.begin,
            "tokens_per_s": result.tokens / steps / per_step,
            "first_loss": result.loss_history[0]["loss"]}


def step_arguments(description: str, what: str, rounds: bool = False, torch_compile: bool = False) -> argparse.Namespace:
    """`--data` and `--steps` (at least 3: one warm-up step and two to time), and `--rounds` and `--torch-compile`
    when asked, parsed."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--data", help="an `agentrig data build` folder (default: build the default profile's data)")
    ap.add_argument("--steps", type=int, default=8, help=f"optimizer steps {what} (the first is warm-up)")
    if rounds:
        ap.add_argument("--rounds", type=int, default=2, help="times the two ways are alternated")
    if torch_compile:
        ap.add_argument("--torch-compile", action="store_true", help="each decoder layer compiled on both sides")
    if what == "per depth":
        ap.add_argument("--layers", default="10,15,20", help="comma-separated depths to time against every layer")
    a = ap.parse_args()
    if a.steps < 3:
        ap.error("--steps must be at least 3: the first step is warm-up and two more make a step time")
    return a


def main() -> None:
    a = step_arguments(__doc__.splitlines()[0], "per depth")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = a.data or build_default_data(work)
        full = time_steps(data, a.steps, work / "depth-all")
        print(f"every layer (peer): {full['seconds_per_step']:.2f} s a step, {full['tokens_per_s']:.0f} tokens/s")
        for n in (int(x) for x in a.layers.split(",")):
            row = time_steps(data, a.steps, work / f"depth-{n}", lora_num_layers=n)
            print(f"last {n} layers: {row['seconds_per_step']:.2f} s a step, {row['tokens_per_s']:.0f} tokens/s; "
                  f"{full['seconds_per_step'] / row['seconds_per_step']:.2f}x the steps a minute")


if __name__ == "__main__":
    main()
