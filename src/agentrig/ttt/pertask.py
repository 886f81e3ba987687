"""Per-task test-time training (`agentrig ttt --per-task`): practise on the task itself, then answer it.

For each task, with its request visible and its answer sealed (a `BlindEnv` task):

1. **k rollouts**: the adapter, sampling (`--temperature`), runs the task k times, each on a fresh state,
   with the harness and its injected faults as in evaluation;
2. **a score without the checker** (`score_rollouts`): a rollout is better when it ended with an answer,
   made fewer calls the harness rejected, left no tool failure unanswered (a failed call followed by no
   other call), wrote no figure in its answer that no tool result or the request gave
   (`envs.base.ungrounded_figures`), and agrees with more of the other rollouts (the same figures in the
   answer, `answer_signature`);
3. **best-of-k**: the best-scored rollout is the answer: the control, the same selector and no training;
4. **per-task training when the rollouts disagree**: `--task-steps` LoRA steps continuing the adapter on the
   best-scored rollout (its supervised turns), then one greedy episode with that adapter on a fresh state is
   the answer, and the adapter is dropped (the next task starts from the original). When every finished
   rollout states the same figures, the per-task answer is the best-of-k one. With `--task-steps 0` there
   is no training and only best-of-k is answered; the rollouts of several tasks then share one batch.

The loop never scores an answer: each one goes to `deliver(modes, opened, episode)`, a callback of the
evaluator (`agentrig.evals.pertask`) that checks it against its state, records it and releases the state.
The sealed tasks make any read of a task's `expected` raise, as in the per-environment loop.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

from agentrig.envs.base import numbers_in, ungrounded_figures
from agentrig.harness.trajectory import Episode

BEST_OF_K, PER_TASK = "best_of_k", "per_task"
ROLLOUT_ROWS = 16  # rows generated together when several tasks' rollouts share a batch (--task-steps 0)
Deliver = Callable[[tuple[str, ...], Any, Episode], None]


@dataclass(frozen=True)
class Score:
    """How a rollout looks without the checker (higher `key()` is better)."""

    finished: bool  # ended with a final answer
    invalid: int  # calls the harness rejected (schema, unknown tool, unparseable)
    unanswered: int  # failed tool results after which the agent called nothing more
    ungrounded: int  # figures in the answer that no tool result or the request gave
    agreement: int  # other finished rollouts whose answer states the same figures

    def key(self) -> tuple[int, int, int, int, int]:
        """Sort key: finished first, then fewer invalid calls, fewer unanswered failures, fewer ungrounded
        figures, then more agreement."""
        return (int(self.finished), -self.invalid, -self.unanswered, -self.ungrounded, self.agreement)


def answer_signature(episode: Episode) -> tuple[Any, ...]:
    """What an answer states: its figures (rounded to the cent, sorted), or its words when it has none."""
    answer = episode.final_answer or ""
    figures = sorted({round(abs(v), 2) for v in numbers_in(answer)})
    return tuple(figures) if figures else (" ".join(answer.lower().split()),)


def score_rollouts(episodes: list[Episode]) -> list[Score]:
    """The checker-free score of each rollout of one task."""
    finished = [ep.termination == "final_answer" for ep in episodes]
    signatures = [answer_signature(ep) for ep in episodes]
    scores = []
    for i, ep in enumerate(episodes):
        context = "\n".join([ep.task.prompt] + [r.content for s in ep.steps for r in s.results if r.ok])
        agreement = sum(1 for j, sig in enumerate(signatures) if j != i and finished[j] and sig == signatures[i])
        scores.append(Score(finished=finished[i], invalid=sum(len(s.defects) for s in ep.steps),
                            unanswered=_unanswered(ep), agreement=agreement if finished[i] else 0,
                            ungrounded=len(ungrounded_figures(ep.final_answer or "", context))))
    return scores


def select(scores: list[Score]) -> int:
    """The index of the best-scored rollout (the first among equals)."""
    return max(range(len(scores)), key=lambda i: (scores[i].key(), -i))


def disagree(episodes: list[Episode]) -> bool:
    """Whether the rollouts leave the answer open: one did not finish, or two finished ones state different figures."""
    if any(ep.termination != "final_answer" for ep in episodes):
        return True
    return len({answer_signature(ep) for ep in episodes}) > 1


def _unanswered(ep: Episode) -> int:
    """Failed tool results after which the episode made no call at all."""
    count = 0
    for i, step in enumerate(ep.steps):
        later_calls = any(s.calls for s in ep.steps[i + 1:])
        count += sum(1 for r in step.results if not r.ok) if not later_calls else 0
    return count


@dataclass
class PerTaskSettings:
    """The per-task mode's knobs (`TTTConfig` carries them on the command line)."""

    k: int = 4
    temperature: float = 0.7
    task_steps: int = 4
    task_learning_rate: float = 3e-4
    faults: float = 0.2
    task_seed: int = 0  # the evaluation's task and fault seed: answers use its fault key, as `agentrig eval` does
    seed: int = 0
    max_new_tokens: int = 160
    max_seq_length: int = 2048


