"""Training throughput: agentrig's trainer against the plain TRL recipe, same data, model and LoRA config.

(a) agentrig: `run_train` (pre-tokenized samples, best-fit packing with per-sample position ids, causal
    attention per sample without a mask, LM head only at supervised positions, no gradient checkpointing).
(b) plain TRL, as TRL's docs show for conversational tool data: a `messages` + `tools` dataset,
    `SFTTrainer` with a PEFT `LoraConfig` and `SFTConfig` defaults (padded batches, gradient checkpointing,
    head over every position).

Both run in the same precision (`--precision fp32`, the default, or `bf16`: autocast on a CPU with native
bf16, which is what agentrig's trainer picks by itself on such a CPU) and the same built datadesk samples (expert episodes with faults through `agentrig data build`;
Hermes ChatML, tools in the system prompt, tool calls and tool results) for `--steps` optimizer steps with batch 2. Figures printed: supervised-token throughput of each
(the supervised tokens of the samples consumed, divided by the `train()` wall time after the first step,
which is warm-up; tokens pro rata by steps) and the ratio a/b,
peak RSS of each (each side runs in its own process), and (a)'s model FLOP utilization against a matmul
peak of the same precision measured in this run. MFU counts the FLOPs LoRA training needs: forward 2N + input-gradient
backward 2N per token for the frozen non-embedding weights N, causal attention within each sample, and the
head at supervised positions only; the 6N convention of full fine-tuning is printed alongside.

    python benchmarks/train_throughput.py --steps 6 [--samples 64] [--precision fp32|bf16]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MAX_LEN = 2048  # the main job's max_seq_length: a datadesk sample is ~1,300 tokens, its system prompt ~900
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]  # the seed's lora_target


def _plain_messages(messages: list[dict]) -> list[dict]:
    """Messages as a TRL user writes them: OpenAI keys only (no agentrig weights); arguments stay JSON strings,
    since Arrow cannot hold dict arguments whose value types differ across rows (trl#5118)."""
    return [{k: v for k, v in m.items() if k in ("role", "content", "tool_calls", "tool_call_id", "name")}
            for m in messages]


def datadesk_samples(n: int, work: Path) -> list[dict]:
    """`n` built datadesk samples (messages + tools): expert episodes with faults, through `agentrig data build`."""
    from agentrig.data.collect import CollectConfig, run_collect
    from agentrig.data.databuild import build_dataset

    episodes = work / "episodes.jsonl"
    run_collect(CollectConfig(episodes=n, out=str(episodes), workers=1, seed=0), progress=False)
    build_dataset([episodes], work / "built", model="smollm2-135m", max_seq_length=MAX_LEN)
    rows = [json.loads(line) for line in (work / "built" / "samples.jsonl").read_text().splitlines()]
    return rows[:n]


def step_clock():
    """A callback noting the time at the end of every optimizer step. The first step is warm-up (allocator
    growth, oneDNN kernel selection) and takes several times a steady step on CPU, so it is left out."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.begin = 0.0  # when training started: marks[0] - begin is the first step, warm-up included
            self.marks: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.marks.append(time.perf_counter())

    return StepClock()


def _steady(clock, total_seconds: float, steps: int) -> tuple[float, float]:
    """(seconds after warm-up, fraction of the run's tokens they cover: pro rata by steps)."""
    if steps < 2 or len(clock.marks) < 2:
        return total_seconds, 1.0
    return clock.marks[-1] - clock.marks[0], (steps - 1) / steps


def _peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2


def _lora_kwargs() -> dict:
    return dict(lora_rank=32, lora_alpha=64, lora_target=",".join(TARGETS), per_device_train_batch_size=2,
                max_seq_length=MAX_LEN)


def run_agentrig(work: Path, steps: int, samples: int, bf16: bool) -> dict:
    """Side (a), in this process."""
    from agentrig.data.render import Renderer
    from agentrig.train.trainconfig import config_from_dict
    from agentrig.train.train import run_train

    renderer = Renderer.for_model("smollm2-135m")
    rows = []
    for i, sample in enumerate(datadesk_samples(samples, work)):
        ids, labels = renderer.sample_ids(sample["messages"])
        rows.append({"sample_id": str(i), "input_ids": ids[:MAX_LEN], "labels": labels[:MAX_LEN]})
    data = work / "tokenized.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = config_from_dict(dict(dataset=str(data), output_dir=str(work / "a"), max_steps=steps, save_steps=10_000,
                                   bf16=bf16, **_lora_kwargs()))
    clock = step_clock()
    result = run_train(config, callbacks=[clock])
    seconds, share = _steady(clock, result.train_seconds, steps)
    rss = _peak_rss_gb()
    flops = _model_flops(_meta_model("smollm2-135m"), rows, result.tokens * share, result.supervised_tokens * share)
    return {"seconds": seconds, "supervised_tokens": result.supervised_tokens * share, "tokens": result.tokens * share,
            "flops": flops, "peak_rss_gb": rss}


