"""Regenerate models/heldout_linattn/: matrix-state linear attention as PyTorch users write it (issue 32).

    python models/generate_heldout_linattn.py            # all (torch 2.13, onnxscript)
    python models/generate_heldout_linattn.py --only delta_ts

Each recurrence is written the way the reference code of its model writes it (the "naive
recurrent" functions of flash-linear-attention, fla/ops/*/naive.py, and RetNet's recurrent
form): q, k, v [B, H, T, d], state S [B, H, dk, dv], per step S updated and o_t = q_t·S.
Every sample comes with <name>.expected.npz (its inputs and PyTorch's eager outputs).

- linear:       causal linear attention, feature map elu(x) + 1 on q and k (Katharopoulos et al.):
                S = S + k_tᵀ v_t (k[..., None] * v[..., None, :]), o_t = einsum('bhk,bhkv->bhv')
- retnet:       RetNet's recurrent retention, a fixed decay per head gamma_h = 1 - 2^(-5-h):
                S = gamma[:, None, None] * S + k_tᵀ v_t; q scaled by dk^-0.5
- gated:        a data-dependent decay per head (GLA/Mamba-2-like scalar gate): g = logsigmoid(a)
                / 16, S = exp(g_t)[..., None, None] * S + k_tᵀ v_t
- delta:        DeltaNet (fla naive delta rule): k L2-normalized, beta = sigmoid(b);
                v_t = (v_t - (S * k_t[..., None]).sum(-2)) * beta_t[..., None];
                S = S + k_t[..., None] * v_t[..., None, :]
- gated_delta:  Gated DeltaNet (fla naive recurrent gated delta rule): g = -exp(A_log) *
                softplus(a + dt_bias) (<= 0), S = S * exp(g_t)[..., None, None], then the delta rule
                on the decayed state

Two exporters each: ``_ts`` TorchScript (``torch.jit.script`` of the Python for-loop over T,
``dynamo=False``, opset 17, B and T symbolic: a Loop) and ``_dyn`` dynamo with
``torch._higher_order_ops.scan`` over dim 2 (T symbolic; the dynamo exporter unrolls a Python
for-loop, so the loop form is TorchScript's only).
"""

from __future__ import annotations

import os

from generate import HERE, export_torch_sample, run_generator

OUT = os.path.join(HERE, "heldout_linattn")
RULES = ["linear", "retnet", "gated", "delta", "gated_delta"]
NAMES = [f"{r}_{x}" for r in RULES for x in ("ts", "dyn")]
B, H, T, DK, DV = 2, 2, 11, 8, 6  # no two equal


