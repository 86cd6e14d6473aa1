"""Random Scans: the reference executor against onnxruntime and against numpy.

Hypothesis draws a Scan (N states, M scan inputs, K scan outputs, element ranks 0-3 so
scan inputs of rank 1-4, axes including negative ones, directions) and a body program
over Add, Mul, Sub, Tanh, Neg, MatMul (weight captured from the main graph or held by
the body), ReduceSum (keepdims, added back to a full-shape value) and shape-preserving
Transposes; the body also reads an outer-scope value and may pass inputs straight through
to outputs. The same program is emitted as an ONNX body and evaluated by the small numpy
interpreter below, so the reference has two independent witnesses: onnxruntime for
sequence lengths 1..6 (sequence_lens in [1, T] for Scan-8), and a plain numpy reading of
the spec for lengths 0..6 (sequence_lens in [0, T]), which onnxruntime cannot run.

Random cases per run: 150 + 150 (Scan-9+, onnxruntime / numpy) and 100 + 100 (Scan-8,
onnxruntime / numpy): 500 in all, about 6 s on two cores.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper as oh

from builders import vi
from reference_helpers import INT64, assert_outputs_close, floats, make_model, run_ort, scan_node
from scanopt.reference import run_model

OPSETS = (9, 11, 13, 16, 19, 21, 23, 24, 25)
BINARY = {"Add": np.add, "Mul": np.multiply, "Sub": np.subtract}
UNARY = {"Tanh": np.tanh, "Neg": np.negative}
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@dataclass(frozen=True)
class Program:
    """A body: values 0..N-1 are states, then M scan elements, then the outer value ``c``."""

    shape: tuple[int, ...]  # every state and scan element has this shape
    n_states: int
    n_scans: int
    steps: tuple  # ("Add", i, j) | ("Tanh", i) | ("MatMul", i) | ("ReduceSum", i, axis, j) | ("Transpose", i, perm)
    state_sources: tuple[int, ...]  # new state n = Tanh(value)
    scan_sources: tuple[tuple[int, bool], ...]  # (value, pass it through without an Identity)
    weight_in_body: bool
    declare_outputs: bool


@st.composite
def programs(draw, *, inputs_as_outputs: bool, max_states=3, max_scans=3, max_outputs=3) -> Program:
    """``inputs_as_outputs``: a scan output may be a body input or the outer value itself,
    with no node between (onnxruntime 1.31 returns zeros or garbage, or refuses the model)."""
    rank = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(1, 3), min_size=rank, max_size=rank)))
    n, m = draw(st.integers(0, max_states)), draw(st.integers(1, max_scans))
    k = draw(st.integers(0 if n else 1, max_outputs))
    perms = [p for p in itertools.permutations(range(rank)) if p != tuple(range(rank))
             and tuple(shape[i] for i in p) == shape]
    ops = [*BINARY, *UNARY] + (["MatMul", "ReduceSum"] if rank else []) + (["Transpose"] if perms else [])
    pool = n + m + 1
    steps = []
    for _ in range(draw(st.integers(1, 5))):
        op = draw(st.sampled_from(ops))
        value = st.integers(0, pool - 1)
        if op in BINARY:
            steps.append((op, draw(value), draw(value)))
        elif op == "ReduceSum":
            steps.append((op, draw(value), draw(st.integers(0, rank - 1)), draw(value)))
        elif op == "Transpose":
            steps.append((op, draw(value), draw(st.sampled_from(perms))))
        else:
            steps.append((op, draw(value)))
        pool += 1
    value = st.integers(0, pool - 1)
    scan_sources = []
    for _ in range(k):
        src = draw(value)
        computed = src > n + m
        scan_sources.append((src, draw(st.booleans()) and (computed or inputs_as_outputs)))
    return Program(
        shape=shape, n_states=n, n_scans=m, steps=tuple(steps),
        state_sources=tuple(draw(value) for _ in range(n)),
        scan_sources=tuple(scan_sources),
        weight_in_body=draw(st.booleans()), declare_outputs=draw(st.booleans()),
    )


# -- the program as numpy -------------------------------------------------------------


def run_program(p: Program, states: list, elements: list, c: np.ndarray, w: np.ndarray):
    """One body step by numpy: (new states, scan output elements)."""
    values = [*states, *elements, c]
    for step in p.steps:
        op, i = step[0], step[1]
        if op in BINARY:
            values.append(BINARY[op](values[i], values[step[2]]))
        elif op in UNARY:
            values.append(UNARY[op](values[i]))
        elif op == "MatMul":
            values.append(np.matmul(values[i], w))
        elif op == "ReduceSum":
            values.append(np.sum(values[i], axis=step[2], keepdims=True) + values[step[3]])
        else:
            values.append(np.transpose(values[i], step[2]))
    return [np.tanh(values[i]) for i in p.state_sources], [values[i] for i, _ in p.scan_sources]


def numpy_scan9(p, inits, scans, c, w, in_axes, in_dirs, out_axes, out_dirs):
    """The Scan-9+ pseudo-code of the spec, with directions and axes, index by index."""
    length = scans[0].shape[in_axes[0]]
    outs = []
    for axis in out_axes:
        axis = axis % (len(p.shape) + 1)
        outs.append(np.zeros(p.shape[:axis] + (length,) + p.shape[axis:], np.float32))
    states = list(inits)
    for t in range(length):
        elements = [np.take(x, length - 1 - t if d else t, axis=a) for x, a, d in zip(scans, in_axes, in_dirs)]
        states, produced = run_program(p, states, elements, c, w)
        for out, value, axis, d in zip(outs, produced, out_axes, out_dirs):
            index = [slice(None)] * out.ndim
            index[axis] = length - 1 - t if d else t
            out[tuple(index)] = value
    return states, outs


def numpy_scan8(p, inits, scans, c, w, dirs, lens):
    """The Scan-8 pseudo-code per batch item; reverse from len-1; zeros past each length."""
    batch, length = scans[0].shape[:2]
    finals = [x.copy() for x in inits]
    outs = [np.zeros((batch, length) + p.shape, np.float32) for _ in p.scan_sources]
    for b in range(batch):
        states, n = [x[b] for x in inits], lens[b]
        for t in range(n):
            elements = [x[b, n - 1 - t if d else t] for x, d in zip(scans, dirs)]
            states, produced = run_program(p, states, elements, c, w)
            for out, value in zip(outs, produced):
                out[b, t] = value
        for final, state in zip(finals, states):
            final[b] = state
    return finals, outs


# -- the program as ONNX --------------------------------------------------------------


def body_graph(p: Program, opset: int) -> onnx.GraphProto:
    names = [f"s{i}" for i in range(p.n_states)] + [f"x{j}" for j in range(p.n_scans)] + ["c"]
    nodes, initializers = [], []
    for k, step in enumerate(p.steps):
        op, src, out = step[0], names[step[1]], f"v{k}"
        if op in BINARY:
            nodes.append(oh.make_node(op, [src, names[step[2]]], [out]))
        elif op in UNARY:
            nodes.append(oh.make_node(op, [src], [out]))
        elif op == "MatMul":
            nodes.append(oh.make_node("MatMul", [src, "W"], [out]))
        elif op == "ReduceSum":
            if opset >= 13:
                initializers.append(onnx.numpy_helper.from_array(np.array([step[2]], np.int64), f"axes{k}"))
                nodes.append(oh.make_node("ReduceSum", [src, f"axes{k}"], [f"r{k}"], keepdims=1))
            else:
                nodes.append(oh.make_node("ReduceSum", [src], [f"r{k}"], axes=[step[2]], keepdims=1))
            nodes.append(oh.make_node("Add", [f"r{k}", names[step[3]]], [out]))
        else:
            nodes.append(oh.make_node("Transpose", [src], [out], perm=list(step[2])))
        names.append(out)
    outputs = []
    for i, src in enumerate(p.state_sources):
        nodes.append(oh.make_node("Tanh", [names[src]], [f"s{i}_out"]))
        outputs.append(f"s{i}_out")
    for k, (src, passthrough) in enumerate(p.scan_sources):
        if passthrough and names[src] not in outputs:
            outputs.append(names[src])
        else:
            nodes.append(oh.make_node("Identity", [names[src]], [f"y{k}"]))
            outputs.append(f"y{k}")
    inputs = [vi(name, p.shape) for name in names[: p.n_states + p.n_scans]]
    declared = [vi(name, p.shape if p.declare_outputs or i < p.n_states else None) for i, name in enumerate(outputs)]
    return oh.make_graph(nodes, "body", inputs, declared, initializer=initializers)


def weight(p: Program, rng) -> np.ndarray:
    d = p.shape[-1] if p.shape else 1
    return (rng.uniform(-1, 1, (d, d)) / d).astype(np.float32)


def scan_model(p: Program, opset: int, w: np.ndarray, **attrs) -> onnx.ModelProto:
    body = body_graph(p, opset)
    weight_init = [onnx.numpy_helper.from_array(w, "W")]
    if p.weight_in_body:
        body.initializer.extend(weight_init)
        weight_init = []
    inits = [f"i{i}" for i in range(p.n_states)]
    scans = [f"X{j}" for j in range(p.n_scans)]
    finals = [f"f{i}" for i in range(p.n_states)]
    outs = [f"Y{k}" for k in range(len(p.scan_sources))]
    lead = ["L"] if opset == 8 else []
    node = scan_node(lead + inits + scans, finals + outs, body, p.n_scans, **attrs)
    # onnxruntime needs the outer value's shape when a body output copies it undeclared
    inputs = floats(*inits, *scans) + [vi("c", list(p.shape))] + [vi("L", None, INT64) for _ in lead]
    return make_model(opset, [node], inputs, floats(*finals, *outs), initializers=weight_init)


def as_outputs(p: Program, finals: list, outs: list) -> dict:
    named = {f"f{i}": np.asarray(v, np.float32) for i, v in enumerate(finals)}
    named.update({f"Y{k}": np.asarray(v, np.float32) for k, v in enumerate(outs)})
    return named


# -- Scan-9 and later -----------------------------------------------------------------


@dataclass(frozen=True)
class Case9:
    program: Program
    opset: int
    length: int
    in_axes: tuple[int, ...]
    in_dirs: tuple[int, ...]
    out_axes: tuple[int, ...]
    out_dirs: tuple[int, ...]
    seed: int


@st.composite
def cases9(draw, min_length: int) -> Case9:
    p = draw(programs(inputs_as_outputs=min_length == 0))
    opset = draw(st.sampled_from(OPSETS))
    rank = len(p.shape) + 1  # of every scan input and scan output
    low = -rank if opset >= 11 else 0
    axis = st.integers(low, rank - 1)
    flag = st.integers(0, 1)
    k = len(p.scan_sources)
    return Case9(
        program=p, opset=opset, length=draw(st.integers(min_length, 6)),
        in_axes=tuple(draw(axis) for _ in range(p.n_scans)), in_dirs=tuple(draw(flag) for _ in range(p.n_scans)),
        out_axes=tuple(draw(axis) for _ in range(k)), out_dirs=tuple(draw(flag) for _ in range(k)),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def build9(case: Case9):
    p, rng = case.program, np.random.default_rng(case.seed)
    w = weight(p, rng)
    attrs = dict(scan_input_axes=list(case.in_axes), scan_input_directions=list(case.in_dirs))
    if p.scan_sources:
        attrs.update(scan_output_axes=list(case.out_axes), scan_output_directions=list(case.out_dirs))
    model = scan_model(p, case.opset, w, **attrs)
    inits = [rng.uniform(-1, 1, p.shape).astype(np.float32) for _ in range(p.n_states)]
    scans = []
    for axis in case.in_axes:
        axis = axis % (len(p.shape) + 1)
        scans.append(rng.uniform(-1, 1, p.shape[:axis] + (case.length,) + p.shape[axis:]).astype(np.float32))
    c = rng.uniform(-1, 1, p.shape).astype(np.float32)
    feeds = {**{f"i{i}": v for i, v in enumerate(inits)}, **{f"X{j}": v for j, v in enumerate(scans)}, "c": c}
    return model, feeds, (inits, scans, c, w)


@settings(max_examples=150, **SETTINGS)
@given(cases9(min_length=1))
def test_scan9_random_against_onnxruntime(case):
    model, feeds, _ = build9(case)
    assert_outputs_close(run_model(model, feeds), run_ort(model, feeds))


@settings(max_examples=150, **SETTINGS)
@given(cases9(min_length=0))
def test_scan9_random_against_numpy_including_zero_length(case):
    model, feeds, (inits, scans, c, w) = build9(case)
    finals, outs = numpy_scan9(case.program, inits, scans, c, w, case.in_axes, case.in_dirs,
                               case.out_axes, case.out_dirs)
    assert_outputs_close(run_model(model, feeds), as_outputs(case.program, finals, outs))


# -- Scan-8 ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Case8:
    program: Program
    batch: int
    length: int
    lens: tuple[int, ...] | None  # None: the sequence_lens input is omitted
    dirs: tuple[int, ...]
    seed: int


@st.composite
def cases8(draw, min_len: int) -> Case8:
    p = draw(programs(inputs_as_outputs=min_len == 0))
    batch, length = draw(st.integers(1, 3)), draw(st.integers(1, 6))
    lens = draw(st.none() | st.tuples(*[st.integers(min_len, length)] * batch))
    dirs = tuple(draw(st.integers(0, 1)) for _ in range(p.n_scans))
    return Case8(p, batch, length, lens, dirs, draw(st.integers(0, 2**32 - 1)))


def build8(case: Case8):
    p, rng = case.program, np.random.default_rng(case.seed)
    w = weight(p, rng)
    model = scan_model(p, 8, w, directions=list(case.dirs))
    if case.lens is None:
        model.graph.node[0].input[0] = ""
        del model.graph.input[-1]
    inits = [rng.uniform(-1, 1, (case.batch,) + p.shape).astype(np.float32) for _ in range(p.n_states)]
    scans = [rng.uniform(-1, 1, (case.batch, case.length) + p.shape).astype(np.float32) for _ in range(p.n_scans)]
    c = rng.uniform(-1, 1, p.shape).astype(np.float32)
    feeds = {**{f"i{i}": v for i, v in enumerate(inits)}, **{f"X{j}": v for j, v in enumerate(scans)}, "c": c}
    if case.lens is not None:
        feeds["L"] = np.array(case.lens, np.int64)
    return model, feeds, (inits, scans, c, w)


@settings(max_examples=100, **SETTINGS)
@given(cases8(min_len=1))
def test_scan8_random_against_onnxruntime(case):
    model, feeds, _ = build8(case)
    assert_outputs_close(run_model(model, feeds), run_ort(model, feeds))


@settings(max_examples=100, **SETTINGS)
@given(cases8(min_len=0))
def test_scan8_random_against_numpy_including_zero_lengths(case):
    model, feeds, (inits, scans, c, w) = build8(case)
    lens = case.lens or (case.length,) * case.batch
    finals, outs = numpy_scan8(case.program, inits, scans, c, w, case.dirs, lens)
    assert_outputs_close(run_model(model, feeds), as_outputs(case.program, finals, outs))
