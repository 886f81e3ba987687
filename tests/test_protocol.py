"""Output protocols: system prompt, strict parse, recorded repairs, and defect classification."""

from __future__ import annotations

import json

from agentrig.harness import HarnessConfig
from agentrig.harness.protocol import DEFECT_KINDS, feedback, get_protocol
from agentrig.harness.trajectory import ToolCall

H = get_protocol("hermes")
L = get_protocol("llama31")
SPEC = {"type": "function", "function": {"name": "add", "description": "Add.", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}


def test_hermes_system_prompt_lists_tools_format_and_rules():
    prompt = H.system_prompt([SPEC], HarnessConfig(max_steps=7, tool_listing="json"))
    assert f"<tools>\n{json.dumps(SPEC)}\n</tools>" in prompt
    assert "<tool_call>" in prompt and "at most 7 steps" in prompt and "3 times in a row" in prompt


def test_strict_parse_of_text_and_parallel_calls():
    out = 'Checking both.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'
    p = H.parse(out, id_prefix="call_3")
    assert p.text == "Checking both." and not p.repairs and not p.defects and not p.is_final
    assert p.calls == [ToolCall("call_3_0", "add", {"a": 1}), ToolCall("call_3_1", "add", {"a": 2})]
    assert H.assistant_text(p.text, p.calls) == out


def test_final_answer():
    p = H.parse("The total is 42.")
    assert p.is_final and p.text == "The total is 42." and not p.calls


def test_repairs_are_recorded():
    p = H.parse("<tool_call>{'name': 'add', 'arguments': {'a': 1}}</tool_call>")
    assert p.calls[0].arguments == {"a": 1} and p.repairs[0].kind in ("json_repair", "literal_eval")
    p = H.parse('<tool_call>{"name": "add", "parameters": {"a": 1}}</tool_call>')
    assert p.calls[0].arguments == {"a": 1} and [r.kind for r in p.repairs] == ["key_alias"]
    p = H.parse('<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>')
    assert p.calls[0].arguments == {"a": 1} and [r.kind for r in p.repairs] == ["arguments_string"]
    p = H.parse('{"name": "add", "arguments": {"a": 1}}')
    assert p.calls[0].name == "add" and p.repairs[0].kind == "bare_json"
    p = H.parse('<tool_call>\n{"name": "add", "arguments": {"a": 1}}')
    assert p.calls and "unclosed_block" in [r.kind for r in p.repairs]


def test_defects_are_classified():
    assert H.parse("").defects[0].kind == "empty_output"
    assert H.parse("   \n").defects[0].message == feedback("empty_output")
    p = H.parse("<tool_call>not json at all</tool_call>")
    assert p.defects[0].kind == "unparseable_call" and not p.calls
    p = H.parse('<tool_call>{"arguments": {}}</tool_call>')
    assert p.defects[0].kind == "unparseable_call" and "name" in p.defects[0].message
    p = H.parse('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\n<tool_response>\n{"result": 99}\n</tool_response>')
    assert [d.kind for d in p.defects] == ["self_written_response"] and p.calls[0].name == "add"
    assert set(DEFECT_KINDS) >= {d.kind for d in p.defects}


def test_llama31_protocol_round_trip():
    calls = [ToolCall("x", "add", {"a": 1})]
    text = L.assistant_text("", calls)
    assert text == '{"name": "add", "parameters": {"a": 1}}'
    p = L.parse("Sure.\n" + text, id_prefix="c")
    assert p.calls == [ToolCall("c_0", "add", {"a": 1})] and p.text == "Sure."
    assert '"parameters"' in L.system_prompt([SPEC], HarnessConfig())
    assert L.parse("Done: 3.").is_final


def test_llama31_unparseable_call_is_told_its_own_syntax():
    (d,) = L.parse('{"name": "add", "parameters": 7}').defects
    assert d.kind == "unparseable_call" and '"parameters"' in d.message and "<tool_call>" not in d.message
    assert "<tool_call>" in H.parse("<tool_call>not json</tool_call>").defects[0].message


RICH = {"type": "function", "function": {"name": "book_slot", "description": "Book a clinic slot.", "parameters": {
    "type": "object", "required": ["clinic", "day", "kind"], "properties": {
        "clinic": {"type": "string", "description": "Clinic id, e.g. \"C-12\"."},
        "day": {"type": "string", "format": "date", "pattern": "^\\d{4}-\\d{2}-\\d{2}$"},
        "kind": {"enum": ["checkup", "vaccine"]},
        "minutes": {"type": "integer", "minimum": 10, "maximum": 60, "default": 20},
        "tags": {"type": "array", "items": {"type": "string"}},
        "patient": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}},
    }}}}


def test_compact_listing_keeps_what_a_valid_call_needs():
    from agentrig.harness.protocol import compact_tool_line

    line = compact_tool_line(RICH)
    assert line == ('book_slot(clinic: string, day: string (date) /^\\d{4}-\\d{2}-\\d{2}$/, kind: "checkup"|"vaccine", '
                    'minutes?: integer 10..60 = 20, tags?: array of string, patient?: {name: string, age?: integer}) - '
                    'Book a clinic slot. clinic: Clinic id, e.g. "C-12"')
    prompt = H.system_prompt([RICH, SPEC], HarnessConfig(tool_listing="compact"))
    assert f"<tools>\n{line}\nadd(a?: integer) - Add.\n</tools>" in prompt
    assert len(prompt) < len(H.system_prompt([RICH, SPEC], HarnessConfig(tool_listing="json")))
    assert H.system_prompt([RICH], HarnessConfig()) == H.system_prompt([RICH], HarnessConfig(tool_listing="compact"))
    assert "book_slot(" in L.system_prompt([RICH], HarnessConfig(tool_listing="compact"))


def test_unknown_tool_listing_is_a_config_error():
    import pytest

    from agentrig.errors import ConfigError

    with pytest.raises(ConfigError, match="compact"):
        H.system_prompt([SPEC], HarnessConfig(tool_listing="yaml"))


def test_every_repair_the_parser_records_survives_an_episode_round_trip(tmp_path):
    """The parser's repairs (json_repair, key alias, string arguments, bare JSON, an unclosed block; literal_eval
    is only reached when json_repair gives up) are recorded in the step and must read back: a kind missing from the records' Literal broke a run."""
    from agentrig.harness import HarnessConfig, ScriptedPolicy, run_episode
    from agentrig.harness.tools import tool, ToolSet
    from agentrig.harness.trajectory import TaskSpec, read_episodes, write_episodes

    @tool
    def add(a: int) -> int:
        """Add one.

        Args:
            a: a number
        """
        return a + 1

    outputs = ['<tool_call>\n{"name": "add", "arguments": {"a": 2,}}\n</tool_call>',   # json_repair
               '<tool_call>\n{"name": "add", "parameters": {"a": 3}}\n</tool_call>',   # key_alias
               '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 4}"}\n</tool_call>',  # arguments_string
               '{"name": "add", "arguments": {"a": 5}}',                                # bare_json
               '<tool_call>\n{"name": "add", "arguments": {"a": 6}}',                   # unclosed_block
               "Done."]
    ep = run_episode(TaskSpec(id="t", prompt="add"), ToolSet([add]), ScriptedPolicy(outputs), HarnessConfig(memory=False))
    kinds = {r.kind for s in ep.steps for r in s.repairs}
    assert kinds == {"json_repair", "key_alias", "arguments_string", "bare_json", "unclosed_block"}
    write_episodes(tmp_path / "e.jsonl", [ep])
    assert read_episodes(tmp_path / "e.jsonl")[0].to_dict() == ep.to_dict()
