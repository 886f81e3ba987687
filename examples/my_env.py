"""A complete small custom environment: a shop with prices and a cart.

Run it:  agentrig collect --env examples/my_env.py:make_env --split train --episodes 20 --out /tmp/shop.jsonl
Tasks ask to put items in the cart and report the cost; the checker looks at the cart (the side effect)
and at the figure in the final answer. `expert()` returns a tiny scripted solver so `--teacher expert` works.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from agentrig.envs import CheckResult, Environment
from agentrig.envs.base import has_figure
from agentrig.harness import PolicyRequest
from agentrig.harness.protocol import get_protocol
from agentrig.harness.tools import Tool, ToolSet, tool
from agentrig.harness.trajectory import Episode, TaskSpec, ToolCall

PRICES = {"apple": 0.5, "bread": 2.25, "coffee": 7.8, "eggs": 3.1, "milk": 1.2, "rice": 4.0}


@dataclass
class Cart:
    """The episode state: what is in the cart."""

    items: dict[str, int] = field(default_factory=dict)


def make_tools(cart: Cart) -> list[Tool]:
    """The shop's tools, bound to one cart."""

    @tool
    def get_price(item: str) -> dict[str, Any] | str:
        """The unit price of an item in EUR.

        Args:
            item: The item name, e.g. "milk".
        """
        return {"item": item, "price": PRICES[item]} if item in PRICES else "No result"

    @tool
    def add_to_cart(item: str, quantity: int) -> dict[str, Any]:
        """Put some units of an item in the cart.

        Args:
            item: The item name.
            quantity: How many units (1-20).
        """
        if item not in PRICES or not 1 <= quantity <= 20:
            raise ValueError("unknown item or quantity outside 1-20")
        cart.items[item] = cart.items.get(item, 0) + quantity
        return {"cart": dict(cart.items)}

    return [get_price, add_to_cart]


class ShopEnv(Environment):
    """Put items in the cart and say what they cost."""

    name = "shop"

    def tasks(self, split: str, n: int, seed: int = 0, start: int = 0) -> list[TaskSpec]:
        """Seeded tasks; the item decides the split (apple/bread/coffee/eggs: train, milk: dev, rice: test)."""
        self.check_split(split)
        items = {"train": ["apple", "bread", "coffee", "eggs"], "dev": ["milk"], "test": ["rice"],
                 "test_unseen_tools": ["rice"]}[split]
        out = []
        for i in range(start, start + n):
            rng = random.Random(f"shop/{split}/{seed}/{i}")
            item, qty = rng.choice(items), rng.randint(1, 9)
            out.append(TaskSpec(id=f"shop-{split}-{seed}-{i}", prompt=f"Add {qty} {item} to my cart. What do they cost?",
                                env="shop", family="buy", split=split, allowed_tools=["get_price", "add_to_cart"],
                                expected={"item": item, "quantity": qty, "cost": round(qty * PRICES[item], 2)},
                                metadata={"params": {"item": item, "quantity": qty}, "impossible": False,
                                          "no_tool": False}))
        return out

    def setup(self, task: TaskSpec) -> tuple[ToolSet, Cart]:
        """Fresh cart, tools bound to it, the task's allowlist."""
        cart = Cart()
        return ToolSet(make_tools(cart), allowed=task.allowed_tools), cart

    def check(self, task: TaskSpec, state: Cart, episode: Episode) -> CheckResult:
        """The cart holds exactly the asked items and the answer states the cost."""
        exp = task.expected
        reasons = []
        cart_ok = state.items == {exp["item"]: exp["quantity"]}
        if not cart_ok:
            reasons.append(f"cart is {state.items}, expected {exp['quantity']} {exp['item']}")
        figure_ok = has_figure(episode.final_answer or "", exp["cost"])
        if not figure_ok:
            reasons.append(f"cost {exp['cost']} missing from the answer")
        return CheckResult(success=not reasons, reasons=reasons or ["all requirements met"],
                           figures_ok=figure_ok, side_effects_ok=cart_ok)

    def expert(self) -> Any:
        """A scripted solver: price, add, answer (reads only the tool results)."""
        return shop_expert


def shop_expert(request: PolicyRequest) -> str:
    """Step 0: ask the price and add to cart in parallel; step 1: answer from the price it got back."""
    proto = get_protocol("hermes")
    p = request.task.metadata["params"]
    if request.step == 0:
        return proto.assistant_text("", [ToolCall("", "get_price", {"item": p["item"]}),
                                         ToolCall("", "add_to_cart", {"item": p["item"], "quantity": p["quantity"]})])
    price = json.loads([m for m in request.messages if m["role"] == "tool"][-2]["content"])["price"]
    return f"Added {p['quantity']} {p['item']} to your cart; they cost {p['quantity'] * price:.2f} EUR."


def make_env() -> ShopEnv:
    """Entry point for `--env examples/my_env.py:make_env`."""
    return ShopEnv()
