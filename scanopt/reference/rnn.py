"""Full-spec reference kernels for ONNX ``RNN``, ``GRU`` and ``LSTM`` (versions 7, 14, 22).

onnx.reference's own kernels ignore ``sequence_lens``, ``activations`` (with ``activation_alpha`` /
``activation_beta``), ``clip`` and ``input_forget``, and its bidirectional RNN applies the forward
activation to both directions, so scanopt cannot use them to verify a Scan fused into one of these
ops. The classes here are named exactly after the ops so that registering them through
``ReferenceEvaluator(..., new_ops=RECURRENT_OPS)`` replaces onnx.reference's versions.

Semantics follow the operator spec; where the spec is silent they follow onnxruntime 1.31, and
where onnxruntime contradicts the spec they follow the spec. Each such point is marked
``spec silent`` or ``ORT differs`` below.

Sequence semantics (spec, and what onnxruntime does):
- item b runs ``sequence_lens[b]`` steps (all ``seq_length`` when absent); ``reverse`` reads
  positions ``len[b]-1, ..., 0`` and writes Y aligned with input time;
- Y is zero at positions ``>= len[b]``; Y_h / Y_c hold the state after the item's last valid step;
- spec silent: an item with length 0 ends with Y_h = Y_c = 0, not the initial state, as
  onnxruntime 1.31 returns for all three ops. A zero-length sequence (seq_length 0) is treated the
  same; there onnxruntime's RNN returns zeros, its GRU aborts the process and its LSTM leaves Y_c
  uninitialized (as it also does when every item has length 0).
"""

from __future__ import annotations

import numpy as np
from onnx.reference.op_run import OpRun


def _sigmoid(x):
    # exp(-log(1 + e^-x)): no overflow for large |x|, unlike 1 / (1 + e^-x).
    return np.exp(-np.logaddexp(0, -x))


# Lower-case name -> (f(x, alpha, beta), default alpha, default beta). A default of None means the
# function takes no such parameter and so consumes no value of activation_alpha / activation_beta.
# Defaults are "the same as of corresponding ONNX operators" (spec).
_ACTIVATIONS = {
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: _sigmoid(x), None, None),
    # ORT differs: it defaults Affine to alpha=0, beta=0; the ONNX Affine op defaults to 1 and 0.
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    # ORT differs: it uses x > alpha and defaults alpha to 0; the spec says x >= alpha and the
    # ONNX ThresholdedRelu op defaults alpha to 1. (x == alpha is common when clip == alpha.)
    "thresholdedrelu": (lambda x, a, b: np.where(x >= a, x, 0), 1.0, None),
    # spec silent: the ONNX ScaledTanh op had no defaults; ORT uses alpha=0, beta=0.
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 0.0, 0.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * np.expm1(np.minimum(x, 0))), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    # log(1 + e^x) without overflow (ORT evaluates the formula literally: inf for x > ~88).
    "softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}


def _resolve_activations(names, alphas, betas, count):
    """Bind the first ``count`` activation names to their alpha/beta.

    "The values are consumed in the order of activation functions" (spec): walking the list, each
    function that takes an alpha (beta) takes the next unused value, or its default when none is
    left. onnxruntime 1.31 does the same for all three ops. Names match case-insensitively.
    """
    if len(names) < count:
        raise ValueError(f"expected {count} activations, got {list(names)}")
    alphas, betas = list(alphas or ()), list(betas or ())
    bound = []
    for name in names[:count]:
        try:
            fn, alpha, beta = _ACTIVATIONS[name.lower()]
        except KeyError:
            raise ValueError(f"unknown activation {name!r}") from None
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        bound.append(lambda x, fn=fn, a=alpha, b=beta: fn(x, a, b))
    return bound


def _run_direction(cell, X, lens, reverse, states):
    """Run ``cell`` over X [T, B, I] for every batch item at once.

    Item b is at position t (forward) or len[b]-1-t (reverse) at step t and is frozen once
    t >= len[b]. Returns Y [T, B, H] (zero past each length) and the final states.
    """
    T, B = X.shape[:2]
    Y = np.zeros((T, B, states[0].shape[-1]), dtype=X.dtype)
    items = np.arange(B)
    for t in range(T):
        valid = t < lens
        pos = np.where(valid, lens - 1 - t, 0) if reverse else np.full(B, t)
        new = cell(X[pos, items], *states)
        states = tuple(np.where(valid[:, None], n, s) for n, s in zip(new, states))
        Y[pos[valid], items[valid]] = states[0][valid]
    # spec silent: length-0 items end with zero states (onnxruntime 1.31), see module docstring.
    states = tuple(np.where((lens > 0)[:, None], s, 0) for s in states)
    return Y, states


