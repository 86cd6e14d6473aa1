"""Regenerate models/heldout_mamba/: a blind held-out set of Mamba-style selective scans (issue 21).

    python models/generate_heldout_mamba.py            # all (torch 2.13, onnxscript)
    python models/generate_heldout_mamba.py --only hf_mixer_dyn

Written blind, before linrec's producer step: each selective scan is written the way another
codebase writes it, and each sample comes with <name>.expected.npz (its inputs and PyTorch's
eager outputs; onnxruntime's for onnxscript, which has no eager Scan). Committed sizes are small
(SIZES); models/evaluate_heldout_mamba.py builds each again at issue 21's size (T=1024, D=64,
N=16, B=1) with :func:`build` for its timing rows, not committed.

PyTorch 2.13, dynamo exporter (``torch._higher_order_ops.scan``; L symbolic):
- minimal_skip_b2_dyn:  mamba-minimal's ``selective_scan(u, delta, A, B, C, D)`` (github.com/johnma2006/
                        mamba-minimal, model.py): deltaA = exp(einsum('bld,dn->bldn')), deltaB_u =
                        einsum('bld,bln,bld->bldn') for all steps before the loop; per step x = deltaA_i * x
                        + deltaB_u_i, y_i = einsum('bdn,bn->bd', x, C_i); then + u * D. Batch 2 (static)
- hf_mixer_dyn:         Hugging Face transformers' MambaMixer.slow_forward layout: hidden [B, D, L],
                        discrete_A = exp(A[None, :, None, :] * dt[:, :, :, None]) [B, D, L, N] (step
                        axis 2), deltaB_u = dt[..., None] * B[:, None] * hidden[..., None]; per step
                        state = dA_i * state + dBu_i, y_i = matmul(state, C_i.unsqueeze(-1))[:, :, 0],
                        as a scan combine fn over dim=2; + hidden * D[None, :, None]
- mambapy_seq_dyn:      alxndrTL's mamba.py selective_scan_seq: deltaA = exp(delta.unsqueeze(-1) * A),
                        BX = delta.unsqueeze(-1) * B.unsqueeze(2) * x.unsqueeze(-1); the scan outputs
                        every state hs [B, L, ED, N]; y = (hs @ C.unsqueeze(-1)).squeeze(3) + D * x
- mamba2_heads_dyn:     Mamba-2's scalar decay per head: A [H], dt [B, L, H], x [B, L, H, P],
                        state [B, H, P, N] = exp(dt_t * A)[..., None, None] * state
                        + (dt_t[..., None] * x_t)[..., None] * B_t[:, None, None, :];
                        y_t = einsum('bhpn,bn->bhp', state, C_t) + D[:, None] * x_t
- s4d_zoh_dyn:          S4D's real diagonal SSM, not selective: dA = exp(dt * A), dB = (dA - 1) / A * B
                        fixed [D, N]; per step h = dA * h + dB * u_t[..., None], y_t = (h * C).sum(-1)
                        over u [L, B, D] (time-major, scan dim 0); + D * u
TorchScript (``torch.jit.script``, ``dynamo=False``, opset 17; B and L symbolic unless said):
- minimal_skip_b2_ts:   mamba-minimal's selective_scan as it is: ``for i in range(l)``, ys.append,
                        torch.stack(ys, dim=1)
- minimal_static_ts:    the same exported with static B=1 and L (no dynamic axes)
- hf_mixer_ts:          the Hugging Face layout as its Python loop, torch.stack(scan_outputs, dim=-1)
- mambapy_seq_ts:       mamba.py's selective_scan_seq as its Python loop (hs.append(h))
- block_minimal_ts:     a whole mamba-minimal MambaBlock: in_proj, causal depthwise conv1d, SiLU,
                        x_proj, dt_proj + softplus, the selective scan, the SiLU(res) gate, out_proj
mamba_ssm's own reference, ``selective_scan_ref`` (state-spaces/mamba, ops/selective_scan_interface.py),
added to the blind set after the first run (no pass changed in between):
- ssm_ref_ts:           u, delta, z [B, D, L], B and C variable [B, N, L]: delta + delta_bias, softplus,
                        deltaA = exp(einsum('bdl,dn->bdln')), deltaB_u = einsum('bdl,bnl,bdl->bdln'); per
                        step x = deltaA[:, :, i] * x + deltaB_u[:, :, i], y = einsum('bdn,bn->bd', x,
                        C[:, :, i]); torch.stack(ys, dim=2) + u * D[:, None], times SiLU(z); the last state
- ssm_ref_dyn:          the same as a scan combine fn over dim=2
- ssm_ref_fp16_ts:      the same loop on float16 inputs, as selective_scan_ref runs them: u.float(),
                        delta.float(), the scan in float32, out.to(dtype=dtype_in)
onnxscript (models/heldout_mamba_onnxscript.py):
- einsum_outside_os:    a Scan over axis 1 whose inputs Exp(Einsum('bld,dn->bldn')) and the Mul
                        broadcasts of delta * u and B are computed outside it; per step ReduceSum of
                        h * C_t over N
"""

