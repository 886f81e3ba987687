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
