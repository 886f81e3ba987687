"""Package-level promises: a light `import agentrig`, imports that run one way, every CLI command wired, the demo runs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from agentrig.cli import COMMANDS, main


def test_import_agentrig_and_cli_modules_do_not_import_torch():
    modules = ["agentrig", "agentrig.harness", "agentrig.harness.tools", "agentrig.harness.protocol"] + [m for m, _ in COMMANDS.values()]
    code = "import sys\n" + "".join(f"import {m}\n" for m in modules) + (
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'trl') if m in sys.modules]\n"
        "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_every_command_has_help(capsys):
    for name in COMMANDS:
        try:
            main([name, "--help"])
        except SystemExit as exc:
            assert exc.code == 0, name
        assert name in capsys.readouterr().out


def test_demo_command_prints_transcript_and_writes_record(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "ep.jsonl")]) == 0
    out = capsys.readouterr().out
    assert "harness notice" in out and "search_web" in out and "ended: final_answer" in out
    assert (tmp_path / "ep.jsonl").read_text().count("\n") == 1


# -- import direction --------------------------------------------------------------------------

SRC = Path(__file__).resolve().parents[1] / "src" / "agentrig"
# The groups each group may import (besides itself and FOUNDATION). Imports run one way: the harness is the
# floor, environments build on it, data on both, training on data; policies and evaluation sit beside them.
ALLOWED: dict[str, set[str]] = {
    "harness": set(),
    "envs": {"harness"},
    "data": {"harness", "envs"},
    "train": {"data"},
    "policies": {"harness"},
    "evals": {"harness", "envs", "policies"},
    "bfcl": {"harness", "policies", "evals"},
    "serve": {"harness", "policies", "data", "evals"},
    "mcp": {"harness", "envs"},
    "ttt": {"harness", "envs", "data", "train", "policies"},  # never evals: the TTT loop does not score itself
}
FOUNDATION = {"config", "errors", "jsonl", "models", "progress"}  # small helpers any group may use; they import only each other
TOP = {"__init__", "__main__", "cli", "run"}  # entry points: may import anything, nothing imports them
# Single module-to-module edges against the grain, each imported inside the function that needs it.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("data.collect", "policies"): "a model or API teacher for `collect --teacher model|openai`",
    ("data.databuild", "bfcl.data"): "the build refuses samples whose user text is a BFCL question",
    ("policies.hf_policy", "data.render"): "inference renders prompts with the chat rendering training uses",
    ("harness.tools", "mcp"): "ToolSet.from_mcp: a tool set from an MCP server's tools",
    ("envs", "mcp.env"): "load_env('mcp:...'): an environment from an MCP server and a tasks file",
    ("data.datacli", "mcp.client"): "data build --mcp-server: the server's tools now, to refuse changed ones",
    ("ttt.loop", "evals.pertask"): "ttt --per-task: its answers are checked by the evaluator as they are given",
    ("evals.pertask", "ttt.pertask"): "the per-task loop, run on a blind environment, hands the evaluator its answers",
}


def _group(module: str) -> str:
    return module.split(".")[0]


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported agentrig module without the `agentrig.` prefix, imported at module level) for one file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = {id(n) for n in tree.body}
    out = []
    for node in ast.walk(tree):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            if name == "agentrig" or not name.startswith("agentrig."):
                continue
            out.append((name.removeprefix("agentrig."), id(node) in top_level))
    return out


def test_imports_run_one_way():
    bad = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).with_suffix("")
        module = ".".join(p for p in rel.parts if p != "__init__") or "__init__"
        source = _group(module)
        for target, at_top in _imports(path):
            dest = _group(target)
            if dest in {"cli", "run"} and module not in {"__main__"}:
                bad.append(f"{module} imports {target}: nothing imports the entry points")
            elif source in TOP or dest == source or dest in FOUNDATION:
                continue
            elif source in FOUNDATION:
                bad.append(f"{module} imports {target}: the foundation imports only itself")
            elif dest in ALLOWED[source]:
                continue
            else:
                reason = next((r for (m, t), r in EXCEPTIONS.items()
                               if module == m and (target == t or target.startswith(t + "."))), None)
                if reason is None:
                    bad.append(f"{module} imports {target}: {source} may import {sorted(ALLOWED[source]) or 'nothing'}")
                elif at_top:
                    bad.append(f"{module} imports {target} at module level; allowed only inside a function ({reason})")
    assert not bad, "\n".join(bad)


def test_import_direction_test_sees_every_group():
    groups = {p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert groups == set(ALLOWED)
    for group in groups:
        doc = ast.get_docstring(ast.parse((SRC / group / "__init__.py").read_text(encoding="utf-8")))
        assert doc and "import" in doc, f"{group}/__init__.py must say what it holds and what it may import"
