"""`agentrig run`: the main job, from nothing to a trained adapter and a base-vs-trained report.

Stages, each writing into one run folder and recorded in `RUN/stages.json` when complete, so a rerun
with the same folder skips finished stages (and the collector and the trainer resume their own partial
work):

1. collect    expert-teacher episodes on the train split, faults and augmentation on  -> collect/train.jsonl
   collect_mix_<i>  the same for each mixed-in environment (`--mix`, `Profile.mix`)  -> collect/mix_<i>.jsonl
2. data       clean, window, render, tokenize and mask, every episode file            -> data/
3. sft        LoRA SFT, r 32 / alpha 64 on every linear layer, lr 1e-3, cosine          -> sft/adapter
              (the seed's q/k/v/o at 2e-4 measured worse here, docs/training.md; the seed's
              YAML still loads and means what it says for `agentrig train`)
4. eval       base and SFT adapter on the environment's eval splits (datadesk: test and unseen tools) -> eval/
   curve      completion against training minutes on the first eval split's first tasks: the base model (step 0)
              and the final adapter from the evaluation, each adapter snapshot evaluated here  -> curve/
   eval_mix_<i>  base and SFT on each mixed-in environment's eval splits, same limits  -> eval_mix_<i>/
   (full)     rollouts of the SFT adapter -> preference pairs -> DPO -> eval sft+dpo   -> dpo/
              (the primary environment only: rollouts, pairs and the SFT+DPO evaluation ignore the mix)
   (full)     ttt: test-time training of the SFT adapter on the unseen-tools split's tools (`agentrig ttt`,
              docs/ttt.md) -> eval sft+ttt, paired against sft on the same tasks       -> ttt/, eval_ttt/
5. report     markdown + self-contained HTML: loss curve, completion curve, metric bars, families,
              failure classes with one transcript each, transcripts             -> report.md/.html

Profiles fix the sizes and the recipe: `default` aims at 30 minutes on 2 CPU cores; `full` trains longer and adds the
DPO round.

A mixture (`Profile.mix`, or `--mix ENV=SHARE[,ENV=SHARE]`, `--mix none` for none) adds other environments' expert
episodes to the training data. A share is that environment's part of all teacher episodes: the primary `--env`
collects the profile's `train_episodes` as without a mix, and each mixed environment
`round(train_episodes * share / (1 - sum of shares))` (at least 1). A run folder keeps the mixture it started with
(`resolved_mix` in run_config.json), so a later change of a profile's mix does not alter a half-finished run.
Not covered: distributed runs (use `accelerate launch -m agentrig train` per stage); MCP servers as mixed-in
environments (they need a tasks file; run one as the primary `--env` with `--tasks`).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable

from agentrig.config import add_flags, comma_list, from_args, load_saved, opt, save_config
from agentrig.errors import ConfigError
from agentrig.jsonl import check_output_folder


@dataclass(frozen=True)
class Profile:
    """Sizes of one run of the main job."""

    name: str
    train_episodes: int
    faults: float
    rename: float
    max_seq_length: int
    sft_steps: int
    batch_size: int  # packed rows per optimizer step
    eval_limit: int  # tasks per split
    eval_max_new_tokens: int
    eval_faults: float = 0.2  # injected tool faults during evaluation, so recovery is measured
    base_eval_limit: int = 0  # tasks per split for the base model's row (0: eval_limit)
    detours: float = 0.1  # share of teacher episodes with a rejected first call and its correction
    lora_target: str = "all"  # LoRA on every linear layer; the seed's q/k/v/o measured worse (docs/training.md)
    learning_rate: float = 1.0e-3  # LoRA's best rate is ~10x full fine-tuning's; 2e-4 barely moved the loss here
    lora_num_layers: int | None = None  # LoRA on the last N decoder layers (None: all); cheaper steps, docs/training.md
    neftune_alpha: float | None = None  # NEFTune noise on the input embeddings while training (None: off), docs/training.md
    prompt_no_grad: bool = False  # each sample's context encoded without gradient (TrainConfig.prompt_no_grad)
    # SFT loss weight of the tokens naming a call's tool (TrainConfig.tool_name_weight; 1: the plain loss); 5 measured
    # against 1 at two training seeds: `test` +15 -3, `dev` +7 -5, unseen tools +3 -4 (docs/training.md, rows 29, 29s1)
    tool_name_weight: float = 1.0
    # SFT loss weight of each assistant turn's first token, the call-or-answer choice (TrainConfig.decision_weight)
    decision_weight: float = 1.0
    # SFT loss weight of the tokens that hold a digit, the figures copied into calls and answers (TrainConfig.figure_weight)
    figure_weight: float = 1.0
    # SFT with each decoder layer compiled (TrainConfig.torch_compile) when it trains on a CPU: measured there only
    # (1.23x a step, compilation paid back after about 70 steps; benchmarks/torch_compile.py)
    torch_compile: bool = False
    # relative draw weights of the primary environment's task families (collect --family-weights; others 1.0)
    family_weights: tuple[tuple[str, float], ...] = ()
    tool_listing: str = "compact"  # HarnessConfig.tool_listing at collection and evaluation
    repeat_notice: bool = False  # HarnessConfig.repeat_notice at collection and evaluation
    # HarnessConfig.echo_calls at collection and evaluation (each result opens with its call); measured at seed 1 and
    # rejected: `test` 20 against 27/40, more invalid calls (docs/training.md, row 41)
    echo_calls: bool = False
    repeat_detours: float = 0.0  # share of teacher episodes with a repeat detour (the expert's repeat_rate)
    borrow_detours: float = 0.0  # share of detours that send a field borrowed from another tool (the expert's borrow_rate)
    mixup_detours: float = 0.0  # share of teacher episodes with a mix-up detour (the expert's mixup_rate)
    # share of teacher episodes whose first run_sql query is sent wrong first (the expert's sql_rate); 0.5 measured
    # at seed 0 and rejected: `dev` 20 -> 14/40 (docs/training.md, row 31)
    sql_detours: float = 0.0
    # the step after a rejected detour call is the corrected call alone, no sentence (the expert's quiet_detours);
    # measured at two training seeds (docs/training.md, rows 32, 32s1): unseen tools 12 against 5/80 (+10 -3),
    # `test` 47 against 46/80, `dev` 39 against 40/80; on in every profile since session 40
    quiet_detours: bool = False
    # the expert's first calls come behind a one-line plan of the task's tools (the expert's plan_first)
    plan_first: bool = False
    # the expert sends one call a turn, each result right after its call (the expert's sequential)
    sequential_calls: bool = False
    # after a turn of several calls with a failure, the expert sends the whole turn again (the expert's retry_round)
    retry_round: bool = False
    # a look-up that answers "No result" is sent once more before the run_sql fallback (the expert's retry_empty);
    # probed at seed 1, not adopted: `test` 27 against 27/40, `dev` 20 against 23 (docs/training.md, row 42)
    retry_empty: bool = False
    max_steps: int = 12  # HarnessConfig.max_steps at collection and evaluation (the system prompt states it)
    curve_points: int = 0  # adapter snapshots evaluated for the completion-vs-training-minutes curve
    curve_limit: int = 10  # tasks per curve point: the first of the primary evaluation split (datadesk: test)
    dpo: bool = False
    rollout_episodes: int = 0
    dpo_steps: int = 0
    # other environments and their share of all teacher episodes, e.g. (("toolworld", 0.3),); module docstring
    mix: tuple[tuple[str, float], ...] = ()
    ttt_minutes: float = 0.0  # a test-time-training stage of this budget (0: none), docs/ttt.md
    ttt_practice: int = 32  # practice tasks
    ttt_steps: int = 40  # LoRA steps at most
    ttt_rollouts: int | None = None  # practice tasks rolled out (None: all; the rest learned from their solution)
    ttt_explore: tuple[int, int] = (6, 4)  # probes per tool and round, rounds
    # TTTConfig fields the stage sets otherwise than `agentrig ttt`'s defaults, e.g. (("stack_rank", 0),)
    ttt_update: tuple[tuple[str, Any], ...] = ()


PROFILES = {
    # 270 SFT steps, measured against 200 at two training seeds (docs/training.md rows 40, 40s1: `test` 50 against 38
    # of 80, `dev` 43 against 40); the base model's row on 10 tasks a split and a curve of two points pay for most of
    # them: the whole job takes 30.5-31.5 min on a 2-core CPU with AMX (row 40m; `agentrig run --sft-steps 200`: 27)
    "default": Profile("default", train_episodes=400, faults=0.25, rename=0.2, max_seq_length=2048, sft_steps=270,
                       batch_size=1, eval_limit=40, eval_max_new_tokens=160, base_eval_limit=10, detours=0.25,
                       curve_points=2, torch_compile=True, tool_name_weight=5.0, quiet_detours=True),
    "full": Profile("full", train_episodes=1000, faults=0.25, rename=0.2, max_seq_length=2048, sft_steps=400,
                    batch_size=1, eval_limit=40, eval_max_new_tokens=192, base_eval_limit=20, detours=0.25,
                    curve_points=4, curve_limit=20, dpo=True, rollout_episodes=48, dpo_steps=24, ttt_minutes=10.0,
                    torch_compile=True, tool_name_weight=5.0, quiet_detours=True,
                    ttt_rollouts=8,  # the update measured on this adapter: continue it at 1e-4 with 30% replay
                    ttt_update=(("stack_rank", 0), ("learning_rate", 1e-4), ("replay_share", 0.3))),
    # For tests and smoke runs: every stage, minutes of CPU.
    "tiny": Profile("tiny", train_episodes=24, faults=0.25, rename=0.2, max_seq_length=2048, sft_steps=2,
                    batch_size=1, eval_limit=2, eval_max_new_tokens=24, curve_points=2, curve_limit=1, dpo=True,
                    rollout_episodes=4, dpo_steps=2, ttt_minutes=3.0, ttt_practice=3, ttt_steps=1, ttt_explore=(2, 2),
                    ttt_rollouts=1, tool_name_weight=5.0, quiet_detours=True),
}
EVAL_SPLITS = ["test", "test_unseen_tools"]
LORA_RANK, LORA_ALPHA = 32, 64  # the seed's LoRA keys (section 3.1), for every profile
MAX_SHARE = 0.9  # one mixed environment's largest share; the primary environment always keeps some episodes
Mix = tuple[tuple[str, float], ...]


@dataclass
class RunConfig:
    """The main job's settings (saved as RUN/run_config.json)."""

    out: str = opt("runs/default", "run folder; rerunning with it resumes")
    profile: str = opt("default", "default: about 30 minutes on 2 CPU cores; full: longer SFT plus a DPO round; "
                       "tiny: smoke test", choices=PROFILES)
    model: str = opt("smollm2-135m", "base model name or folder")
    env: str = opt("datadesk", "environment: datadesk, path/to/file.py:make_env or mcp:stdio:CMD / mcp:http:URL")
    tasks: str | None = opt(None, "tasks file (JSONL) of an MCP environment (--env mcp:...); docs/mcp.md")
    seed: int = opt(0, "seed of collection, training and evaluation")
    workers: int = opt(2, "collector processes")
    mix: str | None = opt(None, "other environments' share of the teacher episodes, e.g. toolworld=0.3 or "
                          "examples/my_env.py:make_env=0.2,toolworld=0.1 (split on the last '='); none: no mixture "
                          "(default: the profile's)", metavar="ENV=SHARE[,...]|none")
    sft_steps: int | None = opt(None, "SFT steps (default: the profile's; the default profile's 270 measured against "
                                "200 in docs/training.md rows 35 and 40: 200 keeps its job inside 30 minutes on a "
                                "CPU where 270 does not)")

    def __post_init__(self) -> None:
        if self.profile not in PROFILES:
            raise ConfigError(f"unknown profile {self.profile!r}; choose one of: {', '.join(PROFILES)}")
        if self.workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {self.workers}")
        if self.sft_steps is not None and self.sft_steps < 1:
            raise ConfigError(f"--sft-steps must be at least 1, got {self.sft_steps}; leave it out for the profile's "
                              f"{PROFILES[self.profile].sft_steps}")
        if self.mix is not None:
            parse_mix(self.mix)  # syntax and shares here; the environments load in `load_mix`

    def profile_settings(self) -> Profile:
        """The profile with this run's overrides (`--sft-steps`); the curve's snapshots follow its steps."""
        prof = PROFILES[self.profile]
        return prof if self.sft_steps is None else replace(prof, sft_steps=self.sft_steps)