from __future__ import annotations

import os
import tempfile

import numpy as np
import onnx

from generate import HERE, IR_VERSION, export_torch_sample, run_generator, save_npz

OUT = os.path.join(HERE, "heldout_mamba")
# in the order they were written (the suffix names the source: _dyn dynamo, _ts TorchScript, _os
# onnxscript); a sample's feeds are seeded by its place here, so adding one changes no other's
NAMES = ["minimal_skip_b2_dyn", "hf_mixer_dyn", "mambapy_seq_dyn", "mamba2_heads_dyn", "s4d_zoh_dyn",
         "minimal_skip_b2_ts", "minimal_static_ts", "hf_mixer_ts", "mambapy_seq_ts", "block_minimal_ts",
         "einsum_outside_os",
         "ssm_ref_dyn", "ssm_ref_ts", "ssm_ref_fp16_ts"]  # the second blind run
ONNXSCRIPT = ["einsum_outside_os"]
# committed sizes: batch, length, channels (d_inner / ED / heads * P), state size; no two equal
SIZES = {
    "minimal_skip_b2_dyn": dict(b=2, l=24, d=16, n=8),
    "minimal_skip_b2_ts": dict(b=2, l=20, d=12, n=6),
    "minimal_static_ts": dict(b=1, l=16, d=8, n=4),
    "hf_mixer_dyn": dict(b=2, l=18, d=16, n=8),
    "hf_mixer_ts": dict(b=1, l=22, d=12, n=5),
    "mambapy_seq_dyn": dict(b=1, l=14, d=10, n=4),
    "mambapy_seq_ts": dict(b=2, l=12, d=8, n=6),
    "mamba2_heads_dyn": dict(b=1, l=26, d=16, n=8),  # d = heads * headdim (4 * 4)
    "s4d_zoh_dyn": dict(b=2, l=40, d=24, n=8),
    "block_minimal_ts": dict(b=1, l=30, d=32, n=16),  # d = d_inner = 2 * d_model
    "einsum_outside_os": dict(b=2, l=28, d=20, n=10),
    "ssm_ref_ts": dict(b=2, l=19, d=12, n=5),
    "ssm_ref_dyn": dict(b=2, l=21, d=10, n=6),
    "ssm_ref_fp16_ts": dict(b=1, l=17, d=14, n=4),
}
ISSUE_SIZE = dict(b=1, l=1024, d=64, n=16)  # issue 21's row: T=1024, D=64, N=16
STATIC = {"minimal_static_ts"}  # exported without dynamic axes (its sizes are baked in)
HEADDIM = 4  # Mamba-2's P at the committed size; ISSUE_SIZE's d=64 is 16 heads of 4


# ---------------------------------------------------------------- the selective scans, as written
def _a_log(d: int, n: int):
    """S4D-real's initialization, as every Mamba codebase writes it: A = -exp(A_log), A_log = log(1..N)."""
    import torch

    return torch.log(torch.arange(1, n + 1, dtype=torch.float32)).repeat(d, 1)


