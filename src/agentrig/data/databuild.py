"""`build_dataset`: episodes to checked training data (clean, window, render, tokenize, mask, verify, write).

The recipe, per input line: read and validate (a bad line is a `DataError` naming file and line, or a
counted skip with `skip_bad`); clean (keep successes, recoveries and labelled honest failures; drop
episodes whose results do not answer their calls; normalize calls; drop duplicates (the same tokens and
labels as a kept sample) and BFCL questions; an id already taken gets `#2`, `#3`, ...);
refuse episodes from an MCP server whose tools changed since they were collected (`mcp_current`: the
hashes of the server's tools now, `agentrig data build --mcp-server SPEC`), and without it report every
tool that appears in more than one version across the inputs (`mcp_tool_versions`, with a warning);
window (the harness's own memory compression when a stretch passes `max_seq_length`); render and mask
through `Renderer`; verify token for token against the inference path; write.

The verification, for every assistant turn of an episode's sample: the messages before it equal
`context_at(episode, i)` (then the training tokens before it are `prompt_ids` of them, which
`Renderer.sample_turns` guarantees by construction and raises otherwise); where the messages differ,
`prompt_ids(context_at(...))` is rendered and compared token by token instead. The same for the turn
itself against `assistant_ids(assistant_message(step))`. Every supervised turn ends with the end-of-turn
token in its labels; weight-0 turns have no labels; no sample exceeds the limit. A failed check raises
`BuildCheckError` naming the sample.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from agentrig.errors import AgentrigError, DataError
from agentrig.jsonl import cut_off, describe, expect_kind, record_kind
from agentrig.data.render import IGNORE_INDEX, RenderedSample, Renderer, RenderError
from agentrig.data.samples import (
    SAMPLE_SCHEMA_VERSION,
    Sample,
    episode_samples,
    keep_reason,
    normalize_calls,
    results_mismatch,
    step_starts,
    window_episode,
)
from agentrig.harness.trajectory import SCHEMA_VERSION, Episode, RecordError

log = logging.getLogger(__name__)
MAX_LISTED_SKIPS = 50
SCHEMA_VERSIONS = {"episodes": SCHEMA_VERSION, "samples": SAMPLE_SCHEMA_VERSION}  # what `expect_kind` checks


class BuildCheckError(AgentrigError):
    """A sample whose training tokens would differ from what inference renders or generates."""


@dataclass
class BuildReport:
    """What the build read, kept, dropped (with reasons), changed and wrote."""

    inputs: list[str]
    out_dir: str
    model: str
    template: str
    max_seq_length: int | None
    lines_read: int = 0
    lines_skipped: int = 0
    skipped: list[str] = field(default_factory=list)  # "file:line: why" (the first MAX_LISTED_SKIPS)
    episodes: int = 0
    kept: dict[str, int] = field(default_factory=dict)  # success / recovered / honest_failure / sample
    dropped: dict[str, int] = field(default_factory=dict)  # cleaning reason -> count
    calls_normalized: int = 0
    episodes_windowed: int = 0
    samples: int = 0
    sample_ids_renamed: int = 0  # kept samples whose id another kept sample had: `#2`, `#3`, ... appended
    bfcl_check: str = "on"
    mcp_tool_versions: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # server -> tool -> hash -> n
    mcp_changed_tools: list[str] = field(default_factory=list)  # "server/tool" seen in more than one version
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict."""
        return asdict(self)


@dataclass
class BuiltSample:
    """A sample with its tokens (what samples.jsonl and tokenized.jsonl hold)."""

    sample: Sample
    rendered: RenderedSample


# -- reading ------------------------------------------------------------------------------------


def read_records(paths: list[Path], skip_bad: bool, report: BuildReport) -> Iterator[Episode | Sample]:
    """Episodes and canonical samples from JSONL files; bad lines raise DataError or are counted."""
    for path in paths:
        if not path.exists():
            raise DataError(f"{path}: no such file")
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                report.lines_read += 1
                try:
                    yield parse_record(raw)
                except ValueError as exc:  # RecordError, JSONDecodeError and UnicodeDecodeError are ValueErrors
                    where = f"{path}:{lineno}: {exc}{cut_off(raw)}"
                    if not skip_bad:
                        raise DataError(f"{where} (use --skip-bad to skip and count bad lines)") from None
                    report.lines_skipped += 1
                    if len(report.skipped) < MAX_LISTED_SKIPS:
                        report.skipped.append(where)