def _modules():
    import torch
    from torch import nn
    from torch.nn import functional as F

    def scan(step, init, xs):
        from torch._higher_order_ops.scan import scan as hop_scan

        return hop_scan(step, init, xs, dim=2)

    class Linear(nn.Module):
        def forward(self, q, k, v):
            q, k = F.elu(q) + 1.0, F.elu(k) + 1.0
            return self.loop(q, k, v)

        def loop(self, q, k, v):
            b, h, t, dk = q.shape
            S = torch.zeros(b, h, dk, v.shape[-1])
            outs = []
            for i in range(t):
                S = S + k[:, :, i, :, None] * v[:, :, i, None, :]
                outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, i], S))
            return torch.stack(outs, dim=2), S

    class LinearScan(Linear):
        def loop(self, q, k, v):
            S = torch.zeros(q.shape[0], q.shape[1], q.shape[3], v.shape[3])

            def step(S, xs):
                q_t, k_t, v_t = xs
                S = S + k_t[..., None] * v_t[..., None, :]
                return S, torch.einsum("bhk,bhkv->bhv", q_t, S)

            S, o = scan(step, S, (q, k, v))
            return o, S

    class RetNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("gamma", 1.0 - 2.0 ** (-5.0 - torch.arange(H, dtype=torch.float32)))

        def forward(self, q, k, v):
            return self.loop(q * q.shape[-1] ** -0.5, k, v)

        def loop(self, q, k, v):
            b, h, t, dk = q.shape
            S = torch.zeros(b, h, dk, v.shape[-1])
            outs = []
            for i in range(t):
                S = self.gamma[:, None, None] * S + k[:, :, i, :, None] * v[:, :, i, None, :]
                outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, i], S))
            return torch.stack(outs, dim=2), S

    class RetNetScan(RetNet):
        def loop(self, q, k, v):
            S = torch.zeros(q.shape[0], q.shape[1], q.shape[3], v.shape[3])
            gamma = self.gamma[:, None, None]

            def step(S, xs):
                q_t, k_t, v_t = xs
                S = gamma * S + k_t[..., None] * v_t[..., None, :]
                return S, torch.einsum("bhk,bhkv->bhv", q_t, S)

            S, o = scan(step, S, (q, k, v))
            return o, S

    class Gated(nn.Module):
        def forward(self, q, k, v, a):
            return self.loop(q * q.shape[-1] ** -0.5, k, v, F.logsigmoid(a) / 16.0)

        def loop(self, q, k, v, g):
            b, h, t, dk = q.shape
            S = torch.zeros(b, h, dk, v.shape[-1])
            outs = []
            for i in range(t):
                S = torch.exp(g[:, :, i])[..., None, None] * S + k[:, :, i, :, None] * v[:, :, i, None, :]
                outs.append(torch.einsum("bhk,bhkv->bhv", q[:, :, i], S))
            return torch.stack(outs, dim=2), S

    class GatedScan(Gated):
        def loop(self, q, k, v, g):
            S = torch.zeros(q.shape[0], q.shape[1], q.shape[3], v.shape[3])

            def step(S, xs):
                q_t, k_t, v_t, g_t = xs
                S = torch.exp(g_t)[..., None, None] * S + k_t[..., None] * v_t[..., None, :]
                return S, torch.einsum("bhk,bhkv->bhv", q_t, S)

            S, o = scan(step, S, (q, k, v, g))
            return o, S

    class Delta(nn.Module):
        def forward(self, q, k, v, b):
            k = F.normalize(k, p=2.0, dim=-1)
            return self.loop(q * q.shape[-1] ** -0.5, k, v, torch.sigmoid(b))

        def loop(self, q, k, v, beta):
            b, h, t, dk = q.shape
            S = torch.zeros(b, h, dk, v.shape[-1])
            outs = []
            for i in range(t):
                k_i = k[:, :, i]
                v_i = v[:, :, i] - (S * k_i[..., None]).sum(-2)
                v_i = v_i * beta[:, :, i, None]
                S = S + k_i[..., None] * v_i[..., None, :]
                outs.append(torch.einsum("bhd,bhdm->bhm", q[:, :, i], S))
            return torch.stack(outs, dim=2), S

    class DeltaScan(Delta):
        def loop(self, q, k, v, beta):
            S = torch.zeros(q.shape[0], q.shape[1], q.shape[3], v.shape[3])

            def step(S, xs):
                q_t, k_t, v_t, b_t = xs
                v_t = (v_t - (S * k_t[..., None]).sum(-2)) * b_t[..., None]
                S = S + k_t[..., None] * v_t[..., None, :]
                return S, torch.einsum("bhd,bhdm->bhm", q_t, S)

            S, o = scan(step, S, (q, k, v, beta))
            return o, S

    class GatedDelta(nn.Module):
        def __init__(self):
            super().__init__()
            self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 4.0, H)))
            self.dt_bias = nn.Parameter(torch.linspace(-1.0, 1.0, H))

        def forward(self, q, k, v, b, a):
            k = F.normalize(k, p=2.0, dim=-1)
            g = -self.A_log.exp()[:, None] * F.softplus(a + self.dt_bias[:, None])
            return self.loop(q * q.shape[-1] ** -0.5, k, v, torch.sigmoid(b), g)

        def loop(self, q, k, v, beta, g):
            b, h, t, dk = q.shape
            S = torch.zeros(b, h, dk, v.shape[-1])
            outs = []
            for i in range(t):
                S = S * g[:, :, i].exp()[..., None, None]
                k_i = k[:, :, i]
                v_i = v[:, :, i] - (S * k_i[..., None]).sum(-2)
                v_i = v_i * beta[:, :, i, None]
                S = S + k_i[..., None] * v_i[..., None, :]
                outs.append(torch.einsum("bhd,bhdm->bhm", q[:, :, i], S))
            return torch.stack(outs, dim=2), S

    class GatedDeltaScan(GatedDelta):
        def loop(self, q, k, v, beta, g):
            S = torch.zeros(q.shape[0], q.shape[1], q.shape[3], v.shape[3])

            def step(S, xs):
                q_t, k_t, v_t, b_t, g_t = xs
                S = S * g_t.exp()[..., None, None]
                v_t = (v_t - (S * k_t[..., None]).sum(-2)) * b_t[..., None]
                S = S + k_t[..., None] * v_t[..., None, :]
                return S, torch.einsum("bhd,bhdm->bhm", q_t, S)

            S, o = scan(step, S, (q, k, v, beta, g))
            return o, S

    return dict(linear_ts=Linear, linear_dyn=LinearScan, retnet_ts=RetNet, retnet_dyn=RetNetScan,
                gated_ts=Gated, gated_dyn=GatedScan, delta_ts=Delta, delta_dyn=DeltaScan,
                gated_delta_ts=GatedDelta, gated_delta_dyn=GatedDeltaScan)


def _feeds(name: str):
    import torch

    g = torch.Generator().manual_seed(NAMES.index(name))
    randn = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    feeds = {"q": randn(B, H, T, DK), "k": randn(B, H, T, DK), "v": randn(B, H, T, DV)}
    rule = name.rsplit("_", 1)[0]
    if rule in ("delta", "gated_delta"):
        feeds["b"] = randn(B, H, T)
    if rule in ("gated", "gated_delta"):
        feeds["a"] = randn(B, H, T)
    # the dynamo exporter: a symbolic batch fails torch's scan export here (as dyn_gla's); T symbolic
    dyn = name.endswith("_dyn")
    axes = {k: ({2: "seq"} if dyn else {0: "batch", 2: "seq"}) for k in feeds}
    return feeds, axes


def write(name: str) -> None:
    import torch

    feeds, axes = _feeds(name)
    torch.manual_seed(1)
    module = _modules()[name]().eval()
    module.__module__ = "scanopt_samples"
    export_torch_sample(module, feeds, ["o", "S"], os.path.join(OUT, f"{name}.onnx"),
                        scripted=name.endswith("_ts"), axes=axes)


if __name__ == "__main__":
    run_generator(__file__, __doc__, NAMES, write, OUT)
