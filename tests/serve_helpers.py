"""Helpers for the server tests: a tiny model that has memorized a few replies, adapters, a running server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TOOLS = [WEATHER, CLOCK]
PARIS_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
OSLO_REPLY = 'Checking Oslo.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
TWO_CALLS = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>')
CALLED = [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]

# (request body, the reply the model learns for it)
MEMORIZED: list[tuple[dict[str, Any], str]] = [
    ({"messages": [{"role": "user", "content": "hi"}]}, "Hello there, friend."),
    ({"messages": [{"role": "user", "content": "What is the weather in Paris?"}], "tools": TOOLS}, PARIS_CALL),
    ({"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": TOOLS}, OSLO_REPLY),
    ({"messages": [{"role": "user", "content": "Weather and time in Rome?"}], "tools": TOOLS}, TWO_CALLS),
    ({"messages": [{"role": "user", "content": "What is the weather in Paris?"},
                   {"role": "assistant", "content": None, "tool_calls": CALLED},
                   {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}], "tools": TOOLS},
     "It is sunny in Paris, 21 C."),
]


def server_prompt(body: dict[str, Any], renderer: Any) -> list[int]:
    """The prompt ids the server renders for a request body (default harness rules)."""
    from agentrig.harness.loop import HarnessConfig, note_tool
    from agentrig.harness.protocol import get_protocol
    from agentrig.serve.wire import ChatRequest, prompt_messages

    req = ChatRequest(model="m", **body)
    return list(renderer.prompt_ids(prompt_messages(req, get_protocol("hermes"), HarnessConfig(), note_tool().spec())))


def train_memorized(folder: Path, tokenizer: Any, max_steps: int = 150) -> Path:
    """A tiny random Llama trained (full fine-tuning, seconds) until greedy decoding gives each MEMORIZED reply.

    Logits are computed only where a reply token is predicted (the 49k-word head over the whole prompt
    would cost ten times more); training stops once every reply token is the argmax."""
    import torch

    from agentrig.data.render import Renderer
    from agentrig.models import tiny_random_model

    renderer = Renderer(tokenizer)
    model = tiny_random_model(len(tokenizer), initializer_range=0.2)
    rows = []
    for body, reply in MEMORIZED:
        prompt = server_prompt(body, renderer)
        answer = renderer.encode(reply) + [renderer.eot_id]
        rows.append((torch.tensor([prompt + answer[:-1]]), len(prompt) - 1, torch.tensor(answer)))
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    for _ in range(max_steps):
        loss, right = 0.0, True
        for ids, start, answer in rows:
            hidden = model.model(input_ids=ids).last_hidden_state[0, start:]
            logits = model.lm_head(hidden)
            loss = loss + torch.nn.functional.cross_entropy(logits, answer)
            right = right and bool((logits.argmax(-1) == answer).all())
        if right and float(loss.detach()) < 0.05 * len(rows):
            break
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    else:
        raise AssertionError(f"the tiny model did not memorize its replies in {max_steps} steps")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def random_adapter(model_dir: Path, folder: Path, seed: int = 1) -> Path:
    """A LoRA adapter with random (non-zero) weights for the model in `model_dir`: it changes the replies."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    peft_model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_" in name:
                param.normal_(0, 0.5)
    peft_model.save_pretrained(folder)
    return folder


def policy_for(model_dir: Path, adapters: dict[str, str] | None = None, **kwargs: Any) -> Any:
    """A fresh HFPolicy on the model folder (fresh weights: PEFT changes the model object it wraps)."""
    from agentrig.policies.hf_policy import HFPolicy

    return HFPolicy.from_pretrained(str(model_dir), adapters, **{"max_new_tokens": 64, **kwargs})


def serve(model_dir: Path, adapters: dict[str, str] | None = None, policy: Any = None, **config: Any) -> Any:
    """`agentrig serve`'s server on a free loopback port, on a background thread (call `.stop()`)."""
    from agentrig.harness.loop import HarnessConfig
    from agentrig.serve.server import ServeConfig, build_state, start_server

    adapters = adapters or {}
    policy = policy or policy_for(model_dir, adapters)
    state = build_state(ServeConfig(model="tiny", **config), adapters, HarnessConfig(), policy=policy)
    return start_server(state)
