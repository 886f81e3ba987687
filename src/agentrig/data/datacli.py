"""`agentrig data build | inspect | pairs | dagger`: the command line of the data stage.

`build` turns episode files into checked training data (`agentrig.data.databuild.build_dataset`) and optional
exports; `inspect` prints samples with the supervised tokens highlighted, so a person sees what the model
will learn; `pairs` writes DPO preference pairs (`agentrig.data.pairs`); `dagger` has the environment's expert
take over a student's own episodes where it went wrong (`agentrig.data.dagger`). Heavy imports happen inside `main`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from agentrig.data.render import IGNORE_INDEX
from agentrig.errors import ConfigError, DataError
from agentrig.jsonl import check_output_file, expect_kind, read_json, read_jsonl


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the `data` subcommands."""
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="episodes to samples.jsonl, tokenized.jsonl, data_card.json, build_report.json")
    b.add_argument("--in", dest="inputs", nargs="+", required=True, metavar="EPISODES.jsonl", help="episode files")
    b.add_argument("--out", required=True, metavar="DIR", help="output folder")
    b.add_argument("--model", default="smollm2-135m", help="whose tokenizer and chat template render the data")
    b.add_argument("--max-seq-length", type=int, default=None, metavar="N", help="token limit; longer episodes are windowed")
    b.add_argument("--skip-bad", action="store_true", help="skip malformed lines and count them instead of stopping")
    b.add_argument("--format", dest="formats", action="append", default=[],
                   choices=["trl", "llamafactory", "axolotl", "openai"], help="also export (repeatable) to DIR/exports/FORMAT")
    b.add_argument("--llamafactory-layout", default="chatml", choices=["chatml", "sharegpt"],
                   help="chatml (default): the training text, agentrig's tokens under LLaMA-Factory's `empty` "
                   "template; sharegpt: readable roles for its `qwen` template (other tokens: docs/data.md)")
    b.add_argument("--openai-tools", default="native", choices=["native", "hermes"],
                   help="the OpenAI export's tool format; run the tuned model with `eval --tool-format` the same")
    b.add_argument("--no-bfcl-check", action="store_true", help="do not refuse samples whose user text is a BFCL question")
    b.add_argument("--mcp-server", default=None, metavar="SPEC",
                   help="drop episodes whose MCP tools differ from what this server lists now (mcp:stdio:CMD, "
                   "mcp:http:URL or mcp:replay:FILE); without it, tools seen in two versions are only reported")
    i = sub.add_parser("inspect", help="print samples with supervised tokens highlighted, and the statistics")
    i.add_argument("path", metavar="FILE", help="a build folder, or its tokenized.jsonl")
    i.add_argument("--n", type=int, default=1, metavar="K", help="how many samples to print")
    p = sub.add_parser("pairs", help="preference pairs (DPO) from episodes of the same tasks, plus synthetic pairs")
    p.add_argument("--in", dest="inputs", nargs="+", required=True, metavar="EPISODES.jsonl")
    p.add_argument("--out", required=True, metavar="FILE", help="output JSONL")
    p.add_argument("--format", default="trl", choices=["trl", "llamafactory"])
    p.add_argument("--no-synthetic", action="store_true", help="only pairs from real episodes")
    p.add_argument("--limit", type=int, metavar="N", help="keep N pairs for one DPO round: every pair from real "
                   "episodes first, then synthetic kinds in turn (what `agentrig run --profile full` trains on)")
    p.add_argument("--seed", type=int, default=0, help="seed of --limit's sample")
    p.add_argument("--skip-bad", action="store_true", help="skip malformed lines and count them")
    d = sub.add_parser("dagger", help="the expert takes over a student's own episodes at its first different step "
                       "(DAgger); successes to an episodes file for `data build`")
    d.add_argument("--in", dest="inputs", nargs="+", required=True, metavar="EPISODES.jsonl",
                   help="the student's episodes (agentrig collect --teacher model --adapter ...)")
    d.add_argument("--out", required=True, metavar="FILE", help="output episodes file")
    d.add_argument("--env", default=None, help="the environment (default: the one in IN.meta.json, else datadesk)")
    d.add_argument("--faults", type=float, default=None,
                   help="fault rate after the takeover (default: the student's collection's, from IN.meta.json)")
    d.add_argument("--max-steps", type=int, default=None, help="harness step limit (default: from IN.meta.json, else 12)")
    d.add_argument("--tool-listing", default=None, help="how the system prompt lists tools (default: from IN.meta.json)")


def main(args: argparse.Namespace) -> int:
    """Run the chosen data action."""
    if args.data_command == "build":
        return _build(args)
    if args.data_command == "inspect":
        return _inspect(args)
    if args.data_command == "dagger":
        return _dagger(args)
    return _pairs(args)


