"""HFPolicy: batched greedy equals one-at-a-time, replies run to the end of turn (several calls) and stop at a
self-written `<tool_response>`, adapter routing, base weights untouched,
and the prefix cache gives the uncached replies over multi-step episodes while prefilling far fewer tokens."""

from __future__ import annotations

import pytest

from agentrig.errors import ConfigError
from agentrig.harness import PolicyRequest
from agentrig.harness.trajectory import TaskSpec


SYSTEM = "You are a function-calling agent."


def _request(prompt: str, family: str = "lookup") -> PolicyRequest:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    return PolicyRequest(messages=messages, tools=[], task=TaskSpec(id=prompt, prompt=prompt, family=family), step=0)


PROMPTS = ["hi", "what is the stock level of SKU A-17 in the north warehouse?", "list orders", "x y z " * 12]


def test_batched_greedy_equals_one_at_a_time(smol_tokenizer) -> None:
    from agentrig.models import tiny_random_model
    from agentrig.policies.hf_policy import HFPolicy

    # initializer_range 0.2: at 0.02 every reply is the same twelve newlines, and a broken mask would pass
    policy = HFPolicy(tiny_random_model(len(smol_tokenizer), initializer_range=0.2), smol_tokenizer, max_new_tokens=12)
    requests = [_request(p) for p in PROMPTS]
    batched = policy.generate_batch(requests)
    single = [policy.generate(r) for r in requests]
    assert len({r.text for r in single}) > 1  # the replies differ, so a row mix-up or padding leak shows
    assert [r.text for r in batched] == [r.text for r in single]
    assert [r.completion_tokens for r in batched] == [r.completion_tokens for r in single]
    lengths = [len(policy.renderer.prompt_ids(r.messages)) for r in requests]
    assert [r.prompt_tokens for r in batched] == lengths
    assert all(0 < r.completion_tokens <= 12 for r in batched)


def _bigram_model(tokenizer, chain: list[int]):
    """A tiny Llama whose next token depends only on the current one: follows `chain` exactly."""
    import torch

    from agentrig.models import tiny_random_model

    model = tiny_random_model(len(tokenizer), tie_word_embeddings=False)
    with torch.no_grad():
        for layer in model.model.layers:  # the residual stream stays the current token's embedding
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.lm_head.weight.zero_()
        emb = model.model.embed_tokens.weight
        for a, b in zip(chain, chain[1:]):
            direction = emb[a] / emb[a].norm()
            model.lm_head.weight[b] += 50.0 * direction
    return model


def test_generation_runs_past_a_tool_call_block_to_the_end_of_turn(smol_tokenizer) -> None:
    from agentrig.policies.hf_policy import HFPolicy
    from agentrig.data.render import Renderer

    renderer = Renderer(smol_tokenizer)
    last = renderer.prompt_ids(_request("hi").messages)[-1]
    target = smol_tokenizer.encode("ok</tool_call> then more words", add_special_tokens=False) + [renderer.eot_id]
    for prefix_cache in (True, False):
        policy = HFPolicy(_bigram_model(smol_tokenizer, [last, *target]), smol_tokenizer, max_new_tokens=20,
                          prefix_cache=prefix_cache)
        replies = policy.generate_batch([_request("hi"), _request("a longer prompt to force left padding")])
        for reply in replies:
            assert reply.text == "ok</tool_call> then more words"  # a second call could follow the first
            assert reply.completion_tokens == len(target)


def test_generation_stops_at_a_self_written_tool_response(smol_tokenizer) -> None:
    from agentrig.policies.hf_policy import HFPolicy
    from agentrig.data.render import Renderer

    renderer = Renderer(smol_tokenizer)
    last = renderer.prompt_ids(_request("hi").messages)[-1]
    target = smol_tokenizer.encode("ok<tool_response> made up", add_special_tokens=False)
    for prefix_cache in (True, False):
        policy = HFPolicy(_bigram_model(smol_tokenizer, [last, *target]), smol_tokenizer, max_new_tokens=30,
                          prefix_cache=prefix_cache)
        reply = policy.generate(_request("hi"))
        assert reply.text == "ok<tool_response>"


