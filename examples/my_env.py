"""A complete small custom environment: a shop with prices, a cart and a checkout.

Run it:  agentrig collect --env examples/my_env.py:make_env --split train --episodes 20 --out /tmp/shop.jsonl
Two task families: `buy` (put items in the cart and report the cost) and `checkout` (the same, then place
the order). The checker looks at the cart and the order (the side effects) and at the figure in the final
answer. Every `collect` feature the built-in datadesk gets works here too: `expert()` is a small solver
that retries failed calls and writes detours (`--teacher expert --detours`), `families()` feeds
`--balance`, the alias tables feed `--rename`, and `drift_names` and `side_effect_tools` shape `--faults`.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from agentrig.envs import CheckResult, Environment
from agentrig.envs.base import has_figure
from agentrig.harness import PolicyReply, PolicyRequest
from agentrig.harness.protocol import get_protocol, result_text
from agentrig.harness.tools import Tool, ToolSet, tool
from agentrig.harness.trajectory import Episode, TaskSpec, ToolCall

PRICES = {"apple": 0.5, "bread": 2.25, "coffee": 7.8, "eggs": 3.1, "milk": 1.2, "rice": 4.0}
FAMILIES = {"buy": ["get_price", "add_to_cart"], "checkout": ["get_price", "add_to_cart", "checkout"]}


@dataclass
class Cart:
    """The episode state: what is in the cart, and whether the order was placed."""

    items: dict[str, int] = field(default_factory=dict)
    ordered: bool = False


def make_tools(cart: Cart) -> list[Tool]:
    """The shop's tools, bound to one cart."""

    @tool
    def get_price(item: str) -> dict[str, Any] | str:
        """The unit price of an item in EUR.

        Args:
            item: The item name, e.g. "milk".
        """
        return {"item": item, "price": PRICES[item]} if item in PRICES else "No result"

    @tool(side_effects=True)  # it changes the cart: faults never run it and then corrupt its output
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

    @tool(side_effects=True)
    def checkout() -> dict[str, Any]:
        """Place the order for everything in the cart."""
        if not cart.items or cart.ordered:
            raise ValueError("the cart is empty or already ordered")
        cart.ordered = True
        return {"ordered": dict(cart.items), "total": round(sum(PRICES[i] * q for i, q in cart.items.items()), 2)}

    return [get_price, add_to_cart, checkout]


class ShopEnv(Environment):
    """Put items in the cart (and check out) and say what they cost."""

    name = "shop"
    # --rename draws one of these per tool and episode (and renames some parameters)
    tool_aliases = {"get_price": [("price_of", "Look up what one unit of an item costs, in EUR.")],
                    "add_to_cart": [("cart_add", "Add a number of units of one item to the shopping cart.")],
                    "checkout": [("place_order", "Order everything that is in the cart now.")]}
    param_aliases = {"item": ["product"], "quantity": ["units"]}
    drift_names = {"price": "unit_price", "cart": "basket", "total": "amount"}  # schema_drift renames these

    def tasks(self, split: str, n: int, seed: int = 0, start: int = 0,
              family_weights: dict[str, float] | None = None) -> list[TaskSpec]:
        """Seeded tasks; the item decides the split (apple/bread/coffee/eggs: train, milk: dev, rice: test)."""
        self.check_split(split)
        items = {"train": ["apple", "bread", "coffee", "eggs"], "dev": ["milk"], "test": ["rice"],
                 "test_unseen_tools": ["rice"]}[split]
        weights = [(family_weights or {}).get(f, 1.0) for f in FAMILIES]
        out = []
        for i in range(start, start + n):
            rng = random.Random(f"shop/{split}/{seed}/{i}")
            item, qty = rng.choice(items), rng.randint(1, 9)
            family = rng.choices(list(FAMILIES), weights)[0]
            prompt = (f"Add {qty} {item} to my cart. What do they cost?" if family == "buy" else
                      f"Buy {qty} {item} for me: put them in the cart and check out. What did I pay?")
            out.append(TaskSpec(id=f"shop-{split}-{seed}-{i}", prompt=prompt, env="shop", family=family, split=split,
                                allowed_tools=list(FAMILIES[family]),
                                expected={"item": item, "quantity": qty, "cost": round(qty * PRICES[item], 2),
                                          "ordered": family == "checkout"},
                                metadata={"params": {"item": item, "quantity": qty}, "impossible": False,
                                          "no_tool": False}))
        return out

    def families(self, split: str, seed: int = 0) -> dict[str, list[str]]:
        """Both families in every split, with the tools each needs (for --balance)."""
        return {f: list(tools) for f, tools in FAMILIES.items()}

    def setup(self, task: TaskSpec) -> tuple[ToolSet, Cart]:
        """Fresh cart, tools bound to it, the task's allowlist."""
        cart = Cart()
        return ToolSet(make_tools(cart), allowed=task.allowed_tools), cart

    def check(self, task: TaskSpec, state: Cart, episode: Episode) -> CheckResult:
        """The cart holds exactly the asked items, the order is placed only when asked, the answer states the cost."""
        exp = task.expected
        reasons = []
        cart_ok = state.items == {exp["item"]: exp["quantity"]} and state.ordered == exp["ordered"]
        if not cart_ok:
            reasons.append(f"cart is {state.items} (ordered: {state.ordered}), expected {exp['quantity']} "
                           f"{exp['item']} (ordered: {exp['ordered']})")
        figure_ok = has_figure(episode.final_answer or "", exp["cost"], kind="money")  # to the cent
        if not figure_ok:
            reasons.append(f"cost {exp['cost']} missing from the answer")
        return CheckResult(success=not reasons, reasons=reasons or ["all requirements met"],
                           figures_ok=figure_ok, side_effects_ok=cart_ok)

    def expert(self, detour_rate: float = 0.0, seed: int = 0) -> Any:
        """The scripted solver below."""
        return ShopExpert(detour_rate, seed)


