"""Package-level promises: a light `import agentrig`, every CLI command wired, the demo command runs."""

from __future__ import annotations

import subprocess
import sys

from agentrig.cli import COMMANDS, main


def test_import_agentrig_and_cli_modules_do_not_import_torch():
    modules = ["agentrig", "agentrig.harness", "agentrig.tools", "agentrig.protocol"] + [m for m, _ in COMMANDS.values()]
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