def parse_record(raw: bytes | str) -> Episode | Sample:
    """One JSONL line as an Episode (has `steps`) or a canonical Sample (has `messages`); ValueError if neither."""
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object, got {type(data).__name__}")
    kind = record_kind(data)
    if kind == "samples":
        return Sample.from_dict(data)
    if kind not in ("episodes", "unknown"):
        raise ValueError(f"this line is from {describe(kind)}, not an episode or a sample")
    if isinstance(data.get("tools"), str):
        try:
            data["tools"] = json.loads(data["tools"])
        except json.JSONDecodeError as exc:
            raise ValueError(f"'tools' is not valid JSON: {exc}") from None
    if not isinstance(data.get("tools", []), list):
        raise ValueError("'tools' must be a list of function specs")
    episode = Episode.from_dict(data)
    try:
        step_starts(episode)
    except (KeyError, TypeError) as exc:
        raise RecordError(f"episode does not match the schema: {exc!r}") from None
    return episode


# -- the BFCL contamination check --------------------------------------------------------------


def bfcl_checker() -> Callable[[str], bool] | None:
    """`is_bfcl_question`, or None (with a warning) when the bfcl-eval data is not installed."""
    from agentrig.bfcl.data import BfclNotInstalled, is_bfcl_question

    try:
        is_bfcl_question("")  # loads the question set once
    except BfclNotInstalled:
        log.warning("bfcl-eval is not installed: the BFCL contamination check is skipped")
        return None
    return is_bfcl_question


def bfcl_function_in(tools_json: str) -> str | None:
    """The first offered tool that reproduces a BFCL function (its name and parameter names), or None."""
    from agentrig.bfcl.data import is_bfcl_function

    try:
        tools = json.loads(tools_json or "[]")
    except ValueError:
        return None
    for spec in tools if isinstance(tools, list) else []:
        fn = spec.get("function", spec) if isinstance(spec, dict) else {}
        name, props = fn.get("name"), (fn.get("parameters") or {}).get("properties") or {}
        if isinstance(name, str) and is_bfcl_function(name, props):
            return name
    return None


# -- checks ---------------------------------------------------------------------------------


def check_masks(sample_id: str, rendered: RenderedSample, weights: list[float], eot_id: int) -> int:
    """Every supervised turn is labelled whole, end-of-turn included; nothing else is. Returns supervised turns."""
    count = covered = 0
    for k, start, end in rendered.turns:
        span = rendered.labels[start:end]
        if weights[k] > 0:
            count += 1
            covered += end - start
            if span != rendered.input_ids[start:end] or rendered.input_ids[end - 1] != eot_id:
                raise BuildCheckError(f"sample {sample_id}: assistant message {k} is not supervised whole up to its end-of-turn token")
        elif span.count(IGNORE_INDEX) != len(span):
            raise BuildCheckError(f"sample {sample_id}: message {k} has weight 0 but supervised tokens")
    if len(rendered.labels) - rendered.labels.count(IGNORE_INDEX) != covered:
        raise BuildCheckError(f"sample {sample_id}: tokens outside the assistant turns are supervised")
    return count


