"""BFCL test data: entries of the seven offline categories, read from the installed `bfcl-eval` package.

The package is located with `importlib.util.find_spec`, so none of its modules (which import vendor SDKs)
are executed. Question files are JSON lines; `possible_answer/` holds the allowed values per argument for
single-turn categories and the ground-truth call strings per turn for multi-turn ones.

BFCL is test data only. `bfcl_questions()` and `is_bfcl_question()` let the data build refuse any sample
whose user text is a BFCL question (all categories, not only the seven run here); `is_bfcl_function()` one
whose offered tools include a function BFCL documents.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrig.errors import AgentrigError, DataError
from agentrig.jsonl import read_jsonl

# The categories `agentrig bench bfcl` runs, in report order, with BFCL's entry counts.
CATEGORIES: tuple[str, ...] = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "multi_turn_base",
)

# Multi-turn entries name the backend classes they use; their function documents live here.
MULTI_TURN_DOC_FILES: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system.json",
    "MathAPI": "math_api.json",
    "MessageAPI": "message_api.json",
    "TwitterAPI": "posting_api.json",
    "TicketAPI": "ticket_api.json",
    "TradingBot": "trading_bot.json",
    "TravelAPI": "travel_booking.json",
    "VehicleControlAPI": "vehicle_control.json",
}

INSTALL_HINT = 'install it with `pip install --no-deps "bfcl-eval==2026.3.23"` (or `pip install agentrig[bfcl]` then that line)'


class BfclNotInstalled(AgentrigError):
    """The `bfcl-eval` package (the source of the test data) is not installed."""


@dataclass
class BfclEntry:
    """One BFCL test entry, as shipped, with its answer key.

    `turns` holds the messages of each user turn (single-turn categories have one turn; live categories may
    start it with a system message). `answer` is, for single-turn categories, BFCL's possible answers
    (a list of `{function_name: {param: [allowed values]}}`, `""` among the values = may be omitted); for
    multi-turn, a list per turn of ground-truth call strings; empty for irrelevance.
    """

    id: str
    category: str
    turns: list[list[dict[str, str]]]
    functions: list[dict[str, Any]]
    answer: list[Any] = field(default_factory=list)
    initial_config: dict[str, Any] = field(default_factory=dict)
    involved_classes: list[str] = field(default_factory=list)

    @property
    def is_multi_turn(self) -> bool:
        """True for multi_turn_* entries, which execute on BFCL's backends."""
        return self.category.startswith("multi_turn")


def data_dir() -> Path:
    """The `data/` folder of the installed `bfcl_eval` package, found without importing it."""
    spec = importlib.util.find_spec("bfcl_eval")
    if spec is None or not spec.submodule_search_locations:
        raise BfclNotInstalled(f"the BFCL test data comes from the `bfcl-eval` package, which is not installed; {INSTALL_HINT}")
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    if not folder.is_dir():
        raise BfclNotInstalled(f"`bfcl-eval` is installed but has no data folder at {folder}; reinstall it: {INSTALL_HINT}")
    return folder


def _multi_turn_functions(folder: Path, classes: list[str], entry_id: str) -> list[dict[str, Any]]:
    functions: list[dict[str, Any]] = []
    for name in classes:
        if name not in MULTI_TURN_DOC_FILES:
            raise DataError(f"{entry_id}: backend class {name!r} is not one of {sorted(MULTI_TURN_DOC_FILES)}")
        functions.extend(read_jsonl(folder / "multi_turn_func_doc" / MULTI_TURN_DOC_FILES[name]))
    return functions


