"""`agentrig eval`: run a model (or its adapters, or an OpenAI-compatible endpoint) on an environment's
test tasks through the harness, check every episode, and write metrics.json, report.md and PNG plots.

`run_eval(policy, config)` is the reusable stage (the main job `agentrig run` calls it too): it builds one
job per (split, task, trial) and runs them through `envs.runner.TaskRunner`, the task lifecycle collection
shares (a fresh tool state each, seeded fault injection, lockstep batches with one model call per round,
the environment's checker), and returns the metrics with the episodes.
The CLI evaluates each named adapter (and, on request, the base model) with one loaded base model,
or one routed policy (`--route FAMILY=NAME`), and writes everything into `--out`.

Not covered: resuming an interrupted evaluation (rerun it; tasks are seeded, so it is the same run).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from agentrig.config import add_flags, comma_list, from_args, opt
from agentrig.errors import ConfigError
from agentrig.jsonl import check_output_folder, read_adapter_config
from agentrig.harness import HarnessConfig
from agentrig.evals.metrics import MetricSet, compute_metrics
from agentrig.harness.trajectory import Episode, TaskSpec, write_episodes

POLICIES = ("model", "expert")


@dataclass
class EvalConfig:
    """What to evaluate on; saved into metrics.json beside the results."""

    env: str = opt("datadesk", "environment: datadesk, path/to/file.py:make_env or mcp:stdio:CMD / mcp:http:URL")
    tasks: str | None = opt(None, "tasks file (JSONL) of an MCP environment (--env mcp:...); docs/mcp.md")
    splits: list[str] | None = opt(None, "comma-separated splits, each measured apart (default: the environment's "
                                   "eval_splits; datadesk: test,test_unseen_tools)", flag="--split", parse=comma_list,
                                   metavar="SPLIT,...")
    limit: int = opt(50, "tasks per split (at most the split's pool_size)")
    trials: int = opt(1, "runs per task, for pass^k (use --temperature > 0)")
    faults: float = opt(0.0, "probability that a tool call gets an injected fault (timeout, error, no result)",
                        metavar="RATE")
    seed: int = opt(0, "task, fault and sampling seed")
    batch_size: int = opt(16, "episodes stepping together")
    harness: HarnessConfig = opt(help="the harness rules (their own flags)", factory=HarnessConfig, cli=False)

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ConfigError(f"--limit must be at least 1, got {self.limit}")
        if self.trials < 1:
            raise ConfigError(f"--trials must be at least 1, got {self.trials}")
        if not 0.0 <= self.faults <= 1.0:
            raise ConfigError(f"--faults is a probability between 0 and 1, got {self.faults}")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size must be at least 1, got {self.batch_size}")


@dataclass
class EvalResult:
    """One policy's evaluation: its metrics, its checked episodes and how long it took."""

    metrics: MetricSet
    episodes: list[Episode]
    wall_s: float

    @property
    def episodes_per_minute(self) -> float:
        """Throughput of the whole evaluation (model, tools and checks)."""
        return 60.0 * len(self.episodes) / self.wall_s if self.wall_s > 0 else 0.0


