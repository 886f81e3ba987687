"""`prompt_no_grad` (train/context.py): the two-pass forward gives the one-pass log-probs, and its gradient
leaves out exactly the path through the context's keys and values."""

from __future__ import annotations

import random

import pytest
from test_train import synthetic_samples, tiny_config, tiny_model_dir, weight_snapshots, write_jsonl  # noqa: F401


def context_batch(seed: int = 0):
    """Packed rows of samples whose supervised part starts at different places; one sample has none."""
    from agentrig.train.packing import TokenizedSample, collate_rows, pack_rows

    rng = random.Random(seed)
    samples = []
    for i in range(9):
        n = rng.randint(12, 90)
        prompt = rng.randint(2, n - 3)
        ids = [rng.randrange(200, 3000) for _ in range(n)]
        labels = [-100] * prompt + ids[prompt:]
        if i == 4:
            labels = [-100] * n  # no supervised token: dropped from both passes
        if i == 6:  # a second supervised turn after an unsupervised tool result
            labels = labels[:n - 6] + [-100] * 3 + labels[n - 3:]
        samples.append(TokenizedSample(f"s{i}", ids, labels))
    rows = pack_rows(samples, 160)
    assert len(rows) >= 2  # several rows, the last with a padded tail
    return collate_rows(rows, pad_id=0)


def model_pair(tokenizer, checkpointing: bool = False, **overrides):
    from agentrig.models import tiny_random_model
    from agentrig.train.attention import use_packed_attention
    from agentrig.train.lmloss import add_supervised_head

    models = []
    for flag in (False, True):
        model = tiny_random_model(len(tokenizer), **overrides)
        assert use_packed_attention(model, 160)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.train()
        models.append(add_supervised_head(model, prompt_no_grad=flag))
    return models


def run(model, batch):
    out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], supervised_labels=batch["labels"])
    (-out["token_logps"].mean()).backward()
    return out


def test_two_passes_give_the_one_pass_log_probs(smol_tokenizer):
    import torch

    batch = context_batch()
    plain, split = model_pair(smol_tokenizer)
    a, b = run(plain, batch), run(split, batch)
    assert torch.equal(a["mask"], b["mask"])
    assert a["token_logps"].shape == b["token_logps"].shape and a["token_logps"].numel() > 100
    assert torch.allclose(a["token_logps"], b["token_logps"], atol=1e-5)


def test_gradient_is_the_same_where_the_context_cannot_reach(smol_tokenizer):
    """Parameters above every layer's keys and values (the last layer's MLP, the final norm) get the one-pass
    gradient exactly; the attention of layer 0 gets a different one (the left-out path is real)."""
    import torch

    batch = context_batch(1)
    plain, split = model_pair(smol_tokenizer)
    run(plain, batch), run(split, batch)
    grads = [{n: p.grad for n, p in m.named_parameters() if p.grad is not None} for m in (plain, split)]
    last = max(int(n.split(".")[2]) for n in grads[0] if ".layers." in n)
    above = [n for n in grads[0] if f"layers.{last}.mlp" in n or n == "model.norm.weight"]
    assert len(above) >= 3
    for name in above:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name
    q0 = "model.layers.0.self_attn.k_proj.weight"
    assert not torch.allclose(grads[0][q0], grads[1][q0], atol=1e-6)


def test_context_only_tokens_get_no_gradient(smol_tokenizer):
    """An input embedding row of a token that appears only in contexts gets no gradient with the stop-gradient
    (the embeddings untied from the head, whose softmax reaches every row)."""
    batch = context_batch(2)
    plain, split = model_pair(smol_tokenizer, tie_word_embeddings=False)
    run(plain, batch), run(split, batch)
    ids, labels, pos = batch["input_ids"], batch["labels"], batch["position_ids"]
    from agentrig.train.context import split_batch

    parts = split_batch(ids, labels, pos)
    context_only = set(parts.prefix_ids[0].tolist()) - set(parts.rest_ids[0].tolist())
    assert len(context_only) > 20
    emb = [m.get_input_embeddings().weight.grad for m in (plain, split)]
    rows = sorted(context_only)
    assert emb[0][rows].abs().sum() > 0
    assert emb[1][rows].abs().sum() == 0


def test_split_cuts_before_the_first_supervised_target():
    import torch

    from agentrig.train.context import split_batch

    # one row: a sample of 6 (targets from index 3), a sample of 4 with no target, a sample of 5 (from index 1)
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 20, 21, 22, 23, 30, 31, 32, 33, 34]])
    pos = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 0, 1, 2, 3, 4]])
    labels = torch.tensor([[-100, -100, -100, 13, 14, 15, -100, -100, -100, -100, -100, 31, 32, 33, 34]])
    parts = split_batch(ids, labels, pos)
    assert parts.prefix_ids.tolist() == [[10, 11]]
    assert parts.rest_ids.tolist() == [[12, 13, 14, 15, 30, 31, 32, 33, 34]]
    assert parts.rest_positions.tolist() == [[2, 3, 4, 5, 0, 1, 2, 3, 4]]
    assert parts.rest_labels.tolist() == [[-100, 13, 14, 15, -100, 31, 32, 33, 34]]
    assert parts.context.prefix_spans == [(0, 2), (2, 2)] and parts.context.rest_spans == [(0, 4), (4, 9)]
    labels[0, 10] = 30  # the third sample's first label supervised: its target would cross samples
    with pytest.raises(ValueError, match="first label is supervised"):
        split_batch(ids, labels, pos)