def _meta_model(name: str):
    """The model's architecture on the meta device: parameter counts without loading (or allocating) weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrig.models import resolve_model

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model(name)))


def _model_flops(model, rows: list[dict], tokens: int, supervised: int) -> dict:
    """FLOPs of the tokens run: LoRA need (4N + attention + head at supervised positions) and the 6N convention."""
    cfg = model.config
    embed = model.get_input_embeddings().weight.numel()
    n_body = sum(p.numel() for p in model.parameters()) - embed * (1 if cfg.tie_word_embeddings else 2)
    d, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
    lengths = [len(r["input_ids"]) for r in rows]
    # Causal attention inside a sample: QK^T and AV, forward 4*d per (query, key) pair, backward twice that.
    attn_per_token = 3 * 4 * d * layers * sum(n * (n + 1) / 2 for n in lengths) / sum(lengths)
    need = tokens * (4 * n_body + attn_per_token) + supervised * 4 * d * vocab
    six_n = 6 * (n_body + d * vocab) * tokens
    return {"lora_need": need, "six_n": six_n, "n_body": n_body}


def run_plain(work: Path, steps: int, samples: int, bf16: bool) -> dict:
    """Side (b): TRL's documented recipe for conversational tool data, in this process."""
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    from agentrig.models import load_tokenizer, resolve_model
    from agentrig.data.render import Renderer

    tokenizer = load_tokenizer("smollm2-135m")
    renderer = Renderer(tokenizer)
    tokenizer.chat_template = renderer.chat_template  # the same rendering as (a)
    built = datadesk_samples(samples, work)
    convs = [_plain_messages(row["messages"]) for row in built]
    supervised = [sum(1 for x in renderer.sample_ids(row["messages"])[1] if x != -100) for row in built]
    # TRL's documented shape for tool data: a messages column and a tools column (here as OpenAI specs).
    dataset = Dataset.from_list([{"messages": m, "tools": json.loads(row["tools"])} for m, row in zip(convs, built)])
    args = SFTConfig(output_dir=str(work / "b"), per_device_train_batch_size=2, max_length=MAX_LEN, max_steps=steps,
                     learning_rate=2e-4, lr_scheduler_type="cosine", logging_steps=1, report_to="none",
                     save_strategy="no", bf16=bf16, use_cpu=True, disable_tqdm=True)
    lora = LoraConfig(r=32, lora_alpha=64, target_modules=TARGETS, task_type="CAUSAL_LM")
    trainer = SFTTrainer(model=resolve_model("smollm2-135m"), args=args, train_dataset=dataset,
                         processing_class=tokenizer, peft_config=lora)
    clock = step_clock()
    trainer.add_callback(clock)
    started = time.perf_counter()
    trainer.train()
    seconds, share = _steady(clock, time.perf_counter() - started, steps)
    consumed = 2 * steps * share
    return {"seconds": seconds, "supervised_tokens": sum(supervised) / len(supervised) * consumed,
            "peak_rss_gb": _peak_rss_gb()}


def matmul_peak_gflops(size: int = 2048, repeats: int = 6, bf16: bool = False) -> float:
    """Best `a @ b` rate on this machine (fp32, or bf16), in GFLOP/s."""
    import torch

    dtype = torch.bfloat16 if bf16 else torch.float32
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        a @ b
        best = max(best, 2 * size ** 3 / (time.perf_counter() - t) / 1e9)
    return best


def _child(which: str, steps: int, samples: int, precision: str) -> dict:
    out = subprocess.run([sys.executable, __file__, "--side", which, "--steps", str(steps), "--samples", str(samples),
                          "--precision", precision],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"side {which} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run both sides in separate processes and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="both sides' precision")
    parser.add_argument("--side", choices=["a", "b"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:
        if args.side == "a":  # as `agentrig train` does at start: huge pages for torch's large CPU blocks
            from agentrig.cli import cpu_allocator_defaults

            cpu_allocator_defaults()
        with tempfile.TemporaryDirectory() as tmp:
            run = run_agentrig if args.side == "a" else run_plain
            print(json.dumps(run(Path(tmp), args.steps, args.samples, args.precision == "bf16")))
        return
    bf16 = args.precision == "bf16"
    peak = matmul_peak_gflops(bf16=bf16)
    a = _child("a", args.steps, args.samples, args.precision)
    b = _child("b", args.steps, args.samples, args.precision)
    peak = max(peak, matmul_peak_gflops(bf16=bf16))
    tput_a, tput_b = a["supervised_tokens"] / a["seconds"], b["supervised_tokens"] / b["seconds"]
    mfu = a["flops"]["lora_need"] / a["seconds"] / (peak * 1e9)
    mfu6 = a["flops"]["six_n"] / a["seconds"] / (peak * 1e9)
    print(f"steps {args.steps}, batch 2, max_seq_length {MAX_LEN}, LoRA r=32 q/k/v/o, SmolLM2-135M {args.precision}, "
          f"{args.samples} built datadesk samples")
    print(f"(a) agentrig : {tput_a:8.1f} supervised tok/s  ({a['tokens'] / a['seconds']:.1f} tok/s incl. context)"
          f"  peak RSS {a['peak_rss_gb']:.2f} GB  ({a['seconds']:.1f} s)")
    print(f"(b) plain TRL: {tput_b:8.1f} supervised tok/s  peak RSS {b['peak_rss_gb']:.2f} GB  ({b['seconds']:.1f} s)")
    print(f"ratio a/b    : {tput_a / tput_b:.2f}x  (target >= 2.0)")
    print(f"matmul peak  : {peak:.1f} GFLOP/s {args.precision} (measured now)")
    print(f"(a) MFU      : {100 * mfu:.1f}% of LoRA-needed FLOPs (target >= 50%); {100 * mfu6:.1f}% in the 6N convention")


if __name__ == "__main__":
    main()
