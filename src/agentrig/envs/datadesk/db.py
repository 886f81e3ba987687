"""The datadesk business database: a deterministic, seeded SQLite file generated at first use.

Tables: regions (with their currency and manager), customers, products, orders (one row per order,
amount in the region's currency, month as 'YYYY-MM'), inventory (per warehouse), exchange_rates
(per currency and month, to USD) and tickets (the held-out support-ticket area).

The same seed gives the same bytes of content on every machine: only `random.Random(seed)` and
values rounded at generation time are used. The file lives in `$AGENTRIG_CACHE/datadesk/` (default
`~/.cache/agentrig`) and is written to a temporary name and renamed, so concurrent workers never see
a half-written database. Everything that reads it opens it read-only (`open_readonly`).
"""

from __future__ import annotations

import os
import random
import sqlite3
import tempfile
from pathlib import Path

DB_VERSION = 1
MONTHS = [f"2024-{m:02d}" for m in range(1, 13)]
# region -> (currency, manager e-mail)
REGIONS: dict[str, tuple[str, str]] = {
    "North": ("EUR", "north.manager@datadesk.example"),
    "South": ("EUR", "south.manager@datadesk.example"),
    "East": ("JPY", "east.manager@datadesk.example"),
    "West": ("USD", "west.manager@datadesk.example"),
    "Central": ("CHF", "central.manager@datadesk.example"),
    "Coastal": ("GBP", "coastal.manager@datadesk.example"),
    "Alpine": ("CHF", "alpine.manager@datadesk.example"),
    "Metro": ("USD", "metro.manager@datadesk.example"),
}
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF"]
_BASE_RATE_TO_USD = {"USD": 1.0, "EUR": 1.09, "GBP": 1.27, "JPY": 0.0068, "CHF": 1.12}
_LOCAL_PER_USD = {c: 1.0 / r for c, r in _BASE_RATE_TO_USD.items()}
SEGMENTS = ["retail", "wholesale", "enterprise", "public"]
WAREHOUSES = ["Rotterdam", "Austin", "Osaka"]
_FIRST = ["Ada", "Ben", "Chloe", "Dmitri", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Luis",
          "Maya", "Nils", "Olga", "Priya", "Quinn", "Rosa", "Sven", "Tariq", "Uma", "Viktor", "Wen", "Yara", "Zoe"]
_LAST = ["Abbott", "Berg", "Costa", "Dubois", "Eriksen", "Fischer", "Garcia", "Haas", "Ivanov", "Jensen", "Kato",
         "Lindqvist", "Moreau", "Novak", "Okafor", "Petrov", "Rossi", "Sato", "Tanaka", "Varga", "Weber", "Young"]
_COMPANY = ["Trading", "Foods", "Logistics", "Labs", "Outfitters", "Supply", "Works", "Studio", "Partners", "Goods"]
_PRODUCTS = {
    "hardware": ["Steel Bracket", "Hex Bolt Set", "Cordless Drill", "Tape Measure", "Work Lamp", "Ladder"],
    "office": ["Desk Chair", "Standing Desk", "Paper Ream", "Stapler", "Monitor Arm", "Whiteboard"],
    "kitchen": ["Chef Knife", "Cast Pan", "Kettle", "Coffee Grinder", "Cutting Board", "Spice Rack"],
    "outdoor": ["Tent", "Sleeping Bag", "Trail Pack", "Water Filter", "Camp Stove", "Headlamp"],
    "electronics": ["USB Hub", "Webcam", "Headset", "Power Bank", "Router", "Smart Plug"],
}
TICKET_SUBJECTS = ["late delivery", "damaged item", "invoice question", "login problem", "refund request",
                   "wrong size", "missing part", "warranty claim"]
TICKET_STATUSES = ["open", "pending", "closed"]
TICKET_PRIORITIES = ["low", "normal", "high", "urgent"]

SCHEMA = """
CREATE TABLE regions (region_id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, currency TEXT NOT NULL,
                      manager_email TEXT NOT NULL);
CREATE TABLE customers (customer_id TEXT PRIMARY KEY, name TEXT UNIQUE NOT NULL, region_id INTEGER NOT NULL,
                        segment TEXT NOT NULL, email TEXT NOT NULL);
CREATE TABLE products (sku TEXT PRIMARY KEY, name TEXT UNIQUE NOT NULL, category TEXT NOT NULL,
                       unit_price_usd REAL NOT NULL);
CREATE TABLE orders (order_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, sku TEXT NOT NULL, month TEXT NOT NULL,
                     quantity INTEGER NOT NULL, amount REAL NOT NULL, currency TEXT NOT NULL);
CREATE TABLE inventory (sku TEXT NOT NULL, warehouse TEXT NOT NULL, on_hand INTEGER NOT NULL,
                        PRIMARY KEY (sku, warehouse));
CREATE TABLE exchange_rates (currency TEXT NOT NULL, month TEXT NOT NULL, rate_to_usd REAL NOT NULL,
                             PRIMARY KEY (currency, month));
CREATE TABLE tickets (ticket_id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, opened TEXT NOT NULL,
                      priority TEXT NOT NULL, status TEXT NOT NULL, subject TEXT NOT NULL);
CREATE INDEX orders_by_month ON orders (month, customer_id);
CREATE INDEX orders_by_customer ON orders (customer_id, month);
CREATE INDEX tickets_by_customer ON tickets (customer_id);
"""


