"""Reading JSON-lines files of objects, and telling which of agentrig's files (or folders) a path is.

Every reader of a JSONL file we did not just write ourselves (tokenized samples, preference pairs, data
exports, BFCL data) goes through `iter_jsonl`, so a malformed file always fails the same way: a
`DataError` with `path:line` and what is wrong there, never a bare `JSONDecodeError` traceback.

Every command that takes a user's file or folder first asks `expect_kind` whether it is the kind it reads
(`path_kind` looks at the first JSON object's keys, or at a folder's marker files), so a samples file given
where tokenized data is expected, an episodes file where pairs are, a folder, an empty or gzipped file all
fail before anything expensive loads, with one paragraph: the path, what it is, what was expected and
which command writes that. Not covered: a file whose first records are of one kind and later ones of
another (the readers name the line), and folders we did not write (they are just "a folder").
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from agentrig.errors import DataError

# kind -> (what it is, the command that writes it): the words of every wrong-input message.
KINDS: dict[str, tuple[str, str]] = {
    "episodes": ("an episodes file", "`agentrig collect` (also `agentrig eval`'s episodes_*.jsonl, `agentrig demo`)"),
    "samples": ("a samples file (samples.jsonl: messages and loss weights, not tokens)", "`agentrig data build`"),
    "tokenized": ("a tokenized dataset (tokenized.jsonl)", "`agentrig data build`"),
    "pairs": ("a preference-pairs file", "`agentrig data pairs`"),
    "pairs_llamafactory": ("a preference-pairs file in LLaMA-Factory's format",
                           "`agentrig data pairs --format llamafactory`"),
    "export": ("a data export for another trainer (TRL, OpenAI, axolotl or LLaMA-Factory rows)",
               "`agentrig data build --format`"),
    "build": ("a `data build` output folder", "`agentrig data build`"),
    "export_folder": ("a data export folder", "`agentrig data build --format`"),
    "adapter": ("a LoRA adapter folder", "`agentrig train` (OUTPUT_DIR/adapter)"),
    "train_run": ("a training output folder", "`agentrig train`"),
    "eval": ("an evaluation folder", "`agentrig eval`"),
    "model": ("a full model folder", "`agentrig export --merge`"),
}
# What a path is when it is none of KINDS.
STATES: dict[str, str] = {
    "missing": "there is no such file or folder",
    "folder": "it is a folder",
    "empty": "the file is empty",
    "binary": "it is a binary file, not JSON lines (compressed? unpack it first)",
    "not_jsonl": "its first lines are not JSON objects",
    "unknown": "its records are JSON objects of no kind agentrig writes",
}
# (found, expected) -> what to do instead; {path} is the path given.
HINTS: dict[tuple[str, str], str] = {
    ("samples", "tokenized"): "the tokenized.jsonl beside it (or their folder) is what this reads",
    ("episodes", "tokenized"): "build it first: `agentrig data build --in {path} --out DIR`",
    ("pairs", "tokenized"): "pairs are for DPO (`stage: dpo` in an `agentrig train` config)",
    ("episodes", "pairs"): "make pairs from it: `agentrig data pairs --in {path} --out pairs.jsonl`",
    ("samples", "pairs"): "pairs are made from episodes: `agentrig data pairs --in EPISODES.jsonl`",
    ("tokenized", "pairs"): "pairs are made from episodes: `agentrig data pairs --in EPISODES.jsonl`",
    ("samples", "episodes"): "pairs are made from the episodes the build read, not from its samples",
    ("build", "episodes"): "give the episodes file it was built from",
    ("pairs_llamafactory", "pairs"): "agentrig trains on TRL's format: write it with `agentrig data pairs --format trl`",
    ("train_run", "adapter"): "its adapter is {path}/adapter",
    ("export_folder", "tokenized"): "give the `data build` folder it was exported from",
    ("export", "tokenized"): "give the `data build` folder it was exported from",
}
SNIFF_LINES = 20  # lines looked at for the first JSON object (a few bad ones are the readers' to name)


def cut_off(raw: bytes) -> str:
    """What to add to a bad line's message when the file ends inside it (a writer killed mid-line)."""
    return "" if raw.endswith(b"\n") else "; the file ends inside this line: it was cut off (a writer killed mid-line?)"


def _decode_error(path: Path, lineno: int, raw: bytes, exc: json.JSONDecodeError) -> DataError:
    return DataError(f"{path}:{lineno}: not valid JSON ({exc.msg} at column {exc.colno}){cut_off(raw)}")


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield `(line number, object)` for each non-blank line; a line that is not a JSON object raises DataError."""
    path = Path(path)
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except UnicodeDecodeError:
                raise DataError(f"{path}:{lineno}: not UTF-8 text: {STATES['binary']}") from None
            except json.JSONDecodeError as exc:
                raise _decode_error(path, lineno, raw, exc) from None
            if not isinstance(row, dict):
                raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
            yield lineno, row


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All objects of a JSON-lines file (see `iter_jsonl`)."""
    return [row for _, row in iter_jsonl(path)]