def test_end_of_turn_token_ends_the_reply(smol_tokenizer) -> None:
    from agentrig.policies.hf_policy import HFPolicy
    from agentrig.data.render import Renderer

    renderer = Renderer(smol_tokenizer)
    last = renderer.prompt_ids(_request("hi").messages)[-1]
    target = smol_tokenizer.encode("all done", add_special_tokens=False) + [renderer.eot_id]
    policy = HFPolicy(_bigram_model(smol_tokenizer, [last, *target]), smol_tokenizer, max_new_tokens=20)
    reply = policy.generate(_request("hi"))
    assert reply.text == "all done"
    assert reply.completion_tokens == len(target)  # the end-of-turn token counts as generated


def _save_adapter(model_factory, folder, seed: int) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    model = model_factory()  # seeds torch itself, so seed the LoRA init after it
    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=64, target_modules=["q_proj", "v_proj", "down_proj"], init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(folder)


def test_adapters_route_per_task_and_leave_base_weights_untouched(smol_tokenizer, tmp_path) -> None:
    import torch

    from agentrig.policies.hf_policy import HFPolicy
    from agentrig.models import tiny_random_model

    def fresh():
        return tiny_random_model(len(smol_tokenizer))

    _save_adapter(fresh, tmp_path / "a", seed=1)
    _save_adapter(fresh, tmp_path / "b", seed=2)
    base = fresh()
    before = {k: v.clone() for k, v in base.state_dict().items()}
    base_only = HFPolicy(fresh(), smol_tokenizer, max_new_tokens=8)

    policy = HFPolicy(
        base,
        smol_tokenizer,
        adapters={"a": str(tmp_path / "a"), "b": str(tmp_path / "b")},
        route={"fa": "a", "fb": "b", "*": "base"},
        max_new_tokens=8,
    )
    requests = [_request("route me", family=f) for f in ("fa", "fb", "other")]
    routed = [r.text for r in policy.generate_batch(requests)]
    assert [policy.adapter_for(r.task) for r in requests] == ["a", "b", "base"]

    alone = {}
    for name in ("a", "b", "base"):
        policy.use(name)
        alone[name] = policy.generate(requests[0]).text
    assert routed == [alone["a"], alone["b"], alone["base"]]
    assert len(set(routed)) == 3, "each adapter (and the base) should answer differently"
    assert alone["base"] == base_only.generate(requests[0]).text

    after = {k.replace(".base_layer", ""): v for k, v in policy.model.get_base_model().state_dict().items() if "lora_" not in k}
    assert set(after) == set(before)
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_unknown_adapter_names_are_config_errors(tiny_model, smol_tokenizer) -> None:
    from agentrig.policies.hf_policy import HFPolicy

    policy = HFPolicy(tiny_model, smol_tokenizer)
    with pytest.raises(ConfigError, match="unknown adapter 'sft'"):
        policy.use("sft")
    with pytest.raises(ConfigError, match="unknown adapter"):
        policy.use({"lookup": "sft"})


def test_sampling_with_a_seed_is_reproducible(tiny_model, smol_tokenizer) -> None:
    from agentrig.policies.hf_policy import HFPolicy

    requests = [_request(p) for p in PROMPTS[:2]]
    first = HFPolicy(tiny_model, smol_tokenizer, max_new_tokens=8, temperature=1.0, seed=7).generate_batch(requests)
    again = HFPolicy(tiny_model, smol_tokenizer, max_new_tokens=8, temperature=1.0, seed=7).generate_batch(requests)
    other = HFPolicy(tiny_model, smol_tokenizer, max_new_tokens=8, temperature=1.0, seed=8).generate_batch(requests)
    assert [r.text for r in first] == [r.text for r in again]
    assert [r.text for r in first] != [r.text for r in other]


# -- prefix cache -------------------------------------------------------------------------------


def _talkative_model(tokenizer):
    """A tiny random Llama with a wide init: varied replies with clear logit margins (no greedy ties)."""
    from agentrig.models import tiny_random_model

    return tiny_random_model(len(tokenizer), initializer_range=0.2)


def _episodes(policy, prompts: list[str], steps: int, rewrite: dict[int, str] | None = None) -> list[list[str]]:
    """Drive `generate_batch` like the harness does: each step's prompt is the last one + reply + observation.

    `rewrite[k] = episode` replaces that episode's context before step k with a new system prompt and only
    its latest turn (what memory compression does), so its prompt no longer extends what was cached.
    """
    convs = {f"ep{i}": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}] for i, p in enumerate(prompts)}
    texts: list[list[str]] = []
    for k in range(steps):
        for eid in [e for step, e in (rewrite or {}).items() if step == k]:
            convs[eid] = [{"role": "system", "content": SYSTEM + " Memory: looked it up."}, convs[eid][1], *convs[eid][-2:]]
        requests = [
            PolicyRequest(messages=list(m), tools=[], task=TaskSpec(id=e, prompt=m[1]["content"], family="fa"), step=k, episode_id=e)
            for e, m in convs.items()
        ]
        replies = policy.generate_batch(requests)
        texts.append([r.text for r in replies])
        for (eid, messages), reply in zip(convs.items(), replies):
            messages.append({"role": "assistant", "content": reply.text})
            messages.append({"role": "tool", "name": "lookup", "content": f"result {k} for {eid}: " + "ok " * (3 * len(eid) + k)})
    return texts


