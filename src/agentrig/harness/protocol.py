"""Output protocols: the system prompt the model reads and the parser for what it writes.

The default is Hermes (`<tool_call>` JSON blocks, FIELD_NOTES section 2); `Llama31Protocol` implements
the Llama-3.1 JSON style (`{"name": ..., "parameters": ...}`), selected by `HarnessConfig.protocol`.
Parsing never raises: it is strict JSON first, then a recorded lenient repair (`json_repair`, then
`ast.literal_eval`), and every other problem becomes a classified `Defect` whose feedback text comes
from the one template file, `feedback.json`. Not handled here: schema validation and permissions
(the harness does those, also for repaired calls).
"""

from __future__ import annotations

import abc
import ast
import json
import re
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Protocol as TypingProtocol, get_args

from agentrig.harness.trajectory import Defect, DefectKind, Repair, ToolCall

DEFECT_KINDS: tuple[str, ...] = get_args(DefectKind)
MAX_REPAIR_CHARS = 20_000  # longer blocks are not worth repairing (and json_repair is slow on them)


@lru_cache(maxsize=1)
def _templates() -> dict[str, Any]:
    return json.loads(resources.files("agentrig.harness").joinpath("feedback.json").read_text(encoding="utf-8"))


def feedback(kind: str, protocol: str | None = None, **fields: Any) -> str:
    """The stable feedback text of a defect class or harness notice, filled in.

    With `protocol`, that protocol's own text (key `KIND.PROTOCOL`) when its call syntax needs one.
    """
    templates = _templates()
    key = f"{kind}.{protocol}" if protocol is not None and f"{kind}.{protocol}" in templates else kind
    return str(templates[key]).format(**fields)


class RulesLike(TypingProtocol):
    """What the system prompt states about the harness (HarnessConfig satisfies it)."""

    max_steps: int
    switch_after_failures: int
    memory: bool
    tool_listing: str  # "json": one JSON spec per line (Hermes's own layout); "compact": one signature line per tool


@dataclass
class ParsedOutput:
    """What a model message means: free text, tool calls, repairs, defects, and whether it is final."""

    text: str
    calls: list[ToolCall] = field(default_factory=list)
    repairs: list[Repair] = field(default_factory=list)
    defects: list[Defect] = field(default_factory=list)
    is_final: bool = False


def canonical_arguments(arguments: dict[str, Any], schema: dict[str, Any] | None = None) -> dict[str, Any]:
    """Arguments with keys in the schema's property order (unknown keys after, sorted)."""
    order = list((schema or {}).get("properties", {}))
    known = [k for k in order if k in arguments]
    rest = sorted(k for k in arguments if k not in order)
    return {k: arguments[k] for k in known + rest}


def call_json(name: str, arguments: dict[str, Any], args_key: str = "arguments") -> str:
    """The one canonical JSON form of a call."""
    return json.dumps({"name": name, args_key: arguments}, ensure_ascii=False)


def _load_call_object(raw: str) -> tuple[Any, Repair | None, str | None]:
    """Strict JSON, then json_repair, then ast.literal_eval. Returns (value, repair, failure reason)."""
    text = raw.strip()
    try:
        return json.loads(text), None, None
    except (json.JSONDecodeError, RecursionError) as exc:
        strict_error = f"invalid JSON: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
    if len(text) > MAX_REPAIR_CHARS:
        return None, None, strict_error
    for kind, repair_fn in (("json_repair", _json_repair), ("literal_eval", _literal_eval)):
        value = repair_fn(text)
        if isinstance(value, dict) and value:
            return value, Repair(kind, raw, json.dumps(value, ensure_ascii=False, default=repr)), None
    return None, None, strict_error


def _json_repair(text: str) -> Any:
    """json_repair's reading of the text, or None when it cannot make one (a best-effort helper)."""
    import json_repair

    try:
        return json_repair.repair_json(text, return_objects=True)
    except Exception:  # its failure, whatever the exception, only means "not repairable this way"
        return None