def answer_tasks(env: Any, split: str, n_tasks: int, *, model: str, adapter: str, name: str, harness: Any,
                 settings: PerTaskSettings, out: Path, deliver: Deliver, log: Any = print) -> dict[str, Any]:
    """Run the per-task mode on the first `n_tasks` of `split` (seed `settings.task_seed`), seen through a
    `BlindEnv`; every answer goes to `deliver`.

    Returns a summary (per task: the scores, whether the rollouts disagreed, the training steps and time);
    it holds no verdict, since the loop never sees one.
    """
    from agentrig.envs.runner import TaskRunner
    from agentrig.harness import run_episodes
    from agentrig.policies.loader import PolicySpec, load_policy
    from agentrig.ttt.blind import BlindEnv

    blind = BlindEnv(env)
    tasks = blind.tasks(split, n_tasks, seed=settings.task_seed)
    out.mkdir(parents=True, exist_ok=True)
    policy = load_policy(PolicySpec(model, adapters={name: adapter}, max_new_tokens=settings.max_new_tokens,
                                    seed=settings.seed,
                                    batch_size=settings.k if settings.task_steps > 0 else ROLLOUT_ROWS))
    policy.use(name)
    faults = TaskRunner.env_faults(blind, settings.faults) if settings.faults > 0 else None
    runner = TaskRunner(blind, harness, faults, seed=settings.seed)
    summary: dict[str, Any] = {"tasks": [], "trained": 0, "train_s": 0.0, "tokens": 0}
    started = time.monotonic()
    # Rollouts come from the original adapter for every task (each task's training is dropped after it), so
    # without training several tasks' rollouts can share one batch; with it, one task at a time.
    per_chunk = 1 if settings.task_steps > 0 else max(1, ROLLOUT_ROWS // settings.k)
    for first in range(0, len(tasks), per_chunk):
        chunk = tasks[first:first + per_chunk]
        opened = [runner.open(task, f"{task.id}#0", f"pertask/{settings.seed}/{task.id}/{j}")
                  for task in chunk for j in range(settings.k)]
        policy.temperature = settings.temperature
        episodes = run_episodes([(o.task, o.tools, o.hook) for o in opened], policy, harness,
                                batch_size=len(opened), seed=settings.seed,
                                episode_ids=[f"{task.id}#k{j}" for task in chunk for j in range(settings.k)])
        for c, task in enumerate(chunk):
            n = first + c
            rollouts = episodes[c * settings.k:(c + 1) * settings.k]
            mine = opened[c * settings.k:(c + 1) * settings.k]
            for ep in rollouts:
                ep.episode_id = f"{task.id}#0"  # every answer of this task pairs with trial 0 of `agentrig eval`
            record = _answer(task, n, rollouts, mine, blind, runner, policy, harness, deliver, model=model,
                             adapter=adapter, name=name, settings=settings, out=out)
            summary["tasks"].append(record)
            if "steps" in record:
                summary["trained"] += 1
                summary["tokens"] += record["tokens"]
                summary["train_s"] += record["train_s"]
            log(f"per-task {n + 1}/{len(tasks)} {task.id}: rollouts {'disagree' if record['disagree'] else 'agree'}"
                + (f", trained {record['steps']} steps" if "steps" in record else ""))
    summary["wall_s"] = round(time.monotonic() - started, 1)
    summary["train_s"] = round(summary["train_s"], 1)
    return summary


def _answer(task: Any, n: int, rollouts: list[Episode], opened: list[Any], blind: Any, runner: Any, policy: Any,
            harness: Any, deliver: Deliver, *, model: str, adapter: str, name: str, settings: PerTaskSettings,
            out: Path) -> dict[str, Any]:
    """Select among one task's rollouts, deliver the best-of-k answer and, where they disagree and training
    is on, train, deliver the per-task answer and reset. Returns the task's record (with `steps`, `tokens`
    and `train_s` where it trained)."""
    from agentrig.harness import run_episodes
    from agentrig.harness.trajectory import write_episodes

    scores = score_rollouts(rollouts)
    best = select(scores)
    open_question = disagree(rollouts)
    write_episodes(out / "rollouts.jsonl", [_unsealed(ep) for ep in rollouts], append=n > 0)
    record: dict[str, Any] = {"task": task.id, "best": best, "disagree": open_question,
                              "scores": [s.key() for s in scores]}
    for j, o in enumerate(opened):
        if j != best:
            blind.close(o.state)
    train = settings.task_steps > 0 and open_question
    # where no training follows, the best rollout is the per-task answer too (with --task-steps 0 there is none)
    deliver((BEST_OF_K,) if train or settings.task_steps == 0 else (BEST_OF_K, PER_TASK), opened[best], rollouts[best])
    if not train:
        return record
    t0 = time.monotonic()
    trained = _train_on(rollouts[best], model=model, adapter=adapter, settings=settings, folder=out / "task_train")
    record.update(steps=trained.global_step, tokens=trained.tokens)
    task_adapter = f"{name}-task{n}"
    policy.load_adapter(task_adapter, str(trained.adapter_dir))
    policy.use(task_adapter)
    policy.temperature = 0.0
    answer = runner.open(task, f"{task.id}#0", f"{settings.task_seed}/{task.id}/0")
    episode = run_episodes([(answer.task, answer.tools, answer.hook)], policy, harness, batch_size=1,
                           episode_ids=[f"{task.id}#0"], seed=settings.seed)[0]
    deliver((PER_TASK,), answer, episode)
    policy.use(name)
    policy.unload_adapter(task_adapter)  # reset: the next task starts from the original adapter
    shutil.rmtree(out / "task_train", ignore_errors=True)
    record["train_s"] = round(time.monotonic() - t0, 1)
    return record


def _unsealed(ep: Episode) -> Episode:
    """A copy of a rollout whose task carries no `expected` (a sealed one cannot be written)."""
    return replace(ep, task=replace(ep.task, expected={}))


def _train_on(episode: Episode, *, model: str, adapter: str, settings: PerTaskSettings, folder: Path) -> Any:
    """`settings.task_steps` LoRA steps continuing `adapter` on the episode's supervised turns."""
    from agentrig.data.samples import episode_samples
    from agentrig.harness.transcript import context_at
    from agentrig.ttt.loop import continue_adapter

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    samples = episode_samples(_unsealed(episode), "selected", context_at=context_at)
    data = folder / "selected.jsonl"
    data.write_text("".join(json.dumps(s.to_dict(), ensure_ascii=False) + "\n" for s, _ in samples), encoding="utf-8")
    return continue_adapter([str(data)], model=model, adapter=adapter, output_dir=folder / "run",
                            learning_rate=settings.task_learning_rate, steps=settings.task_steps,
                            max_seq_length=settings.max_seq_length, seed=settings.seed, packing=False)