def _count_prefilled(model) -> list[int]:
    """The token count (rows x columns) of every forward over more than one column (prefills, not decode steps)."""
    seen: list[int] = []

    def hook(_module, args) -> None:
        if args[0].shape[1] > 1:
            seen.append(args[0].numel())

    model.get_input_embeddings().register_forward_pre_hook(hook)
    return seen


def test_prefix_cache_gives_the_uncached_replies_and_prefills_less(smol_tokenizer) -> None:
    from agentrig.policies.hf_policy import HFPolicy

    model = _talkative_model(smol_tokenizer)
    seen = _count_prefilled(model)
    prompts = ["hi", "what is the stock level of SKU A-17 in the north warehouse?", "list orders"]
    # ep1's context is rewritten before step 2: its prompt no longer extends its cached ids.
    plain = _episodes(HFPolicy(model, smol_tokenizer, max_new_tokens=6, prefix_cache=False), prompts, 3, {2: "ep1"})
    plain_tokens = sum(seen)
    seen.clear()
    cached = _episodes(HFPolicy(model, smol_tokenizer, max_new_tokens=6), prompts, 3, {2: "ep1"})
    assert cached == plain
    assert len({t for step in plain for t in step}) == 9, "replies should differ, else equality proves little"
    assert sum(seen) < plain_tokens / 2


def test_bf16_prefix_cache_is_held_in_bf16_and_gives_the_uncached_replies(smol_tokenizer) -> None:
    """Under bf16 autocast the kept keys/values are bf16 (attention reads them in bf16; fp32 ones were cast
    again at every decode step), the linear weights' bf16 copies give autocast's replies, and the replies
    are the uncached bf16 path's; the model's weights are fp32 again afterwards."""
    import torch

    from agentrig.policies.hf_policy import HFPolicy

    model = _talkative_model(smol_tokenizer)
    prompts = ["hi", "what is the stock level of SKU A-17 in the north warehouse?", "list orders"]
    plain = _episodes(HFPolicy(model, smol_tokenizer, max_new_tokens=6, prefix_cache=False, bf16=True), prompts, 3)
    per_call = HFPolicy(model, smol_tokenizer, max_new_tokens=6, prefix_cache=False, bf16=True)
    per_call._half.use = lambda model: None  # autocast casting the fp32 weights at every call, as before
    assert _episodes(per_call, prompts, 3) == plain  # the bf16 copies are autocast's own rounding
    policy = HFPolicy(model, smol_tokenizer, max_new_tokens=6, bf16=True)
    assert _episodes(policy, prompts, 3) == plain
    kept = [t for entry in policy._prefixes.values() for kv in entry.kv for t in kv]
    assert kept and all(t.dtype == torch.bfloat16 for t in kept)
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_prefix_cache_rows_of_one_episode_in_separate_batches(smol_tokenizer) -> None:
    from agentrig.policies.hf_policy import HFPolicy

    model = _talkative_model(smol_tokenizer)
    prompts = ["a", "bb bb", "ccc ccc ccc", "dddd dddd dddd dddd"]
    plain = _episodes(HFPolicy(model, smol_tokenizer, max_new_tokens=5, prefix_cache=False), prompts, 2)
    # batch_size 2: two chunks per round, and the LRU (2 x batch_size) just holds all four episodes.
    assert _episodes(HFPolicy(model, smol_tokenizer, max_new_tokens=5, batch_size=2), prompts, 2) == plain


