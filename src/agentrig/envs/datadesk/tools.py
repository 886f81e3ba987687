"""The datadesk tools: API-style lookups over the business database, a safe calculator, a report outbox,
schema browsing, and a read-only `run_sql` fallback.

Every lookup tool is one SQL query plus a function that shapes its rows into the tool's JSON answer
(`LOOKUPS`). The API tool runs the query itself; the expert teacher's fallback sends the same query
through `run_sql` and shapes the rows with the same function, so both paths agree by construction.

`run_sql` security: the file is opened read-only (SQLite URI `mode=ro`), an authorizer denies every
action except reading tables and calling functions (no writes, DDL, PRAGMA, ATTACH, transactions), the
sqlite3 module refuses more than one statement per call, at most `SQL_MAX_ROWS` rows come back, and a
progress handler stops any query after `SQL_TIME_LIMIT_S` seconds. Refusals raise `SQLRefused`, which the
harness turns into a "Tool execution failed: SQLRefused: ..." observation; a missing table or column is answered
with the tables, or the named tables' columns, that exist (`schema_hint`).

Tools are defined once per process from the typed, docstringed methods of `DatadeskAPI` and bound to
a fresh `DatadeskState` per episode by copying (defining a tool validates its schema, ~1 ms each).
"""

from __future__ import annotations

import ast
import copy
import math
import operator
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agentrig.envs.datadesk.db import open_readonly
from agentrig.harness.tools import Tool, tool

NO_RESULT = "No result"
SQL_MAX_ROWS = 50
SQL_TIME_LIMIT_S = 1.0
SQL_MAX_VALUE_BYTES = 100_000  # SQLite's own length limit: no string or blob over this is ever built
SQL_MAX_COLUMNS = 64  # SQLite's column limit for a result (and any table or index it would read)
SQL_MAX_RESULT_CHARS = 200_000  # rows are taken until their text passes this (the model is shown 4,000)
REPORT_BODY_MAX = 2000

# Tool names by family. TICKET_TOOLS are held out: only the test_unseen_tools split offers them.
LOOKUP_TOOLS = ["find_customer", "list_orders", "sales_total", "top_products", "find_product", "stock_level",
                "exchange_rate", "region_info"]
UTILITY_TOOLS = ["calculator", "send_report", "list_tables", "describe_table", "run_sql"]
TICKET_TOOLS = ["list_tickets", "ticket_details", "ticket_counts"]
SEEN_TOOLS = LOOKUP_TOOLS + UTILITY_TOOLS
ALL_TOOLS = SEEN_TOOLS + TICKET_TOOLS


class SQLRefused(Exception):
    """A `run_sql` query that was refused or stopped; the message tells the model why."""


class CalculatorError(Exception):
    """An expression the safe calculator does not accept."""


# -- lookups: one query + one shaper each -------------------------------------------------------


def _round2(x: float | None) -> float:
    return round(float(x or 0.0), 2)


def _shape_customer(cols: list[str], rows: list[list[Any]]) -> dict[str, Any] | str:
    if not rows:
        return NO_RESULT
    r = rows[0]
    return {"customer_id": r[0], "name": r[1], "region": r[2], "segment": r[3]}


def _shape_orders(cols: list[str], rows: list[list[Any]]) -> dict[str, Any] | str:
    if not rows:
        return NO_RESULT
    orders = [{"order_id": r[2], "sku": r[3], "quantity": r[4], "amount": r[5]} for r in rows if r[2] is not None]
    return {"customer_id": rows[0][0], "currency": rows[0][1], "orders": orders, "total": _round2(rows[0][6])}


def _shape_sales(cols: list[str], rows: list[list[Any]]) -> dict[str, Any] | str:
    if not rows or not rows[0][2]:
        return NO_RESULT
    r = rows[0]
    return {"region": r[0], "currency": r[1], "orders": r[2], "total": _round2(r[3])}