def _literal_eval(text: str) -> Any:
    """The text as a Python literal (single-quoted dicts), or None when it is not one."""
    try:
        with warnings.catch_warnings():  # model text may hold invalid escapes; not our warning to print
            warnings.simplefilter("ignore")
            return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _normalize_call(obj: Any, raw: str, args_key: str, repairs: list[Repair]) -> tuple[str, dict[str, Any]] | str:
    """(name, arguments) from a decoded call object, or the reason it is unusable."""
    if not isinstance(obj, dict):
        return f"expected a JSON object, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return "missing the tool name ('name')"
    other_key = "parameters" if args_key == "arguments" else "arguments"
    if args_key in obj:
        args = obj[args_key]
    elif other_key in obj:
        args = obj[other_key]
        repairs.append(Repair("key_alias", f"{other_key}", f"{args_key}"))
    else:
        args = {}
    if isinstance(args, str):
        try:
            decoded = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return f"'{args_key}' is a string that is not a JSON object"
        repairs.append(Repair("arguments_string", args, json.dumps(decoded, ensure_ascii=False)))
        args = decoded
    if not isinstance(args, dict):
        return f"'{args_key}' must be a JSON object, got {type(args).__name__}"
    return name.strip(), args


TOOL_LISTINGS = ("json", "compact")


def _type_text(schema: dict[str, Any]) -> str:
    """A JSON Schema as a short type expression: `string /^\\d{4}$/`, `"a"|"b"`, `integer 1..10`, `array of string`, `{a: string, b?: integer}`."""
    if "enum" in schema:
        return "|".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = "|".join(str(k) for k in kind)
    if kind == "array":
        text = f"array of {_type_text(schema.get('items', {}))}"
    elif kind == "object" and schema.get("properties"):
        text = "{" + ", ".join(_param_text(n, p, n in schema.get("required", [])) for n, p in schema["properties"].items()) + "}"
    else:
        text = str(kind)
    if "format" in schema:
        text += f" ({schema['format']})"
    if "pattern" in schema:
        text += f" /{schema['pattern']}/"
    low, high = schema.get("minimum", schema.get("minItems")), schema.get("maximum", schema.get("maxItems"))
    if low is not None or high is not None:
        text += f" {'' if low is None else low}..{'' if high is None else high}"
    return text


def _param_text(name: str, schema: dict[str, Any], required: bool) -> str:
    text = f"{name}{'' if required else '?'}: {_type_text(schema)}"
    if "default" in schema:
        text += f" = {json.dumps(schema['default'], ensure_ascii=False)}"
    return text


def compact_tool_line(spec: dict[str, Any]) -> str:
    """One tool as one line: `name(param: type, opt?: type = default) - description. param: its description; ...`.

    Everything the JSON spec says that a model needs to write a valid call is kept (types, enums, patterns,
    ranges, formats, required vs optional, defaults, nested fields); only the JSON syntax is dropped, which
    takes a third of the tokens (docs/data.md).
    """
    fn = spec.get("function", spec)
    params = fn.get("parameters") or {}
    props: dict[str, Any] = params.get("properties", {})
    required = set(params.get("required", []))
    signature = ", ".join(_param_text(n, p, n in required) for n, p in props.items())
    line = f"{fn['name']}({signature}) - {fn.get('description', '').strip()}"
    notes = [f"{n}: {p['description'].strip().rstrip('.')}" for n, p in props.items() if p.get("description")]
    if notes:
        line += " " + "; ".join(notes)
    return line


