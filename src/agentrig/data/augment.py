"""Augmentation (seed section 4.2): paraphrase, consistent per-episode renaming, tool-frequency balance.

- Paraphrase: every family has several templates (`envs/datadesk/tasks.py`); `paraphrase` adds light
  rewriting on top (politeness wrappers, casing, punctuation), seeded per episode.
- Renaming: `rename_spec` picks, per episode, new names and descriptions for the offered tools and new
  names for some parameters; `renamed_toolset` applies it consistently (the allowlist too), and the
  task records it in `metadata["rename"]` so the expert teacher writes the renamed calls.
- Balance: `tool_frequencies` counts calls in episodes; `flatten_weights` turns the tools each family
  needs into family weights that even out how often each tool is used.
- Detours (a wrong step the harness rejects, weight 0, then the correction) are written by the teacher
  (`ExpertTeacher(detour_rate=...)`); `Augment.detour_rate` carries the setting.
"""

from __future__ import annotations

import copy
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterable

from agentrig.harness.tools import Tool, ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec

TOOL_ALIASES: dict[str, list[tuple[str, str]]] = {
    "find_customer": [("lookup_customer", "Look up one customer record by the customer's full name."),
                      ("customer_search", "Search the customer directory for an exact full name.")],
    "list_orders": [("get_orders", "Fetch all orders a customer placed in a given month, plus their total."),
                    ("customer_orders", "Orders of one customer for one month, with the month's total.")],
    "sales_total": [("region_sales", "Sum of all sales in one region for one month (region currency)."),
                    ("monthly_revenue", "Monthly revenue total of a sales region, in its own currency.")],
    "top_products": [("best_sellers", "Products with the most units sold in a region during a month."),
                     ("product_ranking", "Ranks products by units sold for one region and month.")],
    "find_product": [("product_lookup", "Look up a product by its name to get SKU, category and price."),
                     ("search_catalog", "Find a catalogue item by exact product name.")],
    "stock_level": [("inventory_count", "Current units on hand for a SKU, total and per warehouse."),
                    ("check_stock", "How many units of a SKU are in stock right now.")],
    "exchange_rate": [("fx_rate", "Currency conversion rate for a month: 1 from-unit in to-units."),
                      ("currency_rate", "Monthly exchange rate between two ISO currencies.")],
    "region_info": [("region_details", "Details of a sales region: currency, manager contact, customer count."),
                    ("describe_region", "Facts about one region, including the manager's e-mail.")],
    "calculator": [("calc", "Evaluates an arithmetic expression safely."),
                   ("compute", "Computes the value of a numeric expression.")],
    "send_report": [("email_report", "E-mail a written report to one recipient."),
                    ("dispatch_report", "Sends a report message to an e-mail address.")],
    "list_tables": [("show_tables", "Names of all tables in the database.")],
    "describe_table": [("table_schema", "Column names and types of a database table.")],
    "run_sql": [("sql_query", "Execute a single read-only SELECT against the database (max 50 rows)."),
                ("query_db", "Read-only SQL: one SELECT statement, at most 50 rows back.")],
}
PARAM_ALIASES: dict[str, list[str]] = {
    "month": ["period", "year_month"], "region": ["region_name", "area"], "customer_id": ["client_id", "cust_id"],
    "name": ["full_name", "query_name"], "sku": ["product_code", "item_sku"], "expression": ["expr", "formula"],
    "query": ["sql", "statement"], "from_currency": ["base"], "to_currency": ["quote"], "limit": ["top_n", "count"],
    "to": ["recipient"], "table": ["table_name"],
}
_PREFIXES = ["", "", "Please: ", "Quick question. ", "Hi! ", "Could you help? ", "For the weekly review: "]
_SUFFIXES = ["", "", " Thanks!", " Thank you.", " Keep it short.", " ASAP please."]