def _shape_top(cols: list[str], rows: list[list[Any]]) -> dict[str, Any] | str:
    if not rows:
        return NO_RESULT
    return {"products": [{"sku": r[0], "name": r[1], "units": r[2]} for r in rows]}


def _shape_product(cols: list[str], rows: list[list[Any]]) -> dict[str, Any] | str:
    if not rows:
        return NO_RESULT
    r = rows[0]
    return {"sku": r[0], "name": r[1], "category": r[2], "unit_price_usd": r[3]}


def _shape_stock(cols: list[str], rows: list[list[Any]]) -> dict[str, Any] | str:
    if not rows:
        return NO_RESULT
    return {"sku": rows[0][0], "on_hand": rows[0][3], "warehouses": {r[1]: r[2] for r in rows}}


def _shape_rate(cols: list[str], rows: list[list[Any]]) -> dict[str, Any] | str:
    if not rows or rows[0][0] is None:
        return NO_RESULT
    return {"rate": round(float(rows[0][0]), 6)}


def _shape_region(cols: list[str], rows: list[list[Any]]) -> dict[str, Any] | str:
    if not rows:
        return NO_RESULT
    r = rows[0]
    return {"region": r[0], "currency": r[1], "manager_email": r[2], "customers": r[3]}


def _shape_tickets(cols: list[str], rows: list[list[Any]]) -> dict[str, Any] | str:
    if not rows:
        return NO_RESULT
    return {"tickets": [{"ticket_id": r[0], "opened": r[1], "priority": r[2], "status": r[3], "subject": r[4]}
                        for r in rows]}


def _shape_ticket(cols: list[str], rows: list[list[Any]]) -> dict[str, Any] | str:
    if not rows:
        return NO_RESULT
    r = rows[0]
    return {"ticket_id": r[0], "customer_id": r[1], "opened": r[2], "priority": r[3], "status": r[4], "subject": r[5]}


def _shape_counts(cols: list[str], rows: list[list[Any]]) -> dict[str, Any] | str:
    if not rows:
        return NO_RESULT
    return {"counts": {r[0]: r[1] for r in rows}, "total": rows[0][2]}


@dataclass(frozen=True)
class Lookup:
    """One lookup tool's query (named parameters `:name`) and the shaper of its rows."""

    sql: str
    shape: Callable[[list[str], list[list[Any]]], dict[str, Any] | str]