class OutputProtocol(abc.ABC):
    """Interface shared by the protocols; subclasses define the call syntax."""

    name = "base"
    args_key = "arguments"

    @abc.abstractmethod
    def system_prompt(self, tools: list[dict[str, Any]], rules: RulesLike) -> str:
        """The system prompt: tools with schemas, the output format, the step limit and the recovery rules."""

    @abc.abstractmethod
    def format_calls(self, calls: list[ToolCall]) -> str:
        """How the assistant writes these calls, exactly."""

    def assistant_text(self, text: str, calls: list[ToolCall]) -> str:
        """The whole body of an assistant turn: its text, then its calls."""
        if not calls:
            return text
        block = self.format_calls(calls)
        return f"{text}\n{block}" if text else block

    @abc.abstractmethod
    def parse(self, output: str, id_prefix: str = "call") -> ParsedOutput:
        """Parse a model message. Never raises."""

    def _rules_text(self, rules: RulesLike) -> str:
        lines = [
            "Rules:",
            "- Use only the tools listed above, with arguments that match their schemas.",
            f"- You have at most {rules.max_steps} steps.",
            "- Tool results come back to you; never write a tool result yourself.",
            "- If a tool fails or times out, retry once; if it keeps failing, use another tool"
            f" (a tool that fails {rules.switch_after_failures} times in a row must not be called again),"
            " or tell the user honestly what could not be done. Never invent data.",
            "- When the task is done, or needs no tool, answer the user in plain text without a tool call.",
        ]
        if rules.memory:
            lines.append("- After finishing a sub-goal of a long task, call note with a one-line summary of what you found.")
        return "\n".join(lines)


HERMES_INTRO = "You are a function-calling agent. Solve the user's task with the tools below, then answer.\n"
HERMES_CALL_SYNTAX = ("To call a tool, write a JSON object inside <tool_call></tool_call> tags:\n"
                      '<tool_call>\n{"name": <tool-name>, "arguments": <args-json-object>}\n</tool_call>\n')
NATIVE_INTRO = "You are a function-calling agent. Solve the user's task with the tools you are given, then answer.\n"


class HermesProtocol(OutputProtocol):
    """Hermes function calling: tools in `<tools>`, calls in `<tool_call>` JSON blocks."""

    name = "hermes"
    args_key = "arguments"
    _block = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)

    def system_prompt(self, tools: list[dict[str, Any]], rules: RulesLike) -> str:
        """The Hermes system prompt for these tools and rules (tools listed as `rules.tool_listing` says)."""
        tool_lines = _tool_lines(tools, rules.tool_listing, "\n")
        return f"{HERMES_INTRO}<tools>\n{tool_lines}\n</tools>\n{HERMES_CALL_SYNTAX}" + self._rules_text(rules)

    def format_calls(self, calls: list[ToolCall]) -> str:
        """One `<tool_call>` block per call, canonical JSON inside."""
        return "\n".join(f"<tool_call>\n{call_json(c.name, c.arguments)}\n</tool_call>" for c in calls)

    def parse(self, output: str, id_prefix: str = "call") -> ParsedOutput:
        """Parse `<tool_call>` blocks (or one bare JSON call); classify every problem."""
        if not isinstance(output, str) or not output.strip():
            return ParsedOutput("", defects=[Defect("empty_output", feedback("empty_output"))])
        defects: list[Defect] = []
        cut = output.find("<tool_response>")
        if cut >= 0:
            defects.append(Defect("self_written_response", feedback("self_written_response")))
            output = output[:cut]
        repairs: list[Repair] = []
        calls: list[ToolCall] = []
        blocks = list(self._block.finditer(output))
        text = self._block.sub("", output).replace("</tool_call>", "").strip()
        if not blocks:
            bare = output.strip()
            if bare.startswith("{") and bare.endswith("}") and '"name"' in bare:
                obj, repair, _ = _load_call_object(bare)
                got = _normalize_call(obj, bare, self.args_key, repairs) if obj is not None else None
                if isinstance(got, tuple):
                    repairs.append(Repair("bare_json", bare, "<tool_call>"))
                    if repair:
                        repairs.append(repair)
                    calls.append(ToolCall(f"{id_prefix}_0", got[0], got[1]))
                    return ParsedOutput("", calls, repairs, defects)
        for k, m in enumerate(blocks):
            raw = m.group(1)
            closed = m.group(0).endswith("</tool_call>")
            obj, repair, reason = _load_call_object(raw)
            if obj is None:
                why = reason if closed else "the <tool_call> block is not closed"
                defects.append(Defect("unparseable_call", feedback("unparseable_call", reason=why)))
                continue
            got = _normalize_call(obj, raw, self.args_key, repairs)
            if isinstance(got, str):
                defects.append(Defect("unparseable_call", feedback("unparseable_call", reason=got)))
                continue
            if repair:
                repairs.append(repair)
            if not closed:
                repairs.append(Repair("unclosed_block", raw, "</tool_call>"))
            calls.append(ToolCall(f"{id_prefix}_{k}", got[0], got[1]))
        is_final = not calls and not defects
        return ParsedOutput(text, calls, repairs, defects, is_final)


