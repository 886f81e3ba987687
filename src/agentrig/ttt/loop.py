"""`agentrig ttt`: test-time training of an adapter on an environment's tools, before it works there.

The per-environment loop (docs/ttt.md has the design and the research behind it):

1. **explore** (`explore.py`): the split's tools called from their schemas, from values other tools
   returned, and with broken values, on fresh states of a *blind* environment (`blind.py`): no checker,
   no task answers, tasks from the TTT seed namespace;
2. **practice** (`practice.py`): tasks built backwards from the successful calls and chains, each with its
   own assertion, kept when the constructed solution passes it;
3. **rollouts**: the adapter runs the practice tasks through the same harness (system prompt, render,
   faults on read-only tools). Its successes become SFT data; at its first wrong step in a failed episode
   the constructed solution takes over (DAgger, `data.dagger.relabel`): the takeover step is the chosen
   side of a preference pair whose rejected side is the adapter's own step (`pairs.jsonl`), and the
   relabelled episode is SFT data too. `--rollout-tasks N` rolls out a seeded sample of N practice tasks
   only; the others are learned from their constructed solution directly (what a takeover at the first
   step gives), which leaves the budget's minutes to training (docs/ttt.md measures both);
4. **train**: a new rank-8 LoRA stacked on the frozen adapter (`stack_rank`, `create_new_adapter`, constant
   5e-4), or with `stack_rank` 0 the adapter itself continued (`adapter_name_or_path`), on that data plus a
   replayed share (half by default) of
   the adapter's own training data against forgetting, for `steps` steps or until another step would not
   fit in the time budget; saved as `OUT/NAME-ttt`, which loads next to `NAME` in one `HFPolicy`,
   `agentrig serve` or vLLM.

`--control extra_sft` trains the same steps on the replay data only (the compute-matched control of
docs/ttt.md); `--control none` is the loop. Nothing here calls the environment's checker or reads a task's
`expected`: the evaluation (`agentrig eval`, `agentrig compare`) is done afterwards, by other code.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrig.config import add_flags, from_args, opt, save_config
from agentrig.errors import ConfigError
from agentrig.harness import HarnessConfig

CONTROLS = ("none", "extra_sft")


@dataclass
class TTTConfig:
    """One test-time-training run; saved as `OUT/ttt_config.json`."""

    adapter: str = opt("", "the LoRA adapter folder to adapt (its NAME-ttt is written to --out)", metavar="DIR")
    out: str = opt("", "output folder: exploration, practice tasks, rollouts, pairs, the training run, NAME-ttt")
    model: str = opt("smollm2-135m", "base model of the adapter")
    env: str = opt("datadesk", "environment: datadesk, toolworld, path/to/file.py:make_env or mcp:...")
    tasks: str | None = opt(None, "tasks file of an MCP environment")
    split: str = opt("test_unseen_tools", "the split whose tools to adapt to (its tasks are drawn from the TTT "
                     "seed namespace, never the evaluation's)")
    budget_minutes: float = opt(10.0, "wall-clock minutes for the whole loop; training stops when another step "
                                "would not fit in them")
    surface_tasks: int = opt(16, "tasks of the split set up to find its tools (none of them is run)")
    explore_per_tool: int = opt(6, "probes per tool and round")
    explore_rounds: int = opt(4, "exploration rounds (each uses the values earlier rounds found, so chains form)")
    explore_faults: float = opt(0.1, "injected-fault rate during exploration (read-only tools only)")
    practice_tasks: int = opt(32, "practice tasks built backwards from the exploration")
    missing_share: float = opt(0.0, "share of the practice tasks that ask about something a tool found nothing "
                               "for, answered honestly; measured harmful (the model learns to stop at the first "
                               "\"No result\", its own wrong arguments' too: docs/ttt.md), so off by default")
    single_share: float = opt(0.0, "at least this share of each tool's practice tasks are single calls, as far as "
                              "the exploration found them (0: chains first, singles only where chains run out, so "
                              "their number depends on the seed's exploration: docs/ttt.md)")
    rollout_faults: float = opt(0.2, "injected-fault rate on the adapter's practice rollouts (side-effect tools only "
                                "get faults that stop the call before it runs, as in collection)")
    max_new_tokens: int = opt(160, "generation limit per step of the rollouts")
    rollout_tasks: int | None = opt(8, "practice tasks the adapter is rolled out on (a seeded sample); the "
                                    "others are learned from their constructed solution directly, so training "
                                    "gets the minutes (all: as many as --practice-tasks)")
    fix_share: float = opt(0.0, "share of the practice tasks learned from their constructed solution (not rolled "
                           "out) that start with a broken first call instead, at weight 0: a field borrowed from "
                           "another tool, a value in the user's form, a required field left out; the harness's "
                           "feedback, then the constructed calls (practice.solve_with_fixes)")
    steps: int = opt(40, "LoRA steps at most (one packed row each)")
    learning_rate: float = opt(5e-4, "learning rate of the continued or stacked adapter (constant; a stacked "
                               "rank-8 LoRA fits the practice at 5e-4, not at 1e-4; continuing the adapter, use "
                               "1e-4: at 5e-4 it measured worse, docs/ttt.md)")
    max_seq_length: int = opt(2048, "tokens per packed row")
    tool_name_weight: float = opt(1.0, "SFT loss weight of the supervised tokens naming a call's tool "
                                  "(TrainConfig.tool_name_weight; 1: the plain loss)")
    stack_rank: int = opt(8, "R: merge the adapter into the base and train a new rank-R LoRA on its modules "
                          "(LLaMA-Factory's create_new_adapter); NAME-ttt is the two concatenated, one adapter of "
                          "both ranks summed (train/stack.py); 0: continue training the adapter itself")
    replay: str | None = opt(None, "training data to replay against forgetting (a data build folder, a "
                             "tokenized.jsonl or an episodes file); default: the adapter's own, found through "
                             "the agentrig_train.yaml beside it")
    replay_share: float = opt(0.5, "share of the TTT training samples drawn from --replay (0.5 kept `test` at "
                              "every seed measured with the stacked LoRA, 0.3 lost up to 5 tasks: docs/ttt.md)")
    control: str = opt("none", "`none`: the TTT loop; `extra_sft`: the compute-matched control, the same "
                       "steps on the replay data only", choices=CONTROLS)
    seed: int = opt(0, "seed of the exploration, the practice tasks and the training")
    per_task: bool = opt(False, "per-task mode: for each task of --split, --k sampled rollouts scored without the "
                         "checker, --task-steps LoRA steps on the best one when they disagree, the answer, the "
                         "adapter reset; writes best_of_k and per_task evaluations into --out (docs/ttt.md)")
    k: int = opt(4, "per-task mode: sampled rollouts per task")
    temperature: float = opt(0.7, "per-task mode: sampling temperature of the rollouts (answers are greedy)")
    task_steps: int = opt(4, "per-task mode: LoRA steps on a task whose rollouts disagree (0: best-of-k only, "
                          "several tasks' rollouts batched together)")
    task_learning_rate: float = opt(3e-4, "per-task mode: learning rate of those steps (constant)")
    limit: int = opt(40, "per-task mode: tasks of --split (the first N, at most the split's pool)")
    task_seed: int = opt(0, "per-task mode: the evaluation's task and fault seed (`agentrig eval --seed`), so "
                         "episode ids and faults pair with an `agentrig eval` of the same tasks")
    harness: HarnessConfig = opt(help="the harness rules", factory=HarnessConfig, cli=False)
    name: str = field(default="", metadata={"cli": False})  # the adapter's name: its folder's

    def __post_init__(self) -> None:
        if not self.adapter:
            raise ConfigError("--adapter is required: the LoRA adapter folder to adapt")
        from agentrig.jsonl import read_adapter_config

        read_adapter_config(self.adapter)  # a wrong folder or file: the one message every command gives
        if not self.out:
            raise ConfigError("--out is required")
        if self.budget_minutes <= 0:
            raise ConfigError(f"--budget-minutes must be > 0, got {self.budget_minutes}")
        if not 0.0 <= self.replay_share < 1.0:
            raise ConfigError(f"--replay-share is a fraction in [0, 1), got {self.replay_share}")
        if not 0.0 <= self.missing_share < 1.0:
            raise ConfigError(f"--missing-share is a fraction in [0, 1), got {self.missing_share}")
        if not 0.0 <= self.single_share <= 1.0:
            raise ConfigError(f"--single-share is a fraction in [0, 1], got {self.single_share}")
        if self.stack_rank < 0:
            raise ConfigError(f"--stack-rank must be 0 (continue the adapter) or a LoRA rank, got {self.stack_rank}")
        if not 0.0 <= self.fix_share <= 1.0:
            raise ConfigError(f"--fix-share is a fraction in [0, 1], got {self.fix_share}")
        if self.tool_name_weight <= 0:
            raise ConfigError(f"--tool-name-weight must be positive (1 = the plain loss), got {self.tool_name_weight}")
        if self.steps < 1 or self.practice_tasks < 1:
            raise ConfigError("--steps and --practice-tasks must be at least 1")
        if self.rollout_tasks is not None and self.rollout_tasks < 0:
            raise ConfigError(f"--rollout-tasks must be 0 or more (0: no rollouts), got {self.rollout_tasks}")
        if self.per_task and (self.k < 2 or self.task_steps < 0 or self.limit < 1 or self.temperature <= 0):
            raise ConfigError("--per-task needs --k of at least 2, --temperature above 0 (the rollouts are "
                              "sampled), --limit of at least 1 and --task-steps of at least 0 (0: best-of-k only)")
        if self.control not in CONTROLS:
            raise ConfigError(f"--control must be one of {', '.join(CONTROLS)}, got {self.control!r}")
        self.name = self.name or Path(self.adapter).resolve().name


def rollout_sample(n: int, k: int | None, seed: int) -> set[int]:
    """Indices of the `k` practice tasks (of `n`) the adapter is rolled out on: all when `k` is None or at least
    `n`, else a sample seeded by the TTT seed."""
    if k is None or k >= n:
        return set(range(n))
    return set(random.Random(f"ttt-rollouts/{seed}").sample(range(n), k))


def find_replay(adapter: str) -> str | None:
    """The training data of an adapter trained by `agentrig train` or `agentrig run`: the `dataset` of the
    `agentrig_train.yaml` in the folder above it, when that still exists."""
    import yaml

    cfg = Path(adapter).resolve().parent / "agentrig_train.yaml"
    if not cfg.is_file():
        return None
    data = yaml.safe_load(cfg.read_text(encoding="utf-8")) or {}
    dataset = data.get("dataset")
    first = dataset[0] if isinstance(dataset, list) and dataset else dataset
    if isinstance(first, str) and "," in first:
        first = first.split(",")[0].strip()
    return first if isinstance(first, str) and Path(first).exists() else None


def novel_tools(replay: str, tools: list[str]) -> set[str]:
    """The tools whose name never occurs in the adapter's training data (`replay`: a data build folder, whose
    samples.jsonl holds the rendered system prompts, or an episodes / samples file): what TTT practises most."""
    path = Path(replay)
    text_file = path / "samples.jsonl" if path.is_dir() else path
    if not text_file.is_file():
        return set()
    text = text_file.read_text(encoding="utf-8", errors="replace")
    if '"input_ids"' in text[:2000] and not path.is_dir():  # token ids only: names cannot be read
        return set()
    return {t for t in tools if f"{t}(" not in text and f'"{t}"' not in text}


def _replay_rows(source: str, n: int, seed: int, out: Path, harness: HarnessConfig, model: str) -> Path | None:
    """`n` samples of the replay data as a tokenized.jsonl in `out` (episodes are built first)."""
    path = Path(source)
    if n <= 0:
        return None
    if path.is_dir() and (path / "tokenized.jsonl").is_file():
        path = path / "tokenized.jsonl"
    lines = [ln for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not lines:
        raise ConfigError(f"--replay {source}: empty")
    first = json.loads(lines[0])
    if "input_ids" not in first:  # episodes or samples: built with the trainer's own on-the-fly build
        return path
    rng = random.Random(f"ttt-replay/{seed}")
    picked = rng.sample(lines, min(n, len(lines)))
    dest = out / "replay.tokenized.jsonl"
    dest.write_text("\n".join(picked) + "\n", encoding="utf-8")
    return dest


class _Deadline:
    """A TrainerCallback that ends training when the loop's time budget would not hold another step: at each
    step's end it stops if that step's duration, plus `reserve` seconds for saving the adapter, would carry the
    next one past the deadline (so the loop ends inside its budget, not one step after it)."""

    def __init__(self, deadline: float, reserve: float = 3.0, clock: Any = time.monotonic):
        from transformers import TrainerCallback

        self.deadline, self.reserve, self.clock = deadline, reserve, clock
        self.last: float | None = None
        outer = self

        class Stop(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if outer.last is None:
                    outer.last = outer.clock()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if outer.out_of_time():
                    control.should_training_stop = True
                    state.stopped_by_budget = True

        self.callback = Stop()

    def out_of_time(self) -> bool:
        """Called at a step's end: whether a step as long as this one, and the save, would pass the deadline."""
        now = self.clock()
        step = now - self.last if self.last is not None else 0.0
        self.last = now
        return now + step + self.reserve >= self.deadline