def read_json(path: str | Path, made_by: str) -> Any:
    """One JSON file (a config or card we wrote); DataError naming it and `made_by` when it is not valid JSON."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        return json.loads(raw)
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text ({STATES['binary']}); write it again with {made_by}") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); the file is damaged or cut off: "
                        f"write it again with {made_by}") from None


# -- what kind of file a path is ----------------------------------------------------------------


def record_kind(row: dict[str, Any]) -> str:
    """The KINDS name of a file whose records look like `row`, or "unknown"."""
    if "steps" in row and "task" in row:
        return "episodes"
    if row.get("kind") == "sample" or ("messages" in row and "weights" in row):
        return "samples"
    if "input_ids" in row and "labels" in row:
        return "tokenized"
    if "chosen_ids" in row or ("prompt" in row and isinstance(row.get("chosen"), list)):
        return "pairs"
    if "conversations" in row and "chosen" in row:
        return "pairs_llamafactory"
    if "messages" in row or "conversations" in row:
        return "export"
    return "unknown"


def _folder_kind(path: Path) -> str:
    markers = [("adapter", "adapter_config.json"), ("build", "tokenized.jsonl"), ("export_folder", "export_report.json"),
               ("train_run", "adapter/adapter_config.json"), ("eval", "metrics.json"), ("model", "config.json")]
    return next((kind for kind, marker in markers if (path / marker).is_file()), "folder")


def first_record(path: str | Path) -> tuple[int, dict[str, Any]] | None:
    """The first JSON object among a file's first SNIFF_LINES non-blank lines, with its line number."""
    with Path(path).open("rb") as fh:
        seen = 0
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError:  # a UnicodeDecodeError goes to the caller: not text at all
                row = None
            if isinstance(row, dict):
                return lineno, row
            seen += 1
            if seen >= SNIFF_LINES:
                break
    return None


def path_kind(path: str | Path) -> str:
    """What `path` is: a KINDS name, or one of STATES (missing, folder, empty, binary, not_jsonl, unknown)."""
    path = Path(path)
    if path.is_dir():
        return _folder_kind(path)
    if not path.exists():
        return "missing"
    with path.open("rb") as fh:
        head = fh.read(8192)
    if not head.strip() and path.stat().st_size <= len(head):
        return "empty"
    if b"\x00" in head:
        return "binary"
    try:
        found = first_record(path)
    except UnicodeDecodeError:
        return "binary"
    return record_kind(found[1]) if found else "not_jsonl"


def describe(kind: str) -> str:
    """A kind in words with the command that writes it ("an episodes file, written by `agentrig collect` ..."), or a state."""
    if kind in KINDS:
        what, made_by = KINDS[kind]
        return f"{what}, written by {made_by}"
    return STATES[kind]


def wrong_kind(path: str | Path, found: str, expected: tuple[str, ...], flag: str = "") -> DataError:
    """The one error for a path of the wrong kind: the path, what it is, what was expected and who writes that."""
    by_writer: dict[str, list[str]] = {}
    for kind in expected:
        by_writer.setdefault(KINDS[kind][1], []).append(KINDS[kind][0])
    want = ", or ".join(f"{' or '.join(whats)}, written by {made_by}" for made_by, whats in by_writer.items())
    got = describe(found) if found in STATES else f"this is {describe(found)}"
    hint = next((HINTS[(found, k)] for k in expected if (found, k) in HINTS), "")
    where = f"{flag} {path}" if flag else str(path)
    return DataError(f"{where}: expected {want}; {got}" + (f"; {hint.format(path=path)}" if hint else ""))


def expect_kind(path: str | Path, expected: tuple[str, ...], flag: str = "", versions: dict[str, int] | None = None) -> str:
    """The kind of `path` when it is one of `expected`; otherwise a DataError saying what it is instead.

    `flag` names where the path came from (`--in`, `dataset:`) in the message. With `versions` (kind ->
    the schema version this agentrig reads), a file whose first record has another `schema_version` is
    refused too, naming the line, before anything loads.
    """
    found = path_kind(path)
    if found not in expected:
        raise wrong_kind(path, found, expected, flag)
    if versions and found in versions:
        lineno, row = first_record(path)  # type: ignore[misc]  # path_kind found one
        if row.get("schema_version") != versions[found]:
            raise DataError(f"{path}:{lineno}: {found} of schema version {row.get('schema_version')!r}, from another "
                            f"agentrig; this one reads version {versions[found]}: write them again with its "
                            f"{KINDS[found][1]}")
    return found


def read_adapter_config(adapter_dir: str | Path, flag: str = "--adapter") -> Any:
    """`adapter_config.json` of a LoRA adapter folder; a DataError naming the path when it is not one.

    Every command that takes an adapter (export, eval, chat, serve, collect) calls this before loading the
    model, so a wrong folder, a file, or a damaged config fails at once.
    """
    expect_kind(adapter_dir, ("adapter",), flag)
    return read_json(Path(adapter_dir) / "adapter_config.json", "`agentrig train`")


def check_output_file(path: str | Path, kind: str, flag: str) -> None:
    """Refuse to write a `kind` file at `path` when that is a folder or already holds another kind of file."""
    found = path_kind(path)
    if found in ("missing", "empty", "not_jsonl", kind):
        return
    if Path(path).is_dir():
        got = "it is a folder" if found == "folder" else f"it is a folder ({KINDS[found][0]})"
        raise DataError(f"{flag} {path}: {got}; this writes {KINDS[kind][0]}: give a file path")
    got = STATES[found] if found in STATES else f"it holds {describe(found)}"
    raise DataError(f"{flag} {path}: {got}; writing {KINDS[kind][0]} there would overwrite it: choose another path")


def check_output_folder(path: str | Path, flag: str) -> None:
    """Refuse an output folder path that is an existing file."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise DataError(f"{flag} {path}: this is a file, not a folder; give a folder path for the outputs")
