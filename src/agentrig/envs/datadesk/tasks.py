"""Datadesk task families: seeded generators with several phrasings each, ground truth from the database.

A task is (family, variant, params). Its split is decided by a hash of that key, so the same question
can never land in two splits (train 70 %, dev 15 %, test 15 % of the key space); the support-ticket
family uses the held-out ticket tools and exists only in `test_unseen_tools`. Task i of a split depends
only on (db seed, split, seed, i). Each task's allowlist = the tools its solution needs, `run_sql` as the
fallback (for data tasks), and 2-3 distractors; the teacher reads `metadata["params"]`, the checker
reads `expected` (figures, terms, report side effect, flags).
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
from dataclasses import dataclass
from typing import Any, Callable

from agentrig.envs.datadesk.db import CURRENCIES, MONTHS, REGIONS, SEGMENTS
from agentrig.envs.datadesk.tools import LOOKUP_TOOLS, NO_RESULT, run_lookup
from agentrig.harness.trajectory import TaskSpec

FAMILIES = ["single_lookup", "chained_lookup", "currency_aggregation", "comparison", "report", "arithmetic",
            "long_task", "impossible", "no_tool", "ranking", "sql_query"]
UNSEEN_FAMILIES = ["support_tickets"]
_MONTH_NAMES = ["January", "February", "March", "April", "May", "June", "July", "August", "September",
                "October", "November", "December"]
_MISSING_MONTHS = ["2023-11", "2023-12", "2025-01", "2025-02", "2025-06", "2026-03"]
_FAKE_FIRST = ["Brigitte", "Cosimo", "Delphine", "Evander", "Florin", "Gunnhild", "Horatio", "Isolde"]
_FAKE_LAST = ["Quintero", "Wexford", "Yilmaz", "Zabala", "Oyelaran", "Thorsby", "Marchetti", "Kowalczyk"]
_FAKE_PRODUCTS = ["Laser Level", "Garden Hose", "Soup Ladle", "Fountain Pen", "Snow Shovel", "Bike Pump"]
_RECIPIENTS = ["cfo@datadesk.example", "ops.team@datadesk.example", "board@datadesk.example",
               "sales.lead@datadesk.example", "analyst@datadesk.example"]


def month_text(month: str, rng: random.Random) -> str:
    """A month as the user might write it: "2024-03", "March 2024" or "Mar 2024"."""
    y, m = month.split("-")
    name = _MONTH_NAMES[int(m) - 1]
    return rng.choice([month, f"{name} {y}", f"{name[:3]} {y}"])


@dataclass
class Draft:
    """A task before it gets its id and split: the parts a family generator decides."""

    variant: str
    params: dict[str, Any]
    prompt: str
    needed: list[str]
    expected: dict[str, Any]


class TaskFactory:
    """Generates datadesk tasks from the database (ground truth via the same lookups the tools run)."""

    def __init__(self, conn: sqlite3.Connection, db_seed: int):
        self.conn = conn
        self.db_seed = db_seed
        q = conn.execute
        self.customers = [tuple(r) for r in q("SELECT customer_id, name FROM customers ORDER BY customer_id")]
        self.products = [tuple(r) for r in q("SELECT sku, name FROM products ORDER BY sku")]
        self.regions = list(REGIONS)
        self.tickets = [r[0] for r in q("SELECT ticket_id FROM tickets ORDER BY ticket_id")]
        self.families: dict[str, Callable[[random.Random], Draft]] = {
            "single_lookup": self._single_lookup, "chained_lookup": self._chained_lookup,
            "currency_aggregation": self._currency_aggregation, "comparison": self._comparison,
            "report": self._report, "arithmetic": self._arithmetic, "long_task": self._long_task,
            "impossible": self._impossible, "no_tool": self._no_tool, "ranking": self._ranking,
            "sql_query": self._sql_query, "support_tickets": self._support_tickets,
        }

    # -- assembling --------------------------------------------------------------------------
    def task(self, split: str, seed: int, index: int, family_weights: dict[str, float] | None = None) -> TaskSpec:
        """Task `index` of `split`: draws (family, params) until the key hashes into this split."""
        rng = random.Random(f"datadesk/{self.db_seed}/{split}/{seed}/{index}")
        if split == "test_unseen_tools":
            families = UNSEEN_FAMILIES
            weights = [1.0]
        else:
            families = FAMILIES
            weights = [(family_weights or {}).get(f, 1.0) for f in families]
        draft: Draft | None = None
        while draft is None:
            family = rng.choices(families, weights=weights)[0]
            for _ in range(100):  # small families (no_tool) may have few keys in a split: then redraw the family
                candidate = self.families[family](rng)
                key = f"{family}/{candidate.variant}/{sorted(candidate.params.items())}"
                if split == "test_unseen_tools" or split_of(key) == split:
                    draft = candidate
                    break
        allowed = self._allowlist(draft.needed, family, rng, unseen=split == "test_unseen_tools")
        flags = {"impossible": family == "impossible", "no_tool": family == "no_tool",
                 "unseen_tools": family in UNSEEN_FAMILIES}
        expected = dict(draft.expected, **flags, needed_tools=list(draft.needed))
        return TaskSpec(
            id=f"datadesk-{split}-s{seed}-{index:06d}", prompt=draft.prompt, env="datadesk", family=family,
            split=split, allowed_tools=allowed, expected=expected,
            metadata={"variant": draft.variant, "params": draft.params, "key": key, **flags},
        )

    def _allowlist(self, needed: list[str], family: str, rng: random.Random, unseen: bool) -> list[str]:
        tools = list(dict.fromkeys(needed))
        if family not in ("no_tool",) and "run_sql" not in tools:
            tools.append("run_sql")
        pool = [t for t in LOOKUP_TOOLS + ["calculator", "list_tables", "describe_table"] if t not in tools]
        tools += rng.sample(pool, rng.choice([2, 3]))
        rng.shuffle(tools)
        return tools

    # -- lookups for ground truth ---------------------------------------------------------------
    def _look(self, lookup: str, **args: Any) -> Any:
        return run_lookup(self.conn, lookup, args)

    def _pick_month(self, rng: random.Random) -> str:
        return rng.choice(MONTHS)

    # -- families --------------------------------------------------------------------------------
    def _single_lookup(self, rng: random.Random) -> Draft:
        variant = rng.choice(["sales", "stock", "manager", "segment"])
        if variant == "sales":
            region, month = rng.choice(self.regions), self._pick_month(rng)
            res = self._look("sales_total", region=region, month=month)
            mt = month_text(month, rng)
            prompt = rng.choice([
                f"What were total sales in the {region} region in {mt}?",
                f"How much did {region} sell in {mt}?",
                f"Give me the {region} sales total for {mt}.",
                f"Sales for region {region}, {mt}?",
                f"I need {region}'s total sales in {mt}.",
            ])
            return Draft(variant, {"region": region, "month": month}, prompt, ["sales_total"],
                         {"figures": [_money(res["total"])], "terms": []})
        if variant == "stock":
            sku, name = rng.choice(self.products)
            res = self._look("stock_level", sku=sku)
            prompt = rng.choice([
                f"How many units of {sku} do we have in stock?",
                f"What's the stock level for SKU {sku}?",
                f"Check inventory for {sku}, please.",
                f"How much {sku} is on hand across all warehouses?",
            ])
            return Draft(variant, {"sku": sku}, prompt, ["stock_level"], {"figures": [_count(res["on_hand"])], "terms": []})
        if variant == "manager":
            region = rng.choice(self.regions)
            res = self._look("region_info", region=region)
            prompt = rng.choice([
                f"Who manages the {region} region? I need their e-mail.",
                f"What's the manager e-mail for {region}?",
                f"Give me the contact address of the {region} region manager.",
                f"Which e-mail reaches the {region} manager?",
            ])
            return Draft(variant, {"region": region}, prompt, ["region_info"],
                         {"figures": [], "terms": [res["manager_email"]]})
        cid, name = rng.choice(self.customers)
        res = self._look("find_customer", name=name)
        prompt = rng.choice([
            f"Which region is the customer {name} in?",
            f"Look up {name}: what region and segment are they?",
            f"What segment does customer {name} belong to, and where are they?",
            f"Find {name} in the customer records and tell me their region.",
        ])
        return Draft(variant, {"name": name}, prompt, ["find_customer"],
                     {"figures": [], "terms": [res["region"]]})

    def _chained_lookup(self, rng: random.Random) -> Draft:
        variant = rng.choice(["customer_spend", "product_stock", "customer_manager"])
        if variant == "customer_spend":
            cid, name = rng.choice(self.customers)
            month = self._pick_month(rng)
            res = self._look("list_orders", customer_id=cid, month=month)
            mt = month_text(month, rng)
            prompt = rng.choice([
                f"How much did {name} spend in {mt}?",
                f"What was the order total for customer {name} in {mt}?",
                f"Total of {name}'s orders in {mt}?",
                f"Tell me what {name} ordered in {mt}, in total.",
            ])
            return Draft(variant, {"name": name, "month": month}, prompt, ["find_customer", "list_orders"],
                         {"figures": [_money(res["total"])], "terms": []})
        if variant == "product_stock":
            sku, pname = rng.choice(self.products)
            res = self._look("stock_level", sku=sku)
            prompt = rng.choice([
                f"How many {pname} units are in stock?",
                f"Do we have {pname} in stock? How many?",
                f"What's the total stock of the product {pname}?",
                f"Check how many {pname}s we have across warehouses.",
            ])
            return Draft(variant, {"product": pname}, prompt, ["find_product", "stock_level"],
                         {"figures": [_count(res["on_hand"])], "terms": [sku]})
        cid, name = rng.choice(self.customers)
        cust = self._look("find_customer", name=name)
        res = self._look("region_info", region=cust["region"])
        prompt = rng.choice([
            f"Who is the regional manager for customer {name}? Give me the e-mail.",
            f"I need to escalate something for {name}: which manager e-mail covers them?",
            f"Find the e-mail of the manager responsible for {name}'s region.",
        ])
        return Draft(variant, {"name": name}, prompt, ["find_customer", "region_info"],
                     {"figures": [], "terms": [res["manager_email"]]})

    def _currency_aggregation(self, rng: random.Random) -> Draft:
        r1, r2 = rng.sample(self.regions, 2)
        month = self._pick_month(rng)
        target = rng.choice(CURRENCIES)
        total = 0.0
        for r in (r1, r2):
            s = self._look("sales_total", region=r, month=month)
            rate = self._look("exchange_rate", from_currency=s["currency"], to_currency=target, month=month)["rate"]
            total += s["total"] * rate
        mt = month_text(month, rng)
        prompt = rng.choice([
            f"What were combined sales of {r1} and {r2} in {mt}, in {target}?",
            f"Add up {r1} and {r2} sales for {mt} and give me the total in {target}.",
            f"Total {r1} + {r2} revenue for {mt}, converted to {target}?",
            f"In {target}, how much did {r1} and {r2} sell together in {mt}?",
        ])
        return Draft("pair", {"regions": [r1, r2], "month": month, "currency": target}, prompt,
                     ["sales_total", "exchange_rate", "calculator"], {"figures": [_converted(total, 2)], "terms": []})

    def _comparison(self, rng: random.Random) -> Draft:
        variant = rng.choice(["months", "stock"])
        if variant == "months":
            region = rng.choice(self.regions)
            m1, m2 = sorted(rng.sample(MONTHS, 2))
            a = self._look("sales_total", region=region, month=m1)["total"]
            b = self._look("sales_total", region=region, month=m2)["total"]
            t1, t2 = month_text(m1, rng), month_text(m2, rng)
            prompt = rng.choice([
                f"Did {region} sell more in {t1} or in {t2}?",
                f"Compare {region} sales between {t1} and {t2}: which month was higher?",
                f"Which was the better month for {region}, {t1} or {t2}?",
            ])
            winner = m1 if a >= b else m2
            return Draft(variant, {"region": region, "months": [m1, m2]}, prompt, ["sales_total"],
                         {"figures": [_money(a), _money(b)], "terms": [], "winner": winner, "candidates": [m1, m2]})
        (s1, _n1), (s2, _n2) = rng.sample(self.products, 2)
        a = self._look("stock_level", sku=s1)["on_hand"]
        b = self._look("stock_level", sku=s2)["on_hand"]
        prompt = rng.choice([
            f"Which has more stock, {s1} or {s2}?",
            f"Compare stock levels of {s1} and {s2}.",
            f"Do we hold more units of {s1} or of {s2}?",
        ])
        return Draft(variant, {"skus": [s1, s2]}, prompt, ["stock_level"],
                     {"figures": [_count(a), _count(b)], "terms": [], "winner": s1 if a >= b else s2, "candidates": [s1, s2]})

    def _report(self, rng: random.Random) -> Draft:
        r1, r2 = rng.sample(self.regions, 2)
        month = self._pick_month(rng)
        to = rng.choice(_RECIPIENTS)
        figs = [self._look("sales_total", region=r, month=month)["total"] for r in (r1, r2)]
        mt = month_text(month, rng)
        prompt = rng.choice([
            f"Summarize {mt} sales for {r1} and {r2} and send the report to {to}.",
            f"Send {to} a short report on {r1} and {r2} sales in {mt}.",
            f"Please e-mail {to} the {mt} sales totals of {r1} and {r2}.",
            f"Report {r1} and {r2} sales for {mt} to {to}.",
        ])
        return Draft("two_regions", {"regions": [r1, r2], "month": month, "to": to}, prompt,
                     ["sales_total", "send_report"],
                     {"figures": [], "terms": [], "report": {"to": to, "figures": [_money(f) for f in figs]}})

    def _arithmetic(self, rng: random.Random) -> Draft:
        variant = rng.choice(["pct_change", "avg_order"])
        if variant == "pct_change":
            region = rng.choice(self.regions)
            m1, m2 = sorted(rng.sample(MONTHS, 2))
            a = self._look("sales_total", region=region, month=m1)["total"]
            b = self._look("sales_total", region=region, month=m2)["total"]
            t1, t2 = month_text(m1, rng), month_text(m2, rng)
            prompt = rng.choice([
                f"By what percent did {region} sales change from {t1} to {t2}?",
                f"What's the percentage change in {region} sales between {t1} and {t2}?",
                f"{region}: % change in sales, {t1} vs {t2}?",
            ])
            return Draft(variant, {"region": region, "months": [m1, m2]}, prompt, ["sales_total", "calculator"],
                         {"figures": [_percent((b - a) / a * 100)], "terms": []})
        for _ in range(50):
            cid, name = rng.choice(self.customers)
            month = self._pick_month(rng)
            res = self._look("list_orders", customer_id=cid, month=month)
            if len(res["orders"]) >= 2:
                break
        mt = month_text(month, rng)
        prompt = rng.choice([
            f"What was {name}'s average order value in {mt}?",
            f"Average order amount for customer {name} in {mt}?",
            f"Work out the mean order size of {name} for {mt}.",
        ])
        return Draft(variant, {"name": name, "month": month}, prompt, ["find_customer", "list_orders", "calculator"],
                     {"figures": [_money(res["total"] / len(res["orders"]))], "terms": []})

    def _long_task(self, rng: random.Random) -> Draft:
        regions = rng.sample(self.regions, 3)
        month = self._pick_month(rng)
        total = 0.0
        for r in regions:
            s = self._look("sales_total", region=r, month=month)
            rate = self._look("exchange_rate", from_currency=s["currency"], to_currency="USD", month=month)["rate"]
            total += s["total"] * rate
        mt = month_text(month, rng)
        a, b, c = regions
        prompt = rng.choice([
            f"For {mt}, get sales of {a}, {b} and {c}, convert each to USD and give me the combined USD total.",
            f"I need {a}, {b} and {c} sales in {mt} in USD, plus their sum.",
            f"Convert {mt} sales of {a}, {b} and {c} to USD and add them up.",
        ])
        return Draft("three_regions_usd", {"regions": regions, "month": month}, prompt,
                     ["sales_total", "exchange_rate", "calculator"], {"figures": [_converted(total, 3)], "terms": []})

    def _impossible(self, rng: random.Random) -> Draft:
        variant = rng.choice(["unknown_customer", "missing_month", "unknown_product"])
        if variant == "unknown_customer":
            name = f"{rng.choice(_FAKE_FIRST)} {rng.choice(_FAKE_LAST)}"
            mt = month_text(self._pick_month(rng), rng)
            prompt = rng.choice([
                f"How much did {name} spend in {mt}?",
                f"What's the order total of customer {name} for {mt}?",
                f"Pull {name}'s orders for {mt} and total them.",
            ])
            return Draft(variant, {"name": name, "month_text": mt}, prompt, ["find_customer", "list_orders"],
                         {"figures": [], "terms": []})
        if variant == "missing_month":
            region, month = rng.choice(self.regions), rng.choice(_MISSING_MONTHS)
            mt = month_text(month, rng)
            prompt = rng.choice([
                f"What were total sales in {region} in {mt}?",
                f"How much did {region} sell in {mt}?",
                f"Give me {region}'s sales for {mt}.",
            ])
            return Draft(variant, {"region": region, "month": month}, prompt, ["sales_total"],
                         {"figures": [], "terms": []})
        pname = rng.choice(_FAKE_PRODUCTS)
        prompt = rng.choice([
            f"How many {pname} units are in stock?",
            f"What's our stock of {pname}?",
            f"Check inventory for the product {pname}.",
        ])
        return Draft(variant, {"product": pname}, prompt, ["find_product", "stock_level"], {"figures": [], "terms": []})

    def _no_tool(self, rng: random.Random) -> Draft:
        key = rng.choice(list(NO_TOOL_ANSWERS))
        prompt = rng.choice(NO_TOOL_ANSWERS[key][0])
        return Draft(key, {"topic": key, "prompt": prompt}, prompt, [], {"figures": [], "terms": []})

    def _ranking(self, rng: random.Random) -> Draft:
        region, month, k = rng.choice(self.regions), self._pick_month(rng), rng.choice([1, 2, 3])
        res = self._look("top_products", region=region, month=month, limit=k)
        mt = month_text(month, rng)
        what = "product" if k == 1 else f"{k} products"
        prompt = rng.choice([
            f"What were the top {what} in {region} in {mt}?",
            f"Which {what} sold the most units in {region} during {mt}?",
            f"Best-selling {what} for {region}, {mt}?",
        ])
        return Draft("top_k", {"region": region, "month": month, "limit": k}, prompt, ["top_products"],
                     {"figures": [], "terms": [p["name"] for p in res["products"]]})

    def _sql_query(self, rng: random.Random) -> Draft:
        variant = rng.choice(["segment_count", "month_orders"])
        if variant == "segment_count":
            region, segment = rng.choice(self.regions), rng.choice(SEGMENTS)
            n = self.conn.execute(
                "SELECT COUNT(*) FROM customers c JOIN regions r ON r.region_id = c.region_id "
                "WHERE r.name = ? AND c.segment = ?", (region, segment)).fetchone()[0]
            prompt = rng.choice([
                f"How many {segment} customers do we have in {region}?",
                f"Count the customers in the {segment} segment in region {region}.",
                f"Number of {segment}-segment customers in {region}?",
            ])
            return Draft(variant, {"region": region, "segment": segment}, prompt, ["describe_table", "run_sql"],
                         {"figures": [_count(n)], "terms": []})
        month = self._pick_month(rng)
        n = self.conn.execute("SELECT COUNT(*) FROM orders WHERE month = ?", (month,)).fetchone()[0]
        mt = month_text(month, rng)
        prompt = rng.choice([
            f"How many orders were placed company-wide in {mt}?",
            f"Count all orders in {mt} across every region.",
            f"What's the total number of orders in {mt}?",
        ])
        return Draft(variant, {"month": month}, prompt, ["describe_table", "run_sql"], {"figures": [_count(n)], "terms": []})

    def _support_tickets(self, rng: random.Random) -> Draft:
        variant = rng.choice(["open_count", "month_counts", "ticket_status"])
        if variant == "open_count":
            cid, name = rng.choice(self.customers)
            status = rng.choice(["open", "pending", "closed"])
            res = self._look("list_tickets", customer_id=cid, status=status)
            n = 0 if res == NO_RESULT else len(res["tickets"])
            prompt = rng.choice([
                f"How many {status} support tickets does {name} have?",
                f"Count {name}'s {status} tickets.",
                f"Number of {status} tickets for customer {name}?",
            ])
            return Draft(variant, {"name": name, "status": status}, prompt, ["find_customer", "list_tickets"],
                         {"figures": [_count(n)], "terms": []})
        if variant == "month_counts":
            month = self._pick_month(rng)
            res = self._look("ticket_counts", month=month)
            n = 0 if res == NO_RESULT else res["total"]
            mt = month_text(month, rng)
            prompt = rng.choice([
                f"How many support tickets were opened in {mt}?",
                f"Ticket volume for {mt}?",
                f"Count the tickets opened during {mt}.",
            ])
            return Draft(variant, {"month": month}, prompt, ["ticket_counts"], {"figures": [_count(n)], "terms": []})
        tid = rng.choice(self.tickets)
        res = self._look("ticket_details", ticket_id=tid)
        prompt = rng.choice([
            f"What's the status of ticket {tid}?",
            f"Look up support ticket {tid}: status and subject?",
            f"Is ticket {tid} still open? What is it about?",
        ])
        return Draft(variant, {"ticket_id": tid}, prompt, ["ticket_details"],
                     {"figures": [], "terms": [res["status"], res["subject"]]})


# topic -> (phrasings, the expert's answer). Answers contain no figures.
NO_TOOL_ANSWERS: dict[str, tuple[list[str], str]] = {
    "greeting": (["Hi there!", "Hello, are you there?", "Good morning!"],
                 "Hello! I can look up customers, orders, sales, stock and exchange rates, and send reports. "
                 "What would you like to know?"),
    "capabilities": (["What can you do?", "What kind of questions can you answer?", "How can you help me?"],
                     "I can look up customers and their orders, regional sales totals, best-selling products, "
                     "stock levels and exchange rates, do arithmetic on the results, and send a report by e-mail."),
    "sku_meaning": (["What does SKU stand for?", "What is an SKU?", "Quick question: meaning of SKU?"],
                    "SKU stands for stock keeping unit: the code that identifies one product in inventory."),
    "revenue_vs_profit": (["What's the difference between revenue and profit?",
                           "Is revenue the same as profit?", "Explain revenue vs profit briefly."],
                          "Revenue is the money taken in from sales; profit is what remains after costs are subtracted."),
    "thanks": (["Thanks, that's all!", "Great, thank you.", "That's everything, thanks."],
               "You're welcome! Ask any time you need more figures."),
    "exchange_rate_meaning": (["What does an exchange rate mean?", "How do exchange rates work, in one sentence?"],
                              "An exchange rate says how many units of one currency you get for one unit of another."),
}


def split_of(key: str) -> str:
    """The split a task key belongs to: a hash bucket, so no key is ever in two splits."""
    bucket = int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) % 100
    return "train" if bucket < 70 else "dev" if bucket < 85 else "test"



# -- expected figures, by kind (see envs.base.figure_matches) --------------------------------------
def _money(x: float) -> dict[str, Any]:
    """An amount in its own currency: stated to the cent."""
    return {"value": round(x, 2), "kind": "money"}


def _count(n: int) -> dict[str, Any]:
    """A count: stated exactly."""
    return {"value": int(n), "kind": "count"}


def _converted(x: float, terms: int) -> dict[str, Any]:
    """A sum of `terms` converted amounts: each term may be rounded to the cent before adding."""
    return {"value": round(x, 2), "kind": "approx", "tol": round(0.005 * (terms + 1), 3)}


def _percent(x: float) -> dict[str, Any]:
    """A percentage: stated to at least one decimal."""
    return {"value": round(x, 2), "kind": "approx", "tol": 0.05}
