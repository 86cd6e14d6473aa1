"""The recognized cell in the native op's terms, and the activations the native ops accept."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.passes.fuse.poly import Runtime

ACTIVATION_OPS = {
    "Tanh": (),
    "Sigmoid": (),
    "Relu": (),
    "Softsign": (),
    "Softplus": (),
    "LeakyRelu": (("alpha", 0.01),),
    "Elu": (("alpha", 1.0),),
    "HardSigmoid": (("alpha", 0.2), ("beta", 0.5)),
}
NOT_FUSED = {
    # The spec's two definitions differ at x == alpha (onnxruntime's kernels follow the op's).
    "ThresholdedRelu": ("the ThresholdedRelu op zeroes x == alpha (y = x for x > alpha) while the recurrent ops' "
                        "ThresholdedRelu activation keeps it (x if x >= alpha): not provably the same"),
    "Selu": "Selu is not among the recurrent ops' activations",
    "Gelu": "Gelu is not among the recurrent ops' activations",
}


@dataclass(frozen=True)
class Activation:
    name: str
    params: tuple[tuple[str, float], ...] = ()  # ("alpha", v) / ("beta", v) in op order

    def __str__(self) -> str:
        return self.name + (f"({', '.join(f'{k}={v:g}' for k, v in self.params)})" if self.params else "")


AFFINE = Activation("Affine", (("alpha", 1.0), ("beta", 0.0)))  # no nonlinearity, spelled out


@dataclass(frozen=True)
class Sum:
    """A bias block known only at run time: ``const`` plus run-time vectors."""

    const: np.ndarray
    runtimes: tuple[Runtime, ...]


@dataclass(frozen=True, eq=False)
class Cell:
    """One direction of a native recurrent op, weights in ONNX layout (float64).

    A weight that reads run-time values (an enclosing graph's value, a loop-invariant
    state) is instead a tuple of blocks to concatenate on axis 0: arrays (ONNX layout),
    :class:`Runtime` (x·W orientation: the emitter slices and transposes) and :class:`Sum`.
    """

    kind: str  # "RNN" | "GRU" | "LSTM"
    hidden: int
    input_size: int
    W: np.ndarray | tuple  # [G*H, I]
    R: np.ndarray | tuple  # [G*H, H]
    B: np.ndarray | tuple  # [2*G*H] = [Wb, Rb]
    P: np.ndarray | tuple | None  # [3H] LSTM peepholes (i, o, f)
    activations: tuple[Activation, ...]
    clip: float | None = None
    linear_before_reset: int = 0
    notes: tuple[str, ...] = field(default=())  # forms recognized, for the report
    h: gs.Tensor | None = None  # the body's hidden-state input
    c: gs.Tensor | None = None  # the body's cell-state input (LSTM)
    input_forget: int = 0  # LSTM: f = 1 - i (the forget-gate weights are unused, zeros)

    def attrs(self) -> dict:
        """The native op's attributes for one direction (activations always explicit)."""
        attrs = {"hidden_size": self.hidden, "activations": [a.name for a in self.activations]}
        alphas = [v for a in self.activations for k, v in a.params if k == "alpha"]
        betas = [v for a in self.activations for k, v in a.params if k == "beta"]
        if alphas:
            attrs["activation_alpha"] = alphas
        if betas:
            attrs["activation_beta"] = betas
        if self.clip is not None:
            attrs["clip"] = self.clip
        if self.kind == "GRU":
            attrs["linear_before_reset"] = self.linear_before_reset
        if self.input_forget:
            attrs["input_forget"] = 1
        return attrs
