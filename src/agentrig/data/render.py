"""The one chat rendering used for training and inference: messages to text to token ids, with loss masks.

`Renderer` renders OpenAI-style messages through the model's own chat template when that template
supports tools (it renders `tool_calls` and role `tool`), otherwise through agentrig's Hermes ChatML
template (`templates/hermes_chatml.v1.jinja`). The inference policy calls `prompt_ids(messages)` and
generates until the end-of-turn token; the data build calls `sample_ids(messages, weights)`, which is
literally the concatenation of what inference sees and generates: for every assistant turn, the tokens of
`prompt_ids(messages[:k])` followed by `assistant_ids(messages[k])` (end-of-turn included). If a template
is not prefix-stable (rendering a later turn changes the tokens of an earlier one), `sample_ids` raises
instead of silently training on text the model never sees.

Tool-call arguments are stored as JSON strings (OpenAI wire format) and parsed to dicts just before
rendering (some templates double-encode strings, others need a dict). Tokenization splits the text at the
tokenizer's special tokens and caches each piece: the result is identical to `tokenizer.encode(text)`
(the tokenizer itself extracts special tokens before the byte-level pass), and system prompts shared by
thousands of samples are tokenized once. Not handled: multimodal content parts and `reasoning_content`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from agentrig.errors import AgentrigError

HERMES_TEMPLATE_NAME = "hermes_chatml.v1"
IGNORE_INDEX = -100  # the label of a token that is not supervised; the one place this value is written
_PROBE_TOOL = "agentrig_probe_tool"
_PROBE_VALUE = "agentrig_probe_value"
_PROBE_RESULT = "agentrig_probe_result"
_ENCODE_CACHE_MAX = 200_000
_TURN_CONTEXT = [{"role": "user", "content": "."}]


class RenderError(AgentrigError):
    """A template or message that cannot give identical training and inference tokens."""


@lru_cache(maxsize=None)
def hermes_template() -> str:
    """The text of agentrig's versioned Hermes ChatML tool template."""
    return resources.files("agentrig.data").joinpath(f"templates/{HERMES_TEMPLATE_NAME}.jinja").read_text(encoding="utf-8")


