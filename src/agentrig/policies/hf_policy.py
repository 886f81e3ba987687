"""`HFPolicy`: a local transformers model, optionally with named LoRA adapters routed per task.

The base model is loaded once; any number of PEFT adapters are loaded next to it by name
(`PeftModel.load_adapter`, never merged, seed section 2.4) and each episode is routed to one of them by
a fixed name, a family -> adapter dict, or a callable over the `TaskSpec`. `generate_batch` groups the
requests by adapter, renders each prompt with `agentrig.data.render.Renderer.prompt_ids` (the one rendering
the training data uses) and generates for up to `batch_size` of them together with the KV cache;
`generate_stream` is the harness's continuous batching (an episode's next request joins the running decode
as soon as its reply is applied). On a CPU the active adapter's weights are merged into the base layers for
the duration of a batch (`agentrig.policies.merged`: one product per layer instead of three), and the
original tensors are swapped back afterwards, so the base weights stay untouched. On a CPU with AMX the
forward runs under bf16 autocast (`bf16`), with the KV cache in bf16 and a bf16 copy of each linear weight in
its layer for the batch (`agentrig.policies.halfweights`).
Generation runs to the end-of-turn token, so a turn can hold several `<tool_call>` blocks (parallel
calls, as the training data has them); it stops early when the model starts writing a `<tool_response>`
itself (the harness cuts and classifies that as a defect). It is greedy by default, temperature sampling when `temperature > 0` (seeded when `seed` is set).

Prefix caching (`prefix_cache=True`, the default): step k of an episode re-sends step k-1's prompt plus
the reply and the tool results, so the policy keeps, per (episode id, adapter), the token ids it has
keys/values for and those tensors (batch 1), in an LRU of `2 * batch_size` entries. For a request the
longest shared token prefix with any kept entry of the same adapter is reused (its own episode's entry
in the usual case; another episode's, or an earlier row's of the same batch, for the system prompt at
step 0), only the rest of the prompt but its last token is prefilled (batch 1, with that cache), and
the rows' caches are left-padded with masked zeros into one `agentrig.policies.kvcache.BufferedCache` with room
for the replies. The policy's own decode loop then feeds every live row's newest token with its own
position id, writes keys/values in place (no per-step copy of the cache, which dominates long-context
decoding on a CPU) and drops each row from the batch as it finishes, keeping its keys/values for the
episode's next step. Greedy replies equal the uncached path's (`model.generate`, everything prefilled)
up to floating-point ties; sampling follows `generate`'s temperature and top-p rules.

Not covered: prompts longer than the model's context (they are passed as is) and beam search.
The prefix cache assumes a model whose cache is plain full attention (Llama-family, e.g. SmolLM2);
sliding-window or recurrent layers would need `prefix_cache=False`.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Union

from agentrig.errors import ConfigError
from agentrig.harness import PolicyReply, PolicyRequest
from agentrig.harness.trajectory import TaskSpec
from agentrig.policies.halfweights import HalfWeights
from agentrig.policies.merged import MergedWeights

BASE = "base"  # the route name meaning "no adapter"
TOOL_RESPONSE_OPEN = "<tool_response>"  # a reply that starts a tool result itself stops there

Route = Union[str, dict[str, str], Callable[[TaskSpec], Union[str, None]], None]


@dataclass
class _Prefix:
    """Token ids and, per layer, their keys and values (`[1, kv_heads, len(ids), head_dim]`)."""

    ids: list[int]
    kv: list[tuple[Any, Any]]


class HFPolicy:
    """Batched local generation with named adapters.

    Args:
        model: a causal LM (`transformers` `PreTrainedModel`), already on its device.
        tokenizer: its tokenizer.
        adapters: adapter name -> folder saved by PEFT; loaded once, switched per batch group.
        route: which adapter serves a task: an adapter name (or "base"), a dict family -> name (key "*"
            is the fallback), or a callable `task -> name | None` (None = base). The default is the only
            adapter when there is exactly one, else the base model.
        renderer: the object whose `prompt_ids(messages)` renders prompts; by default
            `agentrig.data.render.Renderer(tokenizer)`.
        max_new_tokens: per step.
        temperature: 0.0 = greedy; above 0, sampling with `top_p`.
        top_p: nucleus sampling mass when sampling.
        seed: makes sampling reproducible for the same sequence of calls and batches.
        batch_size: most sequences in one `model.generate` call.
        prefix_cache: reuse each episode's keys/values across its steps (see the module docstring).
        bf16: run fp32 weights under bf16 autocast on the CPU, as training does: True, False, or None (the
            default) = where the CPU has AMX (`agentrig.models.amx_bf16`). Measured on 2 cores
            (docs/benchmarks.md): with AMX, bf16 made prefill 2.3x and batch-16 decoding 1.4x faster; with
            AVX512-BF16 alone it evaluated the default adapter in 396 s against 408 s, so fp32 stays there.
            Models already in a half precision (GPUs) are unaffected.
        merge_adapters: generate with the active adapter's weights merged into the base layers
            (`agentrig.policies.merged`: one product per layer instead of three, restored exactly on a
            switch); None = on a CPU, where it made evaluation about 12% faster with the same replies.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        adapters: dict[str, str] | None = None,
        route: Route = None,
        renderer: Any = None,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        batch_size: int = 16,
        prefix_cache: bool = True,
        bf16: bool | None = None,
        merge_adapters: bool | None = None,
    ) -> None:
        if temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {temperature}")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if renderer is None:
            from agentrig.data.render import Renderer

            renderer = Renderer(tokenizer)
        self.tokenizer = tokenizer
        self.renderer = renderer
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.seed = seed
        self.batch_size = batch_size
        self.prefix_cache = prefix_cache
        # (episode id, adapter) -> what that episode's last step computed; most recently used last.
        self._prefixes: OrderedDict[tuple[str, str], _Prefix] = OrderedDict()
        self.adapter_names: list[str] = []
        self.model = self._load_adapters(model, adapters or {})
        self.model.eval()
        self._calls = 0
        if tokenizer.pad_token_id is None:
            raise ConfigError("the tokenizer has no pad token; use agentrig.models.load_tokenizer, which sets one")
        # The renderer's end-of-turn token ends a turn; eos too, for models that emit it instead.
        self._stop_ids = {int(renderer.eot_id)} | ({tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set())
        self.route: Route = None
        self.use(route)
        self.bf16 = self._autocast_wanted(bf16)
        self._half = HalfWeights()  # bf16 copies of the linear weights while generating under autocast
        if merge_adapters is None:
            merge_adapters = next(self.model.parameters()).device.type == "cpu"
        self._merged = MergedWeights() if merge_adapters else None

    @classmethod
    def from_pretrained(
        cls, model_name: str, adapters: dict[str, str] | None = None, *, dtype: str = "auto", **kwargs: Any
    ) -> "HFPolicy":
        """Load a model by name or folder (see `agentrig.models`) with its tokenizer and adapters."""
        import torch

        from agentrig.models import load_model, load_tokenizer

        tokenizer = load_tokenizer(model_name)
        model = load_model(model_name, dtype=dtype)
        if torch.cuda.is_available():
            model = model.to("cuda")
        return cls(model, tokenizer, adapters=adapters, **kwargs)

    # -- routing -----------------------------------------------------------------------------
    def use(self, route: Route) -> None:
        """Set the routing rule (see the class docstring); names are checked against the loaded adapters."""
        known = {BASE, *self.adapter_names}
        if route is None:
            route = self.adapter_names[0] if len(self.adapter_names) == 1 else BASE
        if isinstance(route, str):
            if route not in known:
                raise ConfigError(f"unknown adapter {route!r}; loaded: {', '.join(sorted(known))}")
        elif isinstance(route, dict):
            bad = sorted(set(route.values()) - known)
            if bad:
                raise ConfigError(f"route names unknown adapter(s) {bad}; loaded: {', '.join(sorted(known))}")
        self.route = route

    def adapter_for(self, task: TaskSpec) -> str:
        """The adapter name (or "base") that serves this task under the current route."""
        route = self.route
        if isinstance(route, str):
            return route
        if isinstance(route, dict):
            name = route.get(task.family, route.get("*"))
            if name is None:
                raise ConfigError(f"no route for task family {task.family!r} and no '*' fallback in {route}")
            return name
        name = route(task) if route is not None else BASE
        name = BASE if name is None else name
        if name not in (BASE, *self.adapter_names):
            raise ConfigError(f"the routing rule chose unknown adapter {name!r} for task {task.id!r}")
        return name

    # -- the policy interface ----------------------------------------------------------------
    def generate(self, request: PolicyRequest) -> PolicyReply:
        """One step for one episode."""
        return self.generate_batch([request])[0]

    def generate_batch(self, requests: list[PolicyRequest]) -> list[PolicyReply]:
        """One step for many episodes: grouped by adapter, length-sorted, left-padded, generated together."""
        prompts = [list(self.renderer.prompt_ids(r.messages)) for r in requests]
        groups: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault(self.adapter_for(r.task), []).append(i)
        replies: list[PolicyReply | None] = [None] * len(requests)
        for adapter, idx in groups.items():
            idx = sorted(idx, key=lambda i: len(prompts[i]))
            with self._adapter(adapter):
                for start in range(0, len(idx), self.batch_size):
                    chunk = idx[start : start + self.batch_size]
                    keys = [(requests[i].episode_id, adapter) for i in chunk]
                    for i, reply in zip(chunk, self._generate_ids([prompts[i] for i in chunk], keys)):
                        replies[i] = reply
        return [r for r in replies if r is not None]

    def generate_stream(self, pull: Callable[[int], list[PolicyRequest]],
                        on_reply: Callable[[PolicyRequest, PolicyReply], None]) -> None:
        """Continuous batching for the harness (`agentrig.harness.loop.run_episodes`): requests join a running
        decode as rows free up, instead of in lockstep rounds that last as long as their longest reply.

        `pull(free)` returns up to `free` requests ready now (none: nothing ready yet); `on_reply(request,
        reply)` is called as each reply ends, inside the decode loop, and may make new requests ready (the
        episode's next step). Returns when nothing is live and `pull` has nothing more. Requests are served
        by their routed adapter, one adapter's rows at a time. Without the prefix cache, rounds of
        `generate_batch`.
        """
        waiting: dict[str, deque[PolicyRequest]] = {}  # adapter -> pulled requests not yet decoding
        while True:
            adapter = next((a for a, q in waiting.items() if q), None)
            if adapter is None:
                got = pull(self.batch_size)
                if not got:
                    return
                if not self.prefix_cache:
                    for request, reply in zip(got, self.generate_batch(got)):
                        on_reply(request, reply)
                    continue
                self._wait(waiting, got)
                continue
            self._stream(adapter, waiting, pull, on_reply)

    def _wait(self, waiting: dict[str, deque[PolicyRequest]], requests: list[PolicyRequest]) -> None:
        """Queue pulled requests under the adapter each is routed to."""
        for request in requests:
            waiting.setdefault(self.adapter_for(request.task), deque()).append(request)

    def _stream(self, adapter: str, waiting: dict[str, deque[PolicyRequest]],
                pull: Callable[[int], list[PolicyRequest]],
                on_reply: Callable[[PolicyRequest, PolicyReply], None]) -> None:
        """One decode of `adapter`'s rows: start with its waiting requests, admit more as rows end (requests
        pulled for another adapter wait in `waiting` for their own decode)."""
        queue = waiting[adapter]
        rows: list[PolicyRequest] = []
        prompts: list[list[int]] = []
        tokens: list[list[int]] = []

        def take(limit: int) -> list[tuple[list[int], tuple[str, str]]]:
            if len(queue) < limit:
                self._wait(waiting, pull(limit - len(queue)))
            new = []
            while queue and len(new) < limit:
                request = queue.popleft()
                prompt = list(self.renderer.prompt_ids(request.messages))
                rows.append(request)
                prompts.append(prompt)
                tokens.append([])
                new.append((prompt, (request.episode_id, adapter)))
            return new

        def on_token(row: int, token: int) -> bool:
            tokens[row].append(token)
            return False

        def on_done(row: int) -> None:
            text, used = self.reply_text(tokens[row])
            on_reply(rows[row], PolicyReply(text=text, prompt_tokens=len(prompts[row]), completion_tokens=used))

        first = take(self.batch_size)
        if first:
            with self._adapter(adapter):
                self._rows([p for p, _ in first], [k for _, k in first], on_token=on_token, admit=take,
                           on_done=on_done)

    def generate_rows(
        self,
        prompts: list[list[int]],
        adapter: str,
        keys: list[tuple[str, str]],
        *,
        max_new_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        on_token: Callable[[int, int], bool] | None = None,
        admit: Callable[[int], list[tuple[list[int], tuple[str, str]]]] | None = None,
        on_done: Callable[[int], None] | None = None,
    ) -> list[list[int]]:
        """Generated token ids for prompt ids already rendered, one adapter, this batch's own sampling settings.

        For servers (`agentrig.serve`): `keys` are prefix-cache keys; `seed` seeds this batch's sampling exactly;
        `on_token(row, token)` is called for every generated token in order (streaming) and returns True to end
        that row now (a stop string, a client that went away). The stop rules of `finished` still apply.
        `admit` and `on_done` are the continuous batching of `_decode` (rows that join a running batch, and
        a call as each row finishes); without the prefix cache, rows are only admitted at the start.
        """
        saved = (self.max_new_tokens, self.temperature, self.top_p)
        self.max_new_tokens = saved[0] if max_new_tokens is None else max_new_tokens
        self.temperature = saved[1] if temperature is None else temperature
        self.top_p = saved[2] if top_p is None else top_p
        try:
            with self._adapter(adapter):
                return self._rows(prompts, keys, seed, on_token, admit, on_done)
        finally:
            self.max_new_tokens, self.temperature, self.top_p = saved

    # -- adapters loaded while running (the server's runtime LoRA) -------------------------------------
    def load_adapter(self, name: str, folder: str) -> None:
        """Load one more PEFT adapter by name next to the others (the base weights stay untouched)."""
        if name == BASE or name in self.adapter_names:
            raise ConfigError(f"an adapter named {name!r} is already loaded; unload it first or choose another name")
        if self._merged is not None:
            self._merged.forget()
        self._half.forget()
        base = self.model.get_base_model() if self.adapter_names else self.model
        check_adapter(base, folder)  # before PEFT touches the model: a failed load must not half-change it
        from agentrig.models import quiet_loading

        try:
            with quiet_loading():
                if not self.adapter_names:
                    from peft import PeftModel

                    self.model = PeftModel.from_pretrained(self.model, folder, adapter_name=name, is_trainable=False)
                else:
                    self.model.load_adapter(folder, adapter_name=name, is_trainable=False)
        except Exception as exc:  # noqa: BLE001 - PEFT raises many kinds for a folder the base cannot take
            if name in getattr(self.model, "peft_config", {}):
                self.model.delete_adapter(name)
            raise ConfigError(f"cannot load adapter {name!r} from {folder}: {exc.__class__.__name__}: {exc}") from None
        self.model.eval()
        self.adapter_names.append(name)

    def unload_adapter(self, name: str) -> None:
        """Drop a loaded adapter and the prefix-cache entries it computed."""
        if name not in self.adapter_names:
            raise ConfigError(f"no adapter named {name!r} is loaded; loaded: {', '.join(self.adapter_names) or 'none'}")
        if self._merged is not None:
            self._merged.forget()
        self._half.forget()
        if len(self.adapter_names) == 1:
            self.model = self.model.unload()  # back to the plain base model (weights were never merged)
        else:
            if self.model.active_adapter == name:
                self.model.set_adapter(next(n for n in self.adapter_names if n != name))
            self.model.delete_adapter(name)
        self.adapter_names.remove(name)
        for key in [k for k in self._prefixes if k[1] == name]:
            del self._prefixes[key]
        if isinstance(self.route, str) and self.route == name:
            self.route = BASE

    # -- internals ----------------------------------------------------------------------------
    def _autocast_wanted(self, bf16: bool | None) -> bool:
        import torch

        param = next(self.model.parameters())
        if param.dtype != torch.float32 or param.device.type != "cpu":
            return False
        if bf16 is None:
            from agentrig.models import amx_bf16

            return amx_bf16()
        return bf16

    @contextlib.contextmanager
    def _precision(self) -> Iterator[None]:
        """bf16 autocast on the CPU when `self.bf16`, with the linear weights' bf16 copies in place
        (`agentrig.policies.halfweights`: autocast would cast them again at every call); else nothing."""
        import torch

        if not self.bf16:
            yield
            return
        self._half.use(self.model)
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                yield
        finally:
            self._half.restore()

    def _load_adapters(self, model: Any, adapters: dict[str, str]) -> Any:
        if not adapters:
            return model
        from peft import PeftModel

        for name in adapters:
            if name == BASE:
                raise ConfigError(f"{BASE!r} is reserved for the model without adapters; rename that adapter")
        from agentrig.models import quiet_loading

        items = list(adapters.items())
        first_name, first_dir = items[0]
        try:
            with quiet_loading():
                peft_model = PeftModel.from_pretrained(model, first_dir, adapter_name=first_name, is_trainable=False)
                for name, folder in items[1:]:
                    peft_model.load_adapter(folder, adapter_name=name, is_trainable=False)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"cannot load adapters {adapters}: {exc}") from None
        self.adapter_names = [name for name, _ in items]
        return peft_model

    @contextlib.contextmanager
    def _adapter(self, name: str) -> Iterator[None]:
        """Activate one adapter (or none) for the duration of a batch group."""
        if not self.adapter_names:
            yield
        elif name == BASE:
            with self.model.disable_adapter():
                yield
        elif self._merged is not None and self._merged.use(self.model, name):
            try:
                with self.model.disable_adapter():  # the merged base layers are the adapter
                    yield
            finally:
                self._merged.restore()
        else:
            self.model.set_adapter(name)
            yield

    def _generate_ids(self, prompts: list[list[int]], keys: list[tuple[str, str]]) -> list[PolicyReply]:
        """Generate for one batch (one adapter active); `keys` are the rows' prefix-cache keys."""
        replies = []
        for row, prompt in zip(self._rows(prompts, keys), prompts):
            text, used = self.reply_text(row)
            replies.append(PolicyReply(text=text, prompt_tokens=len(prompt), completion_tokens=used))
        return replies

    def _rows(self, prompts: list[list[int]], keys: list[tuple[str, str]], seed: int | None = None,
              on_token: Callable[[int, int], bool] | None = None,
              admit: Callable[[int], list[tuple[list[int], tuple[str, str]]]] | None = None,
              on_done: Callable[[int], None] | None = None) -> list[list[int]]:
        """The generated ids of one batch (the active adapter, the current sampling settings): the decode loop,
        or `generate` without the prefix cache (whose tokens reach `on_token`/`on_done` afterwards).

        Sampling is seeded by `seed` exactly, else by the policy's `seed` and the call count, else not at all.
        """
        import torch

        generator = None
        if self.temperature > 0 and (seed is not None or self.seed is not None):
            generator = torch.Generator().manual_seed(seed if seed is not None else self.seed * 1_000_003 + self._calls)
        self._calls += 1
        with torch.inference_mode(), self._precision():
            if self.prefix_cache and max(len(p) for p in prompts) > 1:
                return self._decode(prompts, keys, generator, on_token, admit, on_done)
            rows = self._hf_generate(prompts, generator)
        for r, row in enumerate(rows):
            for k, token in enumerate(row):
                if on_token is not None and on_token(r, token):
                    del row[k + 1:]
                    break
            if on_done is not None:
                on_done(r)
        return rows

    # -- the stopping rules (one place: the decode loop, the plain path and the replay check use them) --
    def finished(self, generated: list[int]) -> bool:
        """Whether a reply whose tokens so far are `generated` is complete: it ended its turn (end-of-turn or
        eos token) or started writing a `<tool_response>` itself. Several `<tool_call>` blocks may come first."""
        return bool(generated) and (generated[-1] in self._stop_ids or self._writes_response(generated))

    def reply_text(self, row: list[int]) -> tuple[str, int]:
        """The reply text of generated tokens (up to the stop token, cut after a self-written `<tool_response>`)
        and how many tokens it used (the stop token counts as generated)."""
        tokens, stopped = _until_stop(row, self._stop_ids | {self.tokenizer.pad_token_id})
        text = self.tokenizer.decode(tokens, skip_special_tokens=False)
        cut = text.find(TOOL_RESPONSE_OPEN)
        if cut >= 0:
            text = text[: cut + len(TOOL_RESPONSE_OPEN)]
        return text, len(tokens) + int(stopped)

    def _hf_generate(self, prompts: list[list[int]], generator: Any) -> list[list[int]]:
        """The plain path: one left-padded `model.generate` call, prompts prefilled in full, nothing kept."""
        import torch

        pad = self.tokenizer.pad_token_id
        width = max(len(p) for p in prompts)
        device = next(self.model.parameters()).device
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "stop_strings": [TOOL_RESPONSE_OPEN],
            "tokenizer": self.tokenizer,
            "eos_token_id": sorted(self._stop_ids),
            "pad_token_id": pad,
            "use_cache": True,
            "return_dict_in_generate": False,
        }
        if self.temperature > 0:
            kwargs.update(do_sample=True, temperature=self.temperature, top_p=self.top_p, top_k=0)
            if generator is not None:
                torch.manual_seed(int(generator.initial_seed()))
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        out = self.model.generate(input_ids=input_ids, attention_mask=attention, **kwargs)
        return out[:, width:].tolist()

    def _decode(self, prompts: list[list[int]], keys: list[tuple[str, str]], generator: Any,
                on_token: Callable[[int, int], bool] | None = None,
                admit: Callable[[int], list[tuple[list[int], tuple[str, str]]]] | None = None,
                on_done: Callable[[int], None] | None = None) -> list[list[int]]:
        """The prefix-cached path: reuse kept keys/values, decode in place, drop rows as they finish.

        The rows' caches (all but each prompt's last token, see `_batched_prefix`) are left-padded into one
        `BufferedCache` with room for the replies. Each step feeds every live row's newest token (the last
        prompt token first) with its own position id, so padding never shifts a position. A row stops at an
        end-of-turn/eos token, once its text holds a self-written `<tool_response>`, or at `max_new_tokens`;
        its keys/values for its prompt and the tokens fed so far are kept for its episode's next step and the
        row leaves the batch, so the others go on at a smaller batch size.

        Continuous batching (`admit`, the server's): before each step after the first, `admit(free)` may
        return up to `free` new `(prompt ids, key)` rows, which join the running batch at once: each is
        prefilled (reusing kept keys/values), right-aligned at the cache's filled length (every row shifts
        right first when a new prompt is longer than that; the shifted-in positions are masked; columns no live
        row uses any more are dropped), and gets the next row numbers for `on_token` and the result.
        """
        import torch

        device = next(self.model.parameters()).device
        width = max(len(p) for p in prompts)
        cache = self._batched_prefix(prompts, keys, width - 1)
        prompts, keys = list(prompts), list(keys)
        live = list(range(len(prompts)))
        start = [width - len(p) for p in prompts]  # the cache column where each row's positions begin
        out: list[list[int]] = [[] for _ in prompts]
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        step_ids = torch.tensor([[p[-1]] for p in prompts], device=device)
        positions = torch.tensor([[len(p) - 1] for p in prompts], device=device)
        first = True
        while True:
            free = self.batch_size - len(live)
            new = admit(free) if admit is not None and not first and free > 0 else []
            first = False
            if new:
                kvs = [self._prefill_row(q, k, []) for q, k in new]
                filled = cache.get_seq_length()
                drop = min((start[r] for r in live), default=filled)  # columns no live row uses any more
                kept = filled - drop
                filled = max(kept, max(len(q) - 1 for q, _ in new))
                pad = filled - kept
                cache.add_rows(kvs, drop, filled)
                start = [c - drop + pad for c in start]
                rows_mask = [[0] * (filled - len(q) + 1) + [1] * len(q) for q, _ in new]
                mask = torch.cat([mask.new_zeros((mask.shape[0], pad)), mask[:, drop:]], dim=1)
                mask = torch.cat([mask, torch.tensor(rows_mask, device=device, dtype=mask.dtype)], dim=0)
                step_ids = torch.cat([step_ids, torch.tensor([[q[-1]] for q, _ in new], device=device)], dim=0)
                positions = torch.cat([positions, torch.tensor([[len(q) - 1] for q, _ in new], device=device)], dim=0)
                for q, k in new:
                    live.append(len(prompts))
                    prompts.append(q)
                    keys.append(k)
                    start.append(filled - len(q) + 1)
                    out.append([])
            if not live:
                break
            logits = self.model(input_ids=step_ids, attention_mask=mask, position_ids=positions, cache=cache,
                                use_cache=True, logits_to_keep=1).logits[:, -1, :].float()
            chosen = self._next_tokens(logits, generator).tolist()
            held = cache.get_seq_length()
            keep: list[int] = []
            for b, (row, token) in enumerate(zip(live, chosen)):
                out[row].append(token)
                ended = on_token is not None and on_token(row, token)
                if not (ended or len(out[row]) >= self.max_new_tokens or self.finished(out[row])):
                    keep.append(b)
                    continue
                # The cache holds this row's prompt and the tokens fed so far (not the one just chosen).
                self._keep(keys[row], prompts[row] + out[row][:-1], cache, b, start[row], held)
                while len(self._prefixes) > 2 * self.batch_size:
                    self._prefixes.popitem(last=False)
                if on_done is not None:
                    on_done(row)
            if not keep:
                break
            if len(keep) < len(live):
                cache.keep_rows(keep)
                index = torch.tensor(keep, device=device)
                mask, positions = mask.index_select(0, index), positions.index_select(0, index)
                live = [live[b] for b in keep]
                chosen = [chosen[b] for b in keep]
            step_ids = torch.tensor([[t] for t in chosen], device=device)
            positions = positions + 1
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
        return out

    def _next_tokens(self, logits: Any, generator: Any) -> Any:
        """Greedy, or temperature sampling with nucleus (`top_p`) filtering, like `generate`'s sampling."""
        import torch

        if self.temperature <= 0:
            return logits.argmax(dim=-1)
        logits = logits / self.temperature
        if self.top_p < 1.0:
            ordered, order = torch.sort(logits, descending=False)
            cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
            drop = cumulative <= (1 - self.top_p)
            drop[:, -1] = False  # always keep the most likely token
            logits = logits.masked_fill(drop.scatter(1, order, drop), float("-inf"))
        return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(1)

    def _writes_response(self, generated: list[int]) -> bool:
        """Whether the reply's text now holds `<tool_response>` (checked on its last few tokens)."""
        return TOOL_RESPONSE_OPEN in self.tokenizer.decode(generated[-12:], skip_special_tokens=False)

    # -- prefix cache ---------------------------------------------------------------------------
    def _batched_prefix(self, prompts: list[list[int]], keys: list[tuple[str, str]], length: int) -> Any:
        """A `BufferedCache` of the rows' first `len(prompt) - 1` tokens, left-padded to `length` with zeros.

        Each row reuses the longest prefix it shares with a kept entry, or with a row prefilled just
        before it in this batch (at step 0 the episodes share the system prompt), and prefills the rest
        at batch 1: prefill is compute-bound, so batching it gains little on a CPU, and unpadded rows keep
        every position id equal to its index. The padded slots are masked by the attention mask. The
        buffers have room for `max_new_tokens` more positions.
        """
        from agentrig.policies.kvcache import BufferedCache

        rows: list[list[tuple[Any, Any]]] = []
        this_batch: list[_Prefix] = []
        for prompt, key in zip(prompts, keys):
            rows.append(self._prefill_row(prompt, key, this_batch))
        return BufferedCache.left_padded(rows, length, capacity=length + self.max_new_tokens + 1)

    def _prefill_row(self, prompt: list[int], key: tuple[str, str], this_batch: list[_Prefix]) -> list[tuple[Any, Any]]:
        """Keys/values of `prompt[:-1]` at batch 1: the longest known prefix reused, the rest prefilled."""
        import torch
        from transformers import DynamicCache

        device = next(self.model.parameters()).device
        need = len(prompt) - 1
        reused, kv = self._lookup(prompt, key, need, this_batch)
        if reused < need:
            cache = DynamicCache(ddp_cache_data=kv) if reused else DynamicCache()
            self.model(input_ids=torch.tensor([prompt[reused:need]], device=device), cache=cache, use_cache=True,
                       logits_to_keep=1)
            kv = [(layer.keys, layer.values) for layer in cache.layers]
            if self.bf16:
                # Held in bf16, as attention reads them under autocast: otherwise autocast casts the whole
                # cache to bf16 again at every decode step, which made bf16 evaluation 1.45x slower than fp32.
                kv = [(k.to(torch.bfloat16), v.to(torch.bfloat16)) for k, v in kv]
            this_batch.append(_Prefix(prompt[:need], kv))
        return kv

    def _lookup(
        self, prompt: list[int], key: tuple[str, str], limit: int, this_batch: list[_Prefix]
    ) -> tuple[int, list[tuple[Any, Any]]]:
        """The longest known prefix of `prompt` (at most `limit` tokens) computed by the same adapter, and its keys/values.

        The episode's own entry is tried first. When the prompt does not extend it (memory compression
        rewrote the context) or there is none yet (step 0), the rows prefilled earlier in this batch and the
        other kept entries of the same adapter may share a prefix, usually the system prompt with the tool
        list. Nothing shared: `(0, [])`.
        """
        own = self._prefixes.get(key)
        others = [p for k, p in self._prefixes.items() if k[1] == key[1] and k != key]
        best, best_n = None, 0
        for entry in ([own] if own is not None else []) + this_batch + others:
            n = min(_common_prefix(entry.ids, prompt), limit)
            if n > best_n:
                best, best_n = entry, n
            if best_n == limit:
                break
        if best is None:
            return 0, []
        return best_n, [(k[:, :, :best_n], v[:, :, :best_n]) for k, v in best.kv]

    def _keep(self, key: tuple[str, str], ids: list[int], cache: Any, row: int, offset: int, held: int) -> None:
        """Keep one row's keys/values (cache columns `offset:held`, the positions of `ids`) as its episode's entry."""
        kv = [
            (layer.key_buffer[row : row + 1, :, offset:held].clone(), layer.value_buffer[row : row + 1, :, offset:held].clone())
            for layer in cache.layers
        ]
        self._prefixes.pop(key, None)
        self._prefixes[key] = _Prefix(ids, kv)


