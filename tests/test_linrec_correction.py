"""linrec's two-pass form reading the outputs in the chunk pass plus a decay correction
(passes/loopfree/decay_correction.py): which outputs qualify (linear in the state, a state-free
addend dropped from the correction), which decays give each chunk's Π a in closed form, and the
fallback (chunk ends, then the outputs read per position) for the rest. Each rewrite runs
against the loop on onnxruntime and the reference executor.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper as h

import builders as b
import linrec_builders as lb
from equivalence import assert_equivalent
from scanopt.engines import run
from test_linrec import linrec

CORRECTED = "the outputs read in the chunk pass plus a decay correction"
FALLBACK = "chunk ends, then the outputs read per position"


def selective(read: str, decay: str = "exp", T: int = 21, B: int = 2, D: int = 4, N: int = 3):
    """Mamba's selective scan (lb.mamba) with the output written ``read`` and the decay
    ``decay``: "exp" a = Exp(Δ ⊗ A), "exp(-Δ·A)" Exp(Neg(Δ ⊗ Exp(A_log))) as torch authors write
    it, "A·Δ" the Mul's operands swapped, "sigmoid" a = Sigmoid(Δ ⊗ A) (no closed-form product)."""
    a_log = np.log(np.arange(1, N + 1, dtype=np.float32))[None, :].repeat(D, 0)
    nodes = [h.make_node("Exp", ["A_log"], ["A_pos"]), h.make_node("Neg", ["A_pos"], ["A"]),
             h.make_node("Softplus", ["dl"], ["delta"]), h.make_node("Unsqueeze", ["delta", "ax_last"], ["delta3"])]
    if decay == "exp(-Δ·A)":
        nodes += [h.make_node("Mul", ["delta3", "A_pos"], ["dA_pos"]), h.make_node("Neg", ["dA_pos"], ["dA"])]
    else:
        nodes.append(h.make_node("Mul", ["A", "delta3"] if decay == "A·Δ" else ["delta3", "A"], ["dA"]))
    nodes += [h.make_node("Sigmoid" if decay == "sigmoid" else "Exp", ["dA"], ["a"]),
             h.make_node("Mul", ["delta", "x"], ["dx"]), h.make_node("Unsqueeze", ["dx", "ax_last"], ["dx3"]),
             h.make_node("Unsqueeze", ["bt", "ax_mid"], ["bt3"]), h.make_node("Mul", ["dx3", "bt3"], ["bx"]),
             h.make_node("Mul", ["a", "h"], ["ah"]), h.make_node("Add", ["ah", "bx"], ["h_new"]),
             h.make_node("Unsqueeze", ["ct", "ax_mid"], ["ct3"]), h.make_node("Mul", ["h_new", "ct3"], ["hc"])]
    if read == "einsum":  # mamba-minimal's read
        nodes.append(h.make_node("Einsum", ["h_new", "ct"], ["read"], equation="bdn,bn->bd"))
    elif read == "keepdims, squeezed":
        nodes += [h.make_node("ReduceSum", ["hc", "ax_last"], ["read1"], keepdims=1),
                  h.make_node("Squeeze", ["read1", "ax_last"], ["read"])]
    else:
        nodes.append(h.make_node("ReduceSum", ["hc", "ax_last"], ["read"], keepdims=0))
    inits = [b.init("A_log", a_log), b.init("ax_last", np.array([-1], np.int64)),
             b.init("ax_mid", np.array([1], np.int64)), b.init("skip", np.linspace(0.5, 1.5, D).astype(np.float32))]
    if read in ("y", "einsum", "keepdims, squeezed"):
        nodes.append(h.make_node("Identity", ["read"], ["y"]))
    elif read == "y + D*x":  # Mamba's skip connection: a state-free addend
        nodes += [h.make_node("Mul", ["x", "skip"], ["dskip"]), h.make_node("Add", ["read", "dskip"], ["y"])]
    elif read == "D*x - y":  # the state-dependent operand second: the correction negates it
        nodes += [h.make_node("Mul", ["x", "skip"], ["dskip"]), h.make_node("Sub", ["dskip", "read"], ["y"])]
    elif read == "tanh(y)":  # not linear in the state
        nodes.append(h.make_node("Tanh", ["read"], ["y"]))
    elif read == "y + wide":  # the addend is wider than the state's part: dropping it would change the shape
        nodes += [h.make_node("Unsqueeze", ["read", "ax_last"], ["read3"]), h.make_node("Add", ["read3", "bx"], ["y"])]
    y_shape = [B, D, N] if read == "y + wide" else [B, D]
    body_in = [b.vi("h", [B, D, N]), b.vi("x", [B, D]), b.vi("dl", [B, D]), b.vi("bt", [B, N]), b.vi("ct", [B, N])]
    outer_in = [b.vi("h0", [B, D, N]), b.vi("X", [T, B, D]), b.vi("DL", [T, B, D]), b.vi("BT", [T, B, N]),
                b.vi("CT", [T, B, N])]
    return lb._scan_model(nodes, body_in, [b.vi("h_new", [B, D, N]), b.vi("y", y_shape)], outer_in,
                          [b.vi("hT", [B, D, N]), b.vi("Y", [T] + y_shape)], inits, num_scan_inputs=4,
                          scan_inputs=["h0", "X", "DL", "BT", "CT"])


