"""`agentrig demo`: a scripted episode where a tool fails three times, the recovery rule fires and the agent switches.

The policy is a `ScriptedPolicy`, the tools are real Python functions (a weather service that is down,
a search tool that works), and the harness is the same one used for collection, training and inference.
It prints the transcript with rich and writes the episode record as JSONL.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from agentrig.harness.loop import HarnessConfig, run_episode
from agentrig.harness.policy import ScriptedPolicy
from agentrig.harness.tools import ToolSet, tool
from agentrig.harness.trajectory import Episode, TaskSpec, write_episodes
from agentrig.jsonl import check_output_file


@tool
def get_weather(city: str, units: str = "metric") -> dict:
    """Current weather for a city from the weather service.

    Args:
        city: city name, e.g. "Paris"
        units: "metric" or "imperial"
    """
    raise ConnectionError("weather service unavailable (HTTP 503)")


@tool
def search_web(query: str) -> list:
    """Search the web and return the top result snippets.

    Args:
        query: what to search for
    """
    return [{"title": "Paris weather today", "snippet": "Paris: 18 °C, light rain, wind 12 km/h"}]


@tool
def convert_temperature(celsius: float) -> float:
    """Convert a temperature from Celsius to Fahrenheit.

    Args:
        celsius: temperature in degrees Celsius
    """
    return round(celsius * 9 / 5 + 32, 1)


def _call(name: str, **arguments: object) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


SCRIPT = [
    "Let me check the weather service.\n" + _call("get_weather", city="Paris"),
    "The service failed; retrying once.\n" + _call("get_weather", city="Paris", units="metric"),
    _call("get_weather", city="Paris, France"),
    "The weather tool keeps failing, so I will search the web instead.\n" + _call("search_web", query="Paris weather today"),
    _call("convert_temperature", celsius=18),
    "It is 18 °C (64.4 °F) in Paris with light rain. (The weather service was down; this comes from a web search.)",
]


def run_demo(out: Path) -> Episode:
    """Run the scripted recovery episode and write its record to `out`."""
    check_output_file(out, "episodes", "--out")
    tools = ToolSet([get_weather, search_web, convert_temperature])
    task = TaskSpec(id="demo-weather", prompt="What's the weather in Paris right now, in Celsius and Fahrenheit?",
                    env="demo", family="recovery")
    episode = run_episode(task, tools, ScriptedPolicy(SCRIPT), HarnessConfig(), episode_id="demo-0")
    out.parent.mkdir(parents=True, exist_ok=True)
    write_episodes(out, [episode])
    return episode


def print_transcript(episode: Episode) -> None:
    """Print an episode readably: user goal, each step's text, calls, results and notices, the ending."""
    from rich.console import Console
    from rich.panel import Panel

    console = Console()
    console.print(Panel(episode.task.prompt, title="user", border_style="cyan"))
    for step in episode.steps:
        if step.text:
            console.print(f"[bold]assistant[/bold] (step {step.index}): {step.text}", markup=True, highlight=False)
        for call, result in zip(step.calls, step.results):
            style = "green" if result.ok else "red"
            console.print(f"  [yellow]→ {call.name}[/yellow]({json.dumps(call.arguments, ensure_ascii=False)})", highlight=False)
            console.print(f"  [{style}]← {result.content}[/{style}]", highlight=False)
        for defect in step.defects:
            if defect.call_id is None:
                console.print(f"  [red]! {defect.kind}: {defect.message}[/red]", highlight=False)
        for notice in step.notices:
            console.print(Panel(notice, title="harness notice", border_style="magenta"))
    console.print(f"[bold]ended:[/bold] {episode.termination}; failures per tool: {episode.tool_failures}")


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `agentrig demo`."""
    parser.add_argument("--out", type=Path, default=Path("runs/demo/episode.jsonl"), help="where to write the episode record")


def main(args: argparse.Namespace) -> int:
    """Run the demo and print its transcript."""
    episode = run_demo(args.out)
    print_transcript(episode)
    print(f"episode record written to {args.out}")
    return 0
