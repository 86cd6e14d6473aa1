"""Regenerate models/heldout_linattn_onnxscript/: the four LinearAttention recurrences written in
onnxscript at opset 27 (issue 32), three styles each (models/heldout_linattn_onnxscript.py).

    python models/generate_heldout_linattn_onnxscript.py            # all (needs onnxscript, onnxruntime)
    python models/generate_heldout_linattn_onnxscript.py --only delta_es

Names are <rule>_<style>: rule linear, decayed (a per-head scalar decay), delta (DeltaNet),
gated_delta (Gated DeltaNet); style mm (batch-first packed heads, MatMul), es (PyTorch's [B, H, T,
d] with the heads folded into the batch, Einsum), rs (time-major, one Scan per head, Mul and
ReduceSum). B and T are symbolic, H, dk, dv = 2, 8, 6. Each model comes with
<name>.expected.npz: its inputs at B=2, T=11 and onnxruntime's outputs (onnxscript has no eager
Scan), checked here against :func:`reference` (the recurrence in float64 numpy).
"""

from __future__ import annotations

import os

import numpy as np
import onnx

from generate import HERE, run_generator, save_npz

OUT = os.path.join(HERE, "heldout_linattn_onnxscript")
RULES = ["linear", "decayed", "delta", "gated_delta"]
STYLES = ["mm", "es", "rs"]
NAMES = [f"{r}_{s}" for s in STYLES for r in RULES]
H, DK, DV = 2, 8, 6
B, T = 2, 11
IR_VERSION = 13  # opset 27 needs IR 13 (onnxruntime 1.32 reads up to 14)
A_LOG = np.log(np.linspace(1.0, 4.0, H))
DT_BIAS = np.linspace(-1.0, 1.0, H)
GAMMA = 1.0 - 2.0 ** (-5.0 - np.arange(H))


def split(name: str) -> tuple[str, str]:
    rule, style = name.rsplit("_", 1)
    return rule, style


def feeds(name: str, b: int = B, t: int = T, seed: int | None = None) -> dict[str, np.ndarray]:
    """Inputs of ``name`` at batch ``b`` and length ``t`` (seeded by the model's place in NAMES
    unless ``seed``): q, k, v normal, the gate inputs (a, b, f) normal, s0 zeros (``mm``)."""
    rule, style = split(name)
    rng = np.random.default_rng(NAMES.index(name) if seed is None else seed)
    lead = {"mm": (b, t, H), "es": (b, H, t), "rs": (t, b, H)}[style]
    out = {"q": rng.standard_normal(lead + (DK,)), "k": rng.standard_normal(lead + (DK,)),
           "v": rng.standard_normal(lead + (DV,))}
    if rule == "decayed":
        out[{"mm": "a", "es": None, "rs": "f"}[style]] = rng.standard_normal(lead)
        out.pop(None, None)
    if rule in ("delta", "gated_delta"):
        out["b"] = rng.standard_normal(lead)
    if rule == "gated_delta":
        out["a"] = rng.standard_normal(lead)
    if style == "mm":
        out["s0"] = np.zeros((b, H, DK, DV))
    return {k: v.astype(np.float32) for k, v in out.items()}


# where each style keeps the time axis of [B, H, T, ...] ("es": already there)
TIME_AXIS = {"mm": 1, "rs": 0, "es": 2}


def _to_bhtd(x: np.ndarray, style: str) -> np.ndarray:
    """[B, H, T, ...] from the style's layout."""
    return np.moveaxis(x, TIME_AXIS[style], 2)


def _from_bhtd(x: np.ndarray, style: str) -> np.ndarray:
    return np.moveaxis(x, 2, TIME_AXIS[style])


def reference(name: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's outputs {o, state} computed in float64 numpy, step by step."""
    rule, style = split(name)
    x = {k: _to_bhtd(v.astype(np.float64), style) for k, v in inputs.items() if k != "s0"}
    q, k, v = x["q"], x["k"], x["v"]
    b_, h_, t_ = q.shape[:3]
    scale = 1.0
    if rule == "linear":
        elu1 = lambda z: np.where(z > 0, z, np.expm1(np.minimum(z, 0))) + 1.0  # noqa: E731
        q, k = elu1(q), elu1(k)
    else:
        scale = DK ** -0.5
    decay = np.ones((b_, h_, t_))
    if rule == "decayed":
        if style == "mm":
            decay = np.exp(-np.logaddexp(0.0, -x["a"]) / 16.0)
        elif style == "es":
            decay = np.broadcast_to(GAMMA[None, :, None], (b_, h_, t_))
        else:
            decay = 1.0 / (1.0 + np.exp(-(x["f"] + 3.0)))
    beta = None
    if rule in ("delta", "gated_delta"):
        k = k / np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-6 if style == "es" else 0.0)
        beta = 1.0 / (1.0 + np.exp(-x["b"]))
    if rule == "gated_delta":
        decay = np.exp(-np.exp(A_LOG)[None, :, None] * np.logaddexp(0.0, x["a"] + DT_BIAS[None, :, None]))
    S = inputs["s0"].astype(np.float64) if "s0" in inputs else np.zeros((b_, h_, DK, DV))
    o = np.zeros((b_, h_, t_, DV))
    for i in range(t_):
        S = S * decay[:, :, i, None, None]
        if beta is None:
            S = S + k[:, :, i, :, None] * v[:, :, i, None, :]
        else:
            u = (v[:, :, i] - np.einsum("bhk,bhkv->bhv", k[:, :, i], S)) * beta[:, :, i, None]
            S = S + k[:, :, i, :, None] * u[:, :, None, :]
        o[:, :, i] = scale * np.einsum("bhk,bhkv->bhv", q[:, :, i], S)
    return {"o": _from_bhtd(o, style), "state": S}


def build(name: str) -> onnx.ModelProto:
    from heldout_linattn_onnxscript import MODELS

    model = MODELS[name].to_model_proto()
    model.ir_version = IR_VERSION  # no check_model: onnxscript leaves the body's outputs untyped, as written
    model.producer_name = "onnxscript"
    return model


def write(name: str) -> None:
    import onnxruntime as ort

    model = build(name)
    inputs = feeds(name)
    # onnxscript has no eager Scan: onnxruntime is the source's runtime
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    want = reference(name, inputs)
    for o, g in zip(model.graph.output, got):
        w = want[o.name]
        err = float(np.max(np.abs(g - w)) / max(np.max(np.abs(w)), 1e-30))
        assert g.shape == w.shape and err < 1e-5, (name, o.name, g.shape, w.shape, err)
    onnx.save(model, os.path.join(OUT, f"{name}.onnx"))
    save_npz(os.path.join(OUT, f"{name}.expected.npz"), {**inputs, **{o.name: g for o, g in zip(model.graph.output, got)}})


if __name__ == "__main__":
    run_generator(__file__, __doc__, NAMES, write, OUT)