def two_pass_detail(model, **options) -> str:
    out, outcomes = linrec(model, linrec_min_steps=1, linrec_form="two-pass", linrec_chunk=8, tune=False, **options)
    assert len(outcomes) == 1 and outcomes[0][0], outcomes
    assert_equivalent(model, out)
    return outcomes[0][1]


@pytest.mark.parametrize("read", ["y", "y + D*x", "D*x - y", "y + wide"])
@pytest.mark.parametrize("decay", ["exp", "sigmoid"])
def test_outputs_linear_in_the_state_take_the_correction(read, decay):
    """21 steps in chunks of 8 (the last padded): the outputs read in the chunk pass plus the
    correction; the skip connection's D⊙x counted once (it does not read the state); an addend
    wider than the read ([B, D, N] against [B, D, 1]) leaves the correction expanded to it."""
    assert CORRECTED in two_pass_detail(selective(read, decay))


@pytest.mark.parametrize("decay", ["exp(-Δ·A)", "A·Δ"])
@pytest.mark.parametrize("read", ["einsum", "keepdims, squeezed"])
@pytest.mark.parametrize("T", [24, "T"])
def test_other_ways_of_writing_it_take_the_closed_form_decay(decay, read, T):
    """torch's exp(-Δ·A), the Mul's operands swapped, y read by an Einsum or a keepdims
    ReduceSum then Squeeze, at a static and a symbolic length: the correction form, each
    chunk's decay from Σ Δ (no running product: every Loop carries one state), equal to the loop."""
    import onnx

    m = selective(read, decay, T=T, B=3)
    out, outcomes = linrec(m, linrec_form="two-pass", linrec_chunk=8, tune=False, target="portable")
    assert CORRECTED in outcomes[0][1], outcomes
    loops = [n for n in out.graph.node if n.op_type == "Loop"]
    assert loops and all(len(n.input) == 3 for n in loops), [list(n.input) for n in loops]  # M, cond, one state
    rng = np.random.default_rng(5)
    steps = 21 if T == "T" else T
    dims = {"h0": [3, 4, 3], "X": [steps, 3, 4], "DL": [steps, 3, 4], "BT": [steps, 3, 3], "CT": [steps, 3, 3]}
    assert_equivalent(m, out, inputs=[{k: rng.standard_normal(v).astype(np.float32) for k, v in dims.items()}])
    onnx.checker.check_model(out)


def test_an_output_not_linear_in_the_state_is_read_in_a_second_pass():
    """A Tanh of the read: the chunk ends first, then a second pass from the starts reads it."""
    assert FALLBACK in two_pass_detail(selective("tanh(y)"))


@pytest.mark.parametrize("T", [8, 9, 64])
def test_one_chunk_or_a_short_tail(T):
    """One chunk (no correction needed: the second pass from h0), one step past it, many."""
    detail = two_pass_detail(selective("y + D*x", T=T, B=1))
    assert (CORRECTED if T > 8 else FALLBACK) in detail


