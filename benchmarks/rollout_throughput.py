"""Rollout throughput: episodes per minute with batched lockstep generation vs one episode at a time.

Same test tasks, same model, same harness, greedy decoding, fresh tool state per episode in both modes:
(a) `run_episodes(..., batch_size=B)` with `HFPolicy.generate_batch` (one left-padded `model.generate`
per round for all live episodes), (b) `run_episode` for each task in turn. Prints both figures, the
ratio (target >= 4x) and whether both modes produced the same transcripts (they should, up to
floating-point ties). Run: `python benchmarks/rollout_throughput.py` (defaults are sized for a CPU).
"""

from __future__ import annotations

import argparse
import platform
import time

from agentrig.envs import load_env
from agentrig.harness import HarnessConfig, run_episode, run_episodes
from agentrig.hf_policy import HFPolicy


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
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = parser.parse_args()

    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    env = load_env(args.env)
    tasks = env.tasks(args.split, args.episodes, seed=0)
    config = HarnessConfig(max_steps=args.max_steps)
    policy = HFPolicy.from_pretrained(args.model, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
    policy.generate(_warmup_request(env, tasks[0], config, policy))

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
    single = [run_episode(task, tools, policy, config, episode_id=task.id) for task, tools, _ in single_jobs]
    single_s = time.perf_counter() - start
    for state in batch_states + single_states:
        env.close(state)

    same = sum(1 for a, b in zip(batched, single) if [s.raw_output for s in a.steps] == [s.raw_output for s in b.steps])
    steps = sum(len(e.steps) for e in batched)
    device = "cuda" if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    print(f"model {args.model} on {device}, {platform.processor() or platform.machine()}; {len(tasks)} {args.split} "
          f"tasks, {steps} policy steps, max {args.max_steps} steps x {args.max_new_tokens} new tokens")
    print(f"(a) batched lockstep (batch {args.batch_size}): {60 * len(batched) / batched_s:8.1f} episodes/min ({batched_s:.1f} s)")
    print(f"(b) one episode at a time:      {60 * len(single) / single_s:8.1f} episodes/min ({single_s:.1f} s)")
    print(f"ratio (a)/(b): {single_s / batched_s:.2f}x (target >= 4x); identical transcripts: {same}/{len(tasks)}")


def _warmup_request(env, task, config, policy):
    """One request to load kernels before timing."""
    from agentrig.harness import EpisodeRunner

    tools, state = env.setup(task)
    request = EpisodeRunner(task, tools, config).request()
    env.close(state)
    return request


if __name__ == "__main__":
    main()
