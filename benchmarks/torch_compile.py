"""Step time with `torch_compile` (each decoder layer through TorchInductor) against the same trainer eager.

The main job's recipe (r 32 / alpha 64 on every linear module, one packed 2,048-token row a step, bf16 autocast
where the CPU has it, the fused LoRA linear and head) on the default profile's own data, `--steps` optimizer
steps each way, the two ways alternated `--rounds` times so a machine that slows down for a minute slows both.
Each run is a process of its own with an empty TorchInductor cache, so the compiled run pays its whole cold
compilation, as a fresh machine does. Printed per run: the first step's seconds (compilation happens there),
seconds a step after it, tokens/s, the first step's loss and the process's peak RSS; then the peer's (eager) step time over ours and the
number of steps after which compiling has paid for itself.

    python benchmarks/torch_compile.py [--data runs/default/data] [--steps 8] [--rounds 2]

`--data` is an `agentrig data build` folder (the main job's `RUN/data`); without one, 400 expert episodes are
collected and built into a temporary folder first (about a minute).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

from lora_depth import build_default_data, step_arguments, time_steps  # this folder is on sys.path as a script


def one_run(data: str, steps: int, folder: str, compiled: bool) -> dict[str, float]:
    """`lora_depth.time_steps` with or without `torch_compile`, and this process's peak RSS."""
    row = time_steps(data, steps, Path(folder), torch_compile=compiled)
    return {**row, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2}


def in_process(data: str, steps: int, work: Path, name: str, compiled: bool) -> dict[str, float]:
    """`one_run` in a fresh process with an empty TorchInductor cache of its own."""
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(work / f"inductor-{name}")}
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import torch_compile as b; "
            f"print('RESULT', json.dumps(b.one_run({data!r}, {steps}, {str(work / name)!r}, {compiled})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if out.returncode or not lines:
        sys.exit(f"{name} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    a = step_arguments(__doc__.splitlines()[0], "each way and round (the first compiles)", rounds=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = a.data or build_default_data(work)
        totals = {"eager": [0.0, 0.0], "compiled": [0.0, 0.0]}
        for r in range(a.rounds):
            for name in ("eager", "compiled"):
                row = in_process(data, a.steps, work, f"{name}-{r}", name == "compiled")
                totals[name][0] += row["seconds_per_step"]
                totals[name][1] += row["first_step"]
                print(f"round {r + 1} {name}: first step {row['first_step']:.1f} s, then {row['seconds_per_step']:.2f} "
                      f"s a step, {row['tokens_per_s']:.0f} tokens/s, first loss {row['first_loss']:.4f}, "
                      f"peak RSS {row['peak_rss_gb']:.2f} GB", flush=True)
        (peer, peer_first), (ours, ours_first) = ([v / a.rounds for v in totals[k]] for k in ("eager", "compiled"))
        saved = peer - ours
        paid = f"compilation paid back after {(ours_first - peer_first) / saved:.0f} steps" if saved > 0 else \
            "compiled steps are not faster"
        print(f"eager (peer): {peer:.2f} s a step, first step {peer_first:.1f} s; torch_compile: {ours:.2f} s a step, "
              f"first step {ours_first:.1f} s; {peer / ours:.2f}x the steps a minute; {paid}")


if __name__ == "__main__":
    main()