def check_inference(
    renderer: Renderer, episode: Episode, sample: Sample, rendered: RenderedSample, steps: list[int]
) -> None:
    """Tokens before and of every assistant turn equal the inference prompt and the policy's generation."""
    from agentrig.harness.transcript import assistant_message, context_at

    turn_at = {k: (start, end) for k, start, end in rendered.turns}
    offset = len(context_at(episode, steps[0])) - episode.metadata["step_message_index"][steps[0]]
    for i in steps:
        k = episode.metadata["step_message_index"][i] + offset
        if k not in turn_at:
            raise BuildCheckError(f"sample {sample.sample_id}: step {i} is not an assistant turn of the sample")
        start, end = turn_at[k]
        context = context_at(episode, i)
        if context != sample.messages[:k]:
            expected = renderer.prompt_ids(context)
            if expected != rendered.input_ids[:start]:
                raise BuildCheckError(
                    f"sample {sample.sample_id}: the training tokens before step {i} differ from the prompt "
                    f"the harness renders at inference ({len(rendered.input_ids[:start])} vs {len(expected)} tokens)"
                )
        message = assistant_message(episode.steps[i])
        if message != sample.messages[k] and renderer.assistant_ids(message) != rendered.input_ids[start:end]:
            raise BuildCheckError(
                f"sample {sample.sample_id}: the tokens of step {i} differ from what the policy generates"
            )


# -- the build ------------------------------------------------------------------------------


class _Builder:
    """The per-record work of `build_dataset` (kept apart so the benchmark can time it per episode)."""

    def __init__(self, renderer: Renderer, max_seq_length: int | None, report: BuildReport,
                 is_bfcl: Callable[[str], bool] | None, mcp_current: dict[str, dict[str, str]] | None = None) -> None:
        self.mcp_current = mcp_current
        self.renderer = renderer
        self.max_len = max_seq_length
        self.report = report
        self.is_bfcl = is_bfcl
        self.seen: set[str] = set()  # hashes of the kept samples' tokens and labels
        self.ids: set[str] = set()  # the kept samples' ids
        self.kept: Counter[str] = Counter()
        self.dropped: Counter[str] = Counter()

    def add(self, record: Episode | Sample) -> list[BuiltSample]:
        """Clean, window, render, mask and verify one record; the samples to keep."""
        if isinstance(record, Sample):
            self.kept["sample"] += 1
            return [b for b in [self._finish(record, None, None)] if b is not None]
        return self._episode(record)

    def _episode(self, episode: Episode) -> list[BuiltSample]:
        self.report.episodes += 1
        if self._mcp_changed(episode):
            self.dropped["mcp_tools_changed"] += 1
            return []
        keep, reason = keep_reason(episode)
        if not keep:
            self.dropped[reason] += 1
            return []
        if self.renderer.template_name != "model" and episode.protocol != "hermes":
            self.dropped["protocol_mismatch"] += 1
            return []
        if results_mismatch(episode) is not None:
            self.dropped["results_mismatch"] += 1
            return []
        if not any(s.weight > 0 for s in episode.steps):
            self.dropped["no_supervised_turns"] += 1
            return []
        self.report.calls_normalized += normalize_calls(episode)
        from agentrig.harness.transcript import context_at

        pairs = episode_samples(episode, reason, context_at=context_at)
        if self.max_len is not None and any(self._too_long(s) for s, _ in pairs):
            windowed = window_episode(episode, self._fits)
            if len(windowed.memory_events) != len(episode.memory_events):
                self.report.episodes_windowed += 1
                episode = windowed
                pairs = episode_samples(episode, reason, context_at=context_at)
        out = []
        for sample, steps in pairs:
            if not any(sample.weights):
                continue  # a window of detour steps only: nothing to learn
            built = self._finish(sample, episode, steps)
            if built is not None:
                out.append(built)
        if out:
            self.kept[reason] += 1
        return out

    def _mcp_changed(self, episode: Episode) -> bool:
        """Count the MCP tool versions the episode used; True when one differs from the server's tools now."""
        ident = episode.metadata.get("mcp") if isinstance(episode.metadata, dict) else None
        if not isinstance(ident, dict) or not isinstance(ident.get("tools"), dict):
            return False
        server = ident.get("name") or ident.get("server") or "?"
        versions = self.report.mcp_tool_versions.setdefault(server, {})
        for tool, digest in ident["tools"].items():
            counts = versions.setdefault(tool, {})
            counts[digest] = counts.get(digest, 0) + 1
        if self.mcp_current is None or server not in self.mcp_current:
            return False
        now = self.mcp_current[server]
        return any(now.get(tool) != digest for tool, digest in ident["tools"].items())

    def _too_long(self, sample: Sample) -> bool:
        return len(self.renderer.sample_ids(sample.messages, sample.weights)[0]) > self.max_len  # type: ignore[operator]

    def _fits(self, i: int, episode: Episode) -> bool:
        from agentrig.harness.transcript import assistant_message, context_at

        n = len(self.renderer.prompt_ids(context_at(episode, i)))
        return n + len(self.renderer.assistant_ids(assistant_message(episode.steps[i]))) <= self.max_len  # type: ignore[operator]

    def _finish(self, sample: Sample, episode: Episode | None, steps: list[int] | None) -> BuiltSample | None:
        users = [m.get("content") or "" for m in sample.messages if m["role"] == "user"]
        if self.is_bfcl is not None and any(self.is_bfcl(u) for u in users):
            self.dropped["bfcl_contamination"] += 1
            log.warning("sample %s: its user text is a BFCL test question; not trained on", sample.sample_id)
            return None
        if self.is_bfcl is not None and (copied := bfcl_function_in(sample.tools)):
            self.dropped["bfcl_contamination"] += 1
            log.warning("sample %s: it offers BFCL's function %s (same name and parameters); not trained on",
                        sample.sample_id, copied)
            return None
        try:
            rendered = self.renderer.sample_turns(sample.messages, sample.weights)
        except RenderError as exc:
            raise BuildCheckError(f"sample {sample.sample_id}: {exc}") from None
        # A duplicate is what trains the same: the same tokens and labels. Tool-call ids are not rendered, so
        # windows that differ only in them (their step numbers) are duplicates too.
        key = hashlib.sha1(json.dumps([rendered.input_ids, rendered.labels]).encode()).hexdigest()
        if key in self.seen:
            self.dropped["duplicate"] += 1
            return None
        turns = check_masks(sample.sample_id, rendered, sample.weights, self.renderer.eot_id)
        if turns == 0:
            self.dropped["no_supervised_turns"] += 1
            return None
        if episode is not None and steps is not None:
            check_inference(self.renderer, episode, sample, rendered, steps)
        if self.max_len is not None and len(rendered.input_ids) > self.max_len:
            raise BuildCheckError(
                f"sample {sample.sample_id} has {len(rendered.input_ids)} tokens after windowing, more than "
                f"--max-seq-length {self.max_len}: one turn alone is too long; raise the limit"
            )
        self.seen.add(key)
        if sample.sample_id in self.ids:  # another kept sample has this id (inputs whose episode ids collide)
            n = 2
            while f"{sample.sample_id}#{n}" in self.ids:
                n += 1
            sample.sample_id = f"{sample.sample_id}#{n}"
            self.report.sample_ids_renamed += 1
        self.ids.add(sample.sample_id)
        sample.metadata.update(tokens=len(rendered.input_ids), supervised_tokens=len(rendered.labels) - rendered.labels.count(IGNORE_INDEX),
                               supervised_turns=turns)
        return BuiltSample(sample, rendered)