def _build(args: argparse.Namespace) -> int:
    from agentrig.data.databuild import build_dataset
    from agentrig.data.exports import export_samples
    from agentrig.data.samples import Sample

    current = None
    if args.mcp_server:
        from agentrig.mcp.client import current_tool_hashes

        current = current_tool_hashes(args.mcp_server)
    report = build_dataset(args.inputs, args.out, model=args.model, max_seq_length=args.max_seq_length,
                           skip_bad=args.skip_bad, bfcl_check=not args.no_bfcl_check, mcp_current=current)
    print(f"{report.samples} samples from {report.episodes} episodes -> {args.out}")
    print(f"kept {report.kept}, dropped {report.dropped}, skipped lines {report.lines_skipped}, "
          f"windowed {report.episodes_windowed}, calls normalized {report.calls_normalized}")
    if report.mcp_changed_tools:
        print(f"MCP tools seen in more than one version: {', '.join(report.mcp_changed_tools)}"
              + ("" if current else " (pass --mcp-server SPEC to keep only the current version)"))
    if args.formats:
        samples = [Sample.from_dict(row) for row in read_jsonl(Path(args.out) / "samples.jsonl")]
        for fmt in args.formats:
            er = export_samples(samples, fmt, Path(args.out) / "exports" / fmt, model=args.model,
                                max_seq_length=args.max_seq_length, llamafactory_layout=args.llamafactory_layout,
                                openai_tools=args.openai_tools)
            print(f"export {fmt}: {er.samples} samples, {er.changed} changed {er.changes or ''}, "
                  f"{er.weight0_trained} with detour turns the format cannot mask -> {er.out_dir}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.text import Text

    from agentrig.models import load_tokenizer

    path = Path(args.path)
    kind = expect_kind(path, ("build", "tokenized"))
    folder = path if kind == "build" else path.parent
    tokenized = folder / "tokenized.jsonl" if kind == "build" else path
    rows = read_jsonl(tokenized)
    if not rows:
        raise DataError(f"{tokenized}: no samples (the build kept none: its build_report.json says why)")
    card_path = folder / "data_card.json"
    card = read_json(card_path, "`agentrig data build`") if card_path.is_file() else {}
    tokenizer = load_tokenizer(card.get("model", "smollm2-135m"))
    console = Console()
    for row in rows[: args.n]:
        console.rule(f"sample {row['sample_id']}")
        text = Text()
        ids, labels = row["input_ids"], row["labels"]
        start = 0
        for k in range(1, len(ids) + 1):
            if k == len(ids) or (labels[k] != IGNORE_INDEX) != (labels[start] != IGNORE_INDEX):
                piece = tokenizer.decode(ids[start:k], skip_special_tokens=False)
                text.append(piece, style="bold green" if labels[start] != IGNORE_INDEX else "dim")
                start = k
        console.print(text)
        sup = sum(1 for x in labels if x != IGNORE_INDEX)
        console.print(f"[bold]{len(ids)} tokens, {sup} supervised (green)[/bold]")
    if card:
        console.rule("data card")
        console.print_json(json.dumps({k: card[k] for k in ("samples", "tokens", "families", "faults", "masks", "dropped")
                                       if k in card}))
    return 0


def _pairs(args: argparse.Namespace) -> int:
    from agentrig.data.databuild import SCHEMA_VERSIONS, BuildReport, read_records
    from agentrig.data.pairs import build_pairs, mix_pairs
    from agentrig.harness.trajectory import Episode

    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"--limit must be at least 1 (got {args.limit})")

    for path in args.inputs:
        expect_kind(path, ("episodes",), "--in", SCHEMA_VERSIONS)  # built samples hold no rejected steps to pair
    check_output_file(args.out, "pairs", "--out")
    report = BuildReport([str(p) for p in args.inputs], "", "", "", None)
    episodes = [r for r in read_records([Path(p) for p in args.inputs], args.skip_bad, report) if isinstance(r, Episode)]
    pairs, summary = build_pairs(episodes, synthetic=not args.no_synthetic)
    if args.limit is not None:
        pairs = mix_pairs(pairs, args.limit, args.seed)
        summary["kept"] = len(pairs)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        for pair in pairs:
            row = pair.trl() if args.format == "trl" else pair.llamafactory()
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    if args.format == "llamafactory":
        from agentrig.data.exports import dataset_info

        (out.parent / "dataset_info.json").write_text(json.dumps(dataset_info(out.name, ranking=True), indent=2) + "\n")
    summary["lines_skipped"] = report.lines_skipped
    print(f"{len(pairs)} pairs -> {out}: {json.dumps(summary)}")
    return 0


def _dagger(args: argparse.Namespace) -> int:
    from agentrig.data.dagger import DaggerSummary, relabel
    from agentrig.data.databuild import SCHEMA_VERSIONS
    from agentrig.envs import load_env
    from agentrig.envs.runner import TaskRunner
    from agentrig.harness import HarnessConfig
    from agentrig.harness.trajectory import dumps_episode, iter_episodes

    for path in args.inputs:
        expect_kind(path, ("episodes",), "--in", SCHEMA_VERSIONS)
    check_output_file(args.out, "episodes", "--out")
    meta_path = Path(f"{args.inputs[0]}.meta.json")
    meta = read_json(meta_path, "agentrig collect") if meta_path.exists() else {}
    env = load_env(args.env or meta.get("env", "datadesk"), meta.get("tasks"))
    harness = HarnessConfig(max_steps=args.max_steps or meta.get("max_steps", 12),
                            tool_listing=args.tool_listing or meta.get("tool_listing", "compact"),
                            repeat_notice=bool(meta.get("repeat_notice")), echo_calls=bool(meta.get("echo_calls")))
    rate = args.faults if args.faults is not None else meta.get("faults", 0.0)
    faults = TaskRunner.env_faults(env, rate, meta.get("fault_rates") or None) if rate or meta.get("fault_rates") else None
    summary = DaggerSummary()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        for path in args.inputs:
            for ep in relabel(iter_episodes(path), env, harness, faults, summary):
                fh.write(dumps_episode(ep) + "\n")
    print(f"{summary.relabelled} relabelled episodes -> {out}: {json.dumps(summary.to_dict())}")
    return 0