def load_category(category: str, limit: int | None = None) -> list[BfclEntry]:
    """The entries of one category in file order (the first `limit` when given), answers attached."""
    if category not in CATEGORIES:
        raise AgentrigError(f"unknown BFCL category {category!r}; choose from {', '.join(CATEGORIES)}")
    folder = data_dir()
    rows = read_jsonl(folder / f"BFCL_v4_{category}.json")
    if limit is not None:
        rows = rows[:limit]
    answers: dict[str, list[Any]] = {}
    answer_path = folder / "possible_answer" / f"BFCL_v4_{category}.json"
    if category != "irrelevance":
        answers = {row["id"]: row["ground_truth"] for row in read_jsonl(answer_path)}
    entries: list[BfclEntry] = []
    for row in rows:
        entry_id = row["id"]
        if category != "irrelevance" and entry_id not in answers:
            raise DataError(f"{answer_path}: no answer for {entry_id}")
        classes = list(row.get("involved_classes", []))
        functions = _multi_turn_functions(folder, classes, entry_id) if category.startswith("multi_turn") else row["function"]
        entries.append(
            BfclEntry(
                id=entry_id,
                category=category,
                turns=row["question"],
                functions=functions,
                answer=answers.get(entry_id, []),
                initial_config=row.get("initial_config", {}),
                involved_classes=classes,
            )
        )
    return entries


def normalize_question(text: str) -> str:
    """Case-folded text with whitespace runs collapsed: the form contamination checks compare."""
    return re.sub(r"\s+", " ", text).strip().casefold()


def _question_files(folder: Path) -> list[Path]:
    # format_sensitivity is a JSON object of entry ids, not a question file.
    files = [p for p in sorted(folder.glob("BFCL_v4_*.json")) if p.name != "BFCL_v4_format_sensitivity.json"]
    files += sorted((folder / "memory_prereq_conversation").glob("*.json"))
    files += sorted((folder / "unused_datasets" / "question").glob("*.json"))
    return files


def _user_texts(question: Any) -> list[str]:
    # Current files: a list of turns, each a list of messages. Retired files (unused_datasets) also hold a
    # bare string (chatable) or one flat list of messages (sql).
    if isinstance(question, str):
        return [question]
    texts: list[str] = []
    for item in question:
        if isinstance(item, list):
            texts.extend(_user_texts(item))
        elif isinstance(item, dict) and item.get("role") == "user" and isinstance(item.get("content"), str):
            texts.append(item["content"])
    return texts


def bfcl_function_names() -> frozenset[str]:
    """The name of every function any BFCL question file or multi-turn backend documents (case-folded)."""
    return frozenset(_functions())


def is_bfcl_function(name: str, params: Any = None) -> bool:
    """True when a tool named `name` (case-insensitive) is one of BFCL's functions; with `params` (its
    parameter names), only when some BFCL definition of that name has exactly those parameters."""
    shapes = _functions().get(name.casefold())
    if shapes is None:
        return False
    return params is None or frozenset(params) in shapes


@functools.lru_cache(maxsize=1)
def _functions() -> dict[str, set[frozenset[str]]]:
    folder = data_dir()
    out: dict[str, set[frozenset[str]]] = {}

    def add(fn: Any) -> None:
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            props = (fn.get("parameters") or {}).get("properties") or {}
            out.setdefault(fn["name"].casefold(), set()).add(frozenset(props))

    for path in _question_files(folder):
        for row in read_jsonl(path):
            for fn in row.get("function") or []:
                add(fn)
    for doc in MULTI_TURN_DOC_FILES.values():
        for fn in read_jsonl(folder / "multi_turn_func_doc" / doc):
            add(fn)
    return out


@functools.lru_cache(maxsize=1)
def _question_set() -> frozenset[str]:
    texts: set[str] = set()
    for path in _question_files(data_dir()):
        for row in read_jsonl(path):
            texts.update(normalize_question(text) for text in _user_texts(row["question"]))
    texts.discard("")
    return frozenset(texts)


def bfcl_questions() -> set[str]:
    """Normalized text of every user message in every BFCL question file the package ships (a copy)."""
    return set(_question_set())


def is_bfcl_question(text: str) -> bool:
    """True when `text` (after normalization) is the user text of a BFCL question."""
    return normalize_question(text) in _question_set()