def _render(template: str, messages: list[dict[str, Any]], add_generation_prompt: bool, special: dict[str, str]) -> str:
    """Render through transformers' own compiled Jinja environment, as `apply_chat_template` does.

    Calls the compiled template directly (what `render_jinja_template` does after converting message
    objects to plain data): our messages are plain JSON already, and this halves the cost per render.
    """
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(template).render(
        messages=messages, tools=None, documents=None, add_generation_prompt=add_generation_prompt, **special
    )


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as templates want them: `arguments` parsed to a dict (key order kept), `content` never None."""
    out = []
    for msg in messages:
        msg = dict(msg)
        if msg.get("content") is None:
            msg["content"] = ""
        if msg.get("tool_calls"):
            calls = []
            for call in msg["tool_calls"]:
                fn = dict(call["function"])
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"])
                    except json.JSONDecodeError as exc:
                        raise RenderError(f"tool call {fn.get('name')!r} has arguments that are not JSON: {exc}") from None
                calls.append({**call, "function": fn})
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def supports_tools(template: str | None, special: dict[str, str] | None = None) -> bool:
    """Whether a chat template renders an assistant tool call and a tool result (probed, not guessed)."""
    if not template:
        return False
    probe = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": _PROBE_TOOL, "arguments": {"k": _PROBE_VALUE}}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": _PROBE_TOOL, "content": _PROBE_RESULT},
    ]
    try:
        text = _render(template, probe, False, special or {})
    except Exception:  # noqa: BLE001 - any template failure on the probe means "no tool support"
        return False
    return all(s in text for s in (_PROBE_TOOL, _PROBE_VALUE, _PROBE_RESULT))


class Renderer:
    """Messages to token ids, identical for training and inference. Build with `Renderer.for_model(name)`.

    Args:
        tokenizer: a Hugging Face tokenizer (fast tokenizers are much faster).
        chat_template: force a template text; default: the model's own if it supports tools, else Hermes ChatML.
        end_of_turn: the token that ends an assistant turn (generation stops there); default `<|im_end|>`
            for the Hermes template, else the tokenizer's eos token.
    """

    def __init__(self, tokenizer: Any, chat_template: str | None = None, end_of_turn: str | None = None) -> None:
        self.tokenizer = tokenizer
        self._special = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        if chat_template is not None:
            self.chat_template = chat_template
            self.template_name = "custom"
        elif supports_tools(getattr(tokenizer, "chat_template", None), self._special):
            self.chat_template = tokenizer.chat_template
            self.template_name = "model"
        else:
            self.chat_template = hermes_template()
            self.template_name = HERMES_TEMPLATE_NAME
        if end_of_turn is None:
            end_of_turn = "<|im_end|>" if self.template_name == HERMES_TEMPLATE_NAME else tokenizer.eos_token
        vocab_id = tokenizer.convert_tokens_to_ids(end_of_turn)
        if vocab_id is None or vocab_id == tokenizer.unk_token_id:
            raise RenderError(
                f"the tokenizer has no single token {end_of_turn!r} to end assistant turns; add it as a special "
                f"token (tokenizer.add_special_tokens) or pass end_of_turn="
            )
        self.end_of_turn = end_of_turn
        self.eot_id: int = int(vocab_id)
        self._init_encoder()
        self._turn_before: str | None = None

    @classmethod
    def for_model(cls, name_or_path: str) -> "Renderer":
        """The renderer of a model name or folder (tokenizer loaded offline through `agentrig.models`)."""
        from agentrig.models import load_tokenizer

        return cls(load_tokenizer(name_or_path))

    # -- tokenization --------------------------------------------------------------------------
    def _init_encoder(self) -> None:
        """Split at special tokens only when that is exactly what the tokenizer does itself."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        self._backend = backend
        self._split: re.Pattern[str] | None = None
        self._special_ids: dict[str, int] = {}
        self._cache: dict[str, list[int]] = {}
        if backend is None:
            return
        added = list(self.tokenizer.added_tokens_decoder.values())
        if any(not t.special or t.lstrip or t.rstrip or t.single_word or t.normalized for t in added):
            return  # the tokenizer treats some added token specially: use its own encode for every text
        if not added:
            return
        self._special_ids = {t.content: self.tokenizer.convert_tokens_to_ids(t.content) for t in added}
        alternatives = sorted(self._special_ids, key=len, reverse=True)
        self._split = re.compile("(" + "|".join(re.escape(a) for a in alternatives) + ")")

    def encode(self, text: str) -> list[int]:
        """Token ids of `text` without added bos/eos, equal to `tokenizer.encode(text, add_special_tokens=False)`."""
        return self.encode_many([text])[0]

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """`encode` for several texts with one call into the tokenizer for all pieces not cached yet."""
        if self._split is None:
            return [list(self.tokenizer.encode(t, add_special_tokens=False)) for t in texts]
        split = [self._split.split(t) for t in texts]
        cache = self._cache
        missing = list(dict.fromkeys(p for pieces in split for p in pieces[::2] if p and p not in cache))
        if missing:
            if len(cache) > _ENCODE_CACHE_MAX:
                cache.clear()
            for piece, enc in zip(missing, self._backend.encode_batch_fast(missing, add_special_tokens=False)):
                cache[piece] = enc.ids
        out = []
        for pieces in split:
            ids: list[int] = []
            for i, piece in enumerate(pieces):
                if i % 2:
                    ids.append(self._special_ids[piece])
                elif piece:
                    ids.extend(cache[piece])
            out.append(ids)
        return out

    # -- the public rendering API ----------------------------------------------------------------
    def render_text(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        """The template's text for a message list (arguments parsed to dicts first)."""
        return _render(self.chat_template, template_messages(messages), add_generation_prompt, self._special)

    def prompt_text(self, messages: list[dict[str, Any]]) -> str:
        """The context text the policy is given, ending with the assistant generation prompt."""
        return self.render_text(messages, add_generation_prompt=True)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Token ids of `prompt_text(messages)`: what the model conditions on at inference."""
        return self.encode(self.prompt_text(messages))

    def assistant_text(self, message: dict[str, Any]) -> str:
        """The text the policy must generate for `message`, up to and including the end-of-turn token."""
        return self.tokenizer.decode(self.assistant_ids(message), skip_special_tokens=False)

    def assistant_ids(self, message: dict[str, Any]) -> list[int]:
        """Token ids the policy must generate for an assistant message, end-of-turn token included.

        The turn is rendered after a one-message context and cut at the first end-of-turn token: what
        follows it (ChatML's newline) belongs to the next prompt, never to the generation.
        """
        return self._cut_turn(self.encode(self._turn_text(message)))

    def _turn_text(self, message: dict[str, Any]) -> str:
        """Rendered text of an assistant turn after the generation prompt (may run past the end of turn)."""
        if message.get("role") != "assistant":
            raise RenderError(f"assistant_ids needs an assistant message, got role {message.get('role')!r}")
        if self._turn_before is None:
            self._turn_before = self.render_text(_TURN_CONTEXT, add_generation_prompt=True)
        full = self.render_text(_TURN_CONTEXT + [message], add_generation_prompt=False)
        if not full.startswith(self._turn_before):
            raise RenderError(
                f"template {self.template_name!r} is not prefix-stable: the assistant turn changes the text before it"
            )
        return full[len(self._turn_before) :]

    def _cut_turn(self, ids: list[int]) -> list[int]:
        if self.eot_id not in ids:
            raise RenderError(f"template {self.template_name!r} does not end the assistant turn with {self.end_of_turn!r}")
        return ids[: ids.index(self.eot_id) + 1]

    def sample_ids(
        self, messages: list[dict[str, Any]], weights: list[float] | None = None
    ) -> tuple[list[int], list[int]]:
        """Training ids and labels: for each assistant turn, its inference prompt then its generation.

        `weights[k] > 0` supervises assistant message k (its text, calls and end-of-turn token); system,
        user and tool tokens and weight-0 turns get label -100. Messages after the last assistant turn are
        not included (nothing is learned from them). Raises `RenderError` when the prompt of a turn does not
        extend the tokens already built, i.e. when training and inference tokens would differ.
        """
        rendered = self.sample_turns(messages, weights)
        return rendered.input_ids, rendered.labels

    def sample_turns(self, messages: list[dict[str, Any]], weights: list[float] | None = None) -> "RenderedSample":
        """`sample_ids` plus where each assistant turn's generated tokens sit (for checks and inspection)."""
        if weights is None:
            weights = [1.0] * len(messages)
        if len(weights) != len(messages):
            raise RenderError(f"{len(weights)} weights for {len(messages)} messages")
        turns = [k for k, m in enumerate(messages) if m.get("role") == "assistant"]
        texts = [self.prompt_text(messages[:k]) for k in turns] + [self._turn_text(messages[k]) for k in turns]
        encoded = self.encode_many(texts)  # one tokenizer call for every new piece of the sample
        out = RenderedSample([], [], [])
        input_ids, labels = out.input_ids, out.labels
        for j, k in enumerate(turns):
            prompt = encoded[j]
            n = len(input_ids)
            if prompt[:n] != input_ids:
                at = next((i for i, (a, b) in enumerate(zip(prompt, input_ids)) if a != b), min(len(prompt), n))
                raise RenderError(
                    f"message {k}: the inference prompt differs from the training tokens at token {at} "
                    f"({self.tokenizer.decode(prompt[max(0, at - 8) : at + 8])!r} vs "
                    f"{self.tokenizer.decode(input_ids[max(0, at - 8) : at + 8])!r})"
                )
            input_ids.extend(prompt[n:])
            labels.extend([IGNORE_INDEX] * (len(prompt) - n))
            generated = self._cut_turn(encoded[len(turns) + j])
            out.turns.append((k, len(input_ids), len(input_ids) + len(generated)))
            input_ids.extend(generated)
            labels.extend(generated if weights[k] > 0 else [IGNORE_INDEX] * len(generated))
        return out


@dataclass
class RenderedSample:
    """Token ids, labels (-100 = not supervised) and `(message index, start, end)` of each assistant turn."""

    input_ids: list[int]
    labels: list[int]
    turns: list[tuple[int, int, int]]