def build_dataset(
    inputs: str | Path | list[str | Path],
    out_dir: str | Path,
    model: str = "smollm2-135m",
    max_seq_length: int | None = None,
    skip_bad: bool = False,
    renderer: Renderer | None = None,
    bfcl_check: bool = True,
    mcp_current: dict[str, dict[str, str]] | None = None,
) -> BuildReport:
    """Build `samples.jsonl`, `tokenized.jsonl`, `data_card.json` and `build_report.json` in `out_dir`.

    Args:
        inputs: episode (or canonical sample) JSONL files.
        out_dir: the output folder (created).
        model: whose tokenizer and chat template render the data (ignored when `renderer` is given).
        max_seq_length: the token limit; longer episodes are windowed with the harness's memory code.
        skip_bad: count and skip malformed lines instead of stopping at the first.
        renderer: a ready `Renderer` (tests and the main job reuse one).
        mcp_current: server name -> tool -> definition hash of an MCP server's tools now
            (`agentrig.mcp.client.current_tool_hashes`); episodes that used another version are dropped.
        bfcl_check: refuse samples whose user text is a BFCL question or whose tools reproduce a BFCL
            function (name and parameter names) (skipped with a warning when the bfcl-eval data is not installed).
    """
    started = time.perf_counter()
    paths = [Path(p) for p in ([inputs] if isinstance(inputs, (str, Path)) else inputs)]
    for path in paths:
        expect_kind(path, ("episodes", "samples"), "--in", SCHEMA_VERSIONS)
    renderer = renderer or Renderer.for_model(model)
    out = Path(out_dir)
    report = BuildReport([str(p) for p in paths], str(out), model, renderer.template_name, max_seq_length)
    is_bfcl = bfcl_checker() if bfcl_check else None
    report.bfcl_check = "on" if is_bfcl is not None else ("not installed" if bfcl_check else "off")
    builder = _Builder(renderer, max_seq_length, report, is_bfcl, mcp_current)
    built: list[BuiltSample] = []
    for record in read_records(paths, skip_bad, report):
        built.extend(builder.add(record))
    report.kept = dict(builder.kept)
    report.dropped = dict(builder.dropped)
    report.mcp_changed_tools = [f"{server}/{tool}" for server, tools in report.mcp_tool_versions.items()
                                for tool, hashes in tools.items() if len(hashes) > 1]
    if report.mcp_changed_tools and mcp_current is None:
        log.warning("MCP tools in more than one version across the inputs (the server changed between "
                    "collections): %s; pass --mcp-server SPEC to keep only episodes that match its tools now",
                    ", ".join(report.mcp_changed_tools))
    report.samples = len(built)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "samples.jsonl", (b.sample.to_dict() for b in built))
    write_jsonl(
        out / "tokenized.jsonl",
        ({"sample_id": b.sample.sample_id, "input_ids": b.rendered.input_ids, "labels": b.rendered.labels} for b in built),
    )
    report.seconds = round(time.perf_counter() - started, 3)
    (out / "data_card.json").write_text(json.dumps(data_card(built, renderer, report), indent=2, ensure_ascii=False) + "\n")
    (out / "build_report.json").write_text(json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n")
    return report


def write_jsonl(path: Path, rows: Any) -> int:
    """Write dicts one per line (compact, UTF-8); returns the count."""
    n = 0
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
            n += 1
    return n


def data_card(built: list[BuiltSample], renderer: Renderer, report: BuildReport) -> dict[str, Any]:
    """Counts, token statistics, families, faults and mask figures of the built data."""
    lengths = sorted(len(b.rendered.input_ids) for b in built)
    supervised = [sum(x != IGNORE_INDEX for x in b.rendered.labels) for b in built]
    turns = Counter()
    for b in built:
        for k, _, _ in b.rendered.turns:
            turns["supervised" if b.sample.weights[k] > 0 else "masked_weight_0"] += 1

    def pct(q: float) -> int:
        return lengths[min(len(lengths) - 1, int(q * len(lengths)))] if lengths else 0

    meta = [b.sample.metadata for b in built]
    return {
        "samples": len(built),
        "episodes_kept": sum(v for k, v in report.kept.items() if k != "sample"),
        "kept": report.kept,
        "dropped": report.dropped,
        "model": report.model,
        "template": renderer.template_name,
        "end_of_turn": renderer.end_of_turn,
        "max_seq_length": report.max_seq_length,
        "tokens": {
            "total": sum(lengths),
            "supervised": sum(supervised),
            "supervised_fraction": round(sum(supervised) / sum(lengths), 4) if lengths else 0.0,
            "mean": round(statistics.fmean(lengths), 1) if lengths else 0.0,
            "p50": pct(0.5),
            "p95": pct(0.95),
            "max": lengths[-1] if lengths else 0,
        },
        "families": dict(Counter(m.get("family", "") for m in meta)),
        "envs": dict(Counter(m.get("env", "") for m in meta)),
        "splits": dict(Counter(m.get("split", "") for m in meta)),
        "faults": dict(Counter(f for m in meta for f in m.get("faults", []))),
        "windows": sum(1 for m in meta if m.get("windows", 1) > 1),
        "masks": {
            "assistant_turns": dict(turns),
            "system_user_tool": "not supervised",
            "end_of_turn_supervised": True,
        },
    }
