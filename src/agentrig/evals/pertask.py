"""The evaluator of per-task test-time training (`agentrig ttt --per-task`).

The loop (`agentrig.ttt.pertask`) sees the environment through a `BlindEnv` and hands every answer to
`deliver`; here each answer is checked against the state it ran on, with the real task, and recorded under
its modes: `best_of_k` (the best of k sampled rollouts by the checker-free score, no training) and
`per_task` (a few LoRA steps on that rollout when the rollouts disagree, then a greedy answer). Both are
written as an `agentrig eval` folder (`episodes_best_of_k.jsonl`, `episodes_per_task.jsonl`, `metrics.json`,
`report.md`; with `--task-steps 0`, best_of_k alone), with episode ids `TASK_ID#0`, so `agentrig compare OUT:best_of_k OUT:per_task` pairs them and
either pairs with an `agentrig eval --seed S` of the same tasks (`--task-seed S`).
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentrig.errors import ConfigError


def evaluate_per_task(cfg: Any, log: Any = print) -> int:
    """Run the per-task mode of `cfg` (a `TTTConfig` with `per_task`) and write its evaluation into `cfg.out`."""
    from agentrig.envs import load_env
    from agentrig.envs.runner import TaskRunner
    from agentrig.evals.evaluate import EvalConfig, EvalResult, write_metrics
    from agentrig.evals.metrics import compute_metrics
    from agentrig.evals.report import failure_examples, pick_transcripts, rich_table, write_report
    from agentrig.harness.trajectory import write_episodes
    from agentrig.jsonl import check_output_folder
    from agentrig.ttt.pertask import BEST_OF_K, PER_TASK, PerTaskSettings, answer_tasks

    out = Path(cfg.out)
    check_output_folder(out, "--out")
    if (out / "pertask.json").exists():
        raise ConfigError(f"--out {out} already holds a finished per-task run (pertask.json); choose another folder")
    env = load_env(cfg.env, cfg.tasks)
    try:
        env.check_split(cfg.split)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    pool = env.pool_size(cfg.split)
    n = cfg.limit if pool is None else min(cfg.limit, pool)
    real = {t.id: t for t in env.tasks(cfg.split, n, seed=cfg.task_seed)}
    checked: dict[str, list[Any]] = {BEST_OF_K: [], PER_TASK: []}

    lifecycle = TaskRunner(env, cfg.harness)  # its `finish`: the checker on the answer's state, then close

    def deliver(modes: tuple[str, ...], opened: Any, episode: Any) -> None:
        task = real[opened.task.id]
        episode = lifecycle.finish(replace(opened, task=task), replace(episode, task=task))
        for mode in modes:
            checked[mode].append(replace(episode, metadata={**episode.metadata, "trial": 0,
                                                            "faults_rate": cfg.rollout_faults, "per_task_mode": mode}))

    settings = PerTaskSettings(k=cfg.k, temperature=cfg.temperature, task_steps=cfg.task_steps,
                               task_learning_rate=cfg.task_learning_rate, faults=cfg.rollout_faults,
                               task_seed=cfg.task_seed, seed=cfg.seed, max_new_tokens=cfg.max_new_tokens,
                               max_seq_length=cfg.max_seq_length)
    started = time.monotonic()
    summary = answer_tasks(env, cfg.split, n, model=cfg.model, adapter=cfg.adapter, name=cfg.name,
                           harness=cfg.harness, settings=settings, out=out, deliver=deliver, log=log)
    wall = time.monotonic() - started
    config = EvalConfig(env=cfg.env, tasks=cfg.tasks, splits=[cfg.split], limit=n, faults=cfg.rollout_faults,
                        seed=cfg.task_seed, harness=cfg.harness)
    checked = {mode: episodes for mode, episodes in checked.items() if episodes}  # --task-steps 0: best_of_k only
    results = {}
    for mode, episodes in checked.items():
        episodes.sort(key=lambda ep: ep.episode_id)
        write_episodes(out / f"episodes_{mode}.jsonl", episodes)
        results[mode] = EvalResult(metrics=compute_metrics(episodes), episodes=episodes, wall_s=wall)
    write_metrics(out, {mode: config for mode in results}, results,
                  {"policy": "model", "model": cfg.model, "adapters": {cfg.name: cfg.adapter},
                   "per_task": {"k": cfg.k, "temperature": cfg.temperature, "task_steps": cfg.task_steps,
                                "task_learning_rate": cfg.task_learning_rate}})
    summary["completed"] = {mode: sum(bool(ep.success) for ep in eps) for mode, eps in checked.items()}
    summary["tasks_total"] = n
    (out / "pertask.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    metric_sets = {mode: r.metrics for mode, r in results.items()}
    last = checked.get(PER_TASK, checked[BEST_OF_K])
    write_report(out, metric_sets, transcripts=pick_transcripts(last, 3), failures=failure_examples(last),
                 title=f"agentrig ttt --per-task: {cfg.name} on {cfg.env}/{cfg.split}",
                 notes=[f"{n} tasks, k={cfg.k} rollouts at temperature {cfg.temperature}, {cfg.task_steps} LoRA "
                        f"steps where they disagree ({summary['trained']} tasks, {summary['train_s']} s of "
                        f"training), fault rate {cfg.rollout_faults}, task seed {cfg.task_seed}"])
    from rich.console import Console

    Console().print(rich_table(metric_sets, title=f"per-task TTT: {cfg.name} on {cfg.env}/{cfg.split}"))
    log(", ".join(f"{mode} {hits}/{n}" for mode, hits in summary["completed"].items())
        + f"; trained on {summary['trained']} tasks; wrote {out / 'metrics.json'}"
        + (f" (agentrig compare {out}:best_of_k {out}:per_task)" if PER_TASK in checked else ""))
    return 0
