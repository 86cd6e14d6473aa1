"""Regenerate the linear-recurrence samples in models/linrec/ (the linrec pass's), deterministically.

    python models/generate_linrec.py                 # all of them
    python models/generate_linrec.py --only torch_ema

PyTorch 2.13 dynamo exports (need `pip install torch==2.13.0 onnxscript`, imported lazily; the
tests never import torch) of ``torch._higher_order_ops.scan`` over, at T=16 (static shapes)
unless named ``_dyn`` (symbolic ``seq``):
- torch_cumsum:            h' = h + x_t, x [T, B=2, 8]
- torch_cumsum_dyn:        the same with a symbolic length (the CumSum form needs none)
- torch_ema:               learned decay a = sigmoid(w) [8]: h' = a*h + (1-a)*x_t
- torch_mingru:            z = sigmoid(Linear(x)), h~ = Linear(x), h' = (1-z)*h + z*h~
- torch_mingru_dyn:        the same with a symbolic length (the positions form, padded at run time)
- torch_mamba:             selective scan, state [B, D=8, N=4]: Δ = softplus(Linear(x)),
                           a = exp(Δ ⊗ A) with A = -exp(A_log), b = (Δ x) ⊗ B_t, y = Σ_n h' C_t
- torch_mamba_wide:        the same at Mamba's width, T=64, B=1, D=64, N=16 (linrec's two-pass form)
- torch_mamba_minimal_wide: mamba-minimal's selective_scan as models/generate_heldout_linrec.py
                           writes it (y read by ``einsum("bdn,bn->bd", state, C_i)``: an Einsum in
                           the body), T=40, B=1, D=64, N=16, dt_rank 4, static shapes
- torch_linear_attention:  matrix state S [8, 8]: S' = γ S + kᵀv (γ = sigmoid of a learned
                           scalar), y = q S'
- torch_cumprod:           h' = h * x_t
Each comes with <name>.expected.npz: inputs and the outputs torch computed. The hand-written ONNX
forms (Mul/Add, Sigmoid gates, Einsum, Exp of a negative parameter) are tests/linrec_builders.py,
built in the tests themselves.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from generate import HERE, run_generator, save_npz  # noqa: E402
from generate_cells import _export as export_cell  # noqa: E402 - the one torch export helper


def _export(module, args, names, outputs, dynamic=None):
    return export_cell(module, args, names, dynamic, outputs)

import onnx  # noqa: E402

OUT = os.path.join(HERE, "linrec")
T, B, H = 16, 2, 8


def _scan_module(step_factory, params=None):
    """An nn.Module scanning ``step`` (built from the module) over x from h0."""
    import torch
    from torch._higher_order_ops import scan

    class Recurrence(torch.nn.Module):
        def __init__(self):
            super().__init__()
            for key, value in (params or {}).items():
                setattr(self, key, value)

        def forward(self, x, h0):
            h_n, y = scan(step_factory(self), h0, x)
            return y, h_n

    Recurrence.__module__ = "scanopt_samples"
    return Recurrence().eval()


def torch_cumsum(dynamic=False):
    import torch

    torch.manual_seed(0)

    def step(_):
        def f(h, x_t):
            h2 = h + x_t
            return h2, h2.clone()
        return f

    x, h0 = torch.randn(T, B, H), torch.randn(B, H)
    dyn = {"x": {0: torch.export.Dim("seq")}, "h0": {}} if dynamic else None
    return _export(_scan_module(step), (x, h0), ["x", "h0"], ["y", "h_n"], dyn)


def torch_ema():
    import torch

    torch.manual_seed(1)

    def step(m):
        def f(h, x_t):
            a = torch.sigmoid(m.w)
            h2 = a * h + (1 - a) * x_t
            return h2, h2.clone()
        return f

    module = _scan_module(step, {"w": torch.nn.Parameter(torch.randn(H))})
    return _export(module, (torch.randn(T, B, H), torch.zeros(B, H)), ["x", "h0"], ["y", "h_n"])


def torch_mingru(dynamic=False):
    import torch

    torch.manual_seed(2)

    def step(m):
        def f(h, x_t):
            z = torch.sigmoid(m.gate(x_t))
            h2 = (1 - z) * h + z * m.cand(x_t)
            return h2, h2.clone()
        return f

    module = _scan_module(step, {"gate": torch.nn.Linear(H, H), "cand": torch.nn.Linear(H, H)})
    dyn = {"x": {0: torch.export.Dim("seq")}, "h0": {}} if dynamic else None
    return _export(module, (torch.randn(T, B, H), torch.zeros(B, H)), ["x", "h0"], ["y", "h_n"], dyn)


def torch_mamba(steps=T, batch=B, D=H, N=4):
    import torch

    torch.manual_seed(3)

    def step(m):
        def f(h, x_t):  # h [B, D, N], x_t [B, D]
            delta = torch.nn.functional.softplus(m.dt(x_t))
            a = torch.exp(delta.unsqueeze(-1) * -torch.exp(m.A_log))
            b = (delta * x_t).unsqueeze(-1) * m.bp(x_t).unsqueeze(1)
            h2 = a * h + b
            y = (h2 * m.cp(x_t).unsqueeze(1)).sum(-1)
            return h2, y
        return f

    a_log = torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(D, 1)
    module = _scan_module(step, {"dt": torch.nn.Linear(D, D), "bp": torch.nn.Linear(D, N), "cp": torch.nn.Linear(D, N),
                                 "A_log": torch.nn.Parameter(a_log)})
    return _export(module, (torch.randn(steps, batch, D), torch.zeros(batch, D, N)), ["x", "h0"], ["y", "h_n"])


def torch_mamba_minimal_wide(steps=40):
    import torch

    from generate_heldout_linrec import _mamba_module

    torch.manual_seed(1)
    module = _mamba_module(False, d_model=64, d_state=16, dt_rank=4)().eval()
    module.__module__ = "scanopt_samples"
    return _export(module, (torch.randn(1, steps, 64),), ["x"], ["y", "h_n"])


def torch_linear_attention():
    import torch

    torch.manual_seed(4)

    def step(m):
        def f(s, x_t):  # s [B, H, H], x_t [B, H]
            q, k, v = m.q(x_t), m.k(x_t), m.v(x_t)
            s2 = torch.sigmoid(m.g) * s + k.unsqueeze(-1) * v.unsqueeze(-2)
            y = (q.unsqueeze(-2) @ s2).squeeze(-2)
            return s2, y
        return f

    module = _scan_module(step, {"q": torch.nn.Linear(H, H), "k": torch.nn.Linear(H, H), "v": torch.nn.Linear(H, H),
                                 "g": torch.nn.Parameter(torch.tensor(2.0))})
    return _export(module, (torch.randn(T, B, H), torch.zeros(B, H, H)), ["x", "h0"], ["y", "h_n"])


def torch_cumprod():
    import torch

    torch.manual_seed(5)

    def step(_):
        def f(h, x_t):
            h2 = h * x_t
            return h2, h2.clone()
        return f

    x = torch.rand(T, B, H) + 0.5
    return _export(_scan_module(step), (x, torch.ones(B, H)), ["x", "h0"], ["y", "h_n"])


EXPORTED = {
    "torch_cumsum": torch_cumsum,
    "torch_cumsum_dyn": lambda: torch_cumsum(dynamic=True),
    "torch_ema": torch_ema,
    "torch_mingru": torch_mingru,
    "torch_mingru_dyn": lambda: torch_mingru(dynamic=True),
    "torch_mamba": torch_mamba,
    "torch_mamba_wide": lambda: torch_mamba(steps=64, batch=1, D=64, N=16),
    "torch_mamba_minimal_wide": torch_mamba_minimal_wide,
    "torch_linear_attention": torch_linear_attention,
    "torch_cumprod": torch_cumprod,
}


def write(name: str) -> None:
    m, expected = EXPORTED[name]()
    os.makedirs(OUT, exist_ok=True)
    onnx.save(m, os.path.join(OUT, f"{name}.onnx"))
    save_npz(os.path.join(OUT, f"{name}.expected.npz"), expected)


def main(argv=None):
    run_generator(__file__, __doc__, list(EXPORTED), write, OUT, argv)


if __name__ == "__main__":
    main()
