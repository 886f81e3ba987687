"""Configs whose flags derive from their fields (agentrig.config), and the one save format."""

from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from agentrig.config import add_flags, comma_list, from_args, load_saved, opt, save_config
from agentrig.errors import ConfigError


@dataclasses.dataclass
class Demo:
    name: str = opt("x", "a name")
    count: int = opt(3, "how many")
    rate: float | None = opt(None, "a rate")
    fast: bool = opt(False, "go fast")
    memory: bool = opt(True, "remember")
    kind: str = opt("a", "one of two", choices=("a", "b"))
    parts: list[str] = opt(help="comma list", factory=lambda: ["p", "q"], parse=comma_list, flag="--part")
    hidden: int = opt(7, "not a flag", cli=False)


def _parse(cls, argv, **kw):
    parser = argparse.ArgumentParser()
    add_flags(parser, cls, **kw)
    return parser, parser.parse_args(argv)


def test_flags_come_from_the_fields_with_help_defaults_and_types():
    parser, args = _parse(Demo, [])
    assert from_args(Demo, args) == Demo()  # no flags: the dataclass defaults
    text = parser.format_help()
    assert "--count COUNT how many (default: 3)" in " ".join(text.split())
    assert "--part" in text and "--hidden" not in text and "--no-memory" in text
    _, args = _parse(Demo, ["--name", "y", "--count", "5", "--rate", "0.5", "--fast", "--no-memory", "--kind", "b",
                            "--part", "a, b,,c"])
    assert from_args(Demo, args) == Demo("y", 5, 0.5, True, False, "b", ["a", "b", "c"])
    with pytest.raises(SystemExit):
        _parse(Demo, ["--kind", "z"])
    with pytest.raises(SystemExit):
        _parse(Demo, ["--count", "many"])


def test_every_collect_and_eval_field_is_a_flag():
    from agentrig.data.collect import CollectConfig, configure as collect_flags
    from agentrig.evals.evaluate import EvalConfig, configure as eval_flags
    from agentrig.harness import HarnessConfig

    for configure, classes in ((collect_flags, [CollectConfig]), (eval_flags, [EvalConfig, HarnessConfig])):
        parser = argparse.ArgumentParser()
        configure(parser)
        dests = {a.dest for a in parser._actions}
        for cls in classes:
            missing = [f.name for f in dataclasses.fields(cls) if f.metadata.get("cli", True) and f.name not in dests]
            assert not missing, (cls.__name__, missing)
            assert all(f.metadata.get("help") for f in dataclasses.fields(cls)), cls.__name__


def test_configs_validate_the_same_from_python_and_the_cli():
    from agentrig.cli import main
    from agentrig.data.collect import CollectConfig
    from agentrig.run import RunConfig

    with pytest.raises(ConfigError, match="--episodes must be at least 1"):
        CollectConfig(episodes=0)
    with pytest.raises(ConfigError, match="--detours is a share"):
        CollectConfig(detours=1.5)
    with pytest.raises(ConfigError, match="--repeat-detours is a share"):
        CollectConfig(repeat_detours=1.5)
    with pytest.raises(ConfigError, match="--mixup-detours is a share"):
        CollectConfig(mixup_detours=-0.1)
    with pytest.raises(ConfigError, match="--borrow-detours is a share"):
        CollectConfig(borrow_detours=2.0)
    with pytest.raises(ConfigError, match="unknown profile"):
        RunConfig(profile="huge")
    assert main(["collect", "--episodes", "0", "--out", "/tmp/never.jsonl"]) == 2


def test_save_config_round_trips_and_names_the_class(tmp_path):
    from agentrig.data.collect import CollectConfig

    cfg = CollectConfig(episodes=7, fault_rates={"timeout": 0.1})
    path = save_config(cfg, tmp_path / "c.json", note="extra")
    data = json.loads(path.read_text())
    assert data["config_class"] == "CollectConfig" and data["note"] == "extra"
    saved = load_saved(path)
    saved.pop("note")
    assert CollectConfig(**saved) == cfg