def parse_mix(text: str) -> Mix:
    """`--mix` text as ((env, share), ...): "none" is no mixture; each comma-separated part is ENV=SHARE, split on
    its last '=' (file specs hold ':', as in `examples/my_env.py:make_env=0.3`)."""
    if text.strip().lower() == "none":
        return ()
    example = "e.g. --mix toolworld=0.3 or --mix examples/my_env.py:make_env=0.2,toolworld=0.1, or --mix none"
    mix = []
    for part in comma_list(text):
        spec, eq, share = part.rpartition("=")
        if not eq or not spec.strip():
            raise ConfigError(f"--mix {part!r}: write ENV=SHARE, {example}")
        try:
            mix.append((spec.strip(), float(share)))
        except ValueError:
            raise ConfigError(f"--mix {part!r}: the share {share.strip()!r} is not a number, {example}") from None
    if not mix:
        raise ConfigError(f"--mix {text!r} names no environment, {example}")
    check_shares(tuple(mix), "--mix")
    return tuple(mix)


def check_shares(mix: Mix, source: str) -> None:
    """Each share in (0, MAX_SHARE], their sum below 1 (the primary environment keeps the rest), no env twice."""
    for spec, share in mix:
        if not 0 < share <= MAX_SHARE:
            raise ConfigError(f"{source}: the share {share:g} of {spec!r} is outside (0, {MAX_SHARE:g}]; a share is "
                              "that environment's part of all teacher episodes, e.g. 0.3 for 30%")
    total = sum(share for _, share in mix)
    if total >= 1:
        raise ConfigError(f"{source}: the shares add up to {total:g}; keep their sum below 1, since the primary "
                          "--env collects the rest of the teacher episodes")
    specs = [spec for spec, _ in mix]
    if len(set(specs)) != len(specs):
        raise ConfigError(f"{source}: an environment appears twice ({', '.join(specs)}); give each one share")


