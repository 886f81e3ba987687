"""`agentrig serve` throughput: 16 concurrent clients each running a datadesk episode through the server, against
the same 16 episodes sent one request at a time; and the server's overhead per request against in-process
`HFPolicy` on the same prompts.

(a) concurrent: 16 threads, each its own `OpenAIPolicy` running one episode (harness, real tools, faults)
    against the server, which batches whatever requests are waiting;
(b) sequential: the same 16 episodes, one thread, one request at a time (what a server without batching gives);
(c) overhead: the prompts (b) sent, replayed one at a time through the server and through `HFPolicy.generate`
    in this process, same adapter, greedy; the server's extra wall time per request in percent.

Figures printed: requests per second and mean episode latency of (a) and (b) and the ratio a/b of requests per
second (target >= 3.5x on 2 CPU cores; the batched decode loop's own ceiling here is about 4x), and (c)'s
overhead (target < 5%). The episodes of (a) and (b) are checked to be the same (greedy, same seeds).

    python benchmarks/serve_throughput.py [--adapter runs/default/sft/adapter] [--episodes 16] [--replay 24]
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


class Recording:
    """An OpenAIPolicy wrapper that records each request's messages and latency."""

    def __init__(self, policy, log: list, lock: threading.Lock) -> None:
        self.policy, self.log, self.lock = policy, log, lock

    def generate(self, request):
        started = time.perf_counter()
        reply = self.policy.generate(request)
        with self.lock:
            self.log.append((request, time.perf_counter() - started))
        return reply

    def generate_batch(self, requests):
        return [self.generate(r) for r in requests]


def run_one(runner, task, url: str, model: str, max_tokens: int, log: list, lock: threading.Lock):
    from agentrig.policies.openai_policy import OpenAIPolicy

    policy = Recording(OpenAIPolicy(url, model, max_tokens=max_tokens, max_retries=0, timeout_s=600), log, lock)
    opened = runner.open(task, f"{task.id}#0", f"0/{task.id}/0")
    started = time.perf_counter()
    (episode,) = runner.run([opened], policy, batch_size=1)
    return episode, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapter", default="runs/default/sft/adapter", help="served as 'sft'; missing: the base model")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--replay", type=int, default=24, help="prompts replayed for the overhead figure")
    ap.add_argument("--max-tokens", type=int, default=160, help="completion limit per step (the main job's)")
    ap.add_argument("--faults", type=float, default=0.2)
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="inference precision on the CPU")
    a = ap.parse_args()
    a.bf16 = a.precision == "bf16"

    from agentrig.envs import load_env
    from agentrig.envs.runner import TaskRunner
    from agentrig.harness.loop import HarnessConfig
    from agentrig.policies.hf_policy import HFPolicy
    from agentrig.serve.server import ServeConfig, build_state, start_server

    adapters = {"sft": a.adapter} if Path(a.adapter).is_dir() else {}
    model_name = "sft" if adapters else a.model
    policy = HFPolicy.from_pretrained(a.model, adapters or None, max_new_tokens=a.max_tokens, batch_size=16, bf16=a.bf16)
    running = start_server(build_state(ServeConfig(model=a.model, batch_size=16), adapters, HarnessConfig(), policy=policy))
    env = load_env("datadesk")
    tasks = env.tasks("test", a.episodes)
    runner = TaskRunner(env, HarnessConfig(), TaskRunner.env_faults(env, a.faults))
    lock = threading.Lock()
    results = {}
    try:
        for mode in ("sequential", "concurrent"):
            log: list = []
            started = time.perf_counter()
            if mode == "concurrent":
                with ThreadPoolExecutor(len(tasks)) as pool:
                    done = list(pool.map(lambda t: run_one(runner, t, running.url, model_name, a.max_tokens, log, lock),
                                         tasks))
            else:
                done = [run_one(runner, t, running.url, model_name, a.max_tokens, log, lock) for t in tasks]
            wall = time.perf_counter() - started
            results[mode] = {"wall_s": round(wall, 1), "requests": len(log), "requests_per_s": round(len(log) / wall, 3),
                             "mean_episode_s": round(sum(s for _, s in done) / len(done), 1),
                             "steps": [[s.raw_output for s in e.steps] for e, _ in done], "log": log,
                             "largest_batch": running.state.engine.largest_batch}
            print(f"{mode}: {len(log)} requests in {wall:.1f} s = {len(log) / wall:.2f} requests/s, "
                  f"mean episode {results[mode]['mean_episode_s']} s", flush=True)
        same = results["sequential"]["steps"] == results["concurrent"]["steps"]
        # (c) overhead: the same prompts one at a time, through the server and in process
        from agentrig.policies.openai_policy import OpenAIPolicy

        prompts = [req for req, _ in results["sequential"]["log"][: a.replay]]
        remote = OpenAIPolicy(running.url, model_name, max_tokens=a.max_tokens, max_retries=0, timeout_s=600)
        t0 = time.perf_counter()
        served = [remote.generate(r).text for r in prompts]
        server_s = time.perf_counter() - t0
    finally:
        running.stop()
    local = HFPolicy.from_pretrained(a.model, adapters or None, max_new_tokens=a.max_tokens, batch_size=16,
                                     bf16=a.bf16)
    t0 = time.perf_counter()
    direct = [local.generate(r).text for r in prompts]
    local_s = time.perf_counter() - t0
    ratio = results["concurrent"]["requests_per_s"] / results["sequential"]["requests_per_s"]
    overhead = 100 * (server_s - local_s) / local_s if prompts else float("nan")  # --replay 0 skips (c)
    summary = {
        "model": model_name, "episodes": len(tasks),
        **{f"{m}_{k}": results[m][k] for m in results for k in ("wall_s", "requests", "requests_per_s", "mean_episode_s")},
        "largest_batch": results["concurrent"]["largest_batch"], "same_episodes": same,
        "throughput_ratio": round(ratio, 2),
        "replayed_prompts": len(prompts), "server_s": round(server_s, 1), "in_process_s": round(local_s, 1),
        "server_overhead_pct": round(overhead, 1), "same_replies": served == direct,
    }
    print(json.dumps(summary, indent=1))
    print(f"concurrent {results['concurrent']['requests_per_s']:.2f} vs one-at-a-time "
          f"{results['sequential']['requests_per_s']:.2f} requests/s: {ratio:.2f}x (target >= 3.5x); "
          f"server overhead {overhead:+.1f}% per request vs in-process HFPolicy (target < 5%)")


if __name__ == "__main__":
    main()
