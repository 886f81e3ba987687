"""The in-context control of test-time training: the exploration's calls given in the prompt, not trained.

`InContextPolicy(policy, block)` wraps any policy and appends `block` to the system message of every request
(the same text at every step, so a policy's per-episode KV reuse still sees one growing prefix).
`examples_block(explore_file, n)` writes that block from a TTT run's `explore.jsonl`: up to `n` successful
calls (one per tool first, then the rest in order) as `name(arguments) -> result` lines, and up to `n // 4`
rejected calls with the harness's feedback, so the model sees what the tools return and how they refuse.
`agentrig eval --context-examples OUT/explore.jsonl` evaluates with it (docs/ttt.md, the controls).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentrig.harness.policy import PolicyRequest, generate_batch

HEADER = "Examples of calls to these tools and what they returned (from an earlier exploration):"


def examples_block(explore_file: str | Path, n: int = 16, max_result_chars: int = 240) -> str:
    """The examples text of a TTT run's exploration (see the module docstring)."""
    from agentrig.harness.trajectory import iter_episodes

    good: list[tuple[str, str]] = []
    bad: list[str] = []
    for ep in iter_episodes(explore_file):
        for step in ep.steps:
            results = {r.call_id: r for r in step.results}
            for call in step.calls:
                r = results.get(call.id)
                if r is None:
                    continue
                line = f"{call.name}({json.dumps(call.arguments, ensure_ascii=False)})"
                if r.ok and r.fault is None and not r.content.startswith("No result"):
                    good.append((call.name, f"{line} -> {r.content[:max_result_chars]}"))
                elif r.error == "schema":
                    bad.append(f"{line} -> {r.content.splitlines()[1].strip() if len(r.content.splitlines()) > 1 else r.content[:120]}")
    picked: list[str] = []
    seen_tools: set[str] = set()
    for name, line in good:  # one per tool first
        if name not in seen_tools and len(picked) < n:
            seen_tools.add(name)
            picked.append(line)
    for _, line in good:
        if len(picked) >= n:
            break
        if line not in picked:
            picked.append(line)
    lines = picked + list(dict.fromkeys(bad))[: max(1, n // 4)]
    return HEADER + "\n" + "\n".join(f"- {line}" for line in lines) if lines else ""


class InContextPolicy:
    """`policy` with `block` appended to the system message of every request."""

    def __init__(self, policy: Any, block: str):
        self.policy, self.block = policy, block

    def _with_block(self, request: PolicyRequest) -> PolicyRequest:
        messages = [dict(m) for m in request.messages]
        if messages and messages[0].get("role") == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{self.block}"
        else:
            messages.insert(0, {"role": "system", "content": self.block})
        return replace(request, messages=messages)

    def generate_batch(self, requests: list[PolicyRequest]) -> list[Any]:
        """The wrapped policy's replies to the requests with the block in their system message."""
        return generate_batch(self.policy, [self._with_block(r) for r in requests])

    def use(self, route: Any) -> None:
        """Route adapters on the wrapped policy (HFPolicy)."""
        self.policy.use(route)