def test_mamba_einsum_takes_the_closed_form_decay():
    """Einsum("bd,dn->bdn", Δ, A) is linear in Δ: each chunk's Π a is Exp of the Einsum of ΣΔ."""
    m = lb.mamba_einsum(T=40, B=2, D=4, N=3)
    assert CORRECTED in two_pass_detail(m)


def test_long_sequence_with_the_correction_stays_within_tolerance():
    """T = 4096 in chunks of 64: the correction's products (a ⊙ G from the chunk start) are the
    loop's own in another association; within 1e-5 of the loop in float32."""
    m = selective("y + D*x", T=4096, B=1, D=8, N=4)
    out, outcomes = linrec(m, linrec_form="two-pass", linrec_chunk=64, tune=False)
    assert CORRECTED in outcomes[0][1]
    rng = np.random.default_rng(7)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in m.graph.input}
    want, got = run(m, feeds), run(out, feeds)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("read", ["y + D*x", "tanh(y)"])
@pytest.mark.parametrize("decay", ["exp", "sigmoid"])
def test_a_symbolic_length_pads_and_counts_chunks_at_run_time(read, decay):
    """T a name: the chunk count and the padding are computed at run time (a carry Loop across
    the chunks in both forms, the final state read at the last real step); equal to the loop
    at lengths below, at, one past and several times the chunk, with and without padding; zero
    steps give h0."""
    m = selective(read, decay, T="T")
    out, outcomes = linrec(m, linrec_form="two-pass", linrec_chunk=8, tune=False, target="portable")
    assert outcomes[0][0] and "symbolic length" in outcomes[0][1], outcomes
    assert (CORRECTED if read != "tanh(y)" else FALLBACK) in outcomes[0][1]
    rng = np.random.default_rng(3)
    feeds = []
    empty = {k: np.zeros([0] + d, np.float32) for k, d in (("X", [2, 4]), ("DL", [2, 4]), ("BT", [2, 3]), ("CT", [2, 3]))}
    empty["h0"] = rng.standard_normal([2, 4, 3]).astype(np.float32)
    got = run(out, empty)  # onnxruntime cannot run the zero-length Scan itself: the loop's meaning
    np.testing.assert_array_equal(got["hT"], empty["h0"])
    assert got["Y"].shape[0] == 0
    for steps in (1, 5, 8, 9, 16, 37):
        dims = {"h0": [2, 4, 3], "X": [steps, 2, 4], "DL": [steps, 2, 4], "BT": [steps, 2, 3], "CT": [steps, 2, 3]}
        feeds.append({k: rng.standard_normal(v).astype(np.float32) for k, v in dims.items()})
    assert_equivalent(m, out, inputs=feeds)


def test_a_symbolic_length_at_mambas_width_takes_the_two_pass_form_where_it_is_not_slower():
    """The PyTorch export at Mamba's width with its length made a name: over linrec_max_state
    linrec picks the two-pass form (it needed a static length before), equal to torch; applied
    under --target portable, measured where the length is declared, not applied unmeasured by
    default (at 16 steps it measured 0.58x the loop)."""
    import onnx

    from test_linrec import LINREC, assert_matches_torch

    m = onnx.load(LINREC / "torch_mamba_wide.onnx")
    for value in (m.graph.input[0], m.graph.output[0]):
        value.type.tensor_type.shape.dim[0].dim_param = "T"
    out, outcomes = linrec(m, tune=False, target="portable")
    assert outcomes[0][0] and "two-pass, symbolic length" in outcomes[0][1], outcomes
    assert_matches_torch(m, out, dict(np.load(LINREC / "torch_mamba_wide.expected.npz")))
    _, outcomes = linrec(m)
    assert not outcomes[0][0] and "the length is symbolic and unmeasured" in outcomes[0][1], outcomes
    import scanopt

    def declared(steps):  # tuning is off in the suite: the declared length decides
        _, report = scanopt.optimize(m, passes=["linrec"], verify=False,
                                     input_shapes={"x": [steps, 1, 64], "h0": [1, 64, 16]})
        return [o for o in report.outcomes if o.pass_name == "linrec"][0]

    assert declared(256).applied
    assert not declared(16).applied and "declared 16 steps" in declared(16).detail