def resolve_mix(cfg: RunConfig, prof: Profile) -> Mix:
    """The mixture a new run folder trains on: `--mix` when given (`none`: no mixture), else the profile's."""
    return prof.mix if cfg.mix is None else parse_mix(cfg.mix)


def load_mix(mix: Mix, primary: str) -> list[Any]:
    """Each mixed environment, loaded; refuses bad shares, the primary `--env` again, MCP servers (they need a
    tasks file) and environments without an expert teacher, naming the `--mix` part."""
    from agentrig.envs import load_env

    check_shares(mix, "the mixture")  # a profile's mix is held to --mix's rules
    envs = []
    for spec, share in mix:
        where = f"--mix {spec}={share:g}"
        if spec == primary:
            raise ConfigError(f"{where}: that is the primary --env already; it collects the profile's train episodes")
        if spec.startswith("mcp:"):
            raise ConfigError(f"{where}: an MCP server needs its tasks file, which --mix cannot pass; run it as the "
                              "primary --env with --tasks (docs/mcp.md)")
        try:
            env = load_env(spec)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if env.expert() is None:
            raise ConfigError(f"{where}: environment {env.name!r} has no expert teacher (Environment.expert), "
                              "which collects its training episodes")
        envs.append(env)
    return envs


def mix_episodes(train_episodes: int, mix: Mix) -> list[int]:
    """Teacher episodes per mixed environment, so that each one's share is of all episodes (at least 1 each)."""
    rest = 1 - sum(share for _, share in mix)
    return [max(1, round(train_episodes * share / rest)) for _, share in mix]


def mix_text(mix: Mix) -> str:
    """A mixture in `--mix` syntax (`none` when empty)."""
    return ",".join(f"{spec}={share:g}" for spec, share in mix) or "none"


def _on(cfg: RunConfig, spec: str) -> RunConfig:
    """The run's settings with a mixed environment as `--env` (mixed environments take no tasks file)."""
    return replace(cfg, env=spec, tasks=None)


class _Stages:
    """The run folder's record of finished stages: name -> outputs, written atomically after each."""

    def __init__(self, root: Path):
        self.path = root / "stages.json"
        self.done: dict[str, dict[str, Any]] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def run(self, name: str, label: str, fn: Callable[[], dict[str, Any]], console: Any, started: float) -> dict[str, Any]:
        if name in self.done:
            console.print(f"[dim]✓ {label}: done in an earlier run, skipped[/dim]")
            return self.done[name]
        console.rule(f"[bold]{label}[/bold]  (run time so far {_mmss(time.perf_counter() - started)})")
        t = time.perf_counter()
        out = fn()
        out["seconds"] = round(time.perf_counter() - t, 1)
        self.done[name] = out
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.done, indent=1))
        tmp.replace(self.path)
        console.print(f"[green]✓ {label}[/green] in {_mmss(out['seconds'])}")
        return out


