"""`agentrig collect`: run a teacher through the harness on an environment's tasks and save the episodes.

Recipe: load the environment and teacher, then for each index i: task i of the split (seeded by
(seed, i)), augmentation (paraphrase, renaming) seeded by (seed, i), a fault injector seeded by
(seed, i), one episode through the harness, the checker's verdict stored on the episode. Lines are
appended in index order, each complete and flushed; fsync follows every batch of lines (at most
~50 ms apart) and the end. Failures are kept and labelled (`success`, `check`), never dropped.

Resume: `--resume` reads the file, cuts a torn last line, checks that the saved settings
(`OUT.meta.json`) match, and continues at the next index. Because everything is a function of
(seed, index), a resumed file equals an uninterrupted one except timing fields (`TIMING_FIELDS`).
`--workers N` runs expert episodes in N processes (spawned); results are still written in order.
Other teachers (`openai`, `model`) run in this process, batched. Every episode goes through
`envs.runner.TaskRunner`, the task lifecycle evaluation shares (setup, fault hook, run, check, close).
"""

from __future__ import annotations

import argparse
import inspect
import json
import multiprocessing as mp
import os
import random
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

from agentrig.config import add_flags, from_args, load_saved, opt, save_config
from agentrig.data.augment import Augment, apply_rename, flatten_weights, paraphrase
from agentrig.errors import ConfigError
from agentrig.harness.faults import FaultConfig
from agentrig.harness.protocol import TOOL_LISTINGS
from agentrig.jsonl import check_output_file, read_adapter_config

# Fields that hold measured times; everything else in a line is a function of the settings and index.
TIMING_FIELDS = ("wall_s", "duration_s", "policy_s")


def without_timing(obj: Any) -> Any:
    """An episode line (parsed JSON) without its timing fields: what a resumed file must equal."""
    if isinstance(obj, dict):
        return {k: without_timing(v) for k, v in obj.items() if k not in TIMING_FIELDS}
    if isinstance(obj, list):
        return [without_timing(x) for x in obj]
    return obj
TEACHERS = ("expert", "openai", "model")
_FSYNC_EVERY_S = 0.05


def _fault_rates(text: str) -> dict[str, float]:
    return FaultConfig.parse(text).rates if text else {}


def parse_family_weights(text: str) -> dict[str, float]:
    """`ranking=2,single_lookup=1.5` -> {"ranking": 2.0, "single_lookup": 1.5}."""
    out: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, value = part.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = -1.0
        if not sep or not name.strip() or not weight >= 0:
            raise argparse.ArgumentTypeError(f"{part!r} is not FAMILY=WEIGHT with a weight >= 0 "
                                             "(e.g. ranking=2,single_lookup=1.5)")
        out[name.strip()] = weight
    return out


