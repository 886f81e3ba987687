"""`agentrig chat`: the agent on an environment's tools in the terminal, shown as it works.

The user types a request; each request runs as one harness episode (same rules, protocol and rendering
as evaluation), and the terminal shows the agent's words, every tool call before it runs, its result,
harness feedback (defects, recovery notices) and the final answer as they happen. The tool state is
created once per session, so side effects (a sent report) persist across requests. `/quit` or end of
input ends the session.

Not covered: carrying the conversation of earlier requests into later ones (each request starts a
fresh context), and streaming tokens inside one model call.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable, Iterable, Iterator

from agentrig.config import add_flags, comma_list, from_args
from agentrig.errors import ConfigError
from agentrig.harness import EpisodeRunner, HarnessConfig, PolicyReply
from agentrig.harness.policy import generate_batch
from agentrig.harness.protocol import get_protocol
from agentrig.harness.tools import ToolSet
from agentrig.harness.trajectory import Episode, TaskSpec, ToolCall, ToolResult

QUIT = ("/quit", "/exit")


class LiveView:
    """Prints an episode as it happens: the agent's text per reply, calls before they run, their results."""

    def __init__(self, console: Any, protocol: str = "hermes", max_chars: int = 600) -> None:
        self.console = console
        self.proto = get_protocol(protocol)
        self.max_chars = max_chars

    def reply(self, text: str) -> None:
        """Show what the agent said in one reply (a final answer in bold)."""
        parsed = self.proto.parse(text)
        if parsed.is_final:
            self.console.print(f"[bold green]agent:[/] {parsed.text}", highlight=False)
        elif parsed.text:
            self.console.print(f"[green]agent:[/] {parsed.text}", highlight=False)

    def hook(self, call: ToolCall, execute: Callable[[], ToolResult]) -> ToolResult:
        """A ToolHook: show the call, run it, show the result."""
        args = json.dumps(call.arguments, ensure_ascii=False)
        self.console.print(f"  [cyan]-> {call.name}[/]({args})", highlight=False, markup=True)
        result = execute()
        content = result.content if len(result.content) <= self.max_chars else result.content[: self.max_chars] + "..."
        status = "[blue]<- result:[/]" if result.ok else f"[red]<- failed ({result.error}):[/]"
        self.console.print(f"  {status} {content}", highlight=False)
        return result

    def step_feedback(self, episode: Episode) -> None:
        """Show harness feedback of the latest step: rejected calls, unparseable output, notices."""
        step = episode.steps[-1]
        for defect in step.defects:
            self.console.print(f"  [yellow]harness ({defect.kind}):[/] {defect.message}", highlight=False)
        for notice in step.notices:
            self.console.print(f"  [yellow]harness:[/] {notice}", highlight=False)


def run_chat(
    policy: Any,
    tools: ToolSet,
    lines: Iterable[str],
    console: Any,
    config: HarnessConfig | None = None,
    env_name: str = "",
) -> list[Episode]:
    """Answer each input line as one episode on `tools`, printing it live; returns the episodes."""
    config = config or HarnessConfig()
    view = LiveView(console, config.protocol)
    episodes: list[Episode] = []
    for n, raw in enumerate(lines):
        line = raw.strip()
        if not line:
            continue
        if line in QUIT:
            break
        task = TaskSpec(id=f"chat-{n}", prompt=line, env=env_name, split="chat", allowed_tools=list(tools.allowed))
        runner = EpisodeRunner(task, tools, config, tool_hook=view.hook)
        while (request := runner.request()) is not None:
            reply = generate_batch(policy, [request])[0]
            view.reply(reply.text if isinstance(reply, PolicyReply) else reply)
            runner.submit(reply)
            view.step_feedback(runner.episode)
        if runner.episode.termination != "final_answer":
            console.print(f"[red](the episode ended without an answer: {runner.episode.termination})[/]")
        episodes.append(runner.episode)
    return episodes


def session_tools(env: Any, allow: list[str] | None = None, read_only: list[str] | None = None) -> tuple[ToolSet, Any]:
    """Every tool the environment offers for seen-tool tasks, bound to one state for the whole session. An MCP
    environment denies by default: only the tools `allow` names (`["*"]`: all), `read_only` ones open to faults."""
    probe = TaskSpec(id="chat", prompt="", env=env.name, split="chat")
    if env.name == "mcp":
        if not allow:
            raise ConfigError("an MCP server's tools are denied by default: name the ones the agent may use with "
                              "--allow NAME,NAME (or --allow '*' for all)")
        probe.metadata = {"mcp_allowed": list(allow), "read_only_tools": list(read_only or [])}
    elif allow:
        raise ConfigError("--allow chooses an MCP server's tools (--env mcp:...); other environments offer theirs")
    toolset, state = env.setup(probe)
    return ToolSet(list(toolset.tools.values())), state


def build_policy(args: argparse.Namespace) -> Any:
    """The policy the flags describe: an OpenAI-compatible endpoint, or a local model with an optional adapter."""
    from agentrig.policies.loader import PolicySpec, load_policy

    if args.base_url:
        return load_policy(PolicySpec(args.model, base_url=args.base_url, api_key_env=args.api_key_env,
                                      temperature=args.temperature, max_new_tokens=args.max_new_tokens))
    adapters = {"adapter": args.adapter} if args.adapter else None
    return load_policy(PolicySpec(args.model, adapters=adapters, max_new_tokens=args.max_new_tokens,
                                  temperature=args.temperature))


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `agentrig chat`."""
    parser.add_argument("--model", default="smollm2-135m", help="base model name or folder; with --base-url, the served model")
    parser.add_argument("--adapter", default=None, metavar="DIR", help="a trained LoRA adapter folder")
    parser.add_argument("--env", default="datadesk", help="whose tools the agent gets: datadesk, "
                        "path/to/file.py:make_env, or an MCP server (mcp:stdio:'COMMAND', mcp:http:URL)")
    parser.add_argument("--allow", type=comma_list, default=None, metavar="TOOL,...",
                        help="an MCP server's tools the agent may use (deny by default; '*' for all)")
    parser.add_argument("--read-only", type=comma_list, default=None, metavar="TOOL,...",
                        help="MCP tools that change nothing (only these may get injected faults)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--max-new-tokens", type=int, default=384, help="generation limit per step")
    parser.add_argument("--base-url", default=None, help="talk to a model behind an OpenAI-compatible endpoint")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", help="environment variable holding the API key")
    add_flags(parser.add_argument_group("harness rules (HarnessConfig)"), HarnessConfig)


def _prompted(stream: Any, console: Any) -> Iterator[str]:
    interactive = stream.isatty()
    while True:
        if interactive:
            console.print("[bold]you>[/] ", end="")
        line = stream.readline()
        if not line:
            return
        yield line


def main(args: argparse.Namespace) -> int:
    """Run `agentrig chat`."""
    from rich.console import Console

    from agentrig.envs import load_env
    from agentrig.jsonl import read_adapter_config

    if args.adapter:
        read_adapter_config(args.adapter)  # before the environment and the model load
    console = Console(soft_wrap=True)  # the terminal wraps; rich must not cut lines (paths, JSON) itself
    env = load_env(args.env)
    tools, state = session_tools(env, args.allow, args.read_only)
    policy = build_policy(args)
    console.print(f"agentrig chat on {args.env} ({len(tools.allowed)} tools: {', '.join(tools.allowed)}). "
                  "Type a request; /quit to leave.", highlight=False)
    try:
        run_chat(policy, tools, _prompted(sys.stdin, console), console, from_args(HarnessConfig, args), env.name)
    finally:
        env.close(state)
    return 0