class Llama31Protocol(OutputProtocol):
    """Llama-3.1 JSON tool calling: one `{"name": ..., "parameters": {...}}` object per line."""

    name = "llama31"
    args_key = "parameters"

    def system_prompt(self, tools: list[dict[str, Any]], rules: RulesLike) -> str:
        """The Llama-3.1 style system prompt for these tools and rules."""
        tool_lines = _tool_lines(tools, rules.tool_listing, "\n\n")
        return (
            "You are a function-calling agent. Solve the user's task with the functions below, then answer.\n"
            "To call functions, respond with one JSON object per line in the format "
            '{"name": function name, "parameters": dictionary of argument name and its value}. '
            "Do not use variables.\n\n"
            f"{tool_lines}\n\n" + self._rules_text(rules)
        )

    def format_calls(self, calls: list[ToolCall]) -> str:
        """One JSON object per line."""
        return "\n".join(call_json(c.name, c.arguments, "parameters") for c in calls)

    def parse(self, output: str, id_prefix: str = "call") -> ParsedOutput:
        """Lines that are JSON objects with a name are calls; everything else is text."""
        if not isinstance(output, str) or not output.strip():
            return ParsedOutput("", defects=[Defect("empty_output", feedback("empty_output"))])
        body = output.replace("<|python_tag|>", "")
        defects: list[Defect] = []
        cut = body.find("<tool_response>")
        if cut >= 0:
            defects.append(Defect("self_written_response", feedback("self_written_response")))
            body = body[:cut]
        repairs: list[Repair] = []
        calls: list[ToolCall] = []
        text_lines: list[str] = []
        for line in body.splitlines():
            s = line.strip()
            if not (s.startswith("{") and ('"name"' in s or "'name'" in s)):
                text_lines.append(line)
                continue
            obj, repair, reason = _load_call_object(s)
            got = _normalize_call(obj, s, self.args_key, repairs) if obj is not None else (reason or "invalid JSON")
            if isinstance(got, str):
                defects.append(Defect("unparseable_call", feedback("unparseable_call", self.name, reason=got)))
                continue
            if repair:
                repairs.append(repair)
            calls.append(ToolCall(f"{id_prefix}_{len(calls)}", got[0], got[1]))
        text = "\n".join(text_lines).strip()
        return ParsedOutput(text, calls, repairs, defects, not calls and not defects)


def _tool_lines(tools: list[dict[str, Any]], listing: str, sep: str) -> str:
    if listing == "compact":
        return "\n".join(compact_tool_line(t) for t in tools)
    if listing == "json":
        return sep.join(json.dumps(t, ensure_ascii=False) for t in tools)
    from agentrig.errors import ConfigError

    raise ConfigError(f"unknown tool listing {listing!r}; choose one of: {', '.join(TOOL_LISTINGS)}")


PROTOCOLS: dict[str, type[OutputProtocol]] = {"hermes": HermesProtocol, "llama31": Llama31Protocol}