def test_prefix_cache_is_kept_per_adapter(smol_tokenizer, tmp_path) -> None:
    from agentrig.policies.hf_policy import HFPolicy

    def fresh():
        return _talkative_model(smol_tokenizer)

    _save_adapter(fresh, tmp_path / "a", seed=1)
    _save_adapter(fresh, tmp_path / "b", seed=2)
    adapters = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    cached = HFPolicy(fresh(), smol_tokenizer, adapters=adapters, route="a", max_new_tokens=6)
    plain = HFPolicy(fresh(), smol_tokenizer, adapters=adapters, route="a", max_new_tokens=6, prefix_cache=False)

    def run(policy) -> list[list[str]]:
        # one episode whose steps alternate adapters: a, b, a (the LoRA changes v_proj, so a reused
        # cache from the other adapter would change the replies)
        texts = []
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "route me"}]
        for k, name in enumerate(["a", "b", "a"]):
            policy.use(name)
            request = PolicyRequest(list(messages), [], TaskSpec(id="t", prompt="route me", family="fa"), k, "ep")
            text = policy.generate(request).text
            texts.append(text)
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": f"go on {k}"}]
        return texts

    assert run(cached) == run(plain)


def test_prefix_cache_with_sampling_is_reproducible(smol_tokenizer) -> None:
    from agentrig.policies.hf_policy import HFPolicy

    model = _talkative_model(smol_tokenizer)
    prompts = ["hi", "list orders"]

    def sample(seed: int) -> list[list[str]]:
        return _episodes(HFPolicy(model, smol_tokenizer, max_new_tokens=5, temperature=1.0, seed=seed), prompts, 2)

    first = sample(7)
    assert first == sample(7)
    assert first != sample(8)


def test_prefix_cache_rows_that_stop_early_leave_the_batch(smol_tokenizer) -> None:
    """Rows that hit a stop token at different steps: the cached loop drops them and still gives `generate`'s replies."""
    from agentrig.policies.hf_policy import HFPolicy

    model = _talkative_model(smol_tokenizer)
    prompts = ["hi", "what is the stock level of SKU A-17 in the north warehouse?", "list orders"]
    plain = HFPolicy(model, smol_tokenizer, max_new_tokens=8, prefix_cache=False)
    free = plain.generate_batch([_request(p) for p in prompts])
    # Make the 3rd token of the first reply and the 5th of the second stop tokens, for both paths.
    first, second = (smol_tokenizer(r.text, add_special_tokens=False)["input_ids"] for r in free[:2])
    stops = {first[2], second[4]}
    cached = HFPolicy(model, smol_tokenizer, max_new_tokens=8)
    for policy in (plain, cached):
        policy._stop_ids |= stops
    expected = _episodes(plain, prompts, 2)
    assert _episodes(cached, prompts, 2) == expected
    lengths = [len(t) for t in expected[0]]
    assert len(set(lengths)) > 1, "rows should stop at different steps"


def test_sampling_with_a_tiny_top_p_is_greedy(smol_tokenizer) -> None:
    from agentrig.policies.hf_policy import HFPolicy

    model = _talkative_model(smol_tokenizer)
    prompts = ["hi", "list orders"]
    greedy = _episodes(HFPolicy(model, smol_tokenizer, max_new_tokens=6), prompts, 2)
    nucleus = HFPolicy(model, smol_tokenizer, max_new_tokens=6, temperature=1.5, top_p=1e-6, seed=3)
    assert _episodes(nucleus, prompts, 2) == greedy


def test_bf16_autocast_runs_and_leaves_the_weights_fp32(tiny_model, smol_tokenizer, monkeypatch) -> None:
    import torch

    import agentrig.models
    from agentrig.policies.hf_policy import HFPolicy

    for amx in (True, False):  # the default follows the CPU: bf16 with AMX, else fp32 (docs/benchmarks.md)
        monkeypatch.setattr(agentrig.models, "amx_bf16", lambda amx=amx: amx)
        assert HFPolicy(tiny_model, smol_tokenizer).bf16 is amx
        assert HFPolicy(tiny_model, smol_tokenizer, bf16=not amx).bf16 is (not amx)
    policy = HFPolicy(tiny_model, smol_tokenizer, max_new_tokens=6, bf16=True)
    replies = policy.generate_batch([_request(p) for p in PROMPTS])
    assert policy.bf16 is True and len(replies) == len(PROMPTS)
    assert all(0 < r.completion_tokens <= 6 for r in replies)
    assert all(p.dtype == torch.float32 for p in tiny_model.parameters())


