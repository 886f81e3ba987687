"""Every command that reads a user file, given the wrong kind of file: one clear error, never a traceback.

The files are real: episodes from `agentrig collect` (the expert teacher), a `data build` folder with its
samples, tokenized data and a TRL export, pairs from `agentrig data pairs` in both formats, an `agentrig eval`
folder, a PEFT adapter config and a training output folder. The wrong inputs are those files given to the
wrong command, plus an empty file, a last line cut in half (a killed writer), an older schema version, a
gzipped (binary) file and a missing path. Each case runs `agentrig.cli.main` and asserts a nonzero exit,
no traceback, and a message naming the file, the kind expected and the command that writes it. No model
or tokenizer loads in any case: every check runs before anything expensive (a check moved after the model
load would still fail here, on its message, only slower).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
from pathlib import Path

import pytest
import yaml

from agentrig.cli import main

EPISODES = "episodes file"
TOKENIZED = "tokenized dataset"
PAIRS = "preference-pairs file"
ADAPTER = "LoRA adapter folder"
COLLECT = "`agentrig collect`"
BUILD = "`agentrig data build`"
DATA_PAIRS = "`agentrig data pairs`"
TRAIN = "`agentrig train`"

# (command, wrong input, argv, the file the message must name, what else it must say).
# In argv, {name} is a fixture file, {tmp} a fresh folder, {sft:name}/{dpo:name} a YAML config whose dataset is that file.
CASES: list[tuple[str, str, list[str], str, tuple[str, ...]]] = [
    ("data inspect", "samples file", ["data", "inspect", "{samples}"], "samples", (TOKENIZED, BUILD, "samples file")),
    ("data inspect", "episodes file", ["data", "inspect", "{episodes}"], "episodes", (TOKENIZED, BUILD, EPISODES)),
    ("data inspect", "pairs file", ["data", "inspect", "{pairs}"], "pairs", (TOKENIZED, BUILD, PAIRS)),
    ("data inspect", "export folder", ["data", "inspect", "{export_dir}"], "export_dir", (TOKENIZED, BUILD, "export folder")),
    ("data inspect", "export file", ["data", "inspect", "{export_file}"], "export_file", (TOKENIZED, BUILD, "export")),
    ("data inspect", "adapter folder", ["data", "inspect", "{adapter}"], "adapter", (TOKENIZED, BUILD, ADAPTER)),
    ("data inspect", "empty file", ["data", "inspect", "{empty}"], "empty", (TOKENIZED, "empty")),
    ("data inspect", "truncated last line", ["data", "inspect", "{cut_tokenized}"], "cut_tokenized",
     ("{line:cut_tokenized}", "cut off")),
    ("data inspect", "binary file", ["data", "inspect", "{binary}"], "binary", (TOKENIZED, "binary")),
    ("data inspect", "missing file", ["data", "inspect", "{missing}"], "missing", (TOKENIZED, "no such")),
    ("data build", "tokenized file", ["data", "build", "--in", "{tokenized}", "--out", "{tmp}"], "tokenized",
     (EPISODES, COLLECT, TOKENIZED)),
    ("data build", "pairs file", ["data", "build", "--in", "{pairs}", "--out", "{tmp}"], "pairs", (EPISODES, COLLECT, PAIRS)),
    ("data build", "export file", ["data", "build", "--in", "{export_file}", "--out", "{tmp}"], "export_file",
     (EPISODES, COLLECT, "export")),
    ("data build", "build folder", ["data", "build", "--in", "{build}", "--out", "{tmp}"], "build",
     (EPISODES, COLLECT, "`data build` output folder")),
    ("data build", "empty file", ["data", "build", "--in", "{empty}", "--out", "{tmp}"], "empty", (EPISODES, "empty")),
    ("data build", "truncated last line", ["data", "build", "--in", "{cut_episodes}", "--out", "{tmp}"], "cut_episodes",
     ("{line:cut_episodes}", "cut off", "--skip-bad")),
    ("data build", "old episode schema", ["data", "build", "--in", "{old_episodes}", "--out", "{tmp}"], "old_episodes",
     ("schema version 0", COLLECT)),
    ("data build", "old sample schema", ["data", "build", "--in", "{old_samples}", "--out", "{tmp}"], "old_samples",
     ("schema version 0", BUILD)),
    ("data build", "binary file", ["data", "build", "--in", "{binary}", "--out", "{tmp}"], "binary", (EPISODES, "binary")),
    ("data build", "missing file", ["data", "build", "--in", "{missing}", "--out", "{tmp}"], "missing", (EPISODES, "no such")),
    ("data pairs", "samples file", ["data", "pairs", "--in", "{samples}", "--out", "{tmp}/p.jsonl"], "samples",
     (EPISODES, COLLECT, "samples file")),
    ("data pairs", "tokenized file", ["data", "pairs", "--in", "{tokenized}", "--out", "{tmp}/p.jsonl"], "tokenized",
     (EPISODES, COLLECT, TOKENIZED)),
    ("data pairs", "pairs file", ["data", "pairs", "--in", "{pairs}", "--out", "{tmp}/p.jsonl"], "pairs",
     (EPISODES, COLLECT, PAIRS)),
    ("data pairs", "build folder", ["data", "pairs", "--in", "{build}", "--out", "{tmp}/p.jsonl"], "build",
     (EPISODES, COLLECT, "folder")),
    ("data pairs", "empty file", ["data", "pairs", "--in", "{empty}", "--out", "{tmp}/p.jsonl"], "empty", (EPISODES, "empty")),
    ("data pairs", "truncated last line", ["data", "pairs", "--in", "{cut_episodes}", "--out", "{tmp}/p.jsonl"],
     "cut_episodes", ("{line:cut_episodes}", "cut off")),
    ("data pairs", "old episode schema", ["data", "pairs", "--in", "{old_episodes}", "--out", "{tmp}/p.jsonl"],
     "old_episodes", ("schema version 0", COLLECT)),
    ("data pairs", "binary file", ["data", "pairs", "--in", "{binary}", "--out", "{tmp}/p.jsonl"], "binary", (EPISODES, "binary")),
    ("data pairs", "missing file", ["data", "pairs", "--in", "{missing}", "--out", "{tmp}/p.jsonl"], "missing",
     (EPISODES, "no such")),
    ("data pairs", "--out is a folder", ["data", "pairs", "--in", "{episodes}", "--out", "{export_dir}"], "export_dir",
     ("folder", PAIRS)),
    ("data pairs", "--out is the tokenized file", ["data", "pairs", "--in", "{episodes}", "--out", "{copy:tokenized}"],
     "copy:tokenized", (TOKENIZED, "overwrite")),
    ("mcp", "episodes file as environment", ["mcp", "serve", "--env", "{episodes}:make_env"], "episodes",
     ("Python module",)),
    ("eval", "episodes file as MCP tasks", ["eval", "--env", "mcp:stdio:true", "--tasks", "{episodes}", "--policy",
                                            "expert", "--out", "{tmp}"], "episodes", ("line 1", "unknown field")),
    ("eval", "episodes file as MCP replay", ["eval", "--env", "mcp:replay:{episodes}", "--tasks", "{episodes}",
                                             "--policy", "expert", "--out", "{tmp}"], "episodes", ("replay record",)),
    ("collect", "binary MCP tasks file", ["collect", "--env", "mcp:stdio:true", "--tasks", "{binary}", "--teacher",
                                          "expert", "--no-progress", "--out", "{tmp}/e.jsonl"], "binary", ("binary",)),
    ("collect", "folder as MCP tasks", ["collect", "--env", "mcp:stdio:true", "--tasks", "{build}", "--no-progress",
                                        "--out", "{tmp}/e.jsonl"], "build", ("folder", "JSONL")),
    ("eval", "missing MCP tasks file", ["eval", "--env", "mcp:stdio:true", "--tasks", "{missing}", "--policy", "expert",
                                        "--out", "{tmp}"], "missing", ("does not exist",)),
    ("train --config", "episodes file", ["train", "--config", "{episodes}"], "episodes", ("YAML", "lora_agent.yaml", EPISODES)),
    ("train --config", "folder", ["train", "--config", "{build}"], "build", ("YAML", "lora_agent.yaml", "folder")),
    ("train --config", "binary file", ["train", "--config", "{binary}"], "binary", ("YAML", "binary")),
    ("train --config", "empty file", ["train", "--config", "{empty}"], "empty", ("dataset", "lora_agent.yaml")),
    ("train --config", "missing file", ["train", "--config", "{missing}"], "missing", ("YAML", "no such file")),
    ("train sft dataset", "pairs file", ["train", "--config", "{sft:pairs}"], "pairs", (PAIRS, "stage: dpo", BUILD)),
    ("train sft dataset", "eval folder", ["train", "--config", "{sft:eval_dir}"], "eval_dir", (TOKENIZED, BUILD, "evaluation")),
    ("train sft dataset", "empty file", ["train", "--config", "{sft:empty}"], "empty", (TOKENIZED, "empty")),
    ("train sft dataset", "truncated last line", ["train", "--config", "{sft:cut_tokenized}"], "cut_tokenized",
     ("{line:cut_tokenized}", "cut off")),
    ("train sft dataset", "binary file", ["train", "--config", "{sft:binary}"], "binary", (TOKENIZED, "binary")),
    ("train sft dataset", "missing file", ["train", "--config", "{sft:missing}"], "missing", (TOKENIZED, "no such")),
    ("train dpo dataset", "tokenized file", ["train", "--config", "{dpo:tokenized}"], "tokenized", (PAIRS, DATA_PAIRS, TOKENIZED)),
    ("train dpo dataset", "episodes file", ["train", "--config", "{dpo:episodes}"], "episodes", (PAIRS, DATA_PAIRS, EPISODES)),
    ("train dpo dataset", "samples file", ["train", "--config", "{dpo:samples}"], "samples", (PAIRS, DATA_PAIRS, "samples file")),
    ("train dpo dataset", "build folder", ["train", "--config", "{dpo:build}"], "build", (PAIRS, DATA_PAIRS, "`data build`")),
    ("train dpo dataset", "LLaMA-Factory pairs", ["train", "--config", "{dpo:pairs_lf}"], "pairs_lf",
     ("TRL", DATA_PAIRS, "LLaMA-Factory")),
    ("train dpo dataset", "empty file", ["train", "--config", "{dpo:empty}"], "empty", (PAIRS, "empty")),
    ("train dpo dataset", "truncated last line", ["train", "--config", "{dpo:cut_pairs}"], "cut_pairs",
     ("{line:cut_pairs}", "cut off")),
    ("train dpo dataset", "binary file", ["train", "--config", "{dpo:binary}"], "binary", (PAIRS, "binary")),
    ("export", "episodes file as adapter", ["export", "--adapter", "{episodes}"], "episodes", (ADAPTER, TRAIN, EPISODES)),
    ("export", "build folder as adapter", ["export", "--adapter", "{build}"], "build", (ADAPTER, TRAIN, "`data build`")),
    ("export", "training folder as adapter", ["export", "--adapter", "{run}"], "run", (ADAPTER, TRAIN, "{run}/adapter")),
    ("export", "truncated adapter_config.json", ["export", "--adapter", "{cut_adapter}"], "cut_adapter",
     ("adapter_config.json", "not valid JSON", TRAIN)),
    ("export", "missing folder", ["export", "--adapter", "{missing}"], "missing", (ADAPTER, "no such")),
    ("ttt", "build folder as adapter", ["ttt", "--adapter", "{build}", "--out", "{tmp}"], "build", (ADAPTER, TRAIN)),
    ("ttt", "episodes file as adapter", ["ttt", "--adapter", "{episodes}", "--out", "{tmp}"], "episodes", (ADAPTER,)),
    ("compare", "tokenized file as episodes", ["compare", "{tokenized}", "{episodes}"], "tokenized", (EPISODES, TOKENIZED)),
    ("compare", "pairs file as episodes", ["compare", "{episodes}", "{pairs}"], "pairs", (EPISODES, PAIRS)),
    ("compare", "missing file", ["compare", "{missing}", "{episodes}"], "missing", (EPISODES, "no such")),
    ("eval", "build folder as adapter", ["eval", "--adapter", "a={build}", "--out", "{tmp}"], "build", (ADAPTER, TRAIN)),
    ("eval", "episodes file as adapter", ["eval", "--adapter", "a={episodes}", "--out", "{tmp}"], "episodes",
     (ADAPTER, TRAIN, EPISODES)),
    ("eval", "training folder as adapter", ["eval", "--adapter", "a={run}", "--out", "{tmp}"], "run", (ADAPTER, "{run}/adapter")),
    ("eval", "truncated adapter_config.json", ["eval", "--adapter", "a={cut_adapter}", "--out", "{tmp}"], "cut_adapter",
     ("adapter_config.json", "not valid JSON")),
    ("eval", "--out is a file", ["eval", "--policy", "expert", "--limit", "1", "--out", "{episodes}"], "episodes", ("folder",)),
    ("chat", "build folder as adapter", ["chat", "--adapter", "{build}"], "build", (ADAPTER, TRAIN)),
    ("chat", "truncated adapter_config.json", ["chat", "--adapter", "{cut_adapter}"], "cut_adapter",
     ("adapter_config.json", "not valid JSON")),
    ("serve", "build folder as adapter", ["serve", "--adapter", "a={build}"], "build", (ADAPTER, TRAIN)),
    ("collect", "--out is a folder", ["collect", "--episodes", "1", "--no-progress", "--out", "{export_dir}"], "export_dir",
     ("folder", EPISODES)),
    ("collect", "--out is a samples file", ["collect", "--episodes", "1", "--no-progress", "--out", "{copy:samples}"],
     "copy:samples",
     ("samples file", "overwrite")),
    ("collect", "build folder as adapter", ["collect", "--teacher", "model", "--model", "smollm2-135m", "--adapter", "{build}",
                                            "--episodes", "1", "--no-progress", "--out", "{tmp}/e.jsonl"], "build", (ADAPTER, TRAIN)),
    ("bench", "build folder as adapter", ["bench", "bfcl", "--model", "smollm2-135m", "--out", "{tmp}", "--adapter", "{build}"],
     "build", ("adapter_config.json",)),
    ("demo", "--out is a folder", ["demo", "--out", "{export_dir}"], "export_dir", ("folder", EPISODES)),
    ("run", "--out is a file", ["run", "--out", "{episodes}"], "episodes", ("folder",)),
]


def _cut(src: Path, dst: Path) -> int:
    """Copy `src` with its last line cut in half and no newline after it, as a killed writer leaves it; its line number."""
    lines = src.read_bytes().splitlines(keepends=True)
    dst.write_bytes(b"".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    return len(lines)


def _with_version(src: Path, dst: Path, version: int) -> None:
    rows = [json.loads(line) for line in src.read_text().splitlines()]
    dst.write_text("".join(json.dumps({**row, "schema_version": version}) + "\n" for row in rows))


@pytest.fixture(scope="module")
def files(tmp_path_factory, smol_tokenizer) -> dict[str, Path]:
    """Real files of every kind, made by the code paths that write them, and the broken variants."""
    from agentrig.data.collect import CollectConfig, run_collect
    from agentrig.data.databuild import build_dataset
    from agentrig.data.exports import export_samples
    from agentrig.data.render import Renderer
    from agentrig.data.samples import Sample
    from agentrig.jsonl import read_jsonl
    from agentrig.train.trainconfig import TrainConfig

    root = tmp_path_factory.mktemp("inputs")
    f: dict[str, Path] = {"episodes": root / "train.jsonl", "build": root / "built", "pairs": root / "pairs.jsonl",
                          "pairs_lf": root / "lf" / "pairs.jsonl", "eval_dir": root / "eval", "run": root / "run",
                          "missing": root / "no_such.jsonl"}
    run_collect(CollectConfig(episodes=6, out=str(f["episodes"]), faults=0.0, detours=0.0), progress=False)
    build_dataset(f["episodes"], f["build"], renderer=Renderer(smol_tokenizer), bfcl_check=False)
    f["samples"], f["tokenized"] = f["build"] / "samples.jsonl", f["build"] / "tokenized.jsonl"
    f["export_dir"] = f["build"] / "exports" / "trl"
    export_samples([Sample.from_dict(r) for r in read_jsonl(f["samples"])], "trl", f["export_dir"])
    f["export_file"] = f["export_dir"] / "train.jsonl"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["data", "pairs", "--in", str(f["episodes"]), "--out", str(f["pairs"])]) == 0
        assert main(["data", "pairs", "--in", str(f["episodes"]), "--out", str(f["pairs_lf"]), "--format", "llamafactory"]) == 0
        assert main(["eval", "--policy", "expert", "--limit", "1", "--split", "test", "--out", str(f["eval_dir"])]) == 0
    f["adapter"] = f["run"] / "adapter"  # what `agentrig train` leaves: the run folder, its adapter inside
    from peft import LoraConfig

    LoraConfig(r=8, target_modules=["q_proj"], base_model_name_or_path="smollm2-135m").save_pretrained(f["adapter"])
    TrainConfig(dataset=str(f["build"])).save(f["run"])
    f["cut_adapter"] = root / "cut_adapter"
    f["cut_adapter"].mkdir()
    _cut(f["adapter"] / "adapter_config.json", f["cut_adapter"] / "adapter_config.json")
    f["empty"] = root / "empty.jsonl"
    f["empty"].write_bytes(b"")
    f["binary"] = root / "train.jsonl.gz"
    f["binary"].write_bytes(gzip.compress(f["episodes"].read_bytes(), mtime=0))
    for name in ("episodes", "tokenized", "pairs"):
        f[f"cut_{name}"] = root / f"cut_{name}.jsonl"
        f[f"line:cut_{name}"] = Path(f"{f[f'cut_{name}']}:{_cut(f[name], f[f'cut_{name}'])}")
    f["old_episodes"], f["old_samples"] = root / "old_episodes.jsonl", root / "old_samples.jsonl"
    _with_version(f["episodes"], f["old_episodes"], 0)
    _with_version(f["samples"], f["old_samples"], 0)
    return f


def _fill(text: str, f: dict[str, Path], tmp: Path) -> str:
    """`text` with its placeholders replaced (see CASES); `{copy:name}` is a copy in `tmp`, for cases that could overwrite it."""
    for name in f:
        if f"{{copy:{name}}}" in text:
            copy = tmp / "copies" / f[name].name
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_bytes(f[name].read_bytes())
            text = text.replace(f"{{copy:{name}}}", str(copy))
    for stage in ("sft", "dpo"):
        for name in f:
            if f"{{{stage}:{name}}}" in text:
                config = {"dataset": str(f[name]), "output_dir": str(tmp / "run"), "stage": stage}
                if stage == "dpo":
                    config["adapter_name_or_path"] = str(f["adapter"])
                path = tmp / f"{stage}.yaml"
                path.write_text(yaml.safe_dump(config))
                text = text.replace(f"{{{stage}:{name}}}", str(path))
    for name in sorted(f, key=len, reverse=True):
        text = text.replace(f"{{{name}}}", str(f[name]))
    return text.replace("{tmp}", str(tmp))


def run_case(argv: list[str], f: dict[str, Path], tmp: Path, capsys) -> tuple[int, str]:
    """Run the CLI on one case; its exit code and everything it printed."""
    tmp.mkdir(parents=True, exist_ok=True)
    code = main([_fill(a, f, tmp) for a in argv])
    out = capsys.readouterr()
    return code, out.out + out.err


@pytest.mark.parametrize("command, case, argv, named, says", CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_a_wrong_input_is_one_clear_error(command, case, argv, named, says, files, tmp_path, capsys):
    code, text = run_case(argv, files, tmp_path / "case", capsys)
    assert code != 0
    assert "Traceback" not in text
    assert _fill("{" + named + "}", files, tmp_path / "case") in text
    for words in says:
        assert _fill(words, files, tmp_path) in text, f"{command} ({case}): {words!r} not in {text!r}"
    assert text.count("\n") <= 2, "one paragraph"


def test_the_table_covers_every_command_that_reads_a_file():
    from agentrig.cli import COMMANDS

    assert len(CASES) >= 60
    assert {c[0].split()[0] for c in CASES} == set(COMMANDS)
