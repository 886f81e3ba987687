"""The episode's reading view: what the policy saw at a step, and a step as a chat message.

`context_at(episode, i)` rebuilds the exact messages of step i from the records (memory compressions
applied), and `assistant_message(step)` is the canonical OpenAI-style message of a step. The loop writes
with them and the training data reads with them, so the prompt trained on is the prompt the model saw.
Not covered: rendering to tokens (`agentrig.data.render`).
"""

from __future__ import annotations

import json
from typing import Any

from agentrig.harness.memory import with_memory
from agentrig.harness.trajectory import Episode, Step


def assistant_message(step: Step, protocol: str = "hermes") -> dict[str, Any]:
    """The canonical OpenAI-style assistant message of a step (what training renders)."""
    if not step.calls and any(d.kind == "unparseable_call" for d in step.defects):
        return {"role": "assistant", "content": step.raw_output}
    msg: dict[str, Any] = {"role": "assistant", "content": step.text}
    if step.calls:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
            for c in step.calls
        ]
    return msg


def context_at(episode: Episode, i: int) -> list[dict[str, Any]]:
    """The exact messages the policy saw at step i, memory compressions applied."""
    start = episode.metadata.get("step_message_index", [])
    if i >= len(start):
        raise IndexError(f"episode {episode.episode_id} has no step {i}")
    events = [e for e in episode.memory_events if e.before_step <= i]
    upto = max([2] + [e.upto_message for e in events])
    system = {"role": "system", "content": with_memory(episode.system_prompt, [e.summary for e in events])}
    return [system, episode.messages_full[1]] + episode.messages_full[upto : start[i]]