def run_eval(
    policy: Any,
    config: EvalConfig,
    env: Any = None,
    on_episode: Callable[[Episode], None] | None = None,
) -> EvalResult:
    """Evaluate one policy: run, check and measure every (split, task, trial) episode.

    `env` defaults to `load_env(config.env)`; `on_episode` is called with each checked episode (progress).
    Episode ids are `TASK_ID#TRIAL` (a stateful policy such as an expert keys its episodes by them);
    `episode.metadata` records the trial and the injected-fault rate. `config.splits` left None becomes the
    environment's `eval_splits`.
    """
    from agentrig.envs import load_env

    env = env if env is not None else load_env(config.env, config.tasks)
    jobs = _jobs(env, config)
    from agentrig.envs.runner import TaskRunner

    runner = TaskRunner(env, config.harness, TaskRunner.env_faults(env, config.faults))
    episodes: list[Episode] = []
    started = time.perf_counter()
    # Tool states are opened per chunk, not all at once: a state may hold database connections.
    chunk = config.batch_size * 4
    for first in range(0, len(jobs), chunk):
        opened = [runner.open(task, f"{task.id}#{trial}", f"{config.seed}/{task.id}/{trial}")
                  for task, trial in jobs[first : first + chunk]]

        def done(k: int, episode: Episode, trials: list[int] = [t for _, t in jobs[first : first + chunk]]) -> None:
            episode.metadata.update({"trial": trials[k], "faults_rate": config.faults})
            if on_episode is not None:
                on_episode(episode)

        episodes += runner.run(opened, policy, batch_size=config.batch_size, on_done=done)
    wall = time.perf_counter() - started
    return EvalResult(metrics=compute_metrics(episodes), episodes=episodes, wall_s=wall)


def _jobs(env: Any, config: EvalConfig) -> list[tuple[TaskSpec, int]]:
    """(task, trial) of every episode: each split's first `limit` tasks (at most its pool), each trial.

    The one place `config.splits` left None becomes the environment's `eval_splits`.
    """
    if config.splits is None:
        config.splits = list(env.eval_splits)
    jobs: list[tuple[TaskSpec, int]] = []
    for split in config.splits:
        try:
            env.check_split(split)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        pool = env.pool_size(split)
        tasks = env.tasks(split, config.limit if pool is None else min(config.limit, pool), seed=config.seed)
        seen: set[str] = set()
        for task in tasks:
            if task.id in seen:
                raise ConfigError(f"environment {env.name!r} returned task id {task.id!r} twice in split {split!r}; "
                                  "give every task its own id, or make pool_size(split) return how many distinct "
                                  "tasks the split holds (docs/environments.md)")
            seen.add(task.id)
        for trial in range(config.trials):
            jobs += [(task, trial) for task in tasks]
    return jobs


# -- the command line ------------------------------------------------------------------------


