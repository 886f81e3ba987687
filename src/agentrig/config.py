"""Typed configs whose command-line flags derive from their fields, and one way to save them.

The pattern is TRL's `HfArgumentParser`/`TrlParser` (and `TrainConfig`'s for YAML): a config is a
dataclass, each field carries its help text (and, where it has them, its choices, flag name and a parser
for its command-line text) in `metadata`; `add_flags(parser, Config)` makes one flag per field, and
`from_args(Config, args)` builds the config back from the parsed flags, so a field added to a config is a
flag with help without a second edit. Validation lives in the config's `__post_init__` (a `ConfigError`
naming the flag), so a config built from Python is checked exactly like one built from the command line.

`save_config(config, path)` writes every stage's resolved config the same way: JSON of the dataclass
(nested configs inline) with `config_class` naming it; `load_saved(path)` reads one back as a dict.
(`agentrig train` keeps its YAML file `agentrig_train.yaml`, since that file is also an input format:
LLaMA-Factory-style keys a user edits and passes back with `--config`.)

Used by: `CollectConfig` (`agentrig collect`), `EvalConfig` and the harness flags (`agentrig eval`),
`RunConfig` (`agentrig run`), `BenchConfig` (`agentrig bench bfcl`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable, Iterable, TypeVar

T = TypeVar("T")


def opt(default: Any = dataclasses.MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
        choices: Iterable[str] | None = None, flag: str | None = None, parse: Callable[[str], Any] | None = None,
        metavar: str | None = None, cli: bool = True) -> Any:
    """A dataclass field with its command-line facts: help text, choices, a flag name other than
    `--field-name`, a parser for the flag's text (`"a,b"` -> a list), or `cli=False` for no flag."""
    meta = {"help": help, "choices": list(choices) if choices is not None else None, "flag": flag, "parse": parse,
            "metavar": metavar, "cli": cli}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def comma_list(text: str) -> list[str]:
    """`"a, b,,c"` -> `["a", "b", "c"]` (the form of list flags such as `--split`)."""
    return [part.strip() for part in text.split(",") if part.strip()]


_SCALARS: dict[str, Callable[[str], Any]] = {"int": int, "float": float, "str": str, "Path": Path}


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def flag_name(f: dataclasses.Field) -> str:
    """The flag of a field: its metadata's `flag`, else `--` + the name with dashes."""
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def add_flags(parser: argparse.ArgumentParser, cls: type, only: Iterable[str] | None = None,
              skip: Iterable[str] = (), required: Iterable[str] = ()) -> None:
    """One flag per field of the dataclass `cls` (those in `only`, minus `skip`, and not `cli=False`)."""
    wanted = set(only) if only is not None else None
    skipped, needed = set(skip), set(required)
    for f in dataclasses.fields(cls):
        if (wanted is not None and f.name not in wanted) or f.name in skipped or not f.metadata.get("cli", True):
            continue
        kind = str(f.type).replace(" | None", "")
        default = _default(f)
        text = f.metadata.get("help", "").replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": f.name}
        if kind == "bool":
            kwargs["action"] = "store_true" if default is False else argparse.BooleanOptionalAction
            kwargs["default"] = default
        else:
            parse = f.metadata.get("parse") or _SCALARS.get(kind)
            if parse is None:
                raise TypeError(f"{cls.__name__}.{f.name}: type {f.type} needs `parse` in its opt() to be a flag")
            kwargs["type"] = parse
            if f.name in needed:
                kwargs["required"] = True
            else:
                kwargs["default"] = default
                if default not in (None, "", [], {}):
                    shown = ",".join(map(str, default)) if isinstance(default, list) else default
                    text = f"{text} (default: {shown})"
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
            if f.metadata.get("metavar"):
                kwargs["metavar"] = f.metadata["metavar"]
        kwargs["help"] = text
        parser.add_argument(flag_name(f), **kwargs)


def from_args(cls: type[T], args: argparse.Namespace, **extra: Any) -> T:
    """The `cls` config from parsed flags (fields without a flag keep their defaults unless in `extra`)."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    values.update(extra)
    return cls(**values)


def config_dict(config: Any) -> dict[str, Any]:
    """A config as JSON-ready data (paths as strings, nested configs inline)."""
    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return value

    return plain(dataclasses.asdict(config))


def save_config(config: Any, path: str | Path, **extra: Any) -> Path:
    """Write a resolved config as JSON, `config_class` first, `extra` keys after the fields."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"config_class": type(config).__name__, **config_dict(config), **extra}
    path.write_text(json.dumps(payload, indent=1), encoding="utf-8")
    return path


def load_saved(path: str | Path) -> dict[str, Any]:
    """A saved config's fields (without `config_class`)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    data.pop("config_class", None)
    return data