class ShopExpert:
    """Price and add in parallel, check out when asked, answer from the price it got back.

    It reads only the messages, so it needs no per-episode state: a call whose result is not a JSON object
    (a fault) is simply made again. Calls use the episode's tool and parameter names (`--rename`) and the
    request's output protocol. With `detour_rate`, an episode may start with a call to a tool that does not
    exist, weight 0 so training masks it; the harness rejects it and the solver goes on.
    """

    def __init__(self, detour_rate: float = 0.0, seed: int = 0):
        self.detour_rate, self.seed = detour_rate, seed

    def generate(self, request: PolicyRequest) -> PolicyReply:
        """The next step of the plan, given what the tools have returned so far."""
        task, proto = request.task, get_protocol(request.protocol)
        p = task.metadata["params"]
        rename = task.metadata.get("rename") or {}
        names, params = rename.get("tools", {}), rename.get("params", {})

        def call(tool_name: str, **args: Any) -> ToolCall:
            renamed = {params.get(tool_name, {}).get(k, k): v for k, v in args.items()}
            return ToolCall("", names.get(tool_name, tool_name), renamed)

        detour = random.Random(f"shop-detour/{self.seed}/{task.id}").random() < self.detour_rate
        if detour and request.step == 0:
            return PolicyReply(proto.assistant_text("", [ToolCall("", "get_prices", {"item": p["item"]})]), weight=0.0)
        done = _results(request.messages, {v: k for k, v in names.items()})
        price = next((v for v in done.get("get_price", {}).values() if isinstance(v, (int, float))), None)
        calls = ([] if price is not None else [call("get_price", item=p["item"])]) + (
            [] if "add_to_cart" in done else [call("add_to_cart", item=p["item"], quantity=p["quantity"])])
        if not calls and task.family == "checkout" and "checkout" not in done:
            calls = [call("checkout")]
        if calls:
            return PolicyReply(proto.assistant_text("", calls))
        verb = "Ordered" if task.family == "checkout" else "Added"
        return PolicyReply(f"{verb} {p['quantity']} {p['item']}; they cost {p['quantity'] * price:.2f} EUR.")


def _results(messages: list[dict[str, Any]], original: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The last JSON-object result of each tool (under its original name); failed calls leave none."""
    out: dict[str, dict[str, Any]] = {}
    for m in messages:
        if m["role"] != "tool":
            continue
        try:
            value = json.loads(result_text(m))
        except ValueError:
            continue
        if isinstance(value, dict):
            out[original.get(m["name"], m["name"])] = value
    return out


def make_env() -> ShopEnv:
    """Entry point for `--env examples/my_env.py:make_env`."""
    return ShopEnv()