LOOKUPS: dict[str, Lookup] = {
    "find_customer": Lookup(
        "SELECT c.customer_id, c.name, r.name, c.segment FROM customers c JOIN regions r ON r.region_id = c.region_id "
        "WHERE lower(c.name) = lower(:name)", _shape_customer),
    "list_orders": Lookup(
        "SELECT c.customer_id, r.currency, o.order_id, o.sku, o.quantity, o.amount, ROUND(TOTAL(o.amount) OVER (), 2) "
        "AS total FROM customers c "
        "JOIN regions r ON r.region_id = c.region_id LEFT JOIN orders o ON o.customer_id = c.customer_id "
        "AND o.month = :month WHERE c.customer_id = :customer_id ORDER BY o.order_id", _shape_orders),
    "sales_total": Lookup(
        "SELECT r.name, r.currency, COUNT(o.order_id), ROUND(SUM(o.amount), 2) FROM regions r "
        "JOIN customers c ON c.region_id = r.region_id LEFT JOIN orders o ON o.customer_id = c.customer_id "
        "AND o.month = :month WHERE lower(r.name) = lower(:region) GROUP BY r.region_id", _shape_sales),
    "top_products": Lookup(
        "SELECT p.sku, p.name, SUM(o.quantity) AS units FROM orders o JOIN customers c ON c.customer_id = o.customer_id "
        "JOIN regions r ON r.region_id = c.region_id JOIN products p ON p.sku = o.sku "
        "WHERE lower(r.name) = lower(:region) AND o.month = :month GROUP BY p.sku ORDER BY units DESC, p.sku "
        "LIMIT :limit", _shape_top),
    "find_product": Lookup(
        "SELECT sku, name, category, unit_price_usd FROM products WHERE lower(name) = lower(:name)", _shape_product),
    "stock_level": Lookup(
        "SELECT sku, warehouse, on_hand, SUM(on_hand) OVER () AS total_on_hand FROM inventory WHERE sku = upper(:sku) "
        "ORDER BY warehouse", _shape_stock),
    "exchange_rate": Lookup(
        "SELECT ROUND(a.rate_to_usd / b.rate_to_usd, 6) FROM exchange_rates a JOIN exchange_rates b "
        "ON a.month = b.month WHERE a.currency = upper(:from_currency) AND b.currency = upper(:to_currency) "
        "AND a.month = :month", _shape_rate),
    "region_info": Lookup(
        "SELECT r.name, r.currency, r.manager_email, COUNT(c.customer_id) FROM regions r "
        "LEFT JOIN customers c ON c.region_id = r.region_id WHERE lower(r.name) = lower(:region) "
        "GROUP BY r.region_id", _shape_region),
    "list_tickets": Lookup(
        "SELECT ticket_id, opened, priority, status, subject FROM tickets WHERE customer_id = :customer_id "
        "AND (:status = '' OR status = :status) ORDER BY ticket_id", _shape_tickets),
    "ticket_details": Lookup(
        "SELECT ticket_id, customer_id, opened, priority, status, subject FROM tickets "
        "WHERE ticket_id = upper(:ticket_id)", _shape_ticket),
    "ticket_counts": Lookup(
        "SELECT status, COUNT(*), SUM(COUNT(*)) OVER () AS total FROM tickets WHERE opened = :month GROUP BY status "
        "ORDER BY status", _shape_counts),
}


def sql_literal(value: Any) -> str:
    """An SQL literal for a string or number (strings single-quoted, quotes doubled)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"cannot inline {value!r} into SQL")
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def inline_sql(name: str, arguments: dict[str, Any]) -> str:
    """The lookup's query with its parameters written in as literals (what the teacher sends to run_sql)."""
    return re.sub(r":(\w+)", lambda m: sql_literal(arguments[m.group(1)]), LOOKUPS[name].sql)


def run_lookup(conn: sqlite3.Connection, name: str, arguments: dict[str, Any]) -> dict[str, Any] | str:
    """Run a lookup directly (the API tools and the task generator's ground truth use this)."""
    cur = conn.execute(LOOKUPS[name].sql, arguments)
    cols = [d[0] for d in cur.description]
    return LOOKUPS[name].shape(cols, [list(r) for r in cur.fetchall()])


# -- safe calculator --------------------------------------------------------------------------

_BINOPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}
_FUNCS: dict[str, Callable[..., float]] = {"round": round, "abs": abs, "min": min, "max": max, "sqrt": math.sqrt}


def calculate(expression: str) -> float:
    """Evaluate arithmetic by walking its syntax tree (numbers, + - * / // % **, round/abs/min/max/sqrt); no eval."""
    if len(expression) > 300:
        raise CalculatorError("expression longer than 300 characters")
    try:
        tree = ast.parse(expression.replace("^", "**"), mode="eval")
    except SyntaxError:
        raise CalculatorError(f"cannot parse {expression!r} as arithmetic") from None

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 100 or abs(left) > 1e6):
                raise CalculatorError("exponent too large")
            try:
                return _BINOPS[type(node.op)](left, right)
            except ZeroDivisionError:
                raise CalculatorError("division by zero") from None
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS
                and not node.keywords):
            return _FUNCS[node.func.id](*[ev(a) for a in node.args])
        raise CalculatorError(f"unsupported element {ast.dump(node)[:60]!r}; use numbers and + - * / ( )")

    value = ev(tree)
    if isinstance(value, complex) or (isinstance(value, float) and not math.isfinite(value)):
        raise CalculatorError("result is not a finite real number")
    return round(value, 6) if isinstance(value, float) else value