class _Recurrent(OpRun):
    """Shared driver: layouts, directions, optional inputs/outputs, sequence_lens.

    Subclasses set ``n_gates``, ``activations_per_direction``, ``default_activations`` and
    ``n_states``, and implement ``_cell`` for one direction.
    """

    n_gates: int
    activations_per_direction: int
    default_activations: tuple[str, ...]
    n_states = 1

    def _cell(self, W, R, B, P, acts, clip, attrs):
        """Return ``cell(x [B, I], *states [B, H]) -> new states`` for one direction."""
        raise NotImplementedError

    def _run(self, X, W, R, B=None, sequence_lens=None, initial_h=None, initial_c=None, P=None,
             **attrs):
        layout = attrs.get("layout") or 0
        direction = attrs.get("direction") or "forward"
        num_dir = {"forward": 1, "reverse": 1, "bidirectional": 2}[direction]
        if W.shape[0] != num_dir:
            raise ValueError(f"direction={direction!r} needs {num_dir} direction(s) in W {W.shape}")
        dtype = X.dtype
        # float16/bfloat16 are computed in float32 and rounded once at the end.
        work = np.float32 if dtype.itemsize < 4 else dtype
        if layout == 1:  # X [B, T, I], initial states [B, D, H]
            X = np.swapaxes(X, 0, 1)
            initial_h = None if initial_h is None else np.swapaxes(initial_h, 0, 1)
            initial_c = None if initial_c is None else np.swapaxes(initial_c, 0, 1)
        X, W, R = (a.astype(work) for a in (X, W, R))
        T, batch = X.shape[:2]
        H = R.shape[-1]
        B = np.zeros((num_dir, 2 * self.n_gates * H), work) if B is None else B.astype(work)
        P = np.zeros((num_dir, 3 * H), work) if P is None else P.astype(work)
        init = [initial_h, initial_c][: self.n_states]
        init = [np.zeros((num_dir, batch, H), work) if s is None else s.astype(work) for s in init]
        lens = np.full(batch, T) if sequence_lens is None else np.asarray(sequence_lens, np.int64)
        if lens.shape != (batch,) or np.any((lens < 0) | (lens > T)):
            raise ValueError(f"sequence_lens must be [{batch}] values in [0, {T}], got {lens}")

        names = attrs.get("activations") or self.default_activations * num_dir
        acts = _resolve_activations(names, attrs.get("activation_alpha"),
                                    attrs.get("activation_beta"),
                                    self.activations_per_direction * num_dir)
        clip = attrs.get("clip")
        k = self.activations_per_direction
        ys, finals = [], []
        for d in range(num_dir):
            cell = self._cell(W[d], R[d], B[d], P[d], acts[d * k:(d + 1) * k], clip, attrs)
            reverse = direction == "reverse" or d == 1
            y, states = _run_direction(cell, X, lens, reverse, tuple(s[d] for s in init))
            ys.append(y)
            finals.append(states)
        Y = np.stack(ys, axis=1)  # [T, D, B, H]
        states = [np.stack([f[i] for f in finals]) for i in range(self.n_states)]  # [D, B, H]
        if layout == 1:
            Y = Y.transpose(2, 0, 1, 3)
            states = [s.transpose(1, 0, 2) for s in states]
        outputs = (Y, *states)
        return tuple(o.astype(dtype) for o in outputs[: len(self.onnx_node.output)])


def _clipper(clip):
    """Spec: clip bounds the input of every activation to [-clip, clip]; absent means no clip."""
    if clip is None:
        return lambda x: x
    return lambda x: np.clip(x, -clip, clip)


class RNN(_Recurrent):
    """``Ht = f(Xt·Wᵀ + Ht-1·Rᵀ + Wb + Rb)``."""

    n_gates = 1
    activations_per_direction = 1
    # The schema's default is ["Tanh", "Tanh"] even for one direction; only the first
    # num_directions entries are used (as onnxruntime does).
    default_activations = ("Tanh",)

    def _cell(self, W, R, B, P, acts, clip, attrs):
        (f,), c = acts, _clipper(clip)
        Wb, Rb = np.split(B, 2)

        def cell(x, h):
            return (f(c(x @ W.T + h @ R.T + Wb + Rb)),)

        return cell


class GRU(_Recurrent):
    """Gates z, r, h; ``linear_before_reset`` moves Rh (and Rbh) inside the reset product."""

    n_gates = 3
    activations_per_direction = 2
    default_activations = ("Sigmoid", "Tanh")

    def _cell(self, W, R, B, P, acts, clip, attrs):
        (f, g), c = acts, _clipper(clip)
        Wz, Wr, Wh = np.split(W, 3)
        Rz, Rr, Rh = np.split(R, 3)
        Wbz, Wbr, Wbh, Rbz, Rbr, Rbh = np.split(B, 6)
        linear_before_reset = bool(attrs.get("linear_before_reset"))

        def cell(x, h):
            z = f(c(x @ Wz.T + h @ Rz.T + Wbz + Rbz))
            r = f(c(x @ Wr.T + h @ Rr.T + Wbr + Rbr))
            if linear_before_reset:
                ht = g(c(x @ Wh.T + r * (h @ Rh.T + Rbh) + Wbh))
            else:
                ht = g(c(x @ Wh.T + (r * h) @ Rh.T + Rbh + Wbh))
            return ((1 - z) * ht + z * h,)

        return cell


class LSTM(_Recurrent):
    """Gates i, o, f, c; peepholes P = [Pi, Po, Pf]: i and f see Ct-1, o sees the new Ct."""

    n_gates = 4
    activations_per_direction = 3
    default_activations = ("Sigmoid", "Tanh", "Tanh")
    n_states = 2

    def _cell(self, W, R, B, P, acts, clip, attrs):
        (f, g, h_act), c = acts, _clipper(clip)
        Wb, Rb = np.split(B, 2)
        Pi, Po, Pf = np.split(P, 3)
        # input_forget couples the gates as ft = 1 - it (the spec only says "couple"; this is
        # onnxruntime's meaning, which also skips Wf, Rf, Pf and the forget bias).
        input_forget = bool(attrs.get("input_forget"))

        def cell(x, h, c_prev):
            gi, go, gf, gc = np.split(x @ W.T + h @ R.T + Wb + Rb, 4, axis=-1)
            i = f(c(gi + Pi * c_prev))
            forget = 1 - i if input_forget else f(c(gf + Pf * c_prev))
            c_new = forget * c_prev + i * g(c(gc))
            o = f(c(go + Po * c_new))
            return o * h_act(c_new), c_new

        return cell


RECURRENT_OPS = [RNN, GRU, LSTM]