def _mmss(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


# -- stages -----------------------------------------------------------------------------------


def _harness(prof: Profile) -> Any:
    """The harness rules a profile collects and evaluates with."""
    from agentrig.harness import HarnessConfig

    return HarnessConfig(tool_listing=prof.tool_listing, repeat_notice=prof.repeat_notice, max_steps=prof.max_steps,
                         echo_calls=prof.echo_calls)


def _collect(cfg: RunConfig, prof: Profile, root: Path, split: str = "train", teacher: str = "expert",
             episodes: int | None = None, name: str = "train", **extra: Any) -> dict[str, Any]:
    from agentrig.data.collect import CollectConfig, expert_takes, run_collect

    from agentrig.envs import load_env

    out = root / "collect" / f"{name}.jsonl"
    env = load_env(cfg.env, cfg.tasks)
    renames = teacher == "expert" and bool(env.tool_aliases)  # an env without aliases: none

    def takes(param: str) -> bool:
        """Whether this collection's teacher is an expert whose expert() takes `param` (else the option is off)."""
        return teacher == "expert" and expert_takes(env, param)

    ccfg = CollectConfig(env=cfg.env, tasks=cfg.tasks, split=split, episodes=episodes or prof.train_episodes, teacher=teacher,
                         faults=prof.faults, rename=prof.rename if renames else 0.0, seed=cfg.seed,
                         out=str(out), workers=cfg.workers if teacher == "expert" else 1,
                         detours=prof.detours if teacher == "expert" else 0.0, tool_listing=prof.tool_listing,
                         repeat_notice=prof.repeat_notice, echo_calls=prof.echo_calls,
                         repeat_detours=prof.repeat_detours if takes("repeat_rate") else 0.0,
                         mixup_detours=prof.mixup_detours if takes("mixup_rate") else 0.0,
                         borrow_detours=prof.borrow_detours if takes("borrow_rate") else 0.0,
                         sql_detours=prof.sql_detours if takes("sql_rate") else 0.0,
                         quiet_detours=prof.quiet_detours and takes("quiet_detours"),
                         plan_first=prof.plan_first and takes("plan_first"),
                         sequential=prof.sequential_calls and takes("sequential"), max_steps=prof.max_steps,
                         retry_round=prof.retry_round and takes("retry_round"),
                         retry_empty=prof.retry_empty and takes("retry_empty"),
                         # the families named are the primary environment's, so only its expert collection uses them
                         family_weights=dict(prof.family_weights) if teacher == "expert" and name == "train" else {},
                         **extra)
    summary = run_collect(ccfg, resume=out.exists(), progress=True)
    return {"episodes_file": str(out), "episodes": summary.episodes, "successes": summary.successes,
            "recovered": summary.recovered, "faults": dict(summary.faults)}


def _build(cfg: RunConfig, prof: Profile, root: Path, episodes_files: list[str]) -> dict[str, Any]:
    from agentrig.data.databuild import build_dataset

    report = build_dataset(episodes_files, root / "data", model=cfg.model, max_seq_length=prof.max_seq_length)
    card = json.loads((root / "data" / "data_card.json").read_text())
    return {"data_dir": report.out_dir, "samples": card["samples"], "tokens": card["tokens"], "kept": report.kept,
            "dropped": report.dropped, "envs": card["envs"], "episodes_files": list(episodes_files)}


def _sft_speed(sft: dict[str, Any]) -> str:
    """The SFT stage's tokens a second, the machine's speed in the units a step is made of: the same job's minutes
    move with it (on one 2-core CPU, 3.1-7 s a step within two hours), so a reader can tell the machine from the job."""
    seconds, tokens = sft.get("train_seconds"), sft.get("tokens")
    return f" (SFT at {tokens / seconds:.0f} tokens/s)" if seconds and tokens else ""


def _curve_steps(prof: Profile) -> list[int]:
    """The SFT steps whose adapter snapshot the curve evaluates (the final adapter is the last point)."""
    n = prof.curve_points
    return sorted({max(1, round(prof.sft_steps * k / n)) for k in range(1, n)}) if n > 1 else []


def _compiles(prof: Profile, stage: str) -> bool:
    """Whether this stage compiles its decoder layers: SFT on a CPU with a C++ compiler, in a profile that asks for
    it (a DPO round's few steps would not pay the compilation back; on a GPU the main job has not measured it;
    without a compiler it trains eager, as before, and the report's recipe line says which)."""
    import torch

    from agentrig.train.compile import has_cpp_compiler

    return prof.torch_compile and stage == "sft" and not torch.cuda.is_available() and has_cpp_compiler()


def _train(cfg: RunConfig, prof: Profile, root: Path, stage: str, dataset: str, steps: int,
           adapter: str | None = None) -> dict[str, Any]:
    from agentrig.train.train import run_train
    from agentrig.train.trainconfig import TrainConfig
    from agentrig.train.trainlog import SnapshotCallback

    tcfg = TrainConfig(dataset=dataset, model_name_or_path=cfg.model, stage=stage, output_dir=str(root / stage),
                       lora_rank=LORA_RANK, lora_alpha=LORA_ALPHA, lora_target=prof.lora_target,
                       lora_num_layers=prof.lora_num_layers, neftune_noise_alpha=prof.neftune_alpha,
                       prompt_no_grad=prof.prompt_no_grad,
                       tool_name_weight=prof.tool_name_weight if stage == "sft" else 1.0,
                       decision_weight=prof.decision_weight if stage == "sft" else 1.0,
                       figure_weight=prof.figure_weight if stage == "sft" else 1.0,
                       torch_compile=_compiles(prof, stage),
                       learning_rate=prof.learning_rate if stage == "sft" else 5.0e-5, lr_scheduler_type="cosine",
                       warmup_ratio=0.05, per_device_train_batch_size=prof.batch_size, gradient_accumulation_steps=1,
                       max_seq_length=prof.max_seq_length, max_steps=steps, save_steps=max(5, steps // 4),
                       packing=stage == "sft", seed=cfg.seed, adapter_name_or_path=adapter,
                       pref_ftx=1.0 if stage == "dpo" else 0.0)  # the field's guard on chosen replies (docs/training.md)
    snapshots = [SnapshotCallback(root / stage / "snapshots", _curve_steps(prof))] if stage == "sft" else []
    result = run_train(tcfg, resume=True, callbacks=snapshots)
    history = [{**row, "stage": stage} for row in result.loss_history]
    return {"adapter": result.adapter_dir, "steps": result.global_step, "loss_history": history,
            "train_seconds": round(result.train_seconds, 1), "tokens": result.tokens,
            "supervised_tokens": result.supervised_tokens, "vllm_command": result.vllm_command,
            "compiled": tcfg.torch_compile}


def _evaluate(cfg: RunConfig, prof: Profile, root: Path, adapters: dict[str, str], variants: list[str],
              folder: str = "eval", limits: dict[str, int] | None = None, splits: list[str] | None = None) -> dict[str, Any]:
    """Evaluate each variant (`limits[name]` tasks per split, default `prof.eval_limit`) on `splits`."""
    from agentrig.evals.evaluate import EvalConfig, episodes_file, run_eval_with_progress, write_metrics
    from agentrig.harness.trajectory import write_episodes
    from agentrig.policies.loader import PolicySpec, load_policy

    policy = load_policy(PolicySpec(cfg.model, adapters=adapters, max_new_tokens=prof.eval_max_new_tokens, seed=cfg.seed))
    out = root / folder
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    configs: dict[str, EvalConfig] = {}
    evals: dict[str, Any] = {}
    for name in variants:
        policy.use(name)
        configs[name] = EvalConfig(env=cfg.env, tasks=cfg.tasks, splits=splits or EVAL_SPLITS,
                                   limit=(limits or {}).get(name, prof.eval_limit), faults=prof.eval_faults,
                                   seed=cfg.seed, harness=_harness(prof))
        evals[name] = res = run_eval_with_progress(policy, configs[name], name)
        write_episodes(out / episodes_file(name), res.episodes)
        results[name] = {"metrics": res.metrics.to_dict(), "wall_s": round(res.wall_s, 1),
                         "episodes_file": str(out / episodes_file(name))}
    bf16 = bool(getattr(policy, "bf16", False))  # HFPolicy's default: bf16 autocast where the CPU has AMX
    write_metrics(out, configs, evals, {"policy": "model", "model": cfg.model, "adapters": adapters,
                                        "max_new_tokens": prof.eval_max_new_tokens, "bf16": bf16})
    return {**results, "splits": list(splits or EVAL_SPLITS), "bf16": bf16}


def _curve(cfg: RunConfig, prof: Profile, root: Path, sft: dict[str, Any], evaluated: dict[str, Any],
           split: str) -> dict[str, Any]:
    """Completion against training minutes on the first `curve_limit` tasks of `split`, the primary evaluation's
    first (the same tasks and faults at every point): the base model at step 0 and the final adapter read from the
    evaluation's episodes (`evaluated`, the eval stage's record), each SFT snapshot evaluated here. The base point
    is left out when the base row has fewer of those tasks."""
    from agentrig.evals.metrics import completion_rate
    from agentrig.harness.trajectory import read_episodes

    folder = root / "sft" / "snapshots"
    seconds = json.loads((folder / "seconds.json").read_text()) if (folder / "seconds.json").exists() else {}
    snaps = {f"step-{s}": (s, float(seconds[str(s)]), str(folder / f"step-{s}")) for s in _curve_steps(prof)
             if str(s) in seconds}
    results = _evaluate(cfg, prof, root, {name: p[2] for name, p in snaps.items()}, list(snaps), folder="curve",
                        limits={name: prof.curve_limit for name in snaps}, splits=[split]) if snaps else {}
    tasks = _curve_tasks(cfg, split, prof.curve_limit)

    def evaluated_on_tasks(name: str) -> dict[str, Any] | None:
        """The evaluation's `name` row on the curve's tasks, or None when it lacks some of them."""
        if name not in evaluated:
            return None
        episodes = [ep for ep in read_episodes(evaluated[name]["episodes_file"]) if ep.task.id in tasks]
        return completion_rate(episodes).to_dict() if {ep.task.id for ep in episodes} == tasks else None

    points = ([(0, 0.0, evaluated_on_tasks("base"))]
              + [(step, secs, results[name]["metrics"]["completion"]) for name, (step, secs, _) in snaps.items()]
              + [(sft["steps"], float(sft["train_seconds"]), evaluated_on_tasks("sft"))])
    rows = [{"step": step, "train_minutes": round(secs / 60, 2), "completion": completion}
            for step, secs, completion in points if completion is not None]
    return {"points": rows, "split": split, "tasks": len(tasks)}


def _curve_tasks(cfg: RunConfig, split: str, limit: int) -> set[str]:
    """The ids of the first `limit` tasks of `split`, as the evaluation draws them (a prefix of any longer draw)."""
    from agentrig.envs import load_env

    return {t.id for t in load_env(cfg.env, cfg.tasks).tasks(split, limit, seed=cfg.seed)}


def _pairs(root: Path, episode_files: list[str], total: int, seed: int) -> dict[str, Any]:
    """Every pair to `dpo_pairs_all.jsonl`; the round's mix (`pairs.mix_pairs`: the policy's own first) to `dpo_pairs.jsonl`."""
    from collections import Counter

    from agentrig.data.pairs import build_pairs, mix_pairs
    from agentrig.harness.trajectory import read_episodes

    episodes = [ep for f in episode_files for ep in read_episodes(f)]
    pairs, summary = build_pairs(episodes, synthetic=True)
    used = mix_pairs(pairs, total, seed)
    for name, rows in (("dpo_pairs_all.jsonl", pairs), ("dpo_pairs.jsonl", used)):
        with open(root / name, "w", encoding="utf-8") as fh:
            for pair in rows:
                fh.write(json.dumps(pair.trl(), ensure_ascii=False) + "\n")
    return {"pairs_file": str(root / "dpo_pairs.jsonl"), "all_pairs_file": str(root / "dpo_pairs_all.jsonl"),
            **summary, "used": len(used), "used_kinds": dict(Counter(p.kind for p in used))}


def _used_pairs(pairs: dict[str, Any]) -> str:
    if "used" not in pairs:  # a run folder from before mix_pairs
        return f"{pairs['pairs']} pairs"
    kinds = ", ".join(f"{n} {k}" for k, n in pairs["used_kinds"].items())
    return f"{pairs['used']} of {pairs['pairs']} pairs ({kinds})"


def _mixture_note(cfg: RunConfig, stages: dict[str, dict[str, Any]], mix: Mix) -> str:
    """The report line stating the training mixture: each environment, its teacher episodes and their share."""
    counts = [(cfg.env, stages["collect"]["episodes"], None)]
    counts += [(f"{stages[f'eval_mix_{i}']['env_name']} ({spec})", stages[f"collect_mix_{i}"]["episodes"], share)
               for i, (spec, share) in enumerate(mix)]
    total = sum(n for _, n, _ in counts)
    parts = [f"{env} {n} episodes ({n / total:.1%}" + (f", share {share:g})" if share is not None else ")")
             for env, n, share in counts]
    return "training mixture: " + ", ".join(parts)


def _mix_sections(prof: Profile, stages: dict[str, dict[str, Any]], mix: Mix) -> list[Any]:
    """One report section per mixed environment: base vs SFT on its eval splits."""
    from agentrig.evals.metrics import MetricSet
    from agentrig.evals.report import Section

    sections = []
    for i, (spec, _) in enumerate(mix):
        record = stages[f"eval_mix_{i}"]
        sets = {name: MetricSet.from_dict(v["metrics"]) for name, v in record.items() if isinstance(v, dict) and "metrics" in v}
        note = (f"Mixed-in environment {spec}: evaluation on {', '.join(record['splits'])} with {prof.eval_limit} tasks "
                f"per split (the base model: {prof.base_eval_limit or prof.eval_limit}); "
                + below_base(sets["base"], sets["sft"]))
        sections.append(Section(f"Mixed-in environment: {record['env_name']}", sets, note))
    return sections


def _report(cfg: RunConfig, prof: Profile, root: Path, stages: dict[str, dict[str, Any]], total_s: float,
            mix: Mix = ()) -> dict[str, Any]:
    from agentrig.evals.metrics import MetricSet
    from agentrig.evals.report import failure_examples, pick_transcripts, rich_table, write_report
    from agentrig.harness.trajectory import read_episodes
    from rich.console import Console

    evals = {name: v for stage in ("eval", "eval_dpo", "eval_ttt") for name, v in stages.get(stage, {}).items()
             if isinstance(v, dict) and "metrics" in v}
    metric_sets = {name: MetricSet.from_dict(v["metrics"]) for name, v in evals.items()}
    history = stages["sft"]["loss_history"] + stages.get("dpo", {}).get("loss_history", [])
    trained = [n for n in evals if n not in ("base", "sft+ttt")][-1]  # the job's trained adapter (TTT: a note)
    trained_episodes = read_episodes(evals[trained]["episodes_file"])
    transcripts = pick_transcripts(trained_episodes, 3)
    times = ", ".join(f"{k} {_mmss(v['seconds'])}" for k, v in stages.items() if "seconds" in v)
    notes = [
        f"profile {prof.name}: {stages['collect']['episodes']} teacher episodes (fault rate {prof.faults}), "
        f"{stages['data']['samples']} samples, SFT {stages['sft']['steps']} steps"
        + (f", DPO {stages['dpo']['steps']} steps on {_used_pairs(stages['pairs'])}" if "dpo" in stages else ""),
        f"SFT recipe: LoRA r{LORA_RANK}/alpha{LORA_ALPHA} on {prof.lora_target} linear layers, learning rate {prof.learning_rate:g}, cosine, "
        f"{prof.batch_size} packed row(s) of {prof.max_seq_length} tokens per step"
        + (", each sample's context without gradient (prompt_no_grad)" if prof.prompt_no_grad else "")
        + (", each decoder layer compiled (torch_compile)" if stages["sft"].get("compiled") else "")
        + (f", tool-name tokens weighted {prof.tool_name_weight:g}x in the loss (tool_name_weight)"
           if prof.tool_name_weight != 1.0 else "")
        + (f", each turn's first token weighted {prof.decision_weight:g}x (decision_weight)"
           if prof.decision_weight != 1.0 else "")
        + (f", digits weighted {prof.figure_weight:g}x (figure_weight)" if prof.figure_weight != 1.0 else "")
        + f"; detours {prof.detours}, "
        f"tool listing {prof.tool_listing}"
        + (", the teacher's calls one a turn (sequential)" if prof.sequential_calls else "")
        + (", a turn with a failed call sent again whole (retry_round)" if prof.retry_round else "")
        + (", a look-up that found nothing sent once more (retry_empty)" if prof.retry_empty else "")
        + (f", at most {prof.max_steps} steps an episode" if prof.max_steps != 12 else "")
        + (", each tool result opening with its call (echo_calls)" if prof.echo_calls else ""),
        f"model {cfg.model}; evaluation on {', '.join(stages['eval'].get('splits', EVAL_SPLITS))} with {prof.eval_limit} tasks per split "
        f"(the base model: {prof.base_eval_limit or prof.eval_limit}), greedy"
        f"{' in bf16 autocast (a CPU with AMX)' if stages['eval'].get('bf16') else ''}, injected tool-fault rate {prof.eval_faults}",
        f"stage times: {times}; total {_mmss(total_s)}{_sft_speed(stages['sft'])}",
    ]
    if "base" in metric_sets:
        notes.append(below_base(metric_sets["base"], metric_sets[trained]))
    if mix:
        notes.insert(1, _mixture_note(cfg, stages, mix))
    if "eval_ttt" in stages:
        notes.append(_ttt_note(stages))
    if stages.get("curve", {}).get("points"):
        c = stages["curve"]
        notes.append(f"completion curve: the first {c['tasks']} {c['split']} tasks at every point (step 0: the base "
                     "model; the last step: the evaluation's adapter), their faults the same")
    sections = _mix_sections(prof, stages, mix)
    files = write_report(root, metric_sets, loss_history=history, transcripts=transcripts,
                         failures=failure_examples(trained_episodes), curve=stages.get("curve", {}).get("points"),
                         title=f"agentrig run ({prof.name}): {cfg.model} on {cfg.env}", notes=notes, sections=sections)
    console = Console()
    console.print(rich_table(metric_sets, title=f"{cfg.model} on {cfg.env}: base vs trained"))
    for i, section in enumerate(sections):
        console.print(rich_table(section.metric_sets, title=f"{cfg.model} on {stages[f'eval_mix_{i}']['env_name']} "
                                                            "(mixed in): base vs trained"))
    return {"markdown": str(files.markdown), "html": str(files.html)}


def below_base(base: Any, trained: Any) -> str:
    """The report line naming every family where the trained policy completes a smaller share than the base."""
    worse = [f"{f} ({g.completion.hits}/{g.completion.total} vs base {base.by_family[f].completion.hits}/"
             f"{base.by_family[f].completion.total})" for f, g in trained.by_family.items()
             if f in base.by_family and (g.completion.value or 0.0) < (base.by_family[f].completion.value or 0.0)]
    return ("families where the trained adapter completes less than the base model: " + ", ".join(worse)) if worse \
        else "no family where the trained adapter completes less than the base model"


def run_main_job(cfg: RunConfig) -> dict[str, dict[str, Any]]:
    """Run (or resume) every stage of the main job; returns the stage records."""
    from rich.console import Console

    prof = cfg.profile_settings()
    root = Path(cfg.out)
    check_output_folder(root, "--out")
    root.mkdir(parents=True, exist_ok=True)
    saved = root / "run_config.json"
    mix = wanted = resolve_mix(cfg, prof)
    ttt = prof.ttt_minutes > 0
    if saved.exists():
        before = load_saved(saved)
        before.setdefault("tasks", None)  # a run folder from before MCP environments
        before.setdefault("mix", None)  # a run folder from before mixtures ...
        before.setdefault("sft_steps", None)  # ... or before --sft-steps
        started_mix = before.pop("resolved_mix", [])  # ... trained on its own environment alone
        ttt = bool(before.pop("resolved_ttt", False))  # a folder from before the TTT stage has none
        if {k: v for k, v in before.items() if k != "workers"} != {k: v for k, v in asdict(cfg).items() if k != "workers"}:
            raise ConfigError(f"{root} holds a run with other settings ({before}); use another --out to start fresh")
        mix = tuple((spec, float(share)) for spec, share in started_mix)  # the folder's, even if the profile's changed
    from agentrig.envs import load_env

    # refuse a bad --env/--tasks or --mix before the folder records the run (a retry with the fix would be refused)
    env = load_env(cfg.env, cfg.tasks)
    mix_envs = load_mix(mix, cfg.env)
    save_config(cfg, saved, resolved_mix=[list(part) for part in mix], resolved_ttt=ttt)
    console = Console()
    if mix != wanted:
        console.print(f"[yellow]{root} started with --mix {mix_text(mix)}; resuming with it, not with the profile's "
                      f"{mix_text(wanted)}[/yellow]")
    started = time.perf_counter()
    st = _Stages(root)
    eval_splits = list(env.eval_splits)
    curve = bool(prof.curve_points)
    mixed = range(len(mix))
    names = (["collect"] + [f"collect_mix_{i}" for i in mixed] + ["data", "sft", "eval"] + (["curve"] if curve else [])
             + [f"eval_mix_{i}" for i in mixed] + (["rollouts", "pairs", "dpo", "eval_dpo"] if prof.dpo else [])
             + (["ttt", "eval_ttt"] if ttt else []) + ["report"])

    def stage(name: str, label: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        return st.run(name, f"[{names.index(name) + 1}/{len(names)}] {label}", fn, console, started)

    collect = stage("collect", "collect teacher episodes", lambda: _collect(cfg, prof, root))
    collected = [stage(f"collect_mix_{i}", f"collect teacher episodes on {spec} (mixed in, share {share:g})",
                       lambda: {
                           **_collect(_on(cfg, spec), prof, root, episodes=n, name=f"mix_{i}"), "env": spec, "share": share})
                 for i, ((spec, share), n) in enumerate(zip(mix, mix_episodes(prof.train_episodes, mix)))]
    data = stage("data", "build training data", lambda: _build(
        cfg, prof, root, [collect["episodes_file"]] + [c["episodes_file"] for c in collected]))
    sft = stage("sft", "LoRA SFT", lambda: _train(cfg, prof, root, "sft", data["data_dir"], prof.sft_steps))
    evaluated = stage("eval", "evaluate base and SFT", lambda: _evaluate(
        cfg, prof, root, {"sft": sft["adapter"]}, ["base", "sft"], limits={"base": prof.base_eval_limit or prof.eval_limit},
        splits=eval_splits))
    if curve:
        stage("curve", f"completion against training minutes (snapshots on {prof.curve_limit} {eval_splits[0]} tasks)",
              lambda: _curve(cfg, prof, root, sft, evaluated, eval_splits[0]))
    for i, ((spec, _), mix_env) in enumerate(zip(mix, mix_envs)):
        stage(f"eval_mix_{i}", f"evaluate base and SFT on {spec} (mixed in)", lambda: {
            **_evaluate(_on(cfg, spec), prof, root, {"sft": sft["adapter"]}, ["base", "sft"], folder=f"eval_mix_{i}",
                        limits={"base": prof.base_eval_limit or prof.eval_limit}, splits=list(mix_env.eval_splits)),
            "env": spec, "env_name": mix_env.name})
    if prof.dpo:
        rollouts = stage("rollouts", "sample the SFT adapter's own rollouts", lambda: _collect(
            cfg, prof, root, teacher="model", episodes=prof.rollout_episodes, name="rollouts", model=cfg.model,
            adapter=sft["adapter"], temperature=0.8, max_new_tokens=prof.eval_max_new_tokens))
        pairs = stage("pairs", "preference pairs", lambda: _pairs(
            root, [rollouts["episodes_file"], collect["episodes_file"]], prof.dpo_steps * prof.batch_size, cfg.seed))
        dpo = stage("dpo", "DPO on the SFT adapter", lambda: _train(
            cfg, prof, root, "dpo", pairs["pairs_file"], prof.dpo_steps, adapter=sft["adapter"]))
        stage("eval_dpo", "evaluate SFT+DPO",
              lambda: _evaluate(cfg, prof, root, {"sft+dpo": dpo["adapter"]}, ["sft+dpo"], folder="eval_dpo",
                                splits=eval_splits))
    if ttt:
        split = "test_unseen_tools" if "test_unseen_tools" in eval_splits else eval_splits[-1]
        adapted = stage("ttt", f"test-time training on the tools of {split}", lambda: _ttt(
            cfg, prof, root, sft["adapter"], data["data_dir"], split))
        stage("eval_ttt", "evaluate SFT+TTT", lambda: {"skipped": adapted["skipped"]} if "skipped" in adapted
              else _eval_ttt(cfg, prof, root, adapted, eval_splits, st.done["eval"]))
    stage("report", "report", lambda: _report(cfg, prof, root, st.done, _total_seconds(st.done), mix))
    console.print(f"[bold green]done[/bold green]: {st.done['report']['markdown']} and {st.done['report']['html']} "
                  f"(all stages {_mmss(_total_seconds(st.done))}, this invocation {_mmss(time.perf_counter() - started)})")
    return st.done


def _ttt(cfg: RunConfig, prof: Profile, root: Path, adapter: str, data_dir: str, split: str) -> dict[str, Any]:
    from agentrig.ttt.loop import TTTConfig, run_ttt

    out = root / "ttt"
    if (out / "ttt.json").exists():  # finished, but the stage record was not written: keep it
        return json.loads((out / "ttt.json").read_text())
    per_tool, rounds = prof.ttt_explore
    tcfg = TTTConfig(adapter=adapter, out=str(out), model=cfg.model, env=cfg.env, tasks=cfg.tasks, split=split,
                     budget_minutes=prof.ttt_minutes, practice_tasks=prof.ttt_practice, steps=prof.ttt_steps,
                     rollout_tasks=prof.ttt_rollouts,
                     explore_per_tool=per_tool, explore_rounds=rounds, max_new_tokens=prof.eval_max_new_tokens,
                     replay=data_dir, seed=cfg.seed, harness=_harness(prof), **dict(prof.ttt_update))
    return run_ttt(tcfg, skip_empty=True)


def _eval_ttt(cfg: RunConfig, prof: Profile, root: Path, adapted: dict[str, Any], splits: list[str],
              sft_eval: dict[str, Any]) -> dict[str, Any]:
    """SFT+TTT on the primary evaluation's tasks, and its paired comparison with SFT there."""
    from agentrig.evals.paired import compare, load_outcomes

    record = _evaluate(cfg, prof, root, {"sft+ttt": adapted["adapter_ttt"]}, ["sft+ttt"], folder="eval_ttt",
                       splits=splits)
    paired = compare(load_outcomes(sft_eval["sft"]["episodes_file"]), load_outcomes(record["sft+ttt"]["episodes_file"]))
    return {**record, "paired": [r.to_dict() for r in paired]}


def _ttt_note(stages: dict[str, dict[str, Any]]) -> str:
    ttt = stages["ttt"]
    if "skipped" in ttt:
        return f"test-time training on {ttt['split']}: skipped ({ttt['skipped']})"
    parts = []
    for r in stages["eval_ttt"].get("paired", []):
        parts.append(f"{r['split']} {r['both'] + r['only_a']}/{r['n']} -> {r['both'] + r['only_b']}/{r['n']} "
                     f"(B - A {r['difference']:+.3f} [{r['ci95'][0]:+.3f}, {r['ci95'][1]:+.3f}], McNemar p "
                     f"{r['mcnemar_p']:.3f}, gained {r['only_b']}, lost {r['only_a']})")
    return (f"test-time training on {ttt['split']}: {ttt['practice']['verified']} practice tasks, the adapter passed "
            f"{ttt['rollouts']['succeeded']}, {ttt['rollouts']['relabelled']} corrected; {ttt['steps']} LoRA steps, "
            f"{_mmss(ttt['timing']['total'])} in all; sft -> sft+ttt on the same tasks: " + "; ".join(parts))


def _total_seconds(done: dict[str, dict[str, Any]]) -> float:
    return float(sum(v.get("seconds", 0) for v in done.values()))


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `agentrig run`: one per `RunConfig` field."""
    add_flags(parser, RunConfig)


def main(args: argparse.Namespace) -> int:
    """Run `agentrig run`."""
    run_main_job(from_args(RunConfig, args))
    return 0
