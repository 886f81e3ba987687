"""Environments: `load_env("datadesk")`, `load_env("path/to/file.py:make_env")` (see docs/environments.md), or an
MCP server's tools with a tasks file: `load_env("mcp:stdio:COMMAND", tasks="tasks.jsonl")` (docs/mcp.md).

Holds the Environment API (`base.py`) and the built-in `datadesk/` environment with everything specific to
it (database, tools, task families, checker, expert teacher). May import: `agentrig.harness` and the
top-level helpers only; collection, training and evaluation reach an environment through `Environment`.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from agentrig.envs.base import SPLITS, CheckResult, Environment
from agentrig.errors import ConfigError

__all__ = ["SPLITS", "CheckResult", "Environment", "load_env"]


def load_env(spec: str, tasks: str | None = None, record: str | None = None) -> Environment:
    """The environment named by `spec`: "datadesk", "path/to/file.py:make_env" (a function returning one), or
    "mcp:stdio:COMMAND" / "mcp:http:URL" / "mcp:replay:FILE" with its `tasks` file (`record`: append every
    MCP tool result to this replay file). A tasks file given to another environment is an error, not ignored."""
    if spec.startswith("mcp:"):
        from agentrig.mcp.env import make_mcp_env

        return make_mcp_env(spec, tasks, record)
    if tasks is not None or record is not None:
        raise ConfigError(f"--tasks and --mcp-record belong to MCP environments (--env mcp:...), not {spec!r}")
    if spec == "datadesk":
        from agentrig.envs.datadesk import DatadeskEnv

        return DatadeskEnv()
    if spec == "toolworld":
        from agentrig.envs.toolworld import ToolworldEnv

        return ToolworldEnv()
    if ":" not in spec:
        raise ConfigError(f"unknown environment {spec!r}: use 'datadesk', 'toolworld', 'path/to/file.py:make_env' or "
                          "'mcp:stdio:COMMAND' / 'mcp:http:URL' (with --tasks FILE.jsonl)")
    path_text, func_name = spec.rsplit(":", 1)
    path = Path(path_text)
    if not path.is_file():
        raise ConfigError(f"environment file {path} does not exist (from --env {spec!r})")
    module_name = f"agentrig_user_env_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(module_name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"cannot import {path} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_name] = module  # dataclasses and pickling (worker processes) look modules up here
    folder = str(path.resolve().parent)
    added = folder not in sys.path
    if added:  # the file imports its siblings (`from my_tools import ...`) as a script would
        sys.path.insert(0, folder)
    try:
        module_spec.loader.exec_module(module)
    except ImportError as exc:
        raise ConfigError(f"{path} failed to import: {exc} (its own folder {folder} is on the import path; "
                          "install other packages it needs)") from None
    finally:
        if added:
            sys.path.remove(folder)
    factory = getattr(module, func_name, None)
    if factory is None or not callable(factory):
        raise ConfigError(f"{path} has no function {func_name!r}")
    env = factory()
    if not isinstance(env, Environment):
        raise ConfigError(f"{spec} returned {type(env).__name__}, not an agentrig.envs.Environment")
    return env
