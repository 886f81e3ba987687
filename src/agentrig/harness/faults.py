"""Seeded fault injection at the harness's tool-execution layer (a `ToolHook`), recorded in the episode.

Kinds (seed section 4.3): `timeout` (simulated with the harness's own timeout text, never slept),
`no_result` ("No result"), `error_503`, `error_429`, `permission_denied` (realistic "Error: ..." texts, kept
in feedback.json with every other model-facing text), `truncated` (the real output cut mid-way),
`malformed` (the real output with broken JSON quoting) and `schema_drift` (one field of the real JSON
output renamed). Each call draws once from a per-episode RNG, so the same seed and the same calls give
the same faults. Faults that need the real output run the tool first; tools with side effects only get
faults that stop the call before it runs (a corrupted output after a write would invite a duplicate write).
A tool has side effects when its definition says so (`Tool.side_effects`, passed in as the episode's
`ToolSet`) or its environment lists it (`Environment.side_effect_tools` -> `no_mutate`); how drift renames
fields is the environment's `drift_names`. Whoever builds the config passes these facts in.
The built-in `note` tool is never faulted (the harness handles it before this hook anyway), nor is a tool
defined with `inject_faults=False` (an MCP tool the user did not mark read-only): its calls draw nothing.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, get_args

from agentrig.errors import ConfigError
from agentrig.harness.protocol import feedback
from agentrig.harness.trajectory import FaultKind, ToolCall, ToolResult

if TYPE_CHECKING:
    from agentrig.harness.tools import ToolSet

FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)  # this order is the draw order: it decides which fault a seed gives
# Share of each kind in the default mix; `FaultConfig.from_total(0.25)` scales it to 25 % of calls.
DEFAULT_MIX = {"timeout": 0.22, "no_result": 0.12, "error_503": 0.16, "error_429": 0.12, "permission_denied": 0.08,
               "truncated": 0.1, "malformed": 0.1, "schema_drift": 0.1}
_NEEDS_OUTPUT = {"truncated", "malformed", "schema_drift"}
_ERRORS = ("error_503", "error_429", "permission_denied")  # their texts: feedback.json's fault_<kind>
@dataclass
class FaultConfig:
    """Per-kind fault rates (probability per tool call); their sum must be at most 1."""

    rates: dict[str, float] = field(default_factory=dict)
    timeout_s: float = 10.0  # the time the simulated timeout reports
    no_mutate: tuple[str, ...] = ()  # tools with side effects (the environment's `side_effect_tools`)
    drift_names: Mapping[str, str] = field(default_factory=dict)  # the environment's `drift_names`

    def __post_init__(self) -> None:
        unknown = [k for k in self.rates if k not in FAULT_KINDS]
        if unknown:
            raise ConfigError(f"unknown fault kind(s) {', '.join(unknown)}; known: {', '.join(FAULT_KINDS)}")
        if any(v < 0 for v in self.rates.values()) or sum(self.rates.values()) > 1.0 + 1e-9:
            raise ConfigError(f"fault rates must be >= 0 and sum to at most 1, got {self.rates}")

    @classmethod
    def from_total(cls, total: float, **kwargs: object) -> "FaultConfig":
        """The default mix scaled so that `total` of all calls get a fault."""
        if not 0.0 <= total <= 1.0:
            raise ConfigError(f"--faults must be between 0 and 1, got {total}")
        return cls(rates={k: v * total for k, v in DEFAULT_MIX.items()}, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def parse(cls, text: str) -> "FaultConfig":
        """From "timeout=0.1,error_503=0.05" (the CLI's --fault-rates)."""
        rates: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            if "=" not in part:
                raise ConfigError(f"--fault-rates item {part!r} must look like kind=rate")
            k, v = part.split("=", 1)
            try:
                rates[k.strip()] = float(v)
            except ValueError:
                raise ConfigError(f"--fault-rates: {v!r} is not a number") from None
        return cls(rates=rates)

    @property
    def total(self) -> float:
        """Probability that a call gets some fault."""
        return sum(self.rates.values())

    def injector(self, seed: int | str, renames: dict[str, str] | None = None,
                 tools: "ToolSet | None" = None) -> "FaultInjector":
        """A fresh hook for one episode; `renames` maps original tool names to this episode's names, and the
        episode's `tools` add every tool whose definition declares side effects."""
        return FaultInjector(self, seed, renames, tools)


class FaultInjector:
    """A ToolHook: `hook(call, execute) -> ToolResult`. One per episode; draws once per executed call."""

    def __init__(self, config: FaultConfig, seed: int | str, renames: dict[str, str] | None = None,
                 tools: "ToolSet | None" = None):
        self.config = config
        self.rng = random.Random(f"faults/{seed}")
        self.injected: list[str] = []
        self.no_mutate = {(renames or {}).get(n, n) for n in config.no_mutate}
        self.exempt: set[str] = set()
        if tools is not None:
            self.no_mutate |= {name for name, t in tools.tools.items() if t.side_effects}
            self.exempt = {name for name, t in tools.tools.items() if not t.inject_faults}

    def _draw(self, call: ToolCall) -> str | None:
        u = self.rng.random()
        acc = 0.0
        for kind in FAULT_KINDS:
            acc += self.config.rates.get(kind, 0.0)
            if u < acc:
                if kind in _NEEDS_OUTPUT and call.name in self.no_mutate:
                    return "error_503"
                return kind
        return None

    def __call__(self, call: ToolCall, execute: Callable[[], ToolResult]) -> ToolResult:
        if call.name == "note" or call.name in self.exempt:
            return execute()
        kind = self._draw(call)
        if kind is None:
            return execute()
        self.injected.append(kind)
        if kind == "timeout":
            text = feedback("tool_timeout", tool=call.name, seconds=self.config.timeout_s)
            return ToolResult(call.id, call.name, text, ok=False, duration_s=0.0, fault=kind, error="timeout")
        if kind == "no_result":
            return ToolResult(call.id, call.name, feedback("fault_no_result"), ok=False, fault=kind, error=kind)
        if kind in _ERRORS:
            return ToolResult(call.id, call.name, feedback(f"fault_{kind}", tool=call.name), ok=False, fault=kind,
                              error=kind)
        real = execute()
        if not real.ok:  # the tool failed by itself: nothing to corrupt, the real failure stands
            return real
        content = real.content
        if kind == "schema_drift":
            drifted = drift(content, self.rng, self.config.drift_names)
            if drifted is None:
                kind = "truncated"
            else:
                return ToolResult(call.id, call.name, drifted, ok=True, duration_s=real.duration_s, fault=kind)
        if kind == "truncated":
            cut = max(1, int(len(content) * self.rng.uniform(0.3, 0.7)))
            return ToolResult(call.id, call.name, content[:cut], ok=False, duration_s=real.duration_s,
                              fault="truncated", error="truncated", truncated=True)
        broken = content.replace('"', "'").replace(": ", "=", 1)
        if broken == content:
            broken = "{" + content + ",}"
        return ToolResult(call.id, call.name, broken, ok=False, duration_s=real.duration_s, fault=kind, error=kind)


def drift(content: str, rng: random.Random, names: Mapping[str, str] | None = None) -> str | None:
    """The JSON object `content` with one top-level field renamed, or None when it is not a JSON object.

    `names` maps a field to its drifted name; a field without one gets a "_v2" suffix.
    """
    try:
        obj = json.loads(content)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not obj:
        return None
    key = rng.choice(sorted(obj))
    new = (names or {}).get(key, key + "_v2")
    return json.dumps({(new if k == key else k): v for k, v in obj.items()}, ensure_ascii=False)
