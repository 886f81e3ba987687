"""Step time of agentrig's fused LoRA linear and chunked supervised head against PEFT's and autograd's own.

The main job's recipe (r 32 / alpha 64 on every linear module, one packed 2,048-token row a step, lr 1e-3, bf16
autocast where the CPU has it) on the default profile's own data, trained for `--steps` optimizer steps each way
in a fresh process-local run folder, the two ways alternated `--rounds` times so a machine that slows down for a
minute slows both. Ours: `fused.fuse_lora_linears` (one input cast, LoRA's scale and add inside `addmm`) and
`lmloss.head_logps` (the head's log-softmax at the target in chunks, logits made again in backward). The peer is
the same trainer with PEFT's `lora.Linear.forward` and the head through autograd (`cross_entropy` on the
logits): what every other PEFT trainer runs. Printed per round and in total: seconds a step after the first
(warm-up) step, tokens/s, the first step's loss, and the peer's step time over ours.

    python benchmarks/fused_ops.py [--data runs/default/data] [--steps 8] [--rounds 2]

`--data` is an `agentrig data build` folder (the main job's `RUN/data`); without one, 400 expert episodes are
collected and built into a temporary folder first (about a minute).
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Iterator

from lora_depth import build_default_data, step_arguments, time_steps  # this folder is on sys.path as a script


@contextlib.contextmanager
def unfused() -> Iterator[None]:
    """The peer: PEFT's LoRA forward and autograd's head while inside."""
    from agentrig.train import fused, lmloss

    saved = fused.fuse_lora_linears, lmloss.head_logps
    fused.fuse_lora_linears = lambda model: 0
    lmloss.head_logps = lmloss.autograd_head_logps
    try:
        yield
    finally:
        fused.fuse_lora_linears, lmloss.head_logps = saved


def main() -> None:
    a = step_arguments(__doc__.splitlines()[0], "each way and round", rounds=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = a.data or build_default_data(work)
        totals = {"peer": 0.0, "ours": 0.0}
        for r in range(a.rounds):
            with unfused():
                peer = time_steps(data, a.steps, work / f"peer-{r}")
            ours = time_steps(data, a.steps, work / f"ours-{r}")
            for name, row in (("peer", peer), ("ours", ours)):
                totals[name] += row["seconds_per_step"]
                print(f"round {r + 1} {name}: {row['seconds_per_step']:.2f} s a step, {row['tokens_per_s']:.0f} "
                      f"tokens/s, first loss {row['first_loss']:.4f}")
        print(f"PEFT forward + autograd head (peer): {totals['peer'] / a.rounds:.2f} s a step; fused: "
              f"{totals['ours'] / a.rounds:.2f} s a step; {totals['peer'] / totals['ours']:.2f}x the steps a minute")


if __name__ == "__main__":
    main()