@dataclass
class Augment:
    """Augmentation settings for collection (all off by default)."""

    paraphrase: float = 0.0  # probability of light rewriting of the prompt
    rename: float = 0.0  # probability of renaming the tools of an episode
    detour_rate: float = 0.0  # probability of a detour (teacher-side)
    balance: bool = False  # flatten tool frequencies by reweighting families
    family_weights: dict[str, float] = field(default_factory=dict)


def paraphrase(prompt: str, rng: random.Random) -> str:
    """Light rewriting: a politeness prefix or suffix, lower-cased start, or a dropped final '?'."""
    out = prompt
    prefix, suffix = rng.choice(_PREFIXES), rng.choice(_SUFFIXES)
    if prefix and rng.random() < 0.5:
        out = out[0].lower() + out[1:] if out[:1].isupper() and out[1:2].islower() else out
    if rng.random() < 0.3 and out.endswith("?"):
        out = out[:-1]
    return f"{prefix}{out}{suffix}".strip()


def rename_spec(tools: Iterable[str], rng: random.Random) -> dict[str, Any]:
    """New names/descriptions for the given tools and some of their parameters (consistent in one episode)."""
    spec: dict[str, Any] = {"tools": {}, "descriptions": {}, "params": {}}
    for name in tools:
        if name not in TOOL_ALIASES:
            continue
        new, desc = rng.choice(TOOL_ALIASES[name])
        spec["tools"][name] = new
        spec["descriptions"][name] = desc
    return spec


def _param_map(tool: Tool, rng: random.Random) -> dict[str, str]:
    return {p: rng.choice(PARAM_ALIASES[p]) for p in tool.parameters.get("properties", {})
            if p in PARAM_ALIASES and rng.random() < 0.5}


def apply_rename(task: TaskSpec, toolset: ToolSet, rng: random.Random) -> tuple[TaskSpec, ToolSet]:
    """Rename the task's offered tools (and some parameters) consistently; the task records the mapping."""
    spec = rename_spec(task.allowed_tools, rng)
    renamed: list[Tool] = []
    for name in task.allowed_tools:
        t = toolset.get(name)
        assert t is not None
        if name not in spec["tools"]:
            renamed.append(t)
            continue
        params = _param_map(t, rng)
        if params:
            spec["params"][name] = params
        renamed.append(t.renamed(spec["tools"][name], spec["descriptions"][name], params))
    task = copy.deepcopy(task)
    task.allowed_tools = [spec["tools"].get(n, n) for n in task.allowed_tools]
    task.metadata["rename"] = {"tools": spec["tools"], "params": spec["params"]}
    return task, ToolSet(renamed, allowed=task.allowed_tools, max_output_chars=toolset.max_output_chars)


def tool_frequencies(episodes: Iterable[Episode], canonical: bool = True) -> Counter[str]:
    """How often each tool was called (renamed tools counted under their original names)."""
    counts: Counter[str] = Counter()
    for ep in episodes:
        back = {v: k for k, v in (ep.task.metadata.get("rename") or {}).get("tools", {}).items()} if canonical else {}
        for step in ep.steps:
            for call in step.calls:
                counts[back.get(call.name, call.name)] += 1
    return counts


def flatten_weights(family_tools: dict[str, list[str]], rounds: int = 50) -> dict[str, float]:
    """Family weights that even out tool usage: repeatedly damp families whose tools are over-used."""
    weights = {f: 1.0 for f in family_tools}
    for _ in range(rounds):
        usage: Counter[str] = Counter()
        for f, tools in family_tools.items():
            for t in tools:
                usage[t] += weights[f]
        if not usage:
            break
        mean = sum(usage.values()) / len(usage)
        for f, tools in family_tools.items():
            if tools:
                load = sum(usage[t] for t in tools) / len(tools)
                weights[f] *= (mean / load) ** 0.5
        total = sum(weights.values())
        weights = {f: w * len(weights) / total for f, w in weights.items()}
    return weights