# -- read-only SQL ----------------------------------------------------------------------------

_ALLOWED_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}
_AUTH_ACTIONS = ["CREATE_INDEX", "CREATE_TABLE", "CREATE_TEMP_INDEX", "CREATE_TEMP_TABLE", "CREATE_TEMP_TRIGGER",
                 "CREATE_TEMP_VIEW", "CREATE_TRIGGER", "CREATE_VIEW", "DELETE", "DROP_INDEX", "DROP_TABLE",
                 "DROP_TEMP_INDEX", "DROP_TEMP_TABLE", "DROP_TEMP_TRIGGER", "DROP_TEMP_VIEW", "DROP_TRIGGER",
                 "DROP_VIEW", "INSERT", "PRAGMA", "READ", "SELECT", "TRANSACTION", "UPDATE", "ATTACH", "DETACH",
                 "ALTER_TABLE", "REINDEX", "ANALYZE", "CREATE_VTABLE", "DROP_VTABLE", "FUNCTION", "SAVEPOINT",
                 "RECURSIVE"]
_ACTION_NAMES = {getattr(sqlite3, "SQLITE_" + n): n.replace("_", " ") for n in _AUTH_ACTIONS}
_DENIED_FUNCTIONS = {"load_extension", "readfile", "writefile"}


@dataclass
class SQLConnection:
    """A read-only connection guarded by an authorizer, and the actions it denied during the last query."""

    conn: sqlite3.Connection
    denied: list[str]


def open_sql_connection(path: str | Path) -> SQLConnection:
    """A read-only connection whose authorizer allows reads only (used by `run_sql`)."""
    conn = open_readonly(path)
    denied: list[str] = []

    def authorizer(action: int, arg1: str | None, arg2: str | None, dbname: str | None, source: str | None) -> int:
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() in _DENIED_FUNCTIONS:
            denied.append(f"function {arg2}")
            return sqlite3.SQLITE_DENY
        if action in _ALLOWED_ACTIONS:
            return sqlite3.SQLITE_OK
        denied.append(_ACTION_NAMES.get(action, str(action)))
        return sqlite3.SQLITE_DENY

    conn.set_authorizer(authorizer)
    # One SQL function call is not interrupted by the progress handler: randomblob(1e9) or
    # printf('%.*c', 2e8, 'x') would build its whole value first. SQLite's length limit refuses it at once.
    conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, SQL_MAX_VALUE_BYTES)
    conn.setlimit(sqlite3.SQLITE_LIMIT_COLUMN, SQL_MAX_COLUMNS)
    return SQLConnection(conn, denied)


# A table a query names after FROM or JOIN, and the alias that may follow it.
_TABLE_REF = re.compile(r"\b(?:FROM|JOIN)\s+([A-Za-z_]\w*)(?:\s+(?:AS\s+)?([A-Za-z_]\w*))?", re.IGNORECASE)
_NOT_ALIAS = {"where", "join", "on", "left", "right", "inner", "outer", "cross", "natural", "group", "order", "limit",
              "using", "union", "having", "as"}


def table_refs(query: str) -> list[tuple[str, str]]:
    """The tables a query names after FROM or JOIN, each with its alias ("" when it has none), in order."""
    return [(name, alias if alias and alias.lower() not in _NOT_ALIAS else "")
            for name, alias in _TABLE_REF.findall(query)]


def schema_hint(conn: sqlite3.Connection, query: str, message: str) -> str:
    """`message` with what a refused query could have used instead, when SQLite says a table or column does not
    exist: every table's name for a missing table; for a missing column, the columns of the tables the query
    names (with their aliases), or of every table when it names none that exists. Other messages are unchanged.
    `conn` is an unguarded connection to the same database (the guarded one refuses PRAGMA)."""
    if not message.startswith(("no such column", "no such table")):
        return message
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    if message.startswith("no such table"):
        return f"{message}; the tables are {', '.join(tables)}"
    known = {t.lower(): t for t in tables}
    refs: dict[str, str] = {}
    for name, alias in table_refs(query):
        if name.lower() in known:
            t = known[name.lower()]
            refs.setdefault(t, "")
            if alias and alias.lower() != t.lower():
                refs[t] = alias
    parts = []
    for t in refs or dict.fromkeys(tables, ""):
        cols = ", ".join(r[1] for r in conn.execute(f"PRAGMA table_info({t})"))
        parts.append(f"{t}{' ' + refs[t] if refs.get(t) else ''} has {cols}")
    return f"{message}; " + "; ".join(parts)


