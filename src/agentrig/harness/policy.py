"""The policy interface: what a policy is asked (`PolicyRequest`), what it answers (`PolicyReply`), and `Policy`.

A `Policy` has one method, `generate_batch(requests) -> replies`, one reply per request in order. Simpler
shapes are adapted, not probed for at every call site: `as_policy` wraps an object with
`generate(request)`, one with `async agenerate(request)`, or a plain (sync or async) callable, and
`generate_batch(policy, requests)` is the one entry point the loop uses. `ScriptedPolicy` replays prepared
replies (tests and demos). Concrete model policies (local Hugging Face, OpenAI-compatible APIs) live in
`agentrig.policies`; this module holds only the interface, so it needs no model library.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, Sequence, runtime_checkable

from agentrig.errors import AgentrigError
from agentrig.harness.trajectory import TaskSpec


@dataclass
class PolicyRequest:
    """What a policy sees: the exact context (OpenAI-style messages), the tools offered, the task.

    `protocol` names the output protocol in use (`hermes`, `llama31`): a scripted or programmatic policy
    writes its tool calls in that syntax (`agentrig.harness.protocol.get_protocol(request.protocol)`).
    `step` counts from 0 within the episode; a stateful policy starts a new episode at step 0.
    """

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    task: TaskSpec
    step: int
    episode_id: str = ""
    protocol: str = "hermes"


@dataclass
class PolicyReply:
    """A policy's answer: raw text, plus its training weight (0 = detour) and token counts."""

    text: str
    weight: float = 1.0
    prompt_tokens: int = 0
    completion_tokens: int = 0


Reply = str | PolicyReply
"""A plain string is a reply with weight 1 and token counts estimated by the harness."""


@runtime_checkable
class Policy(Protocol):
    """Anything that answers a batch of requests, one reply per request, in order."""

    def generate_batch(self, requests: list[PolicyRequest]) -> list[Reply]:
        """The replies to `requests`, in order."""
        ...


@runtime_checkable
class _Generates(Protocol):
    def generate(self, request: PolicyRequest) -> Reply: ...


@runtime_checkable
class _AGenerates(Protocol):
    def agenerate(self, request: PolicyRequest) -> Awaitable[Reply]: ...


class StepPolicy:
    """Adapts an object with `generate(request)` to `Policy`: one call per request."""

    def __init__(self, inner: _Generates):
        self.inner = inner

    def generate_batch(self, requests: list[PolicyRequest]) -> list[Reply]:
        """`inner.generate` on each request in turn."""
        return [self.inner.generate(r) for r in requests]


class AsyncPolicy:
    """Adapts `async agenerate(request)` (or an async callable) to `Policy`: the batch is gathered concurrently."""

    def __init__(self, agenerate: Callable[[PolicyRequest], Awaitable[Reply]]):
        self.agenerate = agenerate

    def generate_batch(self, requests: list[PolicyRequest]) -> list[Reply]:
        """All requests awaited together in a fresh event loop."""
        async def gather() -> list[Any]:
            return list(await asyncio.gather(*(self.agenerate(r) for r in requests)))

        return asyncio.run(gather())


class FunctionPolicy:
    """Adapts a plain function `request -> reply` to `Policy`."""

    def __init__(self, fn: Callable[[PolicyRequest], Reply]):
        self.fn = fn

    def generate_batch(self, requests: list[PolicyRequest]) -> list[Reply]:
        """`fn` on each request in turn."""
        return [self.fn(r) for r in requests]


def as_policy(policy: Any) -> Policy:
    """`policy` as a `Policy`: itself when it has `generate_batch`, else an adapter for its shape.

    The order decides for objects with several methods: `generate_batch`, then `agenerate`, then
    `generate`, then a plain (sync or async) callable.
    """
    if isinstance(policy, Policy):
        return policy
    if isinstance(policy, _AGenerates):
        return AsyncPolicy(policy.agenerate)
    if isinstance(policy, _Generates):
        return StepPolicy(policy)
    if callable(policy):
        return AsyncPolicy(policy) if inspect.iscoroutinefunction(policy) else FunctionPolicy(policy)
    raise AgentrigError(f"{type(policy).__name__} is not a policy: give it generate(request) or make it callable")


def generate_batch(policy: Any, requests: list[PolicyRequest]) -> list[Reply]:
    """Call any kind of policy (see `as_policy`) on a batch and check that every request got a reply."""
    replies = list(as_policy(policy).generate_batch(requests))
    if len(replies) != len(requests):
        raise AgentrigError(f"policy returned {len(replies)} replies for {len(requests)} requests")
    return replies


class ScriptedPolicy:
    """Replays prepared replies in order (one list, or one list per task id). Used by tests and demos."""

    def __init__(self, replies: Sequence[str | PolicyReply] | dict[str, Sequence[str | PolicyReply]]):
        self._by_task = {k: deque(v) for k, v in replies.items()} if isinstance(replies, dict) else None
        self._queue = deque(replies) if not isinstance(replies, dict) else deque()

    def generate(self, request: PolicyRequest) -> str | PolicyReply:
        """The next prepared reply (for this task, when replies are keyed by task id)."""
        q = self._by_task.get(request.task.id) if self._by_task is not None else self._queue
        if not q:
            raise AgentrigError(f"ScriptedPolicy ran out of replies at step {request.step} of task {request.task.id!r}")
        return q.popleft()

    def generate_batch(self, requests: list[PolicyRequest]) -> list[str | PolicyReply]:
        """`generate` on each request in turn (the `Policy` method)."""
        return [self.generate(r) for r in requests]