def _modules():
    """name -> module class (constructed as ``cls(d, n)``); forward takes the feeds of :func:`_feeds`."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    class MinimalSkip(nn.Module):
        """mamba-minimal's selective_scan: A and D are the block's parameters."""

        def __init__(self, d: int, n: int):
            super().__init__()
            self.A_log, self.D = nn.Parameter(_a_log(d, n)), nn.Parameter(torch.randn(d))

        def forward(self, u, delta, B, C):
            A = -torch.exp(self.A_log.float())
            deltaA = torch.exp(torch.einsum("bld,dn->bldn", delta, A))
            deltaB_u = torch.einsum("bld,bln,bld->bldn", delta, B, u)
            x = torch.zeros(u.size(0), u.size(2), B.size(2))
            return self.scan(deltaA, deltaB_u, C, x) + u * self.D

    class MinimalSkipLoop(MinimalSkip):
        def scan(self, deltaA, deltaB_u, C, x):
            ys = []
            for i in range(deltaA.size(1)):
                x = deltaA[:, i] * x + deltaB_u[:, i]
                ys.append(torch.einsum("bdn,bn->bd", x, C[:, i, :]))
            return torch.stack(ys, dim=1)

    class MinimalSkipHop(MinimalSkip):
        def scan(self, deltaA, deltaB_u, C, x):
            from torch._higher_order_ops import scan

            def step(x, xs):
                dA, dBu, c = xs
                x = dA * x + dBu
                return x, torch.einsum("bdn,bn->bd", x, c)
            _, y = scan(step, x, (deltaA, deltaB_u, C), dim=1)
            return y

    class HFMixer(nn.Module):
        """transformers' MambaMixer.slow_forward from discrete_time_step on: hidden and dt [B, D, L]."""

        def __init__(self, d: int, n: int):
            super().__init__()
            self.A_log, self.D = nn.Parameter(_a_log(d, n)), nn.Parameter(torch.ones(d))

        def forward(self, hidden_states, discrete_time_step, B, C):
            A = -torch.exp(self.A_log.float())
            discrete_A = torch.exp(A[None, :, None, :] * discrete_time_step[:, :, :, None])
            discrete_B = discrete_time_step[:, :, :, None] * B[:, None, :, :].float()
            deltaB_u = discrete_B * hidden_states[:, :, :, None].float()
            ssm_state = torch.zeros(hidden_states.size(0), hidden_states.size(1), B.size(2))
            scan_output = self.scan(discrete_A, deltaB_u, C, ssm_state)
            return scan_output + (hidden_states * self.D[None, :, None])

    class HFMixerLoop(HFMixer):
        def scan(self, discrete_A, deltaB_u, C, ssm_state):
            scan_outputs = []
            for i in range(discrete_A.size(2)):
                ssm_state = discrete_A[:, :, i, :] * ssm_state + deltaB_u[:, :, i, :]
                scan_output = torch.matmul(ssm_state, C[:, i, :].unsqueeze(-1))
                scan_outputs.append(scan_output[:, :, 0])
            return torch.stack(scan_outputs, dim=-1)

    class HFMixerHop(HFMixer):
        def scan(self, discrete_A, deltaB_u, C, ssm_state):
            from torch._higher_order_ops import scan

            def step(state, xs):
                dA, dBu, c = xs
                state = dA * state + dBu
                return state, torch.matmul(state, c.unsqueeze(-1))[:, :, 0]
            _, y = scan(step, ssm_state, (discrete_A, deltaB_u, C.transpose(1, 2)), dim=2)
            return y

    class MambaPySeq(nn.Module):
        """alxndrTL/mamba.py's MambaBlock.selective_scan_seq."""

        def __init__(self, d: int, n: int):
            super().__init__()
            self.A_log, self.D = nn.Parameter(_a_log(d, n)), nn.Parameter(torch.ones(d))
            self.d_inner, self.d_state = d, n

        def forward(self, x, delta, B, C):
            A = -torch.exp(self.A_log)
            deltaA = torch.exp(delta.unsqueeze(-1) * A)
            deltaB = delta.unsqueeze(-1) * B.unsqueeze(2)
            BX = deltaB * (x.unsqueeze(-1))
            h = torch.zeros(x.size(0), self.d_inner, self.d_state)
            hs = self.scan(deltaA, BX, h)
            y = (hs @ C.unsqueeze(-1)).squeeze(3)
            return y + self.D * x

    class MambaPySeqLoop(MambaPySeq):
        def scan(self, deltaA, BX, h):
            hs = []
            for t in range(0, deltaA.size(1)):
                h = deltaA[:, t] * h + BX[:, t]
                hs.append(h)
            return torch.stack(hs, dim=1)

    class MambaPySeqHop(MambaPySeq):
        def scan(self, deltaA, BX, h):
            from torch._higher_order_ops import scan

            def step(h, xs):
                dA, bx = xs
                h = dA * h + bx
                return h, h.clone()
            _, hs = scan(step, h, (deltaA, BX), dim=1)
            return hs

    class Mamba2Heads(nn.Module):
        """Mamba-2's recurrent (ssd_minimal-free) reference: a scalar decay per head."""

        def __init__(self, d: int, n: int):
            super().__init__()
            heads = d // HEADDIM
            self.A_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, heads)))
            self.D = nn.Parameter(torch.ones(heads))
            self.heads, self.d_state = heads, n

        def forward(self, x, dt, B, C):
            from torch._higher_order_ops import scan

            A = -torch.exp(self.A_log)
            dA = torch.exp(dt * A)  # [B, L, H]
            state = torch.zeros(x.size(0), self.heads, x.size(3), self.d_state)

            def step(state, xs):
                da, dt_t, x_t, b_t, c_t = xs
                state = state * da[:, :, None, None] + (dt_t[:, :, None] * x_t)[..., None] * b_t[:, None, None, :]
                return state, torch.einsum("bhpn,bn->bhp", state, c_t)
            _, y = scan(step, state, (dA, dt, x, B, C), dim=1)
            return y + self.D[:, None] * x

    class S4DZoh(nn.Module):
        """S4D-real (Gu et al. 2022) with zero-order hold: the decay is a parameter, the input per step."""

        def __init__(self, d: int, n: int):
            super().__init__()
            self.log_dt = nn.Parameter(torch.linspace(np.log(1e-3), np.log(1e-1), d))
            self.A_log = nn.Parameter(_a_log(d, n))
            self.B, self.C = nn.Parameter(torch.ones(d, n)), nn.Parameter(torch.randn(d, n) * 0.5)
            self.D = nn.Parameter(torch.randn(d))

        def forward(self, u, h0):
            from torch._higher_order_ops import scan

            A = -torch.exp(self.A_log)
            dtA = torch.exp(self.log_dt)[:, None] * A
            dA = torch.exp(dtA)
            dB = (dA - 1.0) / A * self.B
            C = self.C

            def step(h, u_t):
                h = dA * h + dB * u_t[..., None]
                return h, (h * C).sum(-1)
            h_n, y = scan(step, h0, u)
            return y + self.D * u, h_n

    class BlockMinimal(nn.Module):
        """mamba-minimal's MambaBlock.forward / ssm / selective_scan, d_inner = d (d_model = d / 2)."""

        def __init__(self, d: int, n: int):
            super().__init__()
            d_model, dt_rank, d_conv = d // 2, max(1, d // 32), 4
            self.in_proj = nn.Linear(d_model, 2 * d, bias=False)
            self.conv1d = nn.Conv1d(d, d, kernel_size=d_conv, groups=d, padding=d_conv - 1, bias=True)
            self.x_proj = nn.Linear(d, dt_rank + 2 * n, bias=False)
            self.dt_proj = nn.Linear(dt_rank, d, bias=True)
            self.A_log, self.D = nn.Parameter(_a_log(d, n)), nn.Parameter(torch.ones(d))
            self.out_proj = nn.Linear(d, d_model, bias=False)
            self.d_inner, self.d_state, self.dt_rank = d, n, dt_rank

        def forward(self, x):
            l = x.size(1)
            x_and_res = self.in_proj(x)
            x, res = x_and_res.split([self.d_inner, self.d_inner], dim=-1)
            x = self.conv1d(x.transpose(1, 2))[:, :, :l].transpose(1, 2)
            x = F.silu(x)
            y = self.ssm(x)
            y = y * F.silu(res)
            return self.out_proj(y)

        def ssm(self, x):
            A = -torch.exp(self.A_log.float())
            x_dbl = self.x_proj(x)
            delta, B, C = x_dbl.split([self.dt_rank, self.d_state, self.d_state], dim=-1)
            delta = F.softplus(self.dt_proj(delta))
            deltaA = torch.exp(torch.einsum("bld,dn->bldn", delta, A))
            deltaB_u = torch.einsum("bld,bln,bld->bldn", delta, B, x)
            h = torch.zeros(x.size(0), self.d_inner, self.d_state)
            ys = []
            for i in range(x.size(1)):
                h = deltaA[:, i] * h + deltaB_u[:, i]
                ys.append(torch.einsum("bdn,bn->bd", h, C[:, i, :]))
            y = torch.stack(ys, dim=1)
            return y + x * self.D

    class SsmRef(nn.Module):
        """mamba_ssm's selective_scan_ref with variable B and C, D, z, delta_bias, delta_softplus=True
        and return_last_state=True."""

        def __init__(self, d: int, n: int):
            super().__init__()
            self.A_log, self.D = nn.Parameter(_a_log(d, n)), nn.Parameter(torch.ones(d))
            self.delta_bias = nn.Parameter(torch.linspace(-4.0, -2.0, d))

        def forward(self, u, delta, B, C, z):
            A = -torch.exp(self.A_log.float())
            delta = F.softplus(delta.float() + self.delta_bias[..., None].float())
            deltaA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
            deltaB_u = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
            x = A.new_zeros((u.size(0), A.size(0), A.size(1)))
            y, last_state = self.scan(deltaA, deltaB_u, C, x)
            out = y + u * self.D[:, None]
            return out * F.silu(z), last_state

    class SsmRefLoop(SsmRef):
        def scan(self, deltaA, deltaB_u, C, x):
            ys = []
            for i in range(deltaA.size(2)):
                x = deltaA[:, :, i] * x + deltaB_u[:, :, i]
                ys.append(torch.einsum("bdn,bn->bd", x, C[:, :, i]))
            return torch.stack(ys, dim=2), x

    class SsmRefHop(SsmRef):
        def scan(self, deltaA, deltaB_u, C, x):
            from torch._higher_order_ops import scan

            def step(x, xs):
                dA, dBu, c = xs
                x = dA * x + dBu
                return x, torch.einsum("bdn,bn->bd", x, c)
            last_state, y = scan(step, x, (deltaA, deltaB_u, C), dim=2)
            return y, last_state

    class SsmRefHalf(nn.Module):
        """selective_scan_ref's dtype handling: float16 in, the scan in float32, out.to(dtype_in)."""

        def __init__(self, d: int, n: int):
            super().__init__()
            self.ssm = SsmRefLoop(d, n)

        def forward(self, u, delta, B, C, z):
            out, last_state = self.ssm(u.float(), delta.float(), B.float(), C.float(), z.float())
            return out.to(dtype=u.dtype), last_state

    return dict(ssm_ref_ts=SsmRefLoop, ssm_ref_fp16_ts=SsmRefHalf, ssm_ref_dyn=SsmRefHop, minimal_skip_b2_dyn=MinimalSkipHop, minimal_skip_b2_ts=MinimalSkipLoop,
                minimal_static_ts=MinimalSkipLoop, hf_mixer_dyn=HFMixerHop, hf_mixer_ts=HFMixerLoop,
                mambapy_seq_dyn=MambaPySeqHop, mambapy_seq_ts=MambaPySeqLoop, mamba2_heads_dyn=Mamba2Heads,
                s4d_zoh_dyn=S4DZoh, block_minimal_ts=BlockMinimal)