def check_adapter(model: Any, folder: str) -> None:
    """Raise `ConfigError` unless `folder` holds a LoRA adapter whose every matrix fits a linear layer of `model`."""
    import json
    from pathlib import Path

    root = Path(folder)
    config_file = root / "adapter_config.json"
    if not config_file.is_file():
        raise ConfigError(f"{folder} is not an adapter folder (no adapter_config.json); pass the folder PEFT saved")
    try:
        config = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{config_file} is not readable JSON: {exc}") from None
    if str(config.get("peft_type", "")).upper() != "LORA":
        raise ConfigError(f"{folder} holds a {config.get('peft_type')!r} adapter; only LoRA adapters are served")
    weights = root / "adapter_model.safetensors"
    if not weights.is_file():
        raise ConfigError(f"{folder} has no adapter_model.safetensors")
    from safetensors import safe_open

    modules = dict(model.named_modules())
    with safe_open(str(weights), framework="pt") as f:
        for key in f.keys():
            if ".lora_A." not in key and ".lora_B." not in key:
                continue
            path = key.split(".lora_")[0].removeprefix("base_model.model.")
            layer = modules.get(path)
            if layer is None or not hasattr(layer, "in_features"):
                raise ConfigError(f"adapter {folder} targets {path!r}, which this base model has no linear layer for "
                                  "(an adapter trained on another base model?)")
            shape = tuple(f.get_slice(key).get_shape())
            fits = shape[1] == layer.in_features if ".lora_A." in key else shape[0] == layer.out_features
            if not fits:
                raise ConfigError(f"adapter {folder}: {key} has shape {list(shape)}, which does not fit {path} "
                                  f"({layer.in_features} -> {layer.out_features}); it was trained on another base model")


def _common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists (slice comparisons run in C)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _until_stop(row: list[int], stop_ids: set[int]) -> tuple[list[int], bool]:
    """The generated tokens before the first stop/pad token, and whether one was found."""
    for k, tok in enumerate(row):
        if tok in stop_ids:
            return row[:k], True
    return row, False
