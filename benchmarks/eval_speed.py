"""Evaluation speed: `agentrig eval`'s path against the same policy in lockstep rounds with PEFT's LoRA forward.

Same adapter, same held-out tasks, same harness and injected faults as the main job's evaluation (the
default profile's `eval_max_new_tokens`, `eval_faults` and harness), greedy decoding, a fresh tool state
per episode, in this order:
- peer: `HFPolicy` with `merge_adapters=False` behind a wrapper that only has `generate_batch`, so the
  harness runs it in lockstep rounds (every live episode asks once, the round lasts as long as its longest
  reply) and every LoRA layer runs PEFT's three products (the path before 2026-12-05, session 34);
- stream: continuous batching only (`HFPolicy.generate_stream`: an episode's next step joins the running
  decode as soon as its own reply is applied), PEFT's forward;
- merge: lockstep rounds, the adapter merged into the base weights (`agentrig.policies.merged`);
- fp32: both, in fp32 (what `agentrig eval` did before 2026-12-07, and still does on a CPU without AMX);
- ours: what `agentrig eval` and `agentrig run` do now: both, and on a CPU with AMX bf16 autocast with the
  keys/values and the linear weights held in bf16 (`agentrig.policies.halfweights`).
The first three run in fp32, as those paths did.
Prints each variant's wall time, episodes a minute, completion, the ratio to the peer, and how many
episodes have the peer's transcript token for token (greedy replies may differ at floating-point ties).

Run: `python benchmarks/eval_speed.py --adapter runs/default/sft/adapter` (40 `test` tasks); a short
version: `--limit 8 --variants peer,ours`; the precision alone: `--variants fp32,ours`.
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import Any


class Lockstep:
    """Only `generate_batch`: the harness runs it in lockstep rounds."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def generate_batch(self, requests: list) -> list:
        return self.policy.generate_batch(requests)


def main() -> None:
    """Run the variants and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--adapter", required=True, help="a LoRA adapter folder (e.g. runs/default/sft/adapter)")
    parser.add_argument("--env", default="datadesk")
    parser.add_argument("--splits", default="test", help="comma-separated splits")
    parser.add_argument("--limit", type=int, default=40, help="tasks per split")
    parser.add_argument("--variants", default="peer,stream,merge,fp32,ours")
    parser.add_argument("--batch-size", type=int, default=16, help="rows decoding together (policy and evaluation)")
    args = parser.parse_args()

    import torch

    from agentrig.evals.evaluate import EvalConfig, run_eval
    from agentrig.policies.hf_policy import HFPolicy
    from agentrig.run import PROFILES, _harness

    prof = PROFILES["default"]
    config = EvalConfig(env=args.env, splits=args.splits.split(","), limit=args.limit, faults=prof.eval_faults,
                        seed=0, harness=_harness(prof), batch_size=args.batch_size)
    variants = args.variants.split(",")
    known = ("peer", "stream", "merge", "fp32", "ours")
    unknown = [v for v in variants if v not in known]
    if unknown:
        raise SystemExit(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(known)}")
    results: dict[str, tuple[float, Any]] = {}
    for name in variants:
        policy = HFPolicy.from_pretrained(args.model, {"sft": args.adapter}, max_new_tokens=prof.eval_max_new_tokens,
                                          merge_adapters=name in ("merge", "fp32", "ours"), batch_size=args.batch_size,
                                          bf16=None if name == "ours" else False)
        runner = policy if name in ("stream", "fp32", "ours") else Lockstep(policy)
        start = time.perf_counter()
        result = run_eval(runner, config)
        results[name] = (time.perf_counter() - start, result)

    def transcript(ep: Any) -> list[str]:
        return [s.raw_output for s in ep.steps]

    first = next(iter(results))
    peer_s, peer = results[first]
    n = len(peer.episodes)
    from agentrig.models import amx_bf16

    print(f"{args.model} + {args.adapter} on cpu ({torch.get_num_threads()} threads), "
          f"{platform.processor() or platform.machine()}, AMX {'yes' if amx_bf16() else 'no'}; {n} episodes ({args.splits}, {args.limit} a split), "
          f"{prof.eval_max_new_tokens} new tokens a step, faults {prof.eval_faults}")
    print(f"{'variant':8s} {'wall s':>8s} {'episodes/min':>13s} {'completion':>11s} {'vs ' + first:>9s} "
          f"{'same transcripts':>17s}")
    for name, (seconds, result) in results.items():
        c = result.metrics.completion
        same = sum(transcript(a) == transcript(b) for a, b in zip(result.episodes, peer.episodes))
        print(f"{name:8s} {seconds:8.1f} {60 * n / seconds:13.1f} {c.hits:>5d}/{c.total:<5d} "
              f"{peer_s / seconds:8.2f}x {same:>10d}/{n}")


if __name__ == "__main__":
    main()