def test_gradient_checkpointing_recomputes_the_same_passes(smol_tokenizer):
    import torch

    batch = context_batch(3)
    _, split = model_pair(smol_tokenizer)
    _, checkpointed = model_pair(smol_tokenizer, checkpointing=True)
    checkpointed.load_state_dict(split.state_dict())
    split.train()
    a, b = run(split, batch), run(checkpointed, batch)
    assert torch.allclose(a["token_logps"], b["token_logps"], atol=1e-6)
    for (name, p), (_, q) in zip(split.named_parameters(), checkpointed.named_parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_without_packed_attention_the_key_is_refused(tmp_path):
    from agentrig.errors import ConfigError
    from agentrig.train.trainconfig import config_from_dict

    assert config_from_dict({"dataset": str(tmp_path), "prompt_no_grad": True}).prompt_no_grad
    with pytest.raises(ConfigError, match="prompt_no_grad needs agentrig's packed attention"):
        config_from_dict({"dataset": str(tmp_path), "prompt_no_grad": True, "flash_attn": "sdpa"})


def test_training_with_prompt_no_grad_learns_and_reports_the_same_first_loss(tmp_path, tiny_model_dir):
    """`run_train` with the key: its first step's loss is the one-pass run's (same forward, same data), every
    LoRA matrix moves and the loss falls as it memorizes the replies."""
    from agentrig.train.train import run_train

    data = write_jsonl(tmp_path / "data" / "tokenized.jsonl", synthetic_samples(4, seed=1, vocab=12))
    losses = {}
    for flag in (False, True):
        snapshots = weight_snapshots()
        config = tiny_config(tiny_model_dir, data.parent, tmp_path / f"run_{flag}", max_steps=25, learning_rate=1e-2,
                             lora_rank=16, lora_alpha=32, save_steps=100, prompt_no_grad=flag, bf16=False)
        losses[flag] = [h["loss"] for h in run_train(config, callbacks=[snapshots]).loss_history]
    moved = [n for n in snapshots.trainable if not (snapshots.begin[n] == snapshots.end[n]).all()]
    assert sorted(moved) == sorted(snapshots.trainable) and moved
    assert abs(losses[True][0] - losses[False][0]) < 1e-4
    assert losses[True][-1] < 0.5 * losses[True][0]


def test_dpo_pair_log_probs_are_the_same(smol_tokenizer):
    """DPO's rows (chosen rows, then rejected, padded): the summed completion log-probs per row are unchanged."""
    import torch

    from agentrig.train.dpo import PairCollator, pair_logps

    rng = random.Random(4)
    examples = [{"prompt_ids": [rng.randrange(200, 3000) for _ in range(rng.randint(20, 60))],
                 "chosen_ids": [rng.randrange(200, 3000) for _ in range(rng.randint(3, 20))],
                 "rejected_ids": [rng.randrange(200, 3000) for _ in range(rng.randint(3, 20))]} for _ in range(3)]
    batch = PairCollator(pad_id=0, max_len=160)(examples)
    plain, split = model_pair(smol_tokenizer)
    with torch.no_grad():
        a, b = pair_logps(plain, batch), pair_logps(split, batch)
    for x, y in zip(a, b):
        assert torch.allclose(x.float(), y.float(), atol=1e-4)


def test_prompt_no_grad_with_torch_compile_compiles_once_and_trains_the_eager_losses(tmp_path, tiny_model_dir):
    """With `torch_compile` the two passes reach attention through the compiled layers; the context's spans
    change every step and must not make the layers recompile (session 48: minutes a step). After the first
    steps have traced their graphs (with and without gradient), later steps with other sample layouts add none,
    and the losses are the eager two-pass run's."""
    import torch
    from transformers import TrainerCallback

    from agentrig.train import compile as compile_module
    from agentrig.train.train import run_train

    if not compile_module.has_cpp_compiler():
        pytest.skip("TorchInductor needs a C++ compiler on a CPU, and this machine has none")

    class Graphs(TrainerCallback):
        seen: list[int] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.seen.append(torch._dynamo.utils.counters["stats"]["unique_graphs"])

    data = write_jsonl(tmp_path / "data" / "tokenized.jsonl", synthetic_samples(16, seed=2, low=20, high=60))
    torch._dynamo.reset()
    graphs = Graphs()
    losses = {}
    for compiled in (True, False):
        config = tiny_config(tiny_model_dir, data.parent, tmp_path / f"run_{compiled}", max_steps=5, save_steps=100,
                             prompt_no_grad=True, torch_compile=compiled, bf16=False, seed=3)
        losses[compiled] = [h["loss"] for h in run_train(config, callbacks=[graphs] if compiled else []).loss_history]
    assert graphs.seen[0] > 0 and graphs.seen[-1] == graphs.seen[1], graphs.seen  # no graph after step 2
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)
