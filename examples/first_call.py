"""The first call of an adapter on many datadesk tasks: is it a tool the task needs? (docs/training.md, rows 19, 19b)

    python examples/first_call.py ADAPTER_DIR|base SPLIT START N

Runs tasks START..START+N-1 of SPLIT (task seed 0, no faults) for one step each through the real harness, greedy,
with the main job's settings (160 new tokens, compact listing), and prints per family how often the first call is a
tool the task needs (for `no_tool`: no call at all), then the most common wrong picks. Comparing `train` (tasks the
default profile trained on: 0..399) with `test` separates what the adapter memorised from what it generalises.
About 7 minutes for 160 tasks on 2 cores.
"""
import collections
import sys

from agentrig.envs.datadesk import DatadeskEnv
from agentrig.harness.loop import HarnessConfig, run_episodes
from agentrig.policies.hf_policy import HFPolicy


def main() -> None:
    if len(sys.argv) != 5:
        sys.exit(__doc__)
    adapter, split, start, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    env = DatadeskEnv()
    tasks = env.tasks(split, n, seed=0, start=start)
    policy = HFPolicy.from_pretrained("smollm2-135m", adapters=None if adapter == "base" else {"a": adapter},
                                      max_new_tokens=160)
    if adapter != "base":
        policy.use("a")
    jobs = [(t, env.setup(t)[0], None) for t in tasks]
    episodes = run_episodes(jobs, policy, HarnessConfig(max_steps=1), batch_size=16)
    right: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    wrong: collections.Counter[tuple[str, str | None]] = collections.Counter()
    for task, ep in zip(tasks, episodes):
        need = task.expected.get("needed_tools", [])
        calls = ep.steps[0].calls if ep.steps else []
        first = calls[0].name if calls else None
        ok = first in need if need else first is None
        right[task.family][0] += ok
        right[task.family][1] += 1
        if not ok:
            wrong[(task.family, first)] += 1
    for family, (a, b) in sorted(right.items()):
        print(f"{family:22s} {a}/{b}")
    print(f"all                    {sum(a for a, _ in right.values())}/{len(tasks)}")
    print("wrong first calls (family, tool):", wrong.most_common(15))


if __name__ == "__main__":
    main()