def test_rows_admitted_into_a_running_batch_get_the_replies_they_get_alone(tiny_model, smol_tokenizer) -> None:
    """Continuous batching: prompts that join mid-decode (one longer than the cache so far, which shifts every
    row; one after others finished, which drops unused columns) decode exactly as they do alone."""
    from agentrig.policies.hf_policy import HFPolicy

    policy = HFPolicy(tiny_model, smol_tokenizer, max_new_tokens=10)
    render = lambda p: list(policy.renderer.prompt_ids(_request(p).messages))  # noqa: E731
    first = [render("hi"), render("list orders")]
    joining = {2: [render("x y z " * 30)], 6: [render("what is the stock level of SKU A-17?"), render("ok")]}
    calls = {"n": 0}
    done: list[int] = []

    def admit(free: int):
        calls["n"] += 1
        return [(q, (f"late{calls['n']}-{k}", "base")) for k, q in enumerate(joining.get(calls["n"], []))][:free]

    short = {0, 2}  # rows ended after 2 tokens (a stop string, say): by step 5 only row 1 is live, and its
    # cache starts right of column 0, so the admission at step 5 drops the columns nobody uses
    ends = lambda row, token, seen={}: (seen.__setitem__(row, seen.get(row, 0) + 1) or  # noqa: E731
                                        (row in short and seen[row] >= 2))
    rows = policy.generate_rows(first, "base", [("a", "base"), ("b", "base")], admit=admit, on_done=done.append,
                                on_token=ends)
    prompts = first + joining[2] + joining[6]
    assert len(rows) == len(prompts) == 5 and sorted(done) == list(range(5))
    fresh = HFPolicy(tiny_model, smol_tokenizer, max_new_tokens=10)
    alone = [fresh.generate_rows([q], "base", [(f"solo{k}", "base")])[0] for k, q in enumerate(prompts)]
    assert [len(r) for r in rows[:3]] == [2, len(alone[1]), 2]
    assert rows == [a[:2] if k in short else a for k, a in enumerate(alone)]


def test_loading_a_model_and_adapters_keeps_library_noise_out_of_the_terminal(tmp_path, smol_tokenizer, capfd) -> None:
    """No weight-loading bar, no PEFT `is_gradient_checkpointing` FutureWarning (issue 17)."""
    import warnings

    from peft import LoraConfig, get_peft_model

    from agentrig.models import tiny_random_model
    from agentrig.policies.hf_policy import HFPolicy

    model_dir, adapter_dir = tmp_path / "model", tmp_path / "adapter"
    tiny_random_model(len(smol_tokenizer)).save_pretrained(model_dir)
    smol_tokenizer.save_pretrained(model_dir)
    get_peft_model(tiny_random_model(len(smol_tokenizer)), LoraConfig(r=2, target_modules=["q_proj"])).save_pretrained(adapter_dir)
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        policy = HFPolicy.from_pretrained(str(model_dir), {"a": str(adapter_dir)})
        policy.load_adapter("b", str(adapter_dir))
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "is_gradient_checkpointing" not in err, err
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)]


def test_models_load_without_hub_kernels_even_where_the_kernels_package_is_missing(tmp_path, smol_tokenizer, monkeypatch) -> None:
    """transformers >= 5.25 kernelizes by default and refuses to load where `kernels` is not installed (seen on an
    H200 machine: every model load failed); agentrig asks for no Hub kernels, so the load works there too."""
    import transformers.modeling_utils as modeling_utils
    from transformers import AutoModelForCausalLM

    from agentrig.models import load_model, tiny_random_model

    tiny_random_model(len(smol_tokenizer)).save_pretrained(tmp_path / "model")
    monkeypatch.setattr(modeling_utils, "is_kernels_available", lambda *a, **k: False)
    if "use_kernels" in str(modeling_utils.PreTrainedModel.from_pretrained.__doc__):  # the versions that kernelize
        with pytest.raises(ValueError, match="[Kk]ernels"):
            AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    model = load_model(str(tmp_path / "model"))
    assert model.config.vocab_size == len(smol_tokenizer)