@dataclass
class CollectConfig:
    """Settings of one collection (saved beside the output as OUT.meta.json); each field is a flag."""

    env: str = opt("datadesk", "'datadesk', path/to/file.py:make_env or mcp:stdio:CMD / mcp:http:URL")
    tasks: str | None = opt(None, "tasks file (JSONL) of an MCP environment (--env mcp:...); docs/mcp.md")
    mcp_record: str | None = opt(None, "append every MCP tool listing and result to this replay file "
                                 "(replay it with --env mcp:replay:FILE)")
    split: str = opt("train", "train, dev, test or test_unseen_tools (or the environment's own splits)")
    episodes: int = opt(100, "total episodes in the output")
    teacher: str = opt("expert", "who acts: the environment's expert, an OpenAI-compatible endpoint, or a local model",
                       choices=TEACHERS)
    model: str | None = opt(None, "model name (openai) or name/folder (model teacher)")
    base_url: str | None = opt(None, "OpenAI-compatible API root (--teacher openai); key from OPENAI_API_KEY")
    adapter: str | None = opt(None, "LoRA adapter folder for --teacher model")
    temperature: float = opt(0.0, "sampling temperature (model/openai teachers)")
    max_new_tokens: int = opt(256, "generation limit per step (model/openai teachers)")
    faults: float = opt(0.25, "share of tool calls that get an injected fault")
    fault_rates: dict[str, float] = opt(help="per-kind rates, e.g. timeout=0.1,error_503=0.05 (overrides --faults)",
                                        factory=dict, parse=_fault_rates, metavar="KIND=RATE,...")
    seed: int = opt(0, "task, augmentation and fault seed")
    out: str = opt("data/train.jsonl", "episodes file (JSONL); its settings go to OUT.meta.json")
    workers: int = opt(1, "processes (expert teacher)")
    paraphrase: float = opt(0.3, "share of prompts lightly rewritten")
    rename: float = opt(0.0, "share of train episodes with renamed tools (needs the environment's tool_aliases)")
    detours: float = opt(0.1, "share of episodes with a detour step (a rejected call, masked in training)")
    repeat_detours: float = opt(0.0, "share of episodes in which the expert resends a call that answered (masked in "
                                "training), gets the harness's notice, and goes on (datadesk's expert; use with "
                                "--repeat-notice)")
    mixup_detours: float = opt(0.0, "share of episodes in which the expert first sends the request's name to the "
                               "look-up of another kind of thing (masked in training), then says what the name is "
                               "and makes the right call (datadesk's expert)")
    borrow_detours: float = opt(0.0, "share of detour steps (--detours) that send a field borrowed from another "
                                "offered tool's signature, refused as an unexpected field (datadesk's expert)")
    sql_detours: float = opt(0.0, "share of episodes whose first run_sql query is first sent with a column its table "
                             "does not have (masked in training), then named from the refusal and corrected "
                             "(datadesk's expert)")
    quiet_detours: bool = opt(False, "the step after a rejected detour call (--detours) is the corrected call alone, "
                              "with no sentence before it (datadesk's expert)")
    plan_first: bool = opt(False, "the first step's calls come behind a one-line plan of the task's tools in order "
                           "(\"Plan: sales_total x2, calculator (the percent change), answer.\"; datadesk's expert)")
    sequential: bool = opt(False, "one call a turn: the expert sends the calls a step needs one after another, each "
                           "result right after its call, instead of together in one turn (datadesk's expert)")
    retry_round: bool = opt(False, "after a turn of several calls in which some failed, the expert sends that whole "
                            "turn again (the failed calls retried or switched, the rest as they were), so its "
                            "results come back together and in order (datadesk's expert)")
    retry_empty: bool = opt(False, "a look-up that answers \"No result\" is sent once more before the expert's "
                            "fallback (datadesk's expert)")
    repeat_notice: bool = opt(False, "the harness's notice on an identical call after a success (HarnessConfig."
                              "repeat_notice; keep it the same for training and evaluation)")
    echo_calls: bool = opt(False, "each tool result opens with the call it answers (HarnessConfig.echo_calls; keep it "
                           "the same for training and evaluation)")
    balance: bool = opt(False, "flatten tool frequencies via family weights (needs the environment's families)")
    family_weights: dict[str, float] = opt(help="relative draw weight of task families (others 1.0), e.g. ranking=2,"
                                           "arithmetic=0.5 (needs the environment's families; not with --balance)",
                                           factory=dict, parse=parse_family_weights, metavar="FAMILY=WEIGHT,...")
    max_steps: int = opt(12, "harness step limit per episode")
    tool_listing: str = opt("compact", "how the system prompt lists tools (keep it the same for training and "
                            "evaluation)", choices=TOOL_LISTINGS)
    batch_size: int = opt(16, "episodes stepping together (model/openai teachers)")

    def __post_init__(self) -> None:
        for name in ("episodes", "workers", "max_steps", "batch_size", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        for name in ("faults", "paraphrase", "rename", "detours", "repeat_detours", "mixup_detours", "borrow_detours",
                     "sql_detours"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ConfigError(f"--{name.replace('_', '-')} is a share between 0 and 1, got {getattr(self, name)}")
        if self.teacher not in TEACHERS:
            raise ConfigError(f"unknown teacher {self.teacher!r}: use {', '.join(TEACHERS)}")

    def identity(self) -> dict[str, Any]:
        """The settings that decide the content (not where or how fast it is produced)."""
        d = asdict(self)
        for k in ("out", "workers", "episodes", "batch_size", "mcp_record"):
            d.pop(k)
        # newer settings: at their defaults, an older file's identity
        for k in ("repeat_detours", "mixup_detours", "borrow_detours", "sql_detours", "quiet_detours", "plan_first",
                  "sequential", "retry_round", "retry_empty", "repeat_notice", "echo_calls", "family_weights"):
            if not d[k]:
                d.pop(k)
        return d


@dataclass
class CollectSummary:
    """What a collection produced (counts over the whole file, resumed parts included)."""

    out: str
    episodes: int
    written: int
    successes: int
    faults: Counter[str]
    recovered: int
    detours: int
    by_family: dict[str, list[int]]  # family -> [episodes, successes]
    tool_calls: Counter[str]
    seconds: float

    @property
    def rate(self) -> float:
        """Episodes written per second in this run."""
        return self.written / self.seconds if self.seconds > 0 else 0.0


# -- one episode, a pure function of (config, index) ------------------------------------------

_WORKER: dict[str, Any] = {}


def _setup_worker(cfg: CollectConfig) -> None:
    """Per-process state: environment, task runner (harness, faults), augmentation, teacher."""
    from agentrig.envs import load_env
    from agentrig.envs.runner import TaskRunner
    from agentrig.harness import HarnessConfig

    env = load_env(cfg.env, cfg.tasks, cfg.mcp_record)
    if cfg.rename > 0 and not env.tool_aliases:
        raise ConfigError(f"--rename needs other names for the tools, and environment {env.name!r} has none: "
                          "set its `tool_aliases` (and `param_aliases`), see docs/environments.md")
    faults = TaskRunner.env_faults(env, cfg.faults, cfg.fault_rates)
    harness = HarnessConfig(max_steps=cfg.max_steps, tool_listing=cfg.tool_listing, repeat_notice=cfg.repeat_notice,
                            echo_calls=cfg.echo_calls)
    _WORKER.clear()
    _WORKER.update(cfg=cfg, env=env, runner=TaskRunner(env, harness, faults, seed=cfg.seed),
                   augment=Augment(paraphrase=cfg.paraphrase, rename=cfg.rename, detour_rate=cfg.detours,
                                   balance=cfg.balance),
                   weights=_family_weights(env, cfg))
    if cfg.teacher == "expert":
        _WORKER["teacher"] = _expert(env, cfg)


def _family_weights(env: Any, cfg: CollectConfig) -> dict[str, float] | None:
    if not cfg.balance and not cfg.family_weights:
        return None
    flag = "--balance" if cfg.balance else "--family-weights"
    if cfg.balance and cfg.family_weights:
        raise ConfigError("--balance and --family-weights both set the families' weights: use one of them")
    family_tools = env.families(cfg.split, seed=cfg.seed)
    if not family_tools:
        raise ConfigError(f"{flag} needs the task families of environment {env.name!r} and the tools each needs: "
                          "give it `families(split, seed)`, see docs/environments.md")
    if cfg.balance:
        return flatten_weights(family_tools)
    unknown = sorted(set(cfg.family_weights) - set(family_tools))
    if unknown:
        raise ConfigError(f"--family-weights: no family {', '.join(map(repr, unknown))} in environment {env.name!r}; "
                          f"its families: {', '.join(family_tools)}")
    weights = {f: cfg.family_weights.get(f, 1.0) for f in family_tools}
    if not any(weights.values()):
        raise ConfigError("--family-weights: every family has weight 0, so there is nothing to draw")
    return weights


def expert_takes(env: Any, param: str) -> bool:
    """Whether the environment's `expert()` takes `param` (`repeat_rate`, `mixup_rate`)."""
    return param in inspect.signature(env.expert).parameters


def _expert(env: Any, cfg: CollectConfig) -> Any:
    extra: dict[str, Any] = {}
    for flag, kind, param, rate in (("--repeat-detours", "repeat", "repeat_rate", cfg.repeat_detours),
                                    ("--mixup-detours", "mix-up", "mixup_rate", cfg.mixup_detours),
                                    ("--borrow-detours", "borrowed-field", "borrow_rate", cfg.borrow_detours),
                                    ("--sql-detours", "SQL", "sql_rate", cfg.sql_detours)):
        if rate <= 0:
            continue
        if not expert_takes(env, param):
            raise ConfigError(f"{flag}: the expert of environment {env.name!r} has no {kind} detours (its expert() "
                              f"takes no {param}); leave {flag} at 0")
        extra[param] = rate
    for flag, param, lacks in (("--quiet-detours", "quiet_detours", "writes no detour sentence to leave out"),
                               ("--plan-first", "plan_first", "writes no plans"),
                               ("--sequential", "sequential", "has no one-call-a-turn mode"),
                               ("--retry-round", "retry_round", "has no whole-turn retries"),
                               ("--retry-empty", "retry_empty", "has no retry of an empty answer")):
        if not getattr(cfg, param):
            continue
        if not expert_takes(env, param):
            raise ConfigError(f"{flag}: the expert of environment {env.name!r} {lacks} (its expert() takes no "
                              f"{param}); drop {flag}")
        extra[param] = True
    expert = env.expert(detour_rate=cfg.detours, seed=cfg.seed, **extra)
    if expert is None:
        raise ConfigError(f"environment {env.name!r} has no expert teacher; use --teacher openai or model")
    return expert


def prepare(index: int) -> Any:
    """Episode `index`'s task, opened by the worker's `TaskRunner` with this index's augmentation."""
    cfg: CollectConfig = _WORKER["cfg"]
    env = _WORKER["env"]
    task = env.tasks(cfg.split, 1, seed=cfg.seed, start=index, **({"family_weights": _WORKER["weights"]}
                                                                 if _WORKER["weights"] else {}))[0]

    def augment(task: Any, tools: Any) -> tuple[Any, Any]:
        rng = random.Random(f"augment/{cfg.seed}/{index}")
        aug: Augment = _WORKER["augment"]
        if aug.paraphrase and rng.random() < aug.paraphrase:
            task.prompt = paraphrase(task.prompt, rng)
        if aug.rename and cfg.split == "train" and rng.random() < aug.rename:
            task, tools = apply_rename(task, tools, rng, env.tool_aliases, env.param_aliases)
        task.metadata["collect"] = {"index": index, "seed": cfg.seed, "teacher": cfg.teacher}
        return task, tools

    return _WORKER["runner"].open(task, task.id, f"{cfg.seed}/{index}", transform=augment)


def run_one(index: int) -> str:
    """Episode `index` with the expert teacher, as its JSONL line."""
    from agentrig.harness.trajectory import dumps_episode

    return dumps_episode(_WORKER["runner"].run([prepare(index)], _WORKER["teacher"], batch_size=1)[0])


# -- the file: resume, torn lines, ordered appends ----------------------------------------------


def resume_point(path: Path) -> int:
    """Complete lines in `path`, after cutting a torn or unreadable last line off the file."""
    if not path.exists():
        return 0
    data = path.read_bytes()
    good_end = 0
    count = 0
    pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        if nl < 0:
            break
        try:
            json.loads(data[pos:nl])
        except ValueError:
            break
        count += 1
        good_end = nl + 1
        pos = nl + 1
    if good_end < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(good_end)
            fh.flush()
            os.fsync(fh.fileno())
    return count


def _meta_path(out: Path) -> Path:
    return out.with_name(out.name + ".meta.json")


def _check_meta(cfg: CollectConfig, out: Path) -> None:
    meta = _meta_path(out)
    if not meta.exists():
        raise ConfigError(f"--resume: {meta} is missing, so the settings of {out} are unknown; start without --resume")
    saved = load_saved(meta)  # the whole config (save_config), or only its identity (files from before)
    saved.setdefault("tool_listing", "json")  # collected before the setting existed: tools were listed as JSON
    saved.setdefault("tasks", None)  # collected before MCP environments: no tasks file
    saved = {k: v for k, v in saved.items() if k in cfg.identity()}
    if saved != cfg.identity():
        diff = sorted(k for k in set(saved) | set(cfg.identity()) if saved.get(k) != cfg.identity().get(k))
        raise ConfigError(f"--resume: settings differ from those {out} was collected with: {', '.join(diff)}")


WINDOW_BATCHES = 8  # a model teacher's episodes are opened and run this many batches at a time


def _lines(cfg: CollectConfig, start: int) -> Iterator[str]:
    """Lines start..episodes-1 in index order, from workers, this process, or a batched teacher."""
    indices = range(start, cfg.episodes)
    if cfg.teacher == "expert" and cfg.workers > 1 and _spawn_can_start():
        yield from _spawned(cfg, indices)
        return
    _setup_worker(cfg)
    if cfg.teacher == "expert":
        for i in indices:
            yield run_one(i)
        return
    from agentrig.harness.trajectory import dumps_episode

    policy = _remote_teacher(cfg)
    # Windows of many batches: the batch refills as episodes end, so only a window's last episodes wait for
    # its slowest one (chunks of one batch each waited for theirs: a 12-step straggler held 15 finished rows).
    window = cfg.batch_size * WINDOW_BATCHES
    try:
        for lo in range(start, cfg.episodes, window):
            batch = [prepare(i) for i in range(lo, min(lo + window, cfg.episodes))]
            for ep in _WORKER["runner"].run(batch, policy, batch_size=cfg.batch_size):
                yield dumps_episode(ep)
    finally:
        close = getattr(policy, "close", None)
        if close is not None:
            close()


def _spawn_can_start() -> bool:
    """Whether spawned workers can re-import `__main__`: not when it names a file that is not there (`python - <<EOF`)."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path is None or os.path.isfile(path):
        return True
    print(f"collect: the main module {path!r} is not a file a spawned worker can import; running in this process",
          file=sys.stderr)
    return False


def _spawned(cfg: CollectConfig, indices: range) -> Iterator[str]:
    """Expert episodes from `cfg.workers` spawned processes, in index order.

    A worker that dies while starting (a script that calls this without `if __name__ == "__main__":` re-runs
    itself in every spawned process) breaks the pool, which is raised with what to do, instead of the endless
    respawning `multiprocessing.Pool` falls into.
    """
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    pool = ProcessPoolExecutor(cfg.workers, mp_context=mp.get_context("spawn"), initializer=_setup_worker,
                               initargs=(cfg,))
    try:
        yield from pool.map(run_one, indices, chunksize=8)
    except BrokenProcessPool as e:
        raise ConfigError(f"--workers {cfg.workers}: a worker process died while starting ({e}; its error is printed "
                          "above). Workers are spawned and import the main module again: a script that collects must do "
                          "so under `if __name__ == \"__main__\":`; or collect with --workers 1") from e
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _remote_teacher(cfg: CollectConfig) -> Any:
    """The OpenAI-compatible endpoint or a local model (with an adapter) as the teacher."""
    if not cfg.model:
        raise ConfigError(f"--teacher {cfg.teacher} needs --model")
    from agentrig.policies.loader import PolicySpec, load_policy

    if cfg.teacher == "openai":
        if not cfg.base_url:
            raise ConfigError("--teacher openai needs --base-url (the key is read from OPENAI_API_KEY)")
        return load_policy(PolicySpec(cfg.model, base_url=cfg.base_url, temperature=cfg.temperature,
                                      max_new_tokens=cfg.max_new_tokens, seed=cfg.seed))
    if cfg.teacher == "model":
        adapters = {"adapter": cfg.adapter} if cfg.adapter else None
        return load_policy(PolicySpec(cfg.model, adapters=adapters, temperature=cfg.temperature, seed=cfg.seed,
                                      max_new_tokens=cfg.max_new_tokens, batch_size=cfg.batch_size))
    raise ConfigError(f"unknown teacher {cfg.teacher!r}: use {', '.join(TEACHERS)}")


def run_collect(cfg: CollectConfig, resume: bool = False, progress: bool = True,
                summary: bool | None = None) -> CollectSummary:
    """Collect `cfg.episodes` episodes into `cfg.out` (appending after a resume point); return the summary.

    `progress` shows the live bar; `summary` prints the tables at the end (default: as `progress`).
    """
    out = Path(cfg.out)
    check_output_file(out, "episodes", "--out")  # never truncate a folder, a samples file or a dataset
    if cfg.teacher == "model" and cfg.adapter:
        read_adapter_config(cfg.adapter)  # before the output file is started
    if cfg.balance or cfg.family_weights:  # a family name the environment lacks fails before the output file is started
        from agentrig.envs import load_env

        _family_weights(load_env(cfg.env, cfg.tasks), cfg)
    out.parent.mkdir(parents=True, exist_ok=True)
    if resume and out.exists():
        _check_meta(cfg, out)
        start = resume_point(out)
    else:
        start = 0
        out.write_bytes(b"")
        save_config(cfg, _meta_path(out))
    started = time.perf_counter()
    written = 0
    live = _LiveCounts()
    with open(out, "a", encoding="utf-8") as fh, _progress(progress, cfg.episodes, start) as bar:
        last_sync = time.monotonic()
        for line in _lines(cfg, start) if start < cfg.episodes else iter(()):
            fh.write(line + "\n")
            fh.flush()
            written += 1
            live.add(json.loads(line))
            if time.monotonic() - last_sync > _FSYNC_EVERY_S:
                os.fsync(fh.fileno())
                last_sync = time.monotonic()
            bar.update(live)
        os.fsync(fh.fileno())
    result = summarize(out, written, time.perf_counter() - started)
    if progress if summary is None else summary:
        print_summary(result)
    return result


# -- live counts, progress and the summary -------------------------------------------------------


class _LiveCounts:
    def __init__(self) -> None:
        self.successes = self.faults = self.recovered = 0

    def add(self, ep: dict[str, Any]) -> None:
        self.successes += bool(ep.get("success"))
        self.faults += len(ep.get("faults", []))
        self.recovered += bool(ep.get("success")) and bool(ep.get("faults"))  # Episode.recovered, on the dict


class _progress:
    """Collection progress with live counts (`agentrig.progress`; a no-op when disabled)."""

    def __init__(self, enabled: bool, total: int, done: int):
        from agentrig.progress import progress

        self.cm = progress("collect", total, done, enabled=enabled, fields=lambda f: f.get("counts", ""))

    def __enter__(self) -> "_progress":
        self.bar = self.cm.__enter__()
        return self

    def update(self, live: _LiveCounts) -> None:
        if self.bar is not None:
            self.bar.update(advance=1, counts=f"ok {live.successes}  faults {live.faults}  "
                                              f"recovered {live.recovered}")

    def __exit__(self, *exc: Any) -> None:
        self.cm.__exit__(*exc)


def summarize(out: Path, written: int, seconds: float) -> CollectSummary:
    """Counts over the whole output file."""
    by_family: dict[str, list[int]] = {}
    faults: Counter[str] = Counter()
    tools: Counter[str] = Counter()
    n = ok = recovered = detours = 0
    with open(out, encoding="utf-8") as fh:
        for line in fh:
            ep = json.loads(line)
            n += 1
            success = bool(ep.get("success"))
            ok += success
            fam = by_family.setdefault(ep["task"]["family"] or "-", [0, 0])
            fam[0] += 1
            fam[1] += success
            faults.update(ep.get("faults", []))
            recovered += success and bool(ep.get("faults"))  # Episode.recovered, on the dict
            back = {v: k for k, v in (ep["task"]["metadata"].get("rename") or {}).get("tools", {}).items()}
            for step in ep["steps"]:
                detours += step["weight"] == 0.0
                tools.update(back.get(c["name"], c["name"]) for c in step["calls"])
    return CollectSummary(str(out), n, written, ok, faults, recovered, detours, by_family, tools, seconds)


def print_summary(s: CollectSummary) -> None:
    """Tables per family, per fault kind and per tool."""
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    fam = Table(title=f"{s.out}: {s.episodes} episodes, {s.successes} successful, {s.recovered} recovered "
                      f"after faults, {s.detours} detour steps ({s.rate:.1f} episodes/s this run)")
    for col in ("family", "episodes", "success"):
        fam.add_column(col)
    for name, (n, ok) in sorted(s.by_family.items()):
        fam.add_row(name, str(n), f"{100 * ok / n:.0f}%")
    console.print(fam)
    ft = Table(title="faults injected")
    ft.add_column("kind")
    ft.add_column("count")
    for kind, n in s.faults.most_common():
        ft.add_row(kind, str(n))
    console.print(ft)
    tt = Table(title="tool calls (balance)")
    tt.add_column("tool")
    tt.add_column("calls")
    for name, n in s.tool_calls.most_common():
        tt.add_row(name, str(n))
    console.print(tt)


# -- CLI ----------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `agentrig collect`: one per `CollectConfig` field, plus how to run."""
    add_flags(parser, CollectConfig)
    parser.add_argument("--resume", action="store_true", help="continue an interrupted collection")
    parser.add_argument("--no-progress", action="store_true", help="no live bar (the summary tables still print)")


def main(args: argparse.Namespace) -> int:
    """Run `agentrig collect`."""
    run_collect(from_args(CollectConfig, args), resume=args.resume, progress=not args.no_progress, summary=True)
    return 0
