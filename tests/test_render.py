"""The one renderer: template choice, token-for-token training == inference, loss masks token by token."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrig.harness.protocol import get_protocol
from agentrig.data.render import HERMES_TEMPLATE_NAME, IGNORE_INDEX, Renderer, RenderError, supports_tools
from agentrig.harness.trajectory import ToolCall


@pytest.fixture(scope="module")
def renderer(smol_tokenizer):
    return Renderer(smol_tokenizer)


def tc(i, name, **args):
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


MESSAGES = [
    {"role": "system", "content": "You are an agent.\n<tools>\n{\"name\": \"f\"}\n</tools>"},
    {"role": "user", "content": "Do the thing."},
    {"role": "assistant", "content": "First a look.", "tool_calls": [tc(0, "f", a=1, b="x")]},
    {"role": "tool", "tool_call_id": "c0", "name": "f", "content": "{\"ok\": true}"},
    {"role": "assistant", "content": "", "tool_calls": [tc(1, "f", a=2), tc(2, "g", q="é")]},
    {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "error: timeout"},
    {"role": "tool", "tool_call_id": "c2", "name": "g", "content": "42"},
    {"role": "user", "content": "Notice: something."},
    {"role": "assistant", "content": "Done: 42."},
]
WEIGHTS = [0, 0, 1.0, 0, 0.0, 0, 0, 0, 1.0]  # the second assistant turn is a detour (weight 0)


def test_smollm2_has_no_tool_template_so_ours_is_used(renderer, smol_tokenizer):
    assert not supports_tools(smol_tokenizer.chat_template)
    assert renderer.template_name == HERMES_TEMPLATE_NAME
    assert renderer.end_of_turn == "<|im_end|>" and renderer.eot_id == smol_tokenizer.convert_tokens_to_ids("<|im_end|>")


def test_render_is_transformers_apply_chat_template(renderer, smol_tokenizer):
    from agentrig.data.render import template_messages

    for k in range(1, len(MESSAGES) + 1):
        ours = renderer.render_text(MESSAGES[:k], add_generation_prompt=True)
        theirs = smol_tokenizer.apply_chat_template(template_messages(MESSAGES[:k]), chat_template=renderer.chat_template,
                                                    tokenize=False, add_generation_prompt=True)
        assert ours == theirs


def test_exact_hermes_text(renderer):
    text = renderer.render_text(MESSAGES[:5])
    assert text.endswith(
        "<|im_start|>assistant\nFirst a look.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1, \"b\": \"x\"}}\n"
        "</tool_call><|im_end|>\n<|im_start|>tool\n<tool_response>\n{\"ok\": true}\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 2}}\n</tool_call>\n<tool_call>\n"
        "{\"name\": \"g\", \"arguments\": {\"q\": \"é\"}}\n</tool_call><|im_end|>\n"
    )


def test_masks_token_by_token(renderer):
    r = renderer.sample_turns(MESSAGES, WEIGHTS)
    assert [k for k, _, _ in r.turns] == [2, 4, 8]
    inside = set()
    for k, start, end in r.turns:
        inside.update(range(start, end))
        assert r.input_ids[end - 1] == renderer.eot_id  # every turn ends with the end-of-turn token
        for pos in range(start, end):
            if WEIGHTS[k] > 0:
                assert r.labels[pos] == r.input_ids[pos], (k, pos)  # text, calls and end-of-turn supervised
            else:
                assert r.labels[pos] == IGNORE_INDEX  # detour turn not supervised
    for pos, label in enumerate(r.labels):
        if pos not in inside:
            assert label == IGNORE_INDEX, pos  # system, user and tool tokens never supervised
    assert sum(1 for x in r.labels if x == renderer.eot_id) == 2


def test_training_tokens_equal_inference_tokens(renderer, smol_tokenizer):
    ids, labels = renderer.sample_ids(MESSAGES, WEIGHTS)
    turns = renderer.sample_turns(MESSAGES, WEIGHTS).turns
    for k, start, end in turns:
        assert ids[:start] == renderer.prompt_ids(MESSAGES[:k])  # the prompt inference renders
        assert ids[start:end] == renderer.assistant_ids(MESSAGES[k])  # what the policy must generate
        # and what the plain tokenizer makes of the inference text
        assert renderer.prompt_ids(MESSAGES[:k]) == smol_tokenizer.encode(renderer.prompt_text(MESSAGES[:k]),
                                                                          add_special_tokens=False)
    full = renderer.render_text(MESSAGES)
    assert ids == smol_tokenizer.encode(full[: full.rindex("<|im_end|>") + len("<|im_end|>")], add_special_tokens=False)


def test_assistant_turn_is_the_protocols_text(renderer, smol_tokenizer):
    proto = get_protocol("hermes")
    calls = [ToolCall("c1", "f", {"a": 2}), ToolCall("c2", "g", {"q": "é"})]
    for text in ("", "Checking."):
        msg = {"role": "assistant", "content": text,
               "tool_calls": [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(
                   c.arguments, ensure_ascii=False)}} for c in calls]}
        expected = proto.assistant_text(text, calls) + "<|im_end|>"
        assert renderer.assistant_ids(msg) == smol_tokenizer.encode(expected, add_special_tokens=False)
        assert renderer.assistant_text(msg) == expected


text_st = st.lists(st.sampled_from(list("ab \n{}\":,é<>/_|") + ["<|im_end|>", "<|im_start|>", "<tool_call>", "  "]),
                   max_size=40).map("".join)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(text_st, min_size=1, max_size=4))
def test_cached_encode_equals_the_tokenizer(renderer, smol_tokenizer, texts):
    for t in texts:
        assert renderer.encode(t) == smol_tokenizer.encode(t, add_special_tokens=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.sampled_from(["", "ok", " lead", "\nx", "a b  "]), st.integers(0, 2)), min_size=1, max_size=3),
       st.sampled_from(["r", " r", "\n", "{\"a\": 1}"]))
def test_any_conversation_renders_consistently(renderer, turns, result):
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for j, (text, ncalls) in enumerate(turns):
        calls = [tc(10 * j + c, "f", v=c) for c in range(ncalls)]
        msgs.append({"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})})
        msgs.extend({"role": "tool", "tool_call_id": c["id"], "name": "f", "content": result} for c in calls)
    msgs.append({"role": "assistant", "content": "end"})
    r = renderer.sample_turns(msgs, [1.0] * len(msgs))  # raises if a prompt does not extend the training tokens
    for k, start, end in r.turns:
        assert r.input_ids[:start] == renderer.prompt_ids(msgs[:k])


QWEN_LIKE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}<|im_start|>assistant\n{{ m.content }}"
    "{%- for c in m.tool_calls or [] -%}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
    "\n</tool_call>{%- endfor -%}<|im_end|>\n"
    "{%- elif m.role == 'tool' -%}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- else -%}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_start|>assistant\n{%- endif -%}"
)


def test_a_model_template_with_tool_support_is_used(smol_tokenizer):
    import copy

    tok = copy.copy(smol_tokenizer)
    tok.chat_template = QWEN_LIKE
    r = Renderer(tok)
    assert r.template_name == "model"
    text = r.render_text(MESSAGES[:3])
    assert '"arguments": {"a": 1, "b": "x"}' in text  # arguments parsed to a dict: never double-encoded
    r.sample_ids(MESSAGES, WEIGHTS)


def test_a_template_that_is_not_prefix_stable_is_refused(smol_tokenizer):
    # renders only the last assistant turn's calls: earlier turns change once a later one exists
    unstable = QWEN_LIKE.replace("m.tool_calls or []", "(m.tool_calls if loop.last else []) or []")
    r = Renderer(smol_tokenizer, chat_template=unstable)
    with pytest.raises(RenderError, match="differs from the training tokens"):
        r.sample_ids(MESSAGES, WEIGHTS)