def run_readonly_sql(guarded: SQLConnection, query: str, max_rows: int = SQL_MAX_ROWS,
                     time_limit_s: float = SQL_TIME_LIMIT_S) -> dict[str, Any]:
    """Run one read-only statement on an `open_sql_connection`; raise `SQLRefused` with a clear reason."""
    conn, denied = guarded.conn, guarded.denied
    denied.clear()
    deadline = time.monotonic() + time_limit_s
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 2000)
    try:
        cur = conn.execute(query)
        rows, size = [], 0
        while len(rows) <= max_rows and size <= SQL_MAX_RESULT_CHARS:
            row = cur.fetchone()
            if row is None:
                break
            rows.append(row)
            size += sum(len(v) if isinstance(v, (str, bytes)) else 8 for v in row)
    except sqlite3.ProgrammingError as exc:
        if "one statement" in str(exc):
            raise SQLRefused("only one SQL statement per call is allowed") from None
        raise SQLRefused(str(exc)) from None
    except sqlite3.DatabaseError as exc:
        if denied:
            raise SQLRefused(f"run_sql is read-only: {', '.join(sorted(set(denied)))} is not allowed; "
                             "write one SELECT statement") from None
        if "interrupted" in str(exc):
            raise SQLRefused(f"query stopped after the {time_limit_s:g} s time limit; narrow it with WHERE "
                             "or aggregate") from None
        if "too big" in str(exc):
            raise SQLRefused(f"a value over {SQL_MAX_VALUE_BYTES} bytes was refused; select shorter values") from None
        if "too many columns" in str(exc):
            raise SQLRefused(f"a result may have at most {SQL_MAX_COLUMNS} columns") from None
        raise SQLRefused(str(exc)) from None
    finally:
        conn.set_progress_handler(None, 0)
    if cur.description is None:
        raise SQLRefused("the statement returned no rows; write one SELECT statement")
    if size > SQL_MAX_RESULT_CHARS:  # the row that passed the budget is dropped: nothing huge is serialized
        rows = rows[:-1]
        out: dict[str, Any] = {"columns": [d[0] for d in cur.description], "rows": [list(r) for r in rows]}
        out["note"] = (f"only the first {len(rows)} rows are shown (the result passed {SQL_MAX_RESULT_CHARS} "
                       "characters); select fewer or shorter columns")
        return out
    out = {"columns": [d[0] for d in cur.description], "rows": [list(r) for r in rows[:max_rows]]}
    if len(rows) > max_rows:
        out["note"] = f"only the first {max_rows} rows are shown; add LIMIT, WHERE or aggregate"
    return out


# -- state and the tool methods ---------------------------------------------------------------


@dataclass
class Report:
    """A report sent through `send_report` (the environment's side effect)."""

    to: str
    subject: str
    body: str


@dataclass
class DatadeskState:
    """One episode's state: the read-only database, opened lazily, and the outbox of sent reports."""

    db_file: Path
    reports: list[Report] = field(default_factory=list)
    _conn: sqlite3.Connection | None = None
    _sql: SQLConnection | None = None

    def conn(self) -> sqlite3.Connection:
        """The read-only connection the API tools use."""
        if self._conn is None:
            self._conn = open_readonly(self.db_file)
        return self._conn

    def sql_conn(self) -> SQLConnection:
        """The read-only, authorizer-guarded connection `run_sql` uses."""
        if self._sql is None:
            self._sql = open_sql_connection(self.db_file)
        return self._sql

    def close(self) -> None:
        """Close the connections (the episode is over)."""
        if self._conn is not None:
            self._conn.close()
        if self._sql is not None:
            self._sql.conn.close()
        self._conn = self._sql = None