def _feeds(name: str, b: int, l: int, d: int, n: int):
    """(feeds name -> tensor in forward's order, dynamic axes name -> {axis: dim name}, outputs)."""
    import torch
    from torch.nn import functional as F

    g = torch.Generator().manual_seed(NAMES.index(name))
    randn = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    dt = lambda *shape: F.softplus(randn(*shape) - 3.0)  # Mamba's dt range: about 1e-3 .. 0.1 after softplus  # noqa: E731
    # a symbolic batch fails these three dynamo exports ('SymInt' object has no attribute 'unsqueeze');
    # torch.export.Dim needs a size >= 2, so a dynamo export at B=1 has a static batch
    static_batch = name in ("minimal_skip_b2_dyn", "hf_mixer_dyn", "ssm_ref_dyn") or (b < 2 and name.endswith("_dyn"))
    batch = {} if static_batch else {0: "batch"}
    if name.startswith("hf_mixer"):  # [B, D, L] channels first, B and C [B, L, N]
        feeds = {"hidden_states": randn(b, d, l), "discrete_time_step": dt(b, d, l), "B": randn(b, l, n),
                 "C": randn(b, l, n)}
        axes = {"hidden_states": {**batch, 2: "seq"}, "discrete_time_step": {**batch, 2: "seq"},
                "B": {**batch, 1: "seq"}, "C": {**batch, 1: "seq"}}
        return feeds, axes, ["y"]
    if name.startswith("ssm_ref"):  # channels first [B, D, L]; delta before its bias and softplus
        feeds = {"u": randn(b, d, l), "delta": randn(b, d, l), "B": randn(b, n, l), "C": randn(b, n, l),
                 "z": randn(b, d, l)}
        if "fp16" in name:
            feeds = {k: v.half() for k, v in feeds.items()}
        return feeds, {k: {**batch, 2: "seq"} for k in feeds}, ["y", "last_state"]
    if name == "mamba2_heads_dyn":
        heads = d // HEADDIM
        feeds = {"x": randn(b, l, heads, HEADDIM), "dt": dt(b, l, heads) * 4, "B": randn(b, l, n), "C": randn(b, l, n)}
        return feeds, {k: {1: "seq"} for k in feeds}, ["y"]
    if name == "s4d_zoh_dyn":  # time-major, as S4's recurrent view steps
        feeds = {"u": randn(l, b, d), "h0": torch.zeros(b, d, n)}
        return feeds, {"u": {0: "seq", **{1: v for v in batch.values()}}, "h0": batch}, ["y", "h_n"]
    if name == "block_minimal_ts":
        return {"x": randn(b, l, d // 2)}, {"x": {0: "batch", 1: "seq"}}, ["y"]
    names = ("x", "delta") if name.startswith("mambapy") else ("u", "delta")
    feeds = {names[0]: randn(b, l, d), names[1]: dt(b, l, d), "B": randn(b, l, n), "C": randn(b, l, n)}
    axes = {} if name in STATIC else {k: {**batch, 1: "seq"} for k in feeds}
    return feeds, axes, ["y"]


def export(name: str, directory: str, size: dict | None = None) -> str:
    """Export ``name`` at ``size`` (its committed SIZES by default) to ``directory``/<name>.onnx
    plus <name>.expected.npz; returns the .onnx path."""
    size = size or SIZES[name]
    path = os.path.join(directory, f"{name}.onnx")
    if name in ONNXSCRIPT:
        _write_onnxscript(name, path, size)
        return path
    import torch

    feeds, axes, outputs = _feeds(name, **size)
    torch.manual_seed(1)
    module = _modules()[name](size["d"], size["n"]).eval()
    module.__module__ = "scanopt_samples"
    export_torch_sample(module, feeds, outputs, path, scripted=name.endswith("_ts"), axes=axes)
    return path


def build(name: str, size: dict) -> tuple[onnx.ModelProto, dict]:
    """``name`` exported at ``size`` in a temporary folder: (model, its stored inputs and outputs)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = export(name, tmp, size)
        stored = np.load(path[: -len(".onnx")] + ".expected.npz")
        return onnx.load(path), {k: stored[k] for k in stored.files}


def _write_onnxscript(name: str, path: str, size: dict) -> None:
    import onnxruntime as ort
    from heldout_mamba_onnxscript import MODELS

    model = MODELS[name].to_model_proto()
    model.ir_version = IR_VERSION  # no check_model: onnxscript leaves the body's outputs untyped, as written
    b, l, d, n = size["b"], size["l"], size["d"], size["n"]
    rng = np.random.default_rng(NAMES.index(name))
    feeds = {"u": rng.standard_normal((b, l, d)).astype(np.float32),
             "delta": np.log1p(np.exp(rng.standard_normal((b, l, d)) - 3.0)).astype(np.float32),
             "A_log": np.tile(np.log(np.arange(1, n + 1, dtype=np.float32)), (d, 1)),
             "B": rng.standard_normal((b, l, n)).astype(np.float32),
             "C": rng.standard_normal((b, l, n)).astype(np.float32),
             "h0": np.zeros((b, d, n), np.float32)}
    # onnxscript has no eager Scan: onnxruntime is the source's runtime
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    onnx.save(model, path)
    save_npz(path[: -len(".onnx")] + ".expected.npz",
             {**feeds, **{o.name: v for o, v in zip(model.graph.output, got)}})


def write(name: str) -> None:
    export(name, OUT)


if __name__ == "__main__":
    run_generator(__file__, __doc__, NAMES, write, OUT)