def get_protocol(name: str) -> OutputProtocol:
    """The protocol of that name ("hermes" or "llama31")."""
    if name not in PROTOCOLS:
        from agentrig.errors import ConfigError

        raise ConfigError(f"unknown protocol {name!r}; choose one of: {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]()


# -- the harness's messages in an OpenAI request -----------------------------------------------------

WIRE_FORMATS = ("harness", "hermes", "native")
TOOL_RESPONSE_TEXT = "<tool_response>\n{content}\n</tool_response>"  # a result as the Hermes template wraps it


ECHO_VALUE_CHARS = 60  # a longer string argument is shortened in the echo line (a query, a report's body)


def echo_call(call: ToolCall) -> str:
    """The line a result opens with under `HarnessConfig.echo_calls`: the call it answers, as the model sent it
    (long strings shortened), so that of several same-shaped results, or of an error, the model reads which
    call it belongs to."""
    def short(value: Any) -> Any:
        if isinstance(value, str) and len(value) > ECHO_VALUE_CHARS:
            return value[: ECHO_VALUE_CHARS - 3] + "..."
        return value

    arguments = json.dumps({k: short(v) for k, v in call.arguments.items()}, ensure_ascii=False)
    return feedback("call_echo", tool=call.name, arguments=arguments)


def result_text(message: dict[str, Any]) -> str:
    """A tool message's result without its echo line (`echo_call`), for readers of results (experts, memory)."""
    content, name = str(message.get("content") or ""), message.get("name")
    if not name:
        return content
    head, sep, rest = content.partition("\n")
    prefix, suffix = feedback("call_echo", tool=name, arguments="\0").split("\0")
    if sep and head.startswith(prefix) and head.endswith(suffix):
        return rest
    return content


def native_system_prompt(prompt: str) -> str:
    """A Hermes system prompt without its tool list and call syntax, for a request whose `tools` field lists them.

    The rules and the memory area stay. Raises ValueError when `prompt` is not laid out as
    `HermesProtocol.system_prompt` writes it.
    """
    cut = "\n</tools>\n" + HERMES_CALL_SYNTAX
    end = prompt.find(cut)
    if not prompt.startswith(HERMES_INTRO + "<tools>\n") or end < 0:
        raise ValueError(f"the system prompt is not the Hermes protocol's (it starts {prompt[:60]!r}): only a "
                         "prompt that HermesProtocol.system_prompt wrote can have its tool list moved to `tools`")
    return NATIVE_INTRO + prompt[end + len(cut):]


def wire_messages(messages: list[dict[str, Any]], wire_format: str) -> list[dict[str, Any]]:
    """The harness's (Hermes) messages as an OpenAI chat request carries them, one message for one.

    - "harness": as they are (assistant `tool_calls`, `tool` results), for a server that renders them with
      the chat template the training data was rendered with (`agentrig serve`, vLLM or SGLang with
      `--chat-template`); no `tools` field goes with them: the system prompt lists the tools.
    - "hermes": Hermes text both ways: each assistant turn's calls written into its text as the model
      writes them, each tool result a user turn in `<tool_response>` tags; no `tools` field either.
    - "native": OpenAI function calling both ways: the system prompt without its tool list and call
      syntax (`native_system_prompt`; the request's `tools` field lists the tools), assistant
      `tool_calls`, tool results with only `tool_call_id` and `content`.

    The OpenAI fine-tuning export (`agentrig.data.exports`) and `OpenAIPolicy` both call this, so a
    model tuned on an export is asked in the form it was tuned on.
    """
    if wire_format not in WIRE_FORMATS:
        from agentrig.errors import ConfigError

        raise ConfigError(f"unknown tool format {wire_format!r}; choose one of: {', '.join(WIRE_FORMATS)}")
    if wire_format == "harness":
        return list(messages)
    out: list[dict[str, Any]] = []
    hermes = HermesProtocol()
    for k, msg in enumerate(messages):
        role = msg.get("role")
        if wire_format == "hermes" and role == "assistant":
            calls = [ToolCall(c.get("id", ""), c["function"]["name"], json.loads(c["function"]["arguments"] or "{}"))
                     for c in msg.get("tool_calls") or []]
            out.append({"role": "assistant", "content": hermes.assistant_text(msg.get("content") or "", calls)})
        elif wire_format == "hermes" and role == "tool":
            out.append({"role": "user", "content": TOOL_RESPONSE_TEXT.format(content=msg.get("content") or "")})
        elif wire_format == "native" and role == "system" and k == 0:
            out.append({**msg, "content": native_system_prompt(msg.get("content") or "")})
        elif wire_format == "native" and role == "tool":
            out.append({"role": "tool", "tool_call_id": msg.get("tool_call_id"), "content": msg.get("content") or ""})
        else:
            out.append(dict(msg))
    return out
