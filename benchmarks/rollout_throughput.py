"""Rollout throughput: episodes per minute with batched, prefix-cached generation vs one episode at a time.

Same test tasks, same model, same harness, greedy decoding, fresh tool state per episode in every mode:
(a) `run_episodes(..., batch_size=B)` with `HFPolicy` and the prefix cache on: the episodes stream into the
policy's own decode loop over a preallocated KV cache (`generate_stream`: an episode's next step joins the
running batch as soon as its reply is applied; each step reuses the episode's earlier keys/values; finished
rows leave the batch; an adapter runs merged into the base weights on a CPU),
(b) `run_episode` for each task in turn with the plain path (prefix cache off, batch size 1: one
`model.generate` per step, the whole prompt prefilled).
Prints both figures, the ratio (target >= 4x) and whether both produced the same transcripts (they
should, up to floating-point ties). `--cache-off-batched` adds (c): batched rounds of
`model.generate` with the prefix cache off (and PEFT's unmerged forward), so (c)/(a) is what the cache, the
streaming and the merge buy at the same batch size.

Run: `python benchmarks/rollout_throughput.py` (the issue's setting: 16 episodes, batch 16). A short
version for a small CPU: `--episodes 4 --batch-size 4 --max-steps 2 --max-new-tokens 16`.
`--adapter DIR` runs both modes with a trained LoRA adapter (e.g. the main job's `runs/default/sft/adapter`):
a trained agent calls tools, so its episodes run several steps and the prefix cache has earlier steps to
reuse, which is the evaluation and rollout-collection workload; the base model mostly answers in one step.
"""

from __future__ import annotations

import argparse
import platform
import time

from agentrig.envs import load_env
from agentrig.harness import HarnessConfig, run_episode, run_episodes
from agentrig.policies.hf_policy import HFPolicy


def main() -> None:
    """Measure and print both modes."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--env", default="datadesk")
    parser.add_argument("--split", default="test")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-steps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--adapter", default=None, help="a LoRA adapter folder both modes run with")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    parser.add_argument("--cache-off-batched", action="store_true",
                        help="also run (c): batched like (a) but with the prefix cache off")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    env = load_env(args.env)
    tasks = env.tasks(args.split, args.episodes, seed=0)
    config = HarnessConfig(max_steps=args.max_steps)
    adapters = {"trained": args.adapter} if args.adapter else None
    policy = HFPolicy.from_pretrained(args.model, adapters, max_new_tokens=args.max_new_tokens,
                                      batch_size=args.batch_size)

    def plain(batch_size: int) -> HFPolicy:
        return HFPolicy(policy.model, policy.tokenizer, max_new_tokens=args.max_new_tokens, batch_size=batch_size,
                        prefix_cache=False)

    one_at_a_time = plain(1)
    one_at_a_time.generate(_warmup_request(env, tasks[0], config))  # warms kernels, leaves (a)'s cache empty

    def jobs() -> list:
        states = []
        out = []
        for task in tasks:
            tools, state = env.setup(task)
            states.append(state)
            out.append((task, tools, None))
        return out, states

    batch_jobs, batch_states = jobs()
    start = time.perf_counter()
    batched = run_episodes(batch_jobs, policy, config, batch_size=args.batch_size)
    batched_s = time.perf_counter() - start

    single_jobs, single_states = jobs()
    start = time.perf_counter()
    single = [run_episode(task, tools, one_at_a_time, config, episode_id=task.id) for task, tools, _ in single_jobs]
    single_s = time.perf_counter() - start
    states = batch_states + single_states

    uncached = None
    if args.cache_off_batched:
        uncached_jobs, uncached_states = jobs()
        states += uncached_states
        start = time.perf_counter()
        uncached = run_episodes(uncached_jobs, plain(args.batch_size), config, batch_size=args.batch_size)
        uncached_s = time.perf_counter() - start
    for state in states:
        env.close(state)

    def same(xs, ys) -> int:
        return sum(1 for a, b in zip(xs, ys) if [s.raw_output for s in a.steps] == [s.raw_output for s in b.steps])

    steps = sum(len(e.steps) for e in batched)
    device = "cuda" if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    print(f"model {args.model}{' + adapter ' + args.adapter if args.adapter else ''} on {device}, {platform.processor() or platform.machine()}; {len(tasks)} {args.split} "
          f"tasks, {steps} policy steps, max {args.max_steps} steps x {args.max_new_tokens} new tokens")
    print(f"(a) streamed (batch {args.batch_size}), prefix cache on:         "
          f"{60 * len(batched) / batched_s:8.1f} episodes/min ({batched_s:.1f} s)")
    print(f"(b) one episode at a time, plain path:       {60 * len(single) / single_s:8.1f} episodes/min ({single_s:.1f} s)")
    print(f"ratio (a)/(b): {single_s / batched_s:.2f}x (target >= 4x); identical transcripts: "
          f"{same(batched, single)}/{len(tasks)}")
    if uncached is not None:
        print(f"(c) batched lockstep rounds (batch {args.batch_size}), prefix cache off: "
              f"{60 * len(uncached) / uncached_s:8.1f} episodes/min ({uncached_s:.1f} s)")
        print(f"prefix cache gain at batch {args.batch_size}, (a)/(c): {uncached_s / batched_s:.2f}x; identical "
              f"transcripts: {same(batched, uncached)}/{len(tasks)}")


def _warmup_request(env, task, config):
    """One request to load kernels before timing."""
    from agentrig.harness import EpisodeRunner

    tools, state = env.setup(task)
    request = EpisodeRunner(task, tools, config).request()
    env.close(state)
    return request


if __name__ == "__main__":
    main()