_MONTH = r"^\d{4}-\d{2}$"


class DatadeskAPI:
    """The datadesk tools as typed, docstringed methods; `bind_tools` turns them into `Tool`s."""

    def __init__(self, state: DatadeskState | None):
        self.state = state

    def _lookup(self, lookup: str, **arguments: Any) -> dict[str, Any] | str:
        assert self.state is not None
        return run_lookup(self.state.conn(), lookup, arguments)

    def find_customer(self, name: str) -> dict[str, Any] | str:
        """Find a customer by full name.

        Args:
            name: The customer's full name, e.g. "Ada Berg".
        """
        return self._lookup("find_customer", name=name)

    def list_orders(self, customer_id: str, month: str) -> dict[str, Any] | str:
        """List a customer's orders in one month, with their total in the customer's currency.

        Args:
            customer_id: The customer id, e.g. "C1004".
            month: The month as YYYY-MM.
        """
        return self._lookup("list_orders", customer_id=customer_id, month=month)

    def sales_total(self, region: str, month: str) -> dict[str, Any] | str:
        """Total sales of a region in one month, in the region's currency.

        Args:
            region: The region name, e.g. "North".
            month: The month as YYYY-MM.
        """
        return self._lookup("sales_total", region=region, month=month)

    def top_products(self, region: str, month: str, limit: int = 3) -> dict[str, Any] | str:
        """The best-selling products of a region in one month, by units sold.

        Args:
            region: The region name.
            month: The month as YYYY-MM.
            limit: How many products to return (1-10).
        """
        return self._lookup("top_products", region=region, month=month, limit=max(1, min(10, limit)))

    def find_product(self, name: str) -> dict[str, Any] | str:
        """Find a product by name; returns its SKU, category and unit price in USD.

        Args:
            name: The product name, e.g. "Desk Chair".
        """
        return self._lookup("find_product", name=name)

    def stock_level(self, sku: str) -> dict[str, Any] | str:
        """Units on hand of a product, in total and per warehouse.

        Args:
            sku: The product SKU, e.g. "OF-142".
        """
        return self._lookup("stock_level", sku=sku)

    def exchange_rate(self, from_currency: str, to_currency: str, month: str) -> dict[str, Any] | str:
        """The exchange rate for one month: 1 unit of from_currency = rate units of to_currency.

        Args:
            from_currency: ISO code, e.g. "EUR".
            to_currency: ISO code, e.g. "USD".
            month: The month as YYYY-MM.
        """
        return self._lookup("exchange_rate", from_currency=from_currency, to_currency=to_currency, month=month)

    def region_info(self, region: str) -> dict[str, Any] | str:
        """A region's currency, manager e-mail and number of customers.

        Args:
            region: The region name.
        """
        return self._lookup("region_info", region=region)

    def calculator(self, expression: str) -> dict[str, Any]:
        """Evaluate an arithmetic expression (numbers, + - * / ** and parentheses).

        Args:
            expression: The arithmetic, e.g. "(1200.5 - 980) / 980 * 100".
        """
        return {"result": calculate(expression)}

    def send_report(self, to: str, subject: str, body: str) -> dict[str, Any]:
        """Send a short written report by e-mail.

        Args:
            to: The recipient's e-mail address.
            subject: The subject line.
            body: The report text.
        """
        assert self.state is not None
        if not re.fullmatch(r"[^@\s]+@[^@\s]+\.[A-Za-z]+", to):
            raise ValueError(f"{to!r} is not an e-mail address")
        if len(body) > REPORT_BODY_MAX:
            raise ValueError(f"the body is longer than {REPORT_BODY_MAX} characters")
        self.state.reports.append(Report(to, subject, body))
        return {"status": "sent", "to": to, "report_id": f"R{len(self.state.reports)}"}

    def list_tables(self) -> dict[str, Any]:
        """List the tables of the business database."""
        assert self.state is not None
        rows = self.state.conn().execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
        return {"tables": [r[0] for r in rows]}

    def describe_table(self, table: str) -> dict[str, Any] | str:
        """The columns of one table, with their types.

        Args:
            table: The table name, e.g. "orders".
        """
        assert self.state is not None
        known = {r[0] for r in self.state.conn().execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if table not in known:
            return NO_RESULT
        cols = self.state.conn().execute(f'PRAGMA table_info("{table}")').fetchall()
        return {"table": table, "columns": [{"name": c[1], "type": c[2]} for c in cols]}

    def run_sql(self, query: str) -> dict[str, Any]:
        """Run one read-only SQL SELECT on the business database (at most 50 rows are returned).

        Args:
            query: One SQLite SELECT statement.
        """
        assert self.state is not None
        try:
            return run_readonly_sql(self.state.sql_conn(), query)
        except SQLRefused as exc:  # a missing table or column: name the ones that exist, so the query can be fixed
            raise SQLRefused(schema_hint(self.state.conn(), query, str(exc))) from None

    def list_tickets(self, customer_id: str, status: str = "") -> dict[str, Any] | str:
        """List a customer's support tickets, optionally only those with one status.

        Args:
            customer_id: The customer id, e.g. "C1004".
            status: "open", "pending" or "closed"; empty for all.
        """
        return self._lookup("list_tickets", customer_id=customer_id, status=status)

    def ticket_details(self, ticket_id: str) -> dict[str, Any] | str:
        """The details of one support ticket.

        Args:
            ticket_id: The ticket id, e.g. "T5012".
        """
        return self._lookup("ticket_details", ticket_id=ticket_id)

    def ticket_counts(self, month: str) -> dict[str, Any] | str:
        """How many support tickets were opened in a month, by status.

        Args:
            month: The month as YYYY-MM.
        """
        return self._lookup("ticket_counts", month=month)


# Tools with side effects (their definitions say so too): faults never run them and then corrupt the output.
SIDE_EFFECT_TOOLS = ("send_report",)


def _templates() -> dict[str, Tool]:
    api = DatadeskAPI(None)
    out = {name: tool(getattr(api, name), timeout_s=5.0, side_effects=name in SIDE_EFFECT_TOOLS) for name in ALL_TOOLS}
    for name in ("month",):  # months are strings "YYYY-MM": say so in the schema, the model sees it
        for t in out.values():
            prop = t.parameters["properties"].get(name)
            if prop is not None:
                prop["pattern"] = _MONTH
    # re-create so the validators see the patched schemas
    return {n: Tool(t.name, t.description, t.parameters, t.fn, t.timeout_s, t.side_effects) for n, t in out.items()}


TEMPLATES: dict[str, Tool] = _templates()


def bind_tools(state: DatadeskState, names: list[str] | None = None) -> list[Tool]:
    """The tools (all, or `names`) bound to one episode's state."""
    api = DatadeskAPI(state)
    out = []
    for name in names or ALL_TOOLS:
        t = copy.copy(TEMPLATES[name])
        t.fn = getattr(api, name)
        out.append(t)
    return out


# -- variants for augmentation and faults (Environment.tool_aliases, param_aliases, drift_names) ----

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
# How a drifted field is renamed (a plausible new API version); unknown fields get a "_v2" suffix.
DRIFT_NAMES = {"total": "total_amount", "on_hand": "qty_on_hand", "rate": "fx_rate", "customer_id": "cust_id",
               "region": "region_name", "products": "items", "orders": "order_list", "result": "value",
               "rows": "data", "manager_email": "manager_contact", "tickets": "ticket_list", "counts": "by_status",
               "currency": "ccy", "segment": "customer_segment", "sku": "product_code", "tables": "table_names",
               "columns": "fields", "status": "state"}
