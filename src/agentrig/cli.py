"""The `agentrig` command line: one subcommand per stage, each defined next to the code it runs.

Each command module exposes `configure(parser)` and `main(args) -> int`; this file only wires them up,
so a reader can grep from a flag to the line that uses it. User errors (`AgentrigError`) print a clear
message and exit 2 without a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from agentrig.errors import AgentrigError

# command -> (module, one-line help). Modules must be light to import (torch only inside functions).
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("agentrig.harness.demo", "run a scripted episode with a failing tool and the recovery rule"),
    "collect": ("agentrig.data.collect", "collect trajectories by running a teacher through the harness"),
    "data": ("agentrig.data.datacli", "build, inspect and pair training data from episodes"),
    "train": ("agentrig.train.train", "LoRA SFT or DPO from a YAML config"),
    "export": ("agentrig.train.export", "merge an adapter into full weights for serving"),
    "eval": ("agentrig.evals.evaluate", "evaluate a model or adapters by task completion"),
    "ttt": ("agentrig.ttt.loop", "test-time training: adapt an adapter to an environment's tools before it works there"),
    "compare": ("agentrig.evals.paired", "paired comparison of two evaluations on the same tasks (McNemar)"),
    "run": ("agentrig.run", "the main job: collect, build, train, evaluate and report"),
    "chat": ("agentrig.evals.chat", "talk to the agent on the environment's tools in the terminal"),
    "serve": ("agentrig.serve.server", "serve the model and its adapters behind an OpenAI-compatible API"),
    "mcp": ("agentrig.mcp.server", "serve an environment's tools as an MCP server (stdio or streamable HTTP)"),
    "bench": ("agentrig.bfcl.bench", "public benchmarks (BFCL) offline through the harness"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The full parser; with `only`, just that command's module is imported."""
    parser = argparse.ArgumentParser(prog="agentrig", description="Train small language models into tool-using agents.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if only is None or only == name:
            module = importlib.import_module(module_name)
            module.configure(p)
            p.set_defaults(_module=module)
    return parser


def cpu_allocator_defaults() -> None:
    """Ask torch's CPU allocator for transparent huge pages on large blocks (>= 2 MiB), before torch loads.

    Training and prefill allocate and free GBs of activations per step; on 4 KiB pages that is millions of
    page faults, and glibc's heap fragments around them. With huge pages (`THP_MEM_ALLOC_ENABLE`, read by
    torch once at its first allocation) a SmolLM2 LoRA step at 2x2048 on 2 CPU cores ran ~1.1x faster and
    peaked at 6.0 GB instead of 7.8 GB (docs/benchmarks.md). A value the user set is kept; without torch or THP it is inert.
    """
    if "torch" not in sys.modules:
        os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    cpu_allocator_defaults()
    argv = list(sys.argv[1:] if argv is None else argv)
    only = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(only=only if only else "__none__")
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 0
    try:
        return int(args._module.main(args) or 0)
    except AgentrigError as exc:
        print(f"agentrig {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"agentrig {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
