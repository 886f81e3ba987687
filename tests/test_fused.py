"""The fused `silu(gate) * up` equals the unfused expression in values and gradients, and saves less."""

from __future__ import annotations


def test_silu_mul_matches_unfused_values_and_gradients():
    import torch

    from agentrig.train.fused import silu_mul

    torch.manual_seed(0)
    gate = (torch.randn(3, 5, 7, dtype=torch.float64) * 3).requires_grad_()
    up = torch.randn(3, 5, 7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(silu_mul, (gate, up))
    grad = torch.randn(3, 5, 7, dtype=torch.float64)
    fused = silu_mul(gate, up)
    g_fused = torch.autograd.grad(fused, (gate, up), grad)
    plain = torch.nn.functional.silu(gate) * up
    g_plain = torch.autograd.grad(plain, (gate, up), grad)
    assert torch.allclose(fused, plain)
    assert all(torch.allclose(a, b) for a, b in zip(g_fused, g_plain))


def saved_bytes(fn):
    import torch

    seen: dict[int, int] = {}

    def pack(t):
        seen.setdefault(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(seen.values())


def test_fused_model_trains_identically_and_keeps_fewer_activations(smol_tokenizer):
    import torch

    from agentrig.train.fused import fuse_gated_mlps
    from agentrig.models import tiny_random_model

    ids = torch.randint(200, 3000, (2, 48))
    plain, fused = tiny_random_model(len(smol_tokenizer)), tiny_random_model(len(smol_tokenizer))
    assert fuse_gated_mlps(fused) == 2 and fuse_gated_mlps(torch.nn.Linear(2, 2)) == 0

    def step(model):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        return loss.detach(), model.model.layers[0].mlp.gate_proj.weight.grad.clone()

    (loss_p, grad_p), (loss_f, grad_f) = step(plain), step(fused)
    assert torch.allclose(loss_p, loss_f) and torch.allclose(grad_p, grad_f, atol=1e-6)
    # One (batch, seq, intermediate) tensor fewer per layer is kept for backward.
    saved_plain = saved_bytes(lambda: plain(input_ids=ids, labels=ids))
    saved_fused = saved_bytes(lambda: fused(input_ids=ids, labels=ids))
    per_layer = 2 * 48 * plain.config.intermediate_size * 4
    assert saved_plain - saved_fused == plain.config.num_hidden_layers * per_layer


def _lora_pair(dropout: float = 0.0):
    """A tiny model with LoRA on every linear layer, B made nonzero (as after training), and its fused twin."""
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    from agentrig.models import tiny_random_model
    from agentrig.train.fused import fuse_lora_linears

    model = get_peft_model(tiny_random_model(512), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                                                lora_dropout=dropout))
    torch.manual_seed(1)
    for name, p in model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.05)
    fused = copy.deepcopy(model)
    return model, fused, fuse_lora_linears(fused)


def _loss_and_grads(model, ids):
    loss = model(input_ids=ids, labels=ids).loss
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    grads = __import__("torch").autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
    return loss.detach(), dict(zip(names, grads))


def test_fused_lora_linear_gives_peft_values_and_gradients():
    import torch

    plain, fused, n = _lora_pair()
    assert n == 2 * 7  # q, k, v, o, gate, up, down in each of the 2 layers
    ids = torch.randint(3, 500, (2, 24))
    (loss_p, grads_p), (loss_f, grads_f) = _loss_and_grads(plain, ids), _loss_and_grads(fused, ids)
    assert torch.allclose(loss_p, loss_f, atol=1e-6) and loss_p != 0
    assert grads_p.keys() == grads_f.keys() and any("lora_A" in k for k in grads_p)
    for name in grads_p:
        assert torch.allclose(grads_p[name], grads_f[name], atol=1e-6, rtol=1e-5), name
    assert any(bool(g.abs().sum() > 0) for k, g in grads_f.items() if "lora_A" in k)  # B != 0: A learns too
    # Under bf16 autocast the sum is rounded once instead of three times: close, not equal.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out_p, out_f = plain(input_ids=ids).logits, fused(input_ids=ids).logits
    assert out_f.dtype == out_p.dtype and torch.allclose(out_p.float(), out_f.float(), atol=0.1)


def test_fused_lora_linear_leaves_what_it_does_not_cover_to_peft():
    import torch

    ids = torch.randint(3, 500, (1, 12))
    # With the adapter disabled, or merged into the weights, the output is the base model's.
    plain, fused, _ = _lora_pair()
    with fused.disable_adapter():
        with plain.disable_adapter():
            assert torch.equal(plain(input_ids=ids).logits, fused(input_ids=ids).logits)
    reference = fused(input_ids=ids).logits
    fused.merge_adapter()
    assert torch.allclose(fused(input_ids=ids).logits, reference, atol=1e-5)
    fused.unmerge_adapter()
    # Dropout on the LoRA branch: PEFT's forward, so in eval mode (dropout off) the two agree exactly.
    plain, fused, _ = _lora_pair(dropout=0.5)
    plain.eval(), fused.eval()
    assert torch.equal(plain(input_ids=ids).logits, fused(input_ids=ids).logits)


def test_head_logps_equals_cross_entropy_in_chunks(monkeypatch):
    import torch
    import torch.nn.functional as F

    from agentrig.train import lmloss

    monkeypatch.setattr(lmloss, "_CHUNK", 16)  # 50 rows: four chunks, the last one short
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 300, bias=False).requires_grad_(False)
    hidden = torch.randn(50, 32, dtype=torch.float32, requires_grad=True)
    targets = torch.randint(0, 300, (50,))
    weights = torch.randn(50)
    ours = lmloss.head_logps(head, hidden, targets)
    plain = -F.cross_entropy(head(hidden), targets, reduction="none")
    assert ours.shape == (50,) and torch.allclose(ours, plain, atol=1e-5)
    (g_ours,), (g_plain,) = (torch.autograd.grad((x * weights).sum(), hidden) for x in (ours, plain))
    assert torch.allclose(g_ours, g_plain, atol=1e-6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, plain = lmloss.head_logps(head, hidden, targets), -F.cross_entropy(head(hidden).float(), targets,
                                                                                reduction="none")
    assert ours.dtype == torch.float32 and torch.allclose(ours, plain, atol=1e-5)
    (g_ours,), (g_plain,) = (torch.autograd.grad((x * weights).sum(), hidden) for x in (ours, plain))
    assert g_ours.dtype == hidden.dtype and torch.allclose(g_ours, g_plain, atol=1e-6)


def test_head_logps_recasts_a_changed_weight_and_leaves_trainable_heads_to_autograd():
    import torch

    from agentrig.train import lmloss

    head = torch.nn.Linear(8, 20, bias=False).requires_grad_(False)
    hidden, targets = torch.randn(5, 8), torch.randint(0, 20, (5,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        before = lmloss.head_logps(head, hidden, targets)
        with torch.no_grad():
            head.weight.mul_(2.0)  # an in-place change bumps the version: the cached bf16 copy is stale
        after = lmloss.head_logps(head, hidden, targets)
    assert not torch.allclose(before, after)
    expected = torch.log_softmax(hidden @ head.weight.t(), -1).gather(1, targets[:, None]).squeeze(1)
    assert torch.allclose(after, expected, atol=0.1)
    trainable = torch.nn.Linear(8, 20, bias=False)
    lmloss.head_logps(trainable, hidden, targets).sum().backward()
    assert trainable.weight.grad is not None and trainable.weight.grad.abs().sum() > 0