PRECISIONS = {"auto": None, "bf16": True, "fp32": False}  # --precision -> HFPolicy's bf16


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `agentrig eval`."""
    parser.add_argument("--policy", default="model", choices=list(POLICIES),
                        help="`model` (default): the model and its adapters; `expert`: the environment's expert "
                             "teacher, to check an environment's tasks and checker")
    parser.add_argument("--model", default="smollm2-135m", help="base model name or folder; with --base-url, the served model name")
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=DIR",
                        help="a LoRA adapter to evaluate (repeatable); each is evaluated separately unless --route is given")
    parser.add_argument("--route", action="append", default=[], metavar="FAMILY=NAME",
                        help="route tasks of a family to an adapter ('*' = every other family, 'base' = no adapter); "
                             "evaluates one routed policy")
    parser.add_argument("--include-base", action="store_true", help="also evaluate the base model without adapters")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--max-new-tokens", type=int, default=384, help="generation limit per step (default: %(default)s)")
    parser.add_argument("--precision", default="auto", choices=list(PRECISIONS),
                        help="a local model on a CPU: `auto` (default): bf16 autocast where the CPU has AMX, else "
                             "fp32; `bf16`; `fp32`")
    add_flags(parser, EvalConfig)
    add_flags(parser.add_argument_group("harness rules (HarnessConfig)"), HarnessConfig)
    parser.add_argument("--base-url", default=None, help="evaluate a model behind an OpenAI-compatible endpoint instead")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    parser.add_argument("--concurrency", type=int, default=8, help="parallel requests with --base-url")
    parser.add_argument("--tool-format", default="harness", choices=["harness", "hermes", "native"],
                        help="how requests to --base-url carry tools: `harness` (default): the harness's messages, "
                             "for servers rendering with the training template; `hermes` / `native`: the form of a "
                             "model tuned on `data build --format openai --openai-tools hermes|native`")
    parser.add_argument("--context-examples", default=None, metavar="EXPLORE.jsonl",
                        help="a TTT run's explore.jsonl: give its calls and results in the system prompt (the "
                             "in-context control of docs/ttt.md)")
    parser.add_argument("--context-calls", type=int, default=16, help="examples taken from --context-examples")
    parser.add_argument("--out", required=True, help="output folder")


def parse_pairs(values: list[str], flag: str) -> dict[str, str]:
    """`["a=x", "b=y"]` -> `{"a": "x", "b": "y"}`, with an error naming the flag for a malformed or repeated key."""
    pairs: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise ConfigError(f"{flag} takes KEY=VALUE, got {value!r}")
        if key in pairs:
            raise ConfigError(f"{flag} {key!r} given twice")
        pairs[key] = rest
    return pairs


def _variants(adapters: dict[str, str], route: dict[str, str], include_base: bool) -> dict[str, Any]:
    """Name -> routing rule of every policy variant to evaluate with one loaded model."""
    if route:
        return {"routed": route}
    names = (["base"] if include_base or not adapters else []) + list(adapters)
    return {name: name for name in names}


def main(args: argparse.Namespace) -> int:
    """Run `agentrig eval`."""
    from rich.console import Console

    from agentrig.evals.report import failure_examples, pick_transcripts, rich_table, write_report

    console = Console(stderr=False)
    adapters = parse_pairs(args.adapter, "--adapter")
    route = parse_pairs(args.route, "--route")
    check_output_folder(args.out, "--out")
    for folder in adapters.values():
        read_adapter_config(folder)  # before anything loads
    harness = from_args(HarnessConfig, args)
    config = from_args(EvalConfig, args, harness=harness)
    if args.trials > 1 and args.temperature == 0:
        console.print("[yellow]note:[/] with greedy decoding every trial is identical; pass --temperature for pass^k")

    from agentrig.envs import load_env
    from agentrig.policies.loader import PolicySpec, load_policy

    env = load_env(config.env, config.tasks)
    _jobs(env, config)  # resolves the splits; bad ones and repeated task ids are refused before anything is written
    if args.precision != "auto" and (args.policy == "expert" or args.base_url):
        raise ConfigError(f"--precision {args.precision} sets a local model's arithmetic; "
                          f"{'the expert teacher' if args.policy == 'expert' else 'a model behind --base-url'} has "
                          "none to set: drop --precision (a served model's precision is the server's own flag)")
    if args.policy == "expert":
        if adapters or route or args.base_url:
            raise ConfigError("--policy expert runs the environment's own teacher: drop --adapter/--route/--base-url")
        policy: Any = env.expert()
        if policy is None:
            raise ConfigError(f"environment {env.name!r} has no expert teacher (Environment.expert returns None)")
        variants: dict[str, Any] = {"expert": None}
    elif args.base_url:
        if adapters or route:
            raise ConfigError("--adapter/--route load local adapters; with --base-url choose the adapter by --model")
        policy = load_policy(PolicySpec(args.model, base_url=args.base_url, api_key_env=args.api_key_env,
                                        temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                                        protocol=harness.protocol, concurrency=args.concurrency, seed=args.seed,
                                        tool_format=args.tool_format))
        variants = {args.model: None}
    else:
        policy = load_policy(PolicySpec(args.model, adapters=adapters, max_new_tokens=args.max_new_tokens,
                                        temperature=args.temperature, seed=args.seed, batch_size=args.batch_size,
                                        bf16=PRECISIONS[args.precision]))
        variants = _variants(adapters, route, args.include_base)
    bf16 = getattr(policy, "bf16", None)  # whether the local model runs bf16 (before any wrapper below)

    if args.context_examples:
        from agentrig.evals.incontext import InContextPolicy, examples_block

        if not Path(args.context_examples).is_file():
            raise ConfigError(f"--context-examples {args.context_examples}: no such file (a TTT run's explore.jsonl)")
        block = examples_block(args.context_examples, args.context_calls)
        if not block:
            raise ConfigError(f"--context-examples {args.context_examples}: no recorded call to show")
        policy = InContextPolicy(policy, block)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, EvalResult] = {}
    for name, rule in variants.items():
        if rule is not None:
            policy.use(rule)
        results[name] = run_eval_with_progress(policy, config, name, env=env)
        write_episodes(out / episodes_file(name), results[name].episodes)

    metric_sets = {name: r.metrics for name, r in results.items()}
    policy_config = {"policy": args.policy, "model": args.model, "adapters": adapters, "route": route,
                     "base_url": args.base_url, "tool_format": args.tool_format if args.base_url else None,
                     "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
                     "precision": args.precision, "bf16": bf16, "context_examples": args.context_examples}
    write_metrics(out, {name: config for name in results}, results, policy_config)
    last = list(results.values())[-1]
    who = "the expert teacher" if args.policy == "expert" else args.model
    files = write_report(out, metric_sets, transcripts=pick_transcripts(last.episodes, 3),
                         failures=failure_examples(last.episodes),
                         title=f"agentrig eval: {who} on {args.env}",
                         notes=[f"splits {','.join(config.splits)}, {args.limit} tasks per split, {args.trials} trial(s), "
                                f"fault rate {args.faults}, seed {args.seed}"])
    console.print(rich_table(metric_sets, title=f"{who} on {args.env}"))
    console.print(f"wrote {out / 'metrics.json'}, {files.markdown}, {files.html}")
    return 0


METRICS_SCHEMA = "agentrig.metrics/1"


def write_metrics(out: Path, configs: dict[str, EvalConfig], results: dict[str, EvalResult],
                  policy: dict[str, Any] | None = None) -> Path:
    """`out/metrics.json`, the one schema `agentrig eval` and `agentrig run` both write.

    Keys: `schema`; `config` (the last variant's `EvalConfig` plus `policy`: how the model was loaded);
    `limits` (variant -> tasks per split, since the main job evaluates the base model on fewer);
    `results` (variant -> `MetricSet.to_dict()`); `throughput` (variant -> wall seconds, episodes per
    minute); `episodes` (variant -> its episodes file name in `out`).
    """
    last = list(configs.values())[-1]
    payload = {
        "schema": METRICS_SCHEMA,
        "config": {**asdict(last), **(policy or {})},
        "limits": {name: c.limit for name, c in configs.items()},
        "results": {name: r.metrics.to_dict() for name, r in results.items()},
        "throughput": {name: {"wall_s": round(r.wall_s, 1), "episodes_per_minute": round(r.episodes_per_minute, 2)}
                       for name, r in results.items()},
        "episodes": {name: episodes_file(name) for name in results},
    }
    path = Path(out) / "metrics.json"
    path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    return path


def episodes_file(name: str) -> str:
    """The file name of a variant's episodes in an eval folder."""
    return f"episodes_{_safe(name)}.jsonl"


def run_eval_with_progress(policy: Any, config: EvalConfig, name: str, env: Any = None) -> EvalResult:
    """`run_eval` with progress named `name` on stderr: a bar on a terminal (removed when done), else a line
    every `AGENTRIG_PROGRESS_INTERVAL` seconds with the completions so far (`agentrig.progress`)."""
    from agentrig.envs import load_env
    from agentrig.progress import progress

    env = env if env is not None else load_env(config.env, config.tasks)
    total = len(_jobs(env, config))
    done = {"ok": 0}

    def on_episode(ep: Any) -> None:
        done["ok"] += bool(ep.success)
        bar.update(advance=1, ok=done["ok"])

    with progress(f"eval {name}", total, transient=True,
                  fields=lambda f: f"{f['ok']} completed" if "ok" in f else "") as bar:
        assert bar is not None
        return run_eval(policy, config, env=env, on_episode=on_episode)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
