"""The data of a run: each dataset read as training items, the mixture, the validation split, the run's data card.

`dataset:` names one source or several (`a,b,c`, or a YAML list), each an `agentrig data build` folder, a
tokenized.jsonl, an episodes or samples file, or a data export (file or folder; read back by
`agentrig.data.imports`), or for stage dpo a preference-pairs file. Episodes, samples and exports are built
on the fly with the data pipeline, for the run's model and `max_seq_length` (a LLaMA-Factory chatml-layout
export is the training text already: its pieces are only tokenized), into `output_dir/data/` (one source) or
`output_dir/data/<k>/` (source k of several; validation sources under `output_dir/eval_data/<k>/`), and a
resumed run reuses those builds.

The recipe, as LLaMA-Factory's `merge_dataset`: `max_samples` keeps the first N of each source; `concat`
joins them; `interleave_under` draws the next item of a source chosen by `interleave_probs` (or each in turn)
until one source runs out; `interleave_over` restarts a finished source and stops when every source has been
used whole. Unlike datasets' `interleave_datasets`, each source is shuffled (seeded) before interleaving, so
undersampling keeps a random subset rather than a file's first lines. `val_size` then holds out distinct
items of the mixture (every copy of a held-out item leaves training, so oversampling cannot leak it), or
`eval_dataset` sources are read and concatenated. `data_card.json` in `output_dir` records, per source, what
was available, read and drawn, and its actual share of the mixture's items and supervised tokens.

Not covered: per-source validation losses (LLaMA-Factory's eval_on_each_dataset), streaming.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from agentrig.errors import ConfigError, DataError
from agentrig.jsonl import expect_kind, path_kind
from agentrig.train.trainconfig import TrainConfig

T = TypeVar("T")
Key = tuple[int, int]  # an item of the mixture: (source, index in that source)
SFT_KINDS = ("build", "tokenized", "episodes", "samples", "export", "export_folder")
DATA_CARD_NAME = "data_card.json"


@dataclass
class Source:
    """One dataset entry: as written, what it is, and the file it is read from."""

    name: str
    kind: str  # tokenized, episodes, samples, export, pairs
    file: Path


@dataclass
class SourceCard:
    """What the mixture took from one source."""

    dataset: str
    kind: str
    available: int
    read: int  # after max_samples
    drawn: int = 0  # in the mixture, repeats counted
    distinct: int = 0
    share: float = 0.0  # of the mixture's items
    supervised_tokens: int = 0  # stage dpo: the pairs' chosen and rejected completion tokens
    supervised_share: float = 0.0
    requested: float | None = None  # its interleave_probs entry


@dataclass
class Mixture:
    """Training and validation items, and the data card."""

    train: list[Any]
    val: list[Any]
    card: dict[str, Any] = field(default_factory=dict)


def _source(name: str, stage: str, flag: str) -> Source:
    path = Path(name)
    if stage == "dpo":
        if path.is_dir() and (path / "pairs.jsonl").is_file() and not (path / "tokenized.jsonl").is_file():
            path = path / "pairs.jsonl"  # a folder of pairs means its pairs.jsonl
        return Source(name, expect_kind(path, ("pairs",), f"stage dpo {flag}"), path)
    if path_kind(path) == "missing" and "/" not in name and "." not in name:
        raise DataError(f"{flag} {name}: there is no such file or folder; `{flag[:-1]}` takes paths, not dataset names "
                        "from LLaMA-Factory's dataset_info.json: give a `data build` folder, a tokenized.jsonl, an "
                        "episodes file or an export")
    kind = expect_kind(path, SFT_KINDS, flag)
    if kind == "build":
        return Source(name, "tokenized", path / "tokenized.jsonl")
    if kind in ("export", "export_folder"):
        from agentrig.data.imports import export_file

        return Source(name, "export", export_file(path))
    return Source(name, kind, path)


def check_sources(config: TrainConfig) -> tuple[list[Source], list[Source]]:
    """Training and validation sources, each refused before anything loads when the stage cannot read it."""
    if config.stage == "dpo" and not config.adapter_name_or_path:
        raise ConfigError("stage dpo needs adapter_name_or_path: the SFT adapter to start from (and the reference)")
    if config.adapter_name_or_path:
        if not (Path(config.adapter_name_or_path) / "adapter_config.json").is_file():
            raise ConfigError(f"adapter_name_or_path {config.adapter_name_or_path!r} is not a PEFT adapter folder")
    return ([_source(n, config.stage, "dataset:") for n in config.datasets()],
            [_source(n, config.stage, "eval_dataset:") for n in config.eval_datasets()])


def tokenized_file(source: Source, config: TrainConfig, folder: Path) -> Path:
    """The tokenized.jsonl of an SFT source; episodes, samples and exports are built into `folder` first (once)."""
    if source.kind == "tokenized":
        return source.file
    built = folder / "tokenized.jsonl"
    if built.is_file():
        return built  # a resumed run: the build of the first attempt
    from agentrig.data.databuild import build_dataset, write_jsonl

    inputs = source.file
    if source.kind == "export":
        from agentrig.data.imports import chatml_tokens, is_chatml_layout, read_export
        from agentrig.data.render import Renderer

        folder.mkdir(parents=True, exist_ok=True)
        renderer = Renderer.for_model(config.model_name_or_path)
        if is_chatml_layout(source.file, renderer.end_of_turn):  # the training text already: tokenize the pieces
            write_jsonl(built, chatml_tokens(source.file, renderer))
            return built
        inputs = folder / "imported_samples.jsonl"
        write_jsonl(inputs, (s.to_dict() for s in read_export(source.file)))
    build_dataset([inputs], folder, model=config.model_name_or_path, max_seq_length=config.max_seq_length)
    return built


def build_folders(config: TrainConfig, train: list[Source], val: list[Source]) -> tuple[list[Path], list[Path]]:
    """Where each source is built when it needs a build (see the module docstring)."""
    out = Path(config.output_dir)
    train_dirs = [out / "data"] if len(train) == 1 else [out / "data" / str(k) for k in range(len(train))]
    return train_dirs, [out / "eval_data" / str(k) for k in range(len(val))]


# -- mixing ---------------------------------------------------------------------------------------

def interleave(parts: list[list[T]], probs: list[float] | None, oversample: bool, seed: int) -> list[Key]:
    """(source, index) of each item drawn, in order: by `probs` (or each source in turn) until the first source
    runs out (`oversample` False) or until every source has been used whole, restarting finished ones (True)."""
    rng = random.Random(seed)
    orders = [rng.sample(range(len(p)), len(p)) for p in parts]
    position = [0] * len(parts)
    finished = [not p for p in parts]
    drawn: list[Key] = []
    turn = 0
    while True:
        k = rng.choices(range(len(parts)), weights=probs)[0] if probs else turn % len(parts)
        turn += 1
        if position[k] == len(orders[k]):
            if not oversample:
                return drawn
            position[k] = 0
        drawn.append((k, orders[k][position[k]]))
        position[k] += 1
        if position[k] == len(orders[k]):
            finished[k] = True
            if oversample and all(finished):
                return drawn


def mix(parts: list[list[T]], config: TrainConfig) -> list[Key]:
    """(source, index) of every training item, by `mix_strategy`."""
    if config.mix_strategy == "concat" or len(parts) == 1:
        return [(k, i) for k, part in enumerate(parts) for i in range(len(part))]
    return interleave(parts, config.interleave_probs, config.mix_strategy == "interleave_over", config.seed)


def hold_out(drawn: list[Key], val_size: int | float, seed: int) -> tuple[list[Key], list[Key]]:
    """Split the mixture: `val_size` distinct items (a count, or that share of the distinct items) held out."""
    distinct = list(dict.fromkeys(drawn))
    n = val_size if isinstance(val_size, int) else round(val_size * len(distinct))
    if n < 1:
        raise ConfigError(f"val_size {val_size} holds out no sample of {len(distinct)}: raise it, or give a count")
    if n >= len(distinct):
        raise ConfigError(f"val_size {val_size} holds out {n} of {len(distinct)} samples, leaving none to train on")
    val = set(random.Random(seed).sample(distinct, n))
    return [d for d in drawn if d not in val], [d for d in distinct if d in val]


def build_mixture(parts: list[list[T]], sources: list[Source], available: list[int], config: TrainConfig,
                  weight: Callable[[T], int], val_items: list[T] | None = None) -> Mixture:
    """Mix `parts` (one list per source, already cut to `max_samples`) and split validation; `weight` is an item's
    supervised tokens (for pairs, their chosen and rejected completion tokens); `val_items` the eval_dataset's."""
    drawn = mix(parts, config)
    val_keys: list[Key] = []
    if config.val_size:
        drawn, val_keys = hold_out(drawn, config.val_size, config.seed)
    if not drawn:
        raise DataError(f"dataset {config.dataset!r}: the mixture is empty")
    counts = Counter(k for k, _ in drawn)
    tokens = Counter()
    for k, i in drawn:
        tokens[k] += weight(parts[k][i])
    total_tokens = sum(tokens.values()) or 1
    cards = []
    for k, source in enumerate(sources):
        cards.append(SourceCard(
            source.name, source.kind, available[k], len(parts[k]), counts[k], len({i for j, i in drawn if j == k}),
            round(counts[k] / len(drawn), 4), tokens[k], round(tokens[k] / total_tokens, 4),
            config.interleave_probs[k] if config.interleave_probs else None))
    val = [parts[k][i] for k, i in val_keys] if config.val_size else list(val_items or [])
    card = {"mix_strategy": config.mix_strategy, "interleave_probs": config.interleave_probs,
            "max_samples": config.max_samples, "train_items": len(drawn), "supervised_tokens": sum(tokens.values()),
            "validation": {"items": len(val), "from": "val_size" if config.val_size else
                           ("eval_dataset" if config.eval_dataset is not None else None),
                           "val_size": config.val_size, "eval_dataset": config.eval_datasets()},
            "sources": [asdict(c) for c in cards]}
    return Mixture([parts[k][i] for k, i in drawn], val, card)


def write_card(card: dict[str, Any], config: TrainConfig, extra: dict[str, Any]) -> Path:
    """Write the run's `data_card.json` into `output_dir`."""
    path = Path(config.output_dir) / DATA_CARD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**card, **extra}, indent=2) + "\n")
    return path
