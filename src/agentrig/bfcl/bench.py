"""`agentrig bench bfcl`: run BFCL categories offline on a model (or an adapter) through the harness.

Recipe: resolve the config, load the entries, load the policy, run and score each category, write
`results.json`, `report.md`, `episodes.jsonl` and `config.json` into `--out`, print the table.
Importing this module is light: torch and transformers load inside `load_policy` (`agentrig.policies.loader`).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agentrig.bfcl.data import CATEGORIES, BfclEntry, data_dir, load_category
from agentrig.bfcl.report import CategoryScore, write_results
from agentrig.bfcl.runner import EntryOutcome, harness_config, run_entries
from agentrig.config import add_flags, comma_list, from_args, opt, save_config
from agentrig.errors import ConfigError
from agentrig.harness.trajectory import write_episodes


@dataclass
class BenchConfig:
    """One `agentrig bench bfcl` run."""

    model: str = opt(help="model name (e.g. smollm2-135m) or local folder")
    out: Path = opt(help="output folder (results.json, report.md, episodes.jsonl, config.json)")
    adapter: Path | None = opt(None, "PEFT adapter folder to serve on the model")
    categories: list[str] = opt(help=f"comma-separated subset of {','.join(CATEGORIES)}", factory=lambda: list(CATEGORIES),
                                parse=comma_list)
    limit: int | None = opt(None, "run only the first N entries of each category (all when unset)")
    protocol: str = opt("hermes", "output protocol of tool calls", cli=False)
    batch_size: int = opt(16, "episodes stepping together", cli=False)
    max_new_tokens: int = opt(256, "generation limit per step; a turn may hold several calls (parallel categories)")

    def validate(self) -> None:
        """Raise ConfigError naming the bad value."""
        unknown = [c for c in self.categories if c not in CATEGORIES]
        if unknown or not self.categories:
            raise ConfigError(f"--categories: unknown {', '.join(unknown) or '(empty list)'}; choose from {','.join(CATEGORIES)}")
        if self.limit is not None and self.limit < 1:
            raise ConfigError(f"--limit must be at least 1, got {self.limit}")
        if self.max_new_tokens < 1:
            raise ConfigError(f"--max-new-tokens must be at least 1, got {self.max_new_tokens}")
        if self.adapter is not None and not (self.adapter / "adapter_config.json").is_file():
            raise ConfigError(f"--adapter {self.adapter}: not a PEFT adapter folder (no adapter_config.json)")


@dataclass
class BenchResult:
    """What a run measured: per-category scores and per-entry outcomes."""

    scores: list[CategoryScore]
    outcomes: list[EntryOutcome]


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `agentrig bench bfcl`."""
    parser.add_argument("benchmark", choices=["bfcl"], help="the benchmark to run (BFCL, from the bfcl-eval package)")
    add_flags(parser, BenchConfig, required=("model", "out"))


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    """The BenchConfig of parsed command-line flags."""
    return from_args(BenchConfig, args)


def load_policy(config: BenchConfig) -> Any:
    """The local-model policy (torch and transformers are imported here)."""
    from agentrig.policies.loader import PolicySpec, load_policy

    adapters = {"adapter": str(config.adapter)} if config.adapter is not None else None
    return load_policy(PolicySpec(config.model, adapters=adapters, batch_size=config.batch_size,
                                  max_new_tokens=config.max_new_tokens))


def _bfcl_version() -> str:
    return importlib.metadata.version("bfcl-eval")


def run_bfcl(config: BenchConfig, policy: Any, entries: dict[str, list[BfclEntry]] | None = None) -> BenchResult:
    """Run and score the configured categories with `policy`, then write the results into `config.out`."""
    config.validate()
    entries = entries if entries is not None else {c: load_category(c, config.limit) for c in config.categories}
    harness = harness_config(config.protocol)
    scores: list[CategoryScore] = []
    outcomes: list[EntryOutcome] = []
    for category in config.categories:
        done = run_entries(entries[category], policy, harness, config.batch_size)
        outcomes.extend(done)
        scores.append(CategoryScore(category, len(done), sum(o.valid for o in done), sum(o.episode_valid for o in done)))
        print(f"{category}: {scores[-1].correct}/{scores[-1].n} (whole episode {scores[-1].episode_correct})", flush=True)
    header = {
        "benchmark": "bfcl",
        "model": config.model,
        "adapter": str(config.adapter) if config.adapter is not None else None,
        "date": datetime.date.today().isoformat(),
        "bfcl_eval_version": _bfcl_version(),
        "protocol": config.protocol,
        "limit": config.limit,
        "harness": asdict(harness),
    }
    config.out.mkdir(parents=True, exist_ok=True)
    save_config(config, config.out / "config.json")
    write_results(config.out, header, scores, [o.to_dict() for o in outcomes])
    write_episodes(config.out / "episodes.jsonl", [ep for o in outcomes for ep in o.episodes])
    return BenchResult(scores, outcomes)


def main(args: argparse.Namespace) -> int:
    """Run `agentrig bench bfcl` and print the per-category table."""
    config = config_from_args(args)
    config.validate()
    data_dir()  # fail early, with the install hint, when bfcl-eval is missing
    entries = {c: load_category(c, config.limit) for c in config.categories}
    result = run_bfcl(config, load_policy(config), entries)
    print(f"\n{'category':<20}{'n':>5}{'acc %':>8}  {'95% interval':<14}{'episode %':>9}")
    for s in result.scores:
        low, high = s.ci95
        print(f"{s.category:<20}{s.n:>5}{100 * s.accuracy:>8.1f}  {f'{100 * low:.1f}-{100 * high:.1f}':<14}"
              f"{100 * s.episode().accuracy:>9.1f}")
    print(f"\nwritten: {config.out / 'results.json'}, {config.out / 'report.md'}")
    return 0