def cache_root() -> Path:
    """The agentrig cache folder (`$AGENTRIG_CACHE`, default `~/.cache/agentrig`)."""
    return Path(os.environ.get("AGENTRIG_CACHE", Path.home() / ".cache" / "agentrig"))


def db_path(seed: int = 0) -> Path:
    """Where the database for `seed` lives (it may not exist yet; see `ensure_db`)."""
    return cache_root() / "datadesk" / f"datadesk-v{DB_VERSION}-seed{seed}.sqlite"


def ensure_db(seed: int = 0) -> Path:
    """Return the database path for `seed`, generating the file first if it is missing."""
    path = db_path(seed)
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".datadesk-", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp)
        try:
            generate(conn, seed)
            conn.commit()
        finally:
            conn.close()
        os.replace(tmp, path)  # atomic: a concurrent generator writes the same content
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def open_readonly(path: str | Path) -> sqlite3.Connection:
    """Open the database read-only (SQLite URI mode=ro); usable from the harness's worker threads."""
    conn = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True, check_same_thread=False)
    return conn


def generate(conn: sqlite3.Connection, seed: int) -> None:
    """Fill an empty database with the seeded business data."""
    rng = random.Random(f"datadesk-{DB_VERSION}-{seed}")
    conn.executescript(SCHEMA)
    for i, (name, (cur, mail)) in enumerate(REGIONS.items(), start=1):
        conn.execute("INSERT INTO regions VALUES (?, ?, ?, ?)", (i, name, cur, mail))
    region_ids = list(range(1, len(REGIONS) + 1))

    products: list[tuple[str, str, str, float]] = []
    for cat, names in _PRODUCTS.items():
        for name in names:
            sku = f"{cat[:2].upper()}-{100 + len(products) * 7}"
            products.append((sku, name, cat, round(rng.uniform(4, 400), 2)))
    conn.executemany("INSERT INTO products VALUES (?, ?, ?, ?)", products)
    for sku, *_ in products:
        for wh in WAREHOUSES:
            conn.execute("INSERT INTO inventory VALUES (?, ?, ?)", (sku, wh, rng.randint(0, 900)))

    for cur in CURRENCIES:
        for m in MONTHS:
            rate = 1.0 if cur == "USD" else round(_BASE_RATE_TO_USD[cur] * rng.uniform(0.96, 1.04), 6)
            conn.execute("INSERT INTO exchange_rates VALUES (?, ?, ?)", (cur, m, rate))

    names: set[str] = set()
    customers: list[tuple[str, str, int, str, str]] = []
    while len(customers) < 160:
        if rng.random() < 0.5:
            name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
        else:
            name = f"{rng.choice(_LAST)} {rng.choice(_COMPANY)}"
        if name in names:
            continue
        names.add(name)
        cid = f"C{1000 + len(customers)}"
        email = name.lower().replace(" ", ".") + "@mail.example"
        customers.append((cid, name, rng.choice(region_ids), rng.choice(SEGMENTS), email))
    conn.executemany("INSERT INTO customers VALUES (?, ?, ?, ?, ?)", customers)

    currency_of = {i: REGIONS[n][0] for i, n in enumerate(REGIONS, start=1)}
    order_no = 0
    for cid, _name, rid, _seg, _mail in customers:
        cur = currency_of[rid]
        for m in MONTHS:
            for _ in range(rng.choice([0, 1, 1, 2, 2, 3, 4])):
                sku, _pn, _cat, price = rng.choice(products)
                qty = rng.randint(1, 12)
                amount = round(qty * price * _LOCAL_PER_USD[cur] * rng.uniform(0.9, 1.1), 2)
                order_no += 1
                conn.execute("INSERT INTO orders VALUES (?, ?, ?, ?, ?, ?, ?)",
                             (f"O{100000 + order_no}", cid, sku, m, qty, amount, cur))
    ticket_no = 0
    for cid, *_ in customers:
        for _ in range(rng.choice([0, 0, 1, 1, 2, 3])):
            ticket_no += 1
            conn.execute("INSERT INTO tickets VALUES (?, ?, ?, ?, ?, ?)",
                         (f"T{5000 + ticket_no}", cid, rng.choice(MONTHS), rng.choice(TICKET_PRIORITIES),
                          rng.choice(TICKET_STATUSES), rng.choice(TICKET_SUBJECTS)))
