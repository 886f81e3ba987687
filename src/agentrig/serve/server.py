"""`agentrig serve`: the trained agent behind an OpenAI-compatible HTTP server (uvicorn + the FastAPI app).

    agentrig serve --model smollm2-135m --adapter sft=runs/default/sft/adapter --port 8000

loads the base model once, mounts every adapter by name (never merged), prints the URL and the models it
serves, and serves until interrupted. The harness flags (`--tool-listing`, `--max-steps`, `--memory`, ...)
are the rules written into the system prompt when a request sends `tools`: keep them as the adapter was
trained. `start_server` runs the same server on a background thread (tests, benchmarks, notebooks).
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

from agentrig.config import add_flags, from_args, opt
from agentrig.errors import ConfigError
from agentrig.harness.loop import HarnessConfig


PROMPT_RULES = ("max_steps", "switch_after_failures", "tool_listing", "memory")  # what the system prompt says


@dataclass
class ServeConfig:
    """How `agentrig serve` serves."""

    model: str = opt("smollm2-135m", "base model name or folder; requests name it (or an adapter) in `model`")
    host: str = opt("127.0.0.1", "address to listen on (0.0.0.0 for every interface)")
    port: int = opt(8000, "port to listen on (0: any free port)")
    served_name: str | None = opt(None, "the name requests use for the base model (default: --model)")
    allow_runtime_lora: bool = opt(False, "offer POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's)")
    batch_size: int = opt(16, "most rows generated together")
    max_concurrent: int = opt(64, "requests in flight at once; more get 429")
    max_prompt_tokens: int = opt(8192, "longest prompt accepted (tokens)")
    max_new_tokens: int = opt(2048, "most completion tokens a request may ask for")
    default_max_tokens: int = opt(512, "completion tokens when a request names no limit")
    max_body_bytes: int = opt(4 * 1024 * 1024, "largest request body accepted (bytes); more get 413")
    temperature: float = opt(0.0, "temperature when a request sends none (0 = greedy, the harness's default)")
    batch_window_ms: float = opt(10.0, "a batch starts once no request has arrived for this long (at most 20x it)")

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_concurrent", "max_prompt_tokens", "max_new_tokens", "default_max_tokens",
                     "max_body_bytes"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.port <= 65535:
            raise ConfigError(f"--port must be 0..65535, got {self.port}")
        if self.default_max_tokens > self.max_new_tokens:
            raise ConfigError("--default-max-tokens must not exceed --max-new-tokens")


def build_state(config: ServeConfig, adapters: dict[str, str], rules: HarnessConfig, policy: Any = None) -> Any:
    """The routes' shared state: the policy (loaded unless given), its engine and rendering, the names served."""
    from agentrig.harness.loop import note_tool
    from agentrig.harness.protocol import get_protocol
    from agentrig.serve.app import Limits, ServeState
    from agentrig.serve.engine import Engine

    if rules.protocol != "hermes":
        raise ConfigError("agentrig serve speaks the hermes protocol (vLLM's --tool-call-parser hermes); "
                          f"got protocol {rules.protocol!r}")
    if policy is None:
        from agentrig.policies.hf_policy import HFPolicy

        policy = HFPolicy.from_pretrained(config.model, adapters or None, batch_size=config.batch_size)
    name = config.served_name or config.model
    if name in adapters:
        raise ConfigError(f"the adapter name {name!r} is the base model's name; rename the adapter")
    limits = Limits(max_concurrent=config.max_concurrent, max_prompt_tokens=config.max_prompt_tokens,
                    max_new_tokens=config.max_new_tokens, default_max_tokens=config.default_max_tokens,
                    max_body_bytes=config.max_body_bytes)
    engine = Engine(policy, max_batch=config.batch_size, window_s=config.batch_window_ms / 1000)
    return ServeState(engine=engine, renderer=policy.renderer, protocol=get_protocol(rules.protocol), rules=rules,
                      note_spec=note_tool().spec() if rules.memory else None, base_name=name,
                      adapter_dirs=dict(adapters), limits=limits, allow_runtime_lora=config.allow_runtime_lora,
                      default_temperature=config.temperature)


def make_app(state: Any) -> Any:
    """The ASGI app with the body-size limit in front."""
    from agentrig.serve.app import BodyLimit, create_app

    return BodyLimit(create_app(state), state.limits.max_body_bytes)


@dataclass
class RunningServer:
    """A server started by `start_server`: its URL (ending in /v1), state and a `stop()`."""

    url: str
    state: Any
    server: Any
    thread: threading.Thread

    def stop(self) -> None:
        """Shut the HTTP server and the engine down."""
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.state.engine.close()


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def start_server(state: Any, host: str = "127.0.0.1", port: int = 0, timeout_s: float = 60.0) -> RunningServer:
    """Serve `state` with uvicorn on a background thread; returns once it accepts connections."""
    import uvicorn

    port = port or free_port(host)
    server = uvicorn.Server(uvicorn.Config(make_app(state), host=host, port=port, log_level="warning",
                                           lifespan="off", timeout_graceful_shutdown=5))
    thread = threading.Thread(target=server.run, name="agentrig-serve-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise ConfigError(f"the server did not start on {host}:{port} (is the port in use?)")
        time.sleep(0.02)
    return RunningServer(f"http://{host}:{port}/v1", state, server, thread)


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `agentrig serve`."""
    add_flags(parser, ServeConfig)
    parser.add_argument("--adapter", action="append", default=[], metavar="NAME=DIR",
                        help="serve a LoRA adapter under NAME (repeatable); requests choose it with model=NAME")
    add_flags(parser.add_argument_group("harness rules written into a system prompt built from `tools` "
                                        "(HarnessConfig; keep them as the adapter was trained)"), HarnessConfig,
              only=PROMPT_RULES)


def main(args: argparse.Namespace) -> int:
    """Run `agentrig serve` until interrupted."""
    import uvicorn

    from agentrig.evals.evaluate import parse_pairs
    from agentrig.jsonl import read_adapter_config

    config = from_args(ServeConfig, args)
    adapters = parse_pairs(args.adapter, "--adapter")
    for folder in adapters.values():
        read_adapter_config(folder)  # before the model loads
    state = build_state(config, adapters, from_args(HarnessConfig, args))
    port = config.port or free_port(config.host)
    print(f"agentrig serve: http://{config.host}:{port}/v1 serving {', '.join(state.served())}"
          f" (base {state.base_name}{'; runtime LoRA on' if config.allow_runtime_lora else ''})", flush=True)
    try:
        uvicorn.run(make_app(state), host=config.host, port=port, log_level="warning", lifespan="off")
    finally:
        state.engine.close()
    return 0