def test_streamed_episodes_get_the_replies_of_lockstep_rounds(smol_tokenizer, tmp_path) -> None:
    """`generate_stream` (continuous batching): episodes of different lengths, two adapters routed by family,
    two rows at a time, so rows join a running decode; every reply equals the uncached lockstep one."""
    from collections import deque

    from agentrig.policies.hf_policy import HFPolicy

    def fresh():
        return _talkative_model(smol_tokenizer)

    _save_adapter(fresh, tmp_path / "a", seed=1)
    _save_adapter(fresh, tmp_path / "b", seed=2)
    adapters = {"a": str(tmp_path / "a"), "b": str(tmp_path / "b")}
    route = {"fa": "a", "fb": "b"}
    prompts = {"ep0": ("hi", "fa", 3), "ep1": ("list orders", "fb", 1), "ep2": ("x y z " * 8, "fa", 2),
               "ep3": ("what is the stock level of SKU A-17?", "fb", 3), "ep4": ("ok", "fa", 1)}

    def request(eid: str, messages: list, step: int) -> PolicyRequest:
        prompt, family, _ = prompts[eid]
        return PolicyRequest(list(messages), [], TaskSpec(id=eid, prompt=prompt, family=family), step, eid)

    def observe(messages: list, eid: str, k: int, text: str) -> None:
        messages += [{"role": "assistant", "content": text},
                     {"role": "tool", "name": "lookup", "content": f"result {k} for {eid}: " + "ok " * (2 * k + 1)}]

    convs = {e: [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}] for e, (p, _, _) in prompts.items()}
    lockstep = HFPolicy(fresh(), smol_tokenizer, adapters=adapters, route=route, max_new_tokens=6, prefix_cache=False)
    expected: dict[str, list[str]] = {e: [] for e in prompts}
    for k in range(3):
        live = [e for e in prompts if k < prompts[e][2]]
        for eid, reply in zip(live, lockstep.generate_batch([request(e, convs[e], k) for e in live])):
            expected[eid].append(reply.text)
            observe(convs[eid], eid, k, reply.text)

    policy = HFPolicy(fresh(), smol_tokenizer, adapters=adapters, route=route, max_new_tokens=6, batch_size=2)
    convs = {e: [{"role": "system", "content": SYSTEM}, {"role": "user", "content": p}] for e, (p, _, _) in prompts.items()}
    got: dict[str, list[str]] = {e: [] for e in prompts}
    ready = deque(request(e, convs[e], 0) for e in prompts)
    pulls: list[int] = []

    def pull(free: int) -> list[PolicyRequest]:
        pulls.append(free)
        return [ready.popleft() for _ in range(min(free, len(ready)))]

    def on_reply(req: PolicyRequest, reply) -> None:
        eid = req.episode_id
        got[eid].append(reply.text)
        observe(convs[eid], eid, req.step, reply.text)
        if len(got[eid]) < prompts[eid][2]:
            ready.append(request(eid, convs[eid], req.step + 1))

    policy.generate_stream(pull, on_reply)
    assert got == expected
    assert len({t for texts in expected.values() for t in texts}) > 5, "replies should differ"
    assert 1 in pulls, "rows should have joined a running decode one at a time"


def test_half_weights_swap_bf16_copies_in_and_the_originals_back(smol_tokenizer) -> None:
    """`HalfWeights`: every fp32 linear layer holds a bf16 copy while in use, the tied head too while the
    embeddings stay fp32; the very same parameters afterwards; a weight changed in place or replaced gets a
    fresh copy, an unchanged one is not copied again."""
    import torch

    from agentrig.models import tiny_random_model
    from agentrig.policies.halfweights import HalfWeights

    model = tiny_random_model(len(smol_tokenizer))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    assert head.weight is embeddings.weight  # SmolLM2's tied head
    params = {m: m.weight for m in linears}
    half = HalfWeights()
    half.use(model)
    assert {m.weight.dtype for m in linears} == {torch.bfloat16}
    assert embeddings.weight is params[head] and embeddings.weight.dtype == torch.float32
    q = model.model.layers[0].self_attn.q_proj
    assert torch.equal(q.weight, params[q].data.to(torch.bfloat16))
    copy = q.weight.data_ptr()
    half.restore()
    assert all(m.weight is params[m] and m.weight.dtype == torch.float32 for m in linears)
    half.use(model)
    assert q.weight.data_ptr() == copy  # unchanged weights: the same copy, not made again
    half.restore()
    with torch.no_grad():
        q.weight.mul_(2)  # changed in place: the next use copies it again
    half.use(model)
    assert torch.equal(q.weight, params[q].data.to(torch.bfloat16)) and q.weight.data_ptr() != copy
    half.restore()
    replaced = params[q].data + 1  # another tensor (an adapter's merged weights)
    q.weight.data = replaced
    half.use(model)
    assert torch.equal(q.weight, replaced.to(torch.bfloat16))
    half.forget()
    assert q.weight is params[q] and q.weight.data.data_ptr() == replaced.data_ptr()