def run_ttt(cfg: TTTConfig, log: Any = print, skip_empty: bool = False) -> dict[str, Any]:
    """Run the loop (module docstring); returns the summary also written to `OUT/ttt.json`. With
    `skip_empty` (the main job's stage), an exploration that yields no practice task ends the loop with a
    `skipped` reason in the summary instead of an error."""
    from agentrig.data.dagger import DaggerSummary, relabel
    from agentrig.envs import load_env
    from agentrig.envs.runner import TaskRunner
    from agentrig.harness.trajectory import write_episodes
    from agentrig.ttt.blind import BlindEnv, ttt_seed
    from agentrig.ttt.explore import explore, surfaces
    from agentrig.ttt.practice import PracticeEnv, build_practice, solve

    started = time.monotonic()
    deadline = started + 60.0 * cfg.budget_minutes
    out = Path(cfg.out)
    if (out / "ttt.json").exists():
        raise ConfigError(f"--out {out} already holds a finished TTT run (ttt.json); choose another folder")
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "ttt_config.json")
    replay = cfg.replay or find_replay(cfg.adapter)
    if cfg.replay_share > 0 and replay is None:
        raise ConfigError(f"no replay data found for {cfg.adapter} (no agentrig_train.yaml beside it naming an "
                          "existing dataset): pass --replay DATA or --replay-share 0")
    summary: dict[str, Any] = {"adapter": cfg.adapter, "name": f"{cfg.name}-ttt" if cfg.control == "none"
                               else f"{cfg.name}-{cfg.control}", "control": cfg.control, "env": cfg.env,
                               "split": cfg.split, "replay": replay, "timing": {}}
    env = load_env(cfg.env, cfg.tasks)
    try:
        env.check_split(cfg.split)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    blind = BlindEnv(env)
    sft_files: list[str] = []
    n_practice_samples = 0
    if cfg.control == "none":
        t0 = time.monotonic()
        surf = surfaces(blind, blind.tasks(cfg.split, cfg.surface_tasks, seed=ttt_seed(cfg.seed)))
        exploration = explore(blind, surf, cfg.harness, seed=cfg.seed, per_tool=cfg.explore_per_tool,
                              rounds=cfg.explore_rounds, faults=cfg.explore_faults)
        write_episodes(out / "explore.jsonl", exploration.episodes)
        summary["exploration"] = {"surfaces": len(surf), "tools": sorted({t for s in surf for t in s.tools}),
                                  "episodes": len(exploration.episodes), "by_tool": exploration.summary}
        summary["timing"]["explore"] = round(time.monotonic() - t0, 1)
        log(f"explore: {len(exploration.episodes)} probes of {len(summary['exploration']['tools'])} tools "
            f"in {summary['timing']['explore']} s")

        t0 = time.monotonic()
        new_tools = novel_tools(replay, summary["exploration"]["tools"]) if replay else set()
        summary["exploration"]["new_to_the_adapter"] = sorted(new_tools)
        built = build_practice(exploration, cfg.practice_tasks, seed=cfg.seed, prefer=new_tools or None,
                               missing_share=cfg.missing_share, single_share=cfg.single_share)
        penv = PracticeEnv(blind, surf, built)
        solved = solve(penv, built, cfg.harness)
        kept = [ep.task for ep in solved]
        penv = PracticeEnv(blind, surf, kept)
        with (out / "practice_tasks.jsonl").open("w", encoding="utf-8") as fh:
            for t in kept:
                fh.write(json.dumps({"id": t.id, "prompt": t.prompt, "family": t.family,
                                     "allowed_tools": t.allowed_tools, "assertion": t.expected,
                                     "plan": t.metadata["plan"]}, ensure_ascii=False) + "\n")
        summary["practice"] = {"built": len(built), "verified": len(kept),
                               "families": {f: sum(t.family == f for t in kept) for f in sorted({t.family for t in kept})}}
        summary["timing"]["practice"] = round(time.monotonic() - t0, 1)
        log(f"practice: {len(kept)} of {len(built)} tasks pass their own assertion with the constructed calls")
        if not kept and skip_empty:
            summary["skipped"] = ("no practice task: no exploration call returned a JSON result to quote "
                                  "(tools that answer in plain text are not covered yet)")
            (out / "ttt.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
            log(f"ttt skipped: {summary['skipped']}")
            return summary
        if not kept:
            raise ConfigError(f"exploration of {cfg.env}/{cfg.split} found no successful call to build a practice "
                              "task from; see explore.jsonl (more --explore-rounds or --surface-tasks may help)")

        t0 = time.monotonic()
        from agentrig.policies.loader import PolicySpec, load_policy

        faults = TaskRunner.env_faults(penv, cfg.rollout_faults) if cfg.rollout_faults > 0 else None
        runner = TaskRunner(penv, cfg.harness, faults, seed=cfg.seed)
        rolled = rollout_sample(len(kept), cfg.rollout_tasks, cfg.seed)
        constructed = [ep for i, ep in enumerate(solved) if i not in rolled]
        if cfg.fix_share > 0 and constructed:
            constructed, summary["fix"] = _with_fixes(constructed, penv, cfg)
        opened = [runner.open(t, f"{t.id}#0", f"ttt/{cfg.seed}/{t.id}") for i, t in enumerate(kept) if i in rolled]
        student = []
        if opened:
            policy = load_policy(PolicySpec(cfg.model, adapters={cfg.name: cfg.adapter},
                                            max_new_tokens=cfg.max_new_tokens, seed=cfg.seed))
            policy.use(cfg.name)
            student = runner.run(opened, policy, batch_size=16)
            del policy
        write_episodes(out / "rollouts.jsonl", student)
        wins = [e for e in student if e.success]
        dsum = DaggerSummary()
        relabelled = list(relabel([e for e in student if not e.success], penv, cfg.harness,
                                  faults=None, summary=dsum))
        write_episodes(out / "practice_sft.jsonl", wins + relabelled + constructed)
        pairs = _takeover_pairs(student, relabelled)
        with (out / "pairs.jsonl").open("w", encoding="utf-8") as fh:
            for p in pairs:
                fh.write(json.dumps(p, ensure_ascii=False) + "\n")
        summary["rollouts"] = {"episodes": len(student), "succeeded": len(wins), "relabelled": dsum.relabelled,
                               "relabel": dsum.to_dict(), "pairs": len(pairs), "constructed_only": len(constructed)}
        summary["timing"]["rollouts"] = round(time.monotonic() - t0, 1)
        log(f"rollouts: the adapter passed {len(wins)}/{len(student)} practice tasks; {dsum.relabelled} corrected "
            f"by the constructed solution, {len(pairs)} preference pairs"
            + (f"; {len(constructed)} more learned from their constructed solution without a rollout"
               if constructed else ""))
        sft_files.append(str(out / "practice_sft.jsonl"))
        n_practice_samples = len(wins) + len(relabelled) + len(constructed)
    # replay: a share of the samples (the control: the same number of rows, replay only)
    if cfg.control == "none":
        n_replay = round(n_practice_samples * cfg.replay_share / (1.0 - cfg.replay_share)) if cfg.replay_share else 0
    else:
        n_replay = 10_000  # the control trains on replay data only: all of it is there to draw from
    replay_file = _replay_rows(replay, n_replay, cfg.seed, out, cfg.harness, cfg.model) if replay else None
    if replay_file is not None:
        sft_files.append(str(replay_file))
    if not sft_files:
        raise ConfigError("nothing to train on: no practice data and no replay data")
    summary["train_data"] = {"files": sft_files, "practice_samples": n_practice_samples, "replay_samples": n_replay
                             if cfg.control == "none" else "all"}
    t0 = time.monotonic()
    result = _train(cfg, sft_files, out, deadline)
    summary["timing"]["train"] = round(time.monotonic() - t0, 1)
    final = out / summary["name"]
    if final.exists():
        shutil.rmtree(final)
    shutil.copytree(result.adapter_dir, final)
    summary.update(adapter_ttt=str(final), steps=result.global_step, tokens=result.tokens,
                   supervised_tokens=result.supervised_tokens, tool_name_weight=cfg.tool_name_weight,
                   key_tokens=result.stats.get("key_tokens"), loss_first=result.loss_history[0]["loss"]
                   if result.loss_history else None, loss_last=result.loss_history[-1]["loss"]
                   if result.loss_history else None)
    summary["timing"]["total"] = round(time.monotonic() - started, 1)
    (out / "ttt.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    log(f"trained {result.global_step} steps ({result.tokens} tokens, {result.supervised_tokens} supervised) in "
        f"{summary['timing']['train']} s; wrote {final} (total {summary['timing']['total']} s)")
    return summary


def _takeover_pairs(student: list[Any], relabelled: list[Any]) -> list[dict[str, Any]]:
    """Preference pairs at each takeover: the same context, the constructed step chosen, the adapter's rejected."""
    from agentrig.data.pairs import Pair
    from agentrig.harness.transcript import assistant_message, context_at

    by_id = {e.episode_id: e for e in student}
    out = []
    for ep in relabelled:
        info = ep.task.metadata.get("dagger") or {}
        src, k = by_id.get(info.get("source", "")), info.get("takeover_step")
        if src is None or k is None or k >= len(src.steps):
            continue
        chosen, rejected = assistant_message(ep.steps[k]), assistant_message(src.steps[k])
        if chosen == rejected:
            continue
        out.append(Pair(f"{src.episode_id}@{k}", "episodes", context_at(ep, k), chosen, rejected,
                        json.dumps(ep.tools, ensure_ascii=False)).trl())
    return out


def _with_fixes(constructed: list[Any], penv: Any, cfg: TTTConfig) -> tuple[list[Any], dict[str, Any]]:
    """`constructed` with a `--fix-share` sample of its episodes replaced by their fix-practice version (the
    same tasks, so the number of practice samples is unchanged); the counts and what was broken, for ttt.json."""
    from agentrig.ttt.practice import solve_with_fixes

    picked = set(random.Random(f"ttt-fix-pick/{cfg.seed}").sample(range(len(constructed)),
                                                                  round(cfg.fix_share * len(constructed))))
    fixes = {ep.task.id: ep for ep in solve_with_fixes(penv, [constructed[i].task for i in sorted(picked)],
                                                        cfg.harness, seed=cfg.seed)}
    out = [fixes.get(ep.task.id, ep) if i in picked else ep for i, ep in enumerate(constructed)]
    kinds = sorted(ep.metadata["fix"] for ep in fixes.values())
    return out, {"picked": len(picked), "replaced": len(fixes), "broken": kinds}


def _train(cfg: TTTConfig, files: list[str], out: Path, deadline: float) -> Any:
    train_dir = out / "train"
    if train_dir.exists():
        shutil.rmtree(train_dir)
    return continue_adapter(files, model=cfg.model, adapter=cfg.adapter, output_dir=train_dir,
                            learning_rate=cfg.learning_rate, steps=cfg.steps, max_seq_length=cfg.max_seq_length,
                            seed=cfg.seed, packing=True, callbacks=[_Deadline(deadline).callback],
                            stack_rank=cfg.stack_rank, tool_name_weight=cfg.tool_name_weight)


def continue_adapter(files: list[str], *, model: str, adapter: str, output_dir: Path, learning_rate: float, steps: int,
                     max_seq_length: int, seed: int, packing: bool, callbacks: list[Any] | None = None,
                     stack_rank: int = 0, tool_name_weight: float = 1.0) -> Any:
    """LoRA SFT continuing `adapter` on `files` for `steps` single-row steps at a constant rate (both TTT modes);
    with `stack_rank`, a new LoRA of that rank on the same modules, on top of `adapter` merged; `tool_name_weight`
    weights the tokens naming a call's tool (train/keytokens.py)."""
    from agentrig.jsonl import read_adapter_config
    from agentrig.train.train import run_train
    from agentrig.train.trainconfig import TrainConfig

    stack: dict[str, Any] = {}
    if stack_rank:
        old = read_adapter_config(adapter)
        targets = old.get("target_modules") or "all"
        stack = dict(create_new_adapter=True, lora_rank=stack_rank, lora_alpha=2 * stack_rank,
                     lora_target="all" if isinstance(targets, str) else sorted(targets))
    tcfg = TrainConfig(dataset=",".join(files), model_name_or_path=model, stage="sft", output_dir=str(output_dir),
                       adapter_name_or_path=adapter, learning_rate=learning_rate, lr_scheduler_type="constant",
                       warmup_ratio=0.0, per_device_train_batch_size=1, gradient_accumulation_steps=1,
                       max_seq_length=max_seq_length, max_steps=steps, save_steps=max(steps, 1), packing=packing,
                       seed=seed, tool_name_weight=tool_name_weight, **stack)
    return run_train(tcfg, callbacks=callbacks)


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `agentrig ttt`."""
    add_flags(parser, TTTConfig, required=("adapter", "out"))
    add_flags(parser.add_argument_group("harness rules (HarnessConfig): those the adapter was trained with"),
              HarnessConfig)


def main(args: argparse.Namespace) -> int:
    """Run `agentrig ttt`."""
    harness = from_args(HarnessConfig, args)
    cfg = from_args(TTTConfig, args, harness=harness)
    if cfg.per_task:
        # The answers are checked by the evaluator as they are given; the loop (ttt.pertask) gets a blind
        # environment and a callback that returns nothing.
        from agentrig.evals.pertask import evaluate_per_task

        return evaluate_per_task(cfg)
    summary = run_ttt(cfg)
    print(json.dumps({k: summary[k] for k in ("name", "adapter_ttt", "steps", "timing")}, indent=1))
    return 0
