"""Recurrent cells written as Scan bodies in the forms exporters and people write, for the
fuse tests. Weights are given in ONNX layout (W [G*H, I], gate order of the native op)
and each builder writes them the way its form needs (transposed for MatMul, reordered
to PyTorch's gate order, split per gate...); the tests then compare the original Scan
with the fused model numerically, so no expected value comes from the code under test.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

H, I = 4, 3


def rand(seed, *shape, scale=0.5):
    return np.random.default_rng(seed).uniform(-scale, scale, shape).astype(np.float32)


class Body:
    """A body under construction; ``where`` says where constants live: body initializers,
    outer-scope initializers, or Constant nodes in the body."""

    def __init__(self, batch: bool = True, where: str = "body", opset: int = 17, hidden: int = H, inputs: int = I,
                 prefix: str = "", wrap: str | None = None, wrap_where: str = "body"):
        self.batch, self.where, self.opset, self.prefix = batch, where, opset, prefix
        self.H, self.I = hidden, inputs
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.outer: list[onnx.TensorProto] = []
        self.outer_nodes: list[onnx.NodeProto] = []
        self.count = 0
        # ``wrap`` writes every float weight/bias behind nodes (see :meth:`wrapped`), placed
        # in the body or (``wrap_where="outer"``) in the main graph.
        self.wrap, self.wrap_where = wrap, wrap_where

    def _name(self, hint):
        self.count += 1
        return f"{self.prefix}{hint}_{self.count}"

    def const(self, value, hint="w", where=None):
        value = np.asarray(value)
        if self.wrap and value.dtype.kind == "f" and value.ndim >= 1 and where is None:
            return self.wrapped(value, hint)
        where = where or self.where
        name = self._name(hint)
        tensor = numpy_helper.from_array(np.asarray(value), name)
        if where == "node":
            self.nodes.append(h.make_node("Constant", [], [name], value=tensor))
        else:
            (self.outer if where == "outer" else self.inits).append(tensor)
        return name

    def wrapped(self, value, hint):
        """``value`` computed from stored initializers by the nodes of form ``self.wrap``."""
        store = "outer" if self.wrap_where == "outer" else self.where
        nodes = self.outer_nodes if self.wrap_where == "outer" else self.nodes
        raw = lambda v, k="raw": self.const(v, k, where=store)  # noqa: E731
        ints = lambda v: self.const(np.asarray(v, np.int64), "i", where=store)  # noqa: E731
        name = self._name(hint)
        n, form = value.shape[0], self.wrap
        node = h.make_node
        if form == "transpose":
            perm = list(range(value.ndim))[::-1]
            nodes.append(node("Transpose", [raw(np.transpose(value).copy())], [name], perm=perm))
        elif form == "cast16":
            nodes.append(node("Cast", [raw(value.astype(np.float16))], [name], to=TP.FLOAT))
        elif form == "reshape":
            nodes.append(node("Reshape", [raw(value.reshape(-1)), ints(value.shape)], [name]))
        elif form == "slice":
            packed = np.concatenate([value, np.full_like(value, 9.0)])
            if self.opset >= 10:
                nodes.append(node("Slice", [raw(packed), ints([0]), ints([n]), ints([0])], [name]))
            else:
                nodes.append(node("Slice", [raw(packed)], [name], starts=[0], ends=[n], axes=[0]))
        elif form == "split":
            packed = np.concatenate([np.full_like(value[:1], 7.0), value])
            junk = self._name("junk")
            if self.opset >= 13:
                nodes.append(node("Split", [raw(packed), ints([1, n])], [junk, name], axis=0))
            else:
                nodes.append(node("Split", [raw(packed)], [junk, name], axis=0, split=[1, n]))
        elif form == "concat":
            k = max(1, n // 2)
            nodes.append(node("Concat", [raw(value[:k].copy()), raw(value[k:].copy())], [name], axis=0))
        elif form == "unsqueeze":  # Unsqueeze then Squeeze (a [1, H] row would change an unbatched body's rank)
            mid = self._name("unsq")
            if self.opset >= 13:
                nodes.append(node("Unsqueeze", [raw(value), ints([0])], [mid]))
                nodes.append(node("Squeeze", [mid, ints([0])], [name]))
            else:
                nodes.append(node("Unsqueeze", [raw(value)], [mid], axes=[0]))
                nodes.append(node("Squeeze", [mid], [name], axes=[0]))
        elif form == "identity":
            mid = self._name("id")
            nodes.append(node("Identity", [raw(value)], [mid]))
            nodes.append(node("Identity", [mid], [name]))
        elif form == "constant":
            nodes.append(node("Constant", [], [name], value=numpy_helper.from_array(value, name + "_v")))
        else:
            raise ValueError(form)
        return name

    def op(self, op_type, *inputs, outputs=1, **attrs):
        names = [self._name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(h.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    def linear(self, src, W, b=None, form="matmul"):
        """src·Wᵀ (+ b) for W [out, in] in one of the forms exporters use."""
        if form == "gemm":
            args = [src, self.const(W)] + ([self.const(b, "b")] if b is not None else [])
            return self.op("Gemm", *args, transB=1)
        if form == "gemm_t":
            args = [src, self.const(W.T.copy())] + ([self.const(b, "b")] if b is not None else [])
            return self.op("Gemm", *args)
        if form == "matvec":  # W @ v, for bodies without a batch axis
            out = self.op("MatMul", self.const(W), src)
        else:
            out = self.op("MatMul", src, self.const(W.T.copy()))
        if b is None:
            return out
        return self.op("Add", self.const(b, "b"), out) if form == "bias_first" else self.op("Add", out, self.const(b, "b"))

    def split(self, value, parts, how="split"):
        """Equal last-axis parts of ``value`` by Split or by Slice."""
        axis = -1 if how != "split_pos" else (1 if self.batch else 0)
        if how in ("split", "split_pos"):
            if self.opset >= 18:
                return self.op("Split", value, outputs=parts, axis=axis, num_outputs=parts)
            if self.opset < 13:
                return self.op("Split", value, outputs=parts, axis=axis, split=[self.H] * parts)
            sizes = self.const(np.array([self.H] * parts, np.int64), "sizes", where="body")
            return self.op("Split", value, sizes, outputs=parts, axis=axis)
        outs = []
        for k in range(parts):
            if how.startswith("strided"):  # tf2onnx's strided_slice h[:, a:b]: axes [0, 1], the batch end INT32_MAX
                rows = 2**31 - 1 if how == "strided" else 2  # "strided_rows": only the first 2 rows
                bounds = ([0, k * self.H], [rows, (k + 1) * self.H], [0, 1])
                c = [self.const(np.array(v, np.int64), "s", where="body") for v in bounds]
            else:
                c = [self.const(np.array([v], np.int64), "s", where="body") for v in (k * self.H, (k + 1) * self.H, -1)]
            outs.append(self.op("Slice", value, *c))
        return outs


def split_rows_of(body, value, parts=2):
    """Rows of a packed [parts, n] tensor, each [1, n]."""
    if body.opset >= 13:
        return body.op("Split", value, body.const(np.array([1] * parts, np.int64), "rows", where="body"),
                       outputs=parts, axis=0)
    return body.op("Split", value, outputs=parts, axis=0, split=[1] * parts)


Body.split_rows = split_rows_of


def shape(body: Body, size, lead=None):
    return (["batch", size] if body.batch else [size]) if lead is None else lead


def scan_model(body: Body, states, x="x", ys=("y",), *, in_axis=0, out_axes=None, in_dir=0, out_dirs=None,
               opset=None, finals=True):
    """Wrap ``body`` in a Scan. ``states``: [(input name, output name, size)]; ``ys``: body
    output names of the scan outputs (each gets an Identity, as exporters write it)."""
    opset = opset or body.opset
    k = len(ys)
    out_axes = list(out_axes or [0] * k)
    out_dirs = list(out_dirs or [0] * k)
    nodes = list(body.nodes)
    y_names = []
    for i, y in enumerate(ys):
        y_names.append(f"y_t{i}")
        nodes.append(h.make_node("Identity", [y], [f"y_t{i}"]))
    vi = h.make_tensor_value_info
    b_in = [vi(name, TP.FLOAT, shape(body, size)) for name, _, size in states]
    b_in += [vi(x, TP.FLOAT, shape(body, body.I))]
    b_out = [vi(out, TP.FLOAT, shape(body, size)) for _, out, size in states]
    b_out += [vi(n, TP.FLOAT, shape(body, body.H)) for n in y_names]
    graph = h.make_graph(nodes, "cell_body", b_in, b_out, initializer=body.inits)
    attrs = {"num_scan_inputs": 1, "body": graph}
    if in_axis:
        attrs["scan_input_axes"] = [in_axis]
    if in_dir:
        attrs["scan_input_directions"] = [1]
    if any(out_axes):
        attrs["scan_output_axes"] = out_axes
    if any(out_dirs):
        attrs["scan_output_directions"] = out_dirs

    def outer_shape(size, axis):
        s = list(shape(body, size))
        s.insert(axis, "seq")
        return s

    scan = h.make_node("Scan", [f"{name}0" for name, _, _ in states] + ["X"],
                       [f"{name}_n" for name, _, _ in states] + [f"Y{i}" for i in range(k)], name="cell_scan", **attrs)
    inputs = [vi("X", TP.FLOAT, outer_shape(body.I, in_axis))]
    inputs += [vi(f"{name}0", TP.FLOAT, shape(body, size)) for name, _, size in states]
    outputs = [vi(f"{name}_n", TP.FLOAT, shape(body, size)) for name, _, size in states] if finals else []
    outputs += [vi(f"Y{i}", TP.FLOAT, outer_shape(body.H, a)) for i, a in enumerate(out_axes)]
    g = h.make_graph(body.outer_nodes + [scan], "cell_model", inputs, outputs, initializer=body.outer)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


def scan8_model(body: Body, states, ys=("y",), *, lens=True, reverse=False, finals=True):
    """A Scan-8 (opset 8) over X [batch, seq, I] with a body without batch axis; optional
    sequence_lens input ``lens`` [batch]."""
    vi = h.make_tensor_value_info
    nodes = list(body.nodes) + [h.make_node("Identity", [y], [f"y_t{i}"]) for i, y in enumerate(ys)]
    graph = h.make_graph(
        nodes, "cell_body",
        [vi(name, TP.FLOAT, [size]) for name, _, size in states] + [vi("x", TP.FLOAT, [body.I])],
        [vi(out, TP.FLOAT, [size]) for _, out, size in states] + [vi(f"y_t{i}", TP.FLOAT, [body.H]) for i in range(len(ys))],
        initializer=body.inits)
    attrs = {"num_scan_inputs": 1, "body": graph}
    if reverse:
        attrs["directions"] = [1]
    scan = h.make_node("Scan", ["lens" if lens else ""] + [f"{name}0" for name, _, _ in states] + ["X"],
                       [f"{name}_n" for name, _, _ in states] + [f"Y{i}" for i in range(len(ys))], name="cell_scan8", **attrs)
    inputs = ([vi("lens", TP.INT64, ["batch"])] if lens else []) + [vi("X", TP.FLOAT, ["batch", "seq", body.I])]
    inputs += [vi(f"{name}0", TP.FLOAT, ["batch", size]) for name, _, size in states]
    outputs = [vi(f"{name}_n", TP.FLOAT, ["batch", size]) for name, _, size in states] if finals else []
    outputs += [vi(f"Y{i}", TP.FLOAT, ["batch", "seq", body.H]) for i in range(len(ys))]
    g = h.make_graph(body.outer_nodes + [scan], "cell_model8", inputs, outputs, initializer=body.outer)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 8)], ir_version=8)


def two_scans(first, second, suffix="_b"):
    """One model running both models' Scans over the same X; ``second``'s other inputs and
    its outputs get ``suffix`` (its body names must already differ: use a Body prefix)."""
    model = onnx.ModelProto()
    model.CopyFrom(first)
    g2 = second.graph
    rename = {v.name: v.name + suffix for v in list(g2.input) + list(g2.output) if v.name != "X"}
    rename.update({i.name: i.name + suffix for i in g2.initializer})
    scan = onnx.NodeProto()
    scan.CopyFrom(g2.node[0])
    scan.name += suffix
    scan.input[:] = [rename.get(n, n) for n in scan.input]
    scan.output[:] = [rename.get(n, n) for n in scan.output]
    model.graph.node.append(scan)
    for v in g2.input:
        if v.name != "X":
            model.graph.input.append(h.make_tensor_value_info(rename[v.name], v.type.tensor_type.elem_type,
                                                              [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]))
    for v in g2.output:
        model.graph.output.append(h.make_tensor_value_info(rename[v.name], v.type.tensor_type.elem_type,
                                                           [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]))
    for init in g2.initializer:
        model.graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(init), rename[init.name]))
    return model


def weights_as_inputs(model):
    """Every float initializer of the main graph becomes a graph input (a run-time weight)."""
    for init in [i for i in model.graph.initializer if i.data_type == TP.FLOAT]:
        model.graph.initializer.remove(init)
        model.graph.input.append(h.make_tensor_value_info(init.name, TP.FLOAT, list(init.dims)))
    return model


def feeds(model, T=6, B=3, seed=0, lens=None):
    """Inputs with seq = T and batch = B (longer than the verifier's synthesized ones)."""
    rng = np.random.default_rng(seed)
    out = {}
    for v in model.graph.input:
        dims = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        dims = [T if d == "seq" else B if d == "batch" else d for d in dims]
        if v.type.tensor_type.elem_type == TP.INT64:  # sequence_lens
            out[v.name] = np.asarray(lens if lens is not None else rng.integers(1, T + 1, dims), np.int64)
        else:
            out[v.name] = rng.standard_normal(dims).astype(np.float32)
    return [out]


# -- cells ---------------------------------------------------------------------------------

def rnn(body, x, hs, seed=0, act="Tanh", form="matmul", bias="split", order="xh", act_attrs=None, clip=None):
    """h' = act(x·Wᵀ + h·Rᵀ + Wb + Rb)."""
    H, I = body.H, body.I
    W, R, Wb, Rb = rand(seed, H, I), rand(seed + 1, H, H), rand(seed + 2, H), rand(seed + 3, H)
    if bias == "merged":
        xw, hr = body.linear(x, W, form=form), body.linear(hs, R, form=form)
        terms = [xw, hr, body.const(Wb + Rb, "b")]
        pre = body.op("Sum", *terms) if order == "sum" else body.op("Add", body.op("Add", *terms[:2]), terms[2])
    elif bias == "none":
        xw, hr = body.linear(x, W, form=form), body.linear(hs, R, form=form)
        pre = body.op("Add", xw, hr)
    else:
        xw, hr = body.linear(x, W, Wb, form=form), body.linear(hs, R, Rb, form=form)
        pre = body.op("Add", *((xw, hr) if order == "xh" else (hr, xw)))
    if clip is not None:
        pre = body.op("Clip", pre, body.const(np.float32(-clip), "lo"), body.const(np.float32(clip), "hi"))
    return body.op(act, pre, **(act_attrs or {}))


def gru(body, x, hs, seed=0, lbr=0, order="onnx", fused=True, cut="split", update="standard", form="matmul",
        acts=("Sigmoid", "Tanh"), act_attrs=({}, {})):
    """ONNX GRU (z, r, h) written in ONNX or PyTorch (r, z, n) gate order."""
    H, I = body.H, body.I
    W, R = rand(seed, 3 * H, I), rand(seed + 1, 3 * H, H)
    Wb, Rb = rand(seed + 2, 3 * H), rand(seed + 3, 3 * H)
    gates = {"z": 0, "r": 1, "h": 2}
    names = ["r", "z", "h"] if order == "torch" else ["z", "r", "h"]
    rows = lambda a, g: a[gates[g] * H:(gates[g] + 1) * H]  # noqa: E731
    stack = lambda a, gs: np.concatenate([rows(a, g) for g in gs])  # noqa: E731
    if fused:
        xi = body.split(body.linear(x, stack(W, names), stack(Wb, names), form=form), 3, cut)
        xg = dict(zip(names, xi))
        if lbr:
            hi = body.split(body.linear(hs, stack(R, names), stack(Rb, names), form=form), 3, cut)
            hg = dict(zip(names, hi))
        else:
            zr = [g for g in names if g != "h"]
            hi = body.split(body.linear(hs, stack(R, zr), stack(Rb, zr), form=form), 2, cut)
            hg = dict(zip(zr, hi))
    else:
        xg = {g: body.linear(x, rows(W, g), rows(Wb, g), form=form) for g in names}
        hg = {g: body.linear(hs, rows(R, g), rows(Rb, g), form=form) for g in names if lbr or g != "h"}
    z = body.op(acts[0], body.op("Add", xg["z"], hg["z"]), **act_attrs[0])
    r = body.op(acts[0], body.op("Add", hg["r"], xg["r"]), **act_attrs[0])
    if lbr:
        cand_in = body.op("Add", xg["h"], body.op("Mul", r, hg["h"]))
    else:
        rh = body.op("Mul", hs, r)
        cand_in = body.op("Add", xg["h"], body.linear(rh, rows(R, "h"), rows(Rb, "h"), form=form))
    n = body.op(acts[1], cand_in, **act_attrs[1])
    one = body.const(np.float32(1.0), "one", where="body")
    if update == "standard":  # (1 - z) * n + z * h
        return body.op("Add", body.op("Mul", body.op("Sub", one, z), n), body.op("Mul", z, hs))
    if update == "lerp":  # n + z * (h - n)
        return body.op("Add", n, body.op("Mul", z, body.op("Sub", hs, n)))
    if update == "expanded":  # z*h + n - z*n
        return body.op("Sub", body.op("Add", body.op("Mul", hs, z), n), body.op("Mul", n, z))
    raise ValueError(update)


def lstm(body, x, hs, cs, seed=0, order="onnx", cut="split", peep=False, form="matmul", acts=("Sigmoid", "Tanh", "Tanh")):
    """LSTM written with one fused matmul per source, gates in ONNX (i, o, f, c) or PyTorch
    (i, f, g, o) order; optional peepholes (i, f read c; o reads the new c)."""
    H, I = body.H, body.I
    W, R = rand(seed, 4 * H, I), rand(seed + 1, 4 * H, H)
    Wb, Rb = rand(seed + 2, 4 * H), rand(seed + 3, 4 * H)
    P = rand(seed + 4, 3 * H)
    onnx_order = ["i", "o", "f", "c"]
    names = ["i", "f", "c", "o"] if order == "torch" else onnx_order
    rows = lambda a, g: a[onnx_order.index(g) * H:(onnx_order.index(g) + 1) * H]  # noqa: E731
    stack = lambda a: np.concatenate([rows(a, g) for g in names])  # noqa: E731
    gates = body.op("Add", body.linear(x, stack(W), stack(Wb), form=form), body.linear(hs, stack(R), stack(Rb), form=form))
    pre = dict(zip(names, body.split(gates, 4, cut)))
    f_act, g_act, h_act = acts
    if peep:
        pre["i"] = body.op("Add", pre["i"], body.op("Mul", body.const(P[:H], "pi"), cs))
        pre["f"] = body.op("Add", body.op("Mul", cs, body.const(P[2 * H:], "pf")), pre["f"])
    i = body.op(f_act, pre["i"])
    f = body.op(f_act, pre["f"])
    g = body.op(g_act, pre["c"])
    c_new = body.op("Add", body.op("Mul", f, cs), body.op("Mul", i, g))
    if peep:
        pre["o"] = body.op("Add", pre["o"], body.op("Mul", c_new, body.const(P[H:2 * H], "po")))
    o = body.op(f_act, pre["o"])
    h_new = body.op("Mul", o, body.op(h_act, c_new))
    return h_new, c_new


def cell(kind, body, seed=0, **kw):
    """(states for scan_model, new hidden state) of a ``kind`` cell in ``body``."""
    if kind == "RNN":
        h_new = rnn(body, "x", "h", seed=seed, **kw)
        return [("h", h_new, body.H)], h_new
    if kind == "GRU":
        h_new = gru(body, "x", "h", seed=seed, **kw)
        return [("h", h_new, body.H)], h_new
    h_new, c_new = lstm(body, "x", "h", "c", seed=seed, **kw)
    return [("h", h_new, body.H), ("c", c_new, body.H)], h_new


# -- running the pass ----------------------------------------------------------------------

def fuse(model, passes=("fuse", "cleanup")):
    """(optimized model, fuse outcomes) without the pipeline's own verification."""
    import scanopt

    # target portable: these tests check the rewrite itself, not the cost policy's choice, nor
    # what other runtimes run (portable_runtimes: none)
    out, report = scanopt.optimize(model, passes=list(passes), verify=False,
                                   options={"target": "portable", "portable_runtimes": []})
    return out, [o for o in report.outcomes if o.pass_name == "fuse"]


def check_fused(model, kind, inputs=True, **feed_kw):
    """Fuse ``model``: exactly one Scan, replaced by one ``kind`` op, equivalent on both
    engines on synthesized inputs and (``inputs``) on fixed T=7, B=3 feeds."""
    from equivalence import assert_equivalent, ops

    out, outcomes = fuse(model)
    assert [o.applied for o in outcomes] == [True], [o.detail for o in outcomes]
    counts = ops(out)
    assert counts["Scan"] == 0 and counts[kind] == 1, counts
    assert_equivalent(model, out)
    if inputs:
        assert_equivalent(model, out, inputs=feeds(model, T=7, B=3, **feed_kw))
    return out


def declined(model) -> str:
    """Fuse ``model``: its one Scan stays (fuse declines it); the reason."""
    from equivalence import ops

    out, outcomes = fuse(model)
    assert [o.applied for o in outcomes] == [False], [o.detail for o in outcomes]
    assert ops(out)["Scan"] == 1
    return outcomes[0].detail


def guarded_nodes(graph):
    """The nodes of ``graph`` and of its Ifs' else branches."""
    for node in graph.node:
        yield node
        if node.op_type == "If":
            yield from guarded_nodes(next(a.g for a in node.attribute if a.name == "else_branch"))


def native(model):
    """The one RNN/GRU/LSTM node of a model (at the top, or in the non-empty branch of the
    If that guards it against an empty X)."""
    (node,) = [n for n in guarded_nodes(model.graph) if n.op_type in ("RNN", "GRU", "LSTM")]
    return node, {a.name: h.get_attribute_value(a) for a in node.attribute}


def matches_torch(model, name, models_dir):
    """Run ``model`` in onnxruntime on the inputs stored with sample ``name`` and compare
    with the outputs PyTorch computed when the sample was exported."""
    import os

    import onnxruntime as ort

    expected = np.load(os.path.join(models_dir, f"{name}.expected.npz"))
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: expected[i.name] for i in sess.get_inputs()}
    names = [o.name for o in sess.get_outputs()]
    for key, got in zip(names, sess.run(names, feeds)):
        np.testing.assert_allclose(got, expected[key], rtol=1e-5, atol=1e-6, err_msg=key)


# -- more cell forms (issue 12): weights given in ONNX layout, written the way each tool does -----

def _rows(a, gate, order, H):
    k = order.index(gate)
    return a[k * H:(k + 1) * H]


VIAS = ("identity", "unsqueeze", "reshape", "flatten", "cast")


def relaid_matmul(body, value, K, via=None):
    """``value·K`` with ``value`` first re-laid out by ``via`` (rows kept: what TF1 converters and
    hand-written cells put between Concat([x, h]) and its MatMul), and the product laid back."""
    ints = lambda v: body.const(np.asarray(v, np.int64), "shape", where="body")  # noqa: E731
    lead = 1 if body.batch else 0
    if via is None:
        return body.op("MatMul", value, body.const(K))
    if via == "identity":
        return body.op("MatMul", body.op("Identity", body.op("Identity", value)), body.const(K))
    if via == "cast":
        return body.op("MatMul", body.op("Cast", value, to=TP.FLOAT), body.const(K))
    if via == "unsqueeze":  # [.., K] -> [.., 1, K] (a row), and Squeeze after the product
        up = body.op("Unsqueeze", value, ints([lead])) if body.opset >= 13 else body.op("Unsqueeze", value, axes=[lead])
        out = body.op("MatMul", up, body.const(K))
        return body.op("Squeeze", out, ints([lead])) if body.opset >= 13 else body.op("Squeeze", out, axes=[lead])
    if via == "flatten":  # Flatten at the last axis of a [B, K] value keeps it; [K] becomes [1, K] by Reshape
        flat = body.op("Flatten", value, axis=1) if body.batch else body.op("Reshape", value, ints([1, K.shape[0]]))
        out = body.op("MatMul", flat, body.const(K))
        return out if body.batch else body.op("Reshape", out, ints([K.shape[1]]))
    if via == "reshape":  # Reshape to [-1, K] (or [1, K]) and back to the state's shape
        row = body.op("Reshape", value, ints([-1, K.shape[0]]) if body.batch else ints([1, K.shape[0]]))
        out = body.op("MatMul", row, body.const(K))
        return body.op("Reshape", out, ints([-1, K.shape[1]]) if body.batch else ints([K.shape[1]]))
    raise ValueError(via)


def concat_rnn(body, x, hs, seed=0, act="Tanh", via=None):
    """Keras/TF1 BasicRNNCell: act(Concat([x, h]) @ K + b), K [I+H, H]."""
    H, I = body.H, body.I
    W, R, Wb = rand(seed, H, I), rand(seed + 1, H, H), rand(seed + 2, H)
    K = np.concatenate([W.T, R.T])
    cat = body.op("Concat", x, hs, axis=-1)
    return body.op(act, body.op("Add", relaid_matmul(body, cat, K, via), body.const(Wb, "b")))


def concat_gru(body, x, hs, seed=0):
    """TF1 GRUCell: [r, u] = σ(Concat([x, h]) @ Kg + bg); c = tanh(Concat([x, r⊙h]) @ Kc + bc);
    h' = u⊙h + (1-u)⊙c (linear_before_reset=0, update gate complemented)."""
    H, I = body.H, body.I
    W, R, Wb = rand(seed, 3 * H, I), rand(seed + 1, 3 * H, H), rand(seed + 2, 3 * H)
    onnx_order = ["z", "r", "h"]
    Kg = np.concatenate([np.concatenate([_rows(W, g, onnx_order, H) for g in "rz"]).T,
                         np.concatenate([_rows(R, g, onnx_order, H) for g in "rz"]).T])
    bg = np.concatenate([_rows(Wb, g, onnx_order, H) for g in "rz"])
    Kc = np.concatenate([_rows(W, "h", onnx_order, H).T, _rows(R, "h", onnx_order, H).T])
    gates = body.op("Sigmoid", body.op("Add", body.op("MatMul", body.op("Concat", x, hs, axis=-1), body.const(Kg)),
                                       body.const(bg, "b")))
    r, u = body.split(gates, 2)
    rh = body.op("Mul", r, hs)
    c = body.op("Tanh", body.op("Add", body.op("MatMul", body.op("Concat", x, rh, axis=-1), body.const(Kc)),
                                body.const(_rows(Wb, "h", onnx_order, H), "b")))
    one = body.const(np.float32(1.0), "one", where="body")
    return body.op("Add", body.op("Mul", u, hs), body.op("Mul", body.op("Sub", one, u), c))


def concat_lstm(body, x, hs, cs, seed=0, forget_bias=1.0, via=None):
    """TF1 BasicLSTMCell: [i, j, f, o] = Concat([x, h]) @ K + b; c' = c⊙σ(f + forget_bias) +
    σ(i)⊙tanh(j); h' = tanh(c')⊙σ(o)."""
    H, I = body.H, body.I
    W, R, Wb = rand(seed, 4 * H, I), rand(seed + 1, 4 * H, H), rand(seed + 2, 4 * H)
    order = "ijfo"
    K = np.concatenate([W.T, R.T])
    pre = body.op("Add", relaid_matmul(body, body.op("Concat", x, hs, axis=-1), K, via), body.const(Wb, "b"))
    g = dict(zip(order, body.split(pre, 4)))
    f = body.op("Sigmoid", body.op("Add", g["f"], body.const(np.float32(forget_bias), "fb", where="body")))
    c_new = body.op("Add", body.op("Mul", cs, f), body.op("Mul", body.op("Sigmoid", g["i"]), body.op("Tanh", g["j"])))
    return body.op("Mul", body.op("Tanh", c_new), body.op("Sigmoid", g["o"])), c_new


def concat_lstm_native(seed=0, forget_bias=1.0, H=H, I=I):
    """The native LSTM :func:`concat_lstm` computes, its i, j, f, o blocks laid out in ONNX order
    i, o, f, c by hand (the forget bias added to f's input bias)."""
    W, R, Wb = rand(seed, 4 * H, I), rand(seed + 1, 4 * H, H), rand(seed + 2, 4 * H)
    blocks = lambda a: dict(zip("ijfo", np.split(a, 4)))  # noqa: E731
    w, r, b = blocks(W), blocks(R), blocks(Wb)
    b["f"] = b["f"] + forget_bias
    order = "iofj"
    return native_model("LSTM", np.concatenate([w[g] for g in order]), np.concatenate([r[g] for g in order]),
                        np.concatenate([np.concatenate([b[g] for g in order]), np.zeros(4 * H)]))


def keras_gru(body, x, hs, seed=0, bias_cut="gather", rec_cut="split"):
    """Keras GRU with reset_after=True: kernel [I, 3H], recurrent_kernel [H, 3H] in gate order
    z, r, h and one packed bias [2, 3H] (input row, recurrent row); h' = z⊙h + (1-z)⊙hh.
    ``rec_cut``: how the recurrent gates are cut (:meth:`Body.split`; Keras 3 through tf2onnx:
    "strided")."""
    H, I = body.H, body.I
    W, R = rand(seed, 3 * H, I), rand(seed + 1, 3 * H, H)
    bias = rand(seed + 2, 2, 3 * H)
    packed = body.const(bias, "bias")
    if bias_cut == "gather":
        b_in = body.op("Gather", packed, body.const(np.int64(0), "i0", where="body"), axis=0)
        b_rec = body.op("Gather", packed, body.const(np.int64(1), "i1", where="body"), axis=0)
    else:  # Split into [1, 3H] rows, then Squeeze
        rows = body.split_rows(packed)
        b_in, b_rec = (body.op("Squeeze", r, body.const(np.array([0], np.int64), "ax", where="body")) for r in rows)
    xz, xr, xh = body.split(body.op("Add", body.op("MatMul", x, body.const(W.T.copy(), "kernel")), b_in), 3)
    hz, hr, hh = body.split(body.op("Add", body.op("MatMul", hs, body.const(R.T.copy(), "rkernel")), b_rec), 3,
                            how=rec_cut)
    z = body.op("Sigmoid", body.op("Add", xz, hz))
    r = body.op("Sigmoid", body.op("Add", xr, hr))
    cand = body.op("Tanh", body.op("Add", xh, body.op("Mul", r, hh)))
    one = body.const(np.float32(1.0), "one", where="body")
    return body.op("Add", body.op("Mul", z, hs), body.op("Mul", body.op("Sub", one, z), cand))


def coupled_lstm(body, x, hs, cs, seed=0, write="forget"):
    """Coupled input-forget gate LSTM: c' = f⊙c + (1-f)⊙g (``write="forget"``) or
    c' = (1-i)⊙c + i⊙g (``"input"``); h' = o⊙tanh(c')."""
    H = body.H
    W, R = rand(seed, 3 * H, body.I), rand(seed + 1, 3 * H, H)
    Wb = rand(seed + 2, 3 * H)
    pre = body.op("Add", body.linear(x, W, Wb), body.linear(hs, R))
    a, gpre, opre = body.split(pre, 3)
    gate = body.op("Sigmoid", a)
    g, o = body.op("Tanh", gpre), body.op("Sigmoid", opre)
    one = body.const(np.float32(1.0), "one", where="body")
    other = body.op("Sub", one, gate)
    keep, take = (gate, other) if write == "forget" else (other, gate)
    c_new = body.op("Add", body.op("Mul", keep, cs), body.op("Mul", take, g))
    return body.op("Mul", o, body.op("Tanh", c_new)), c_new


def many_bias_rnn(body, x, hs, seed=0, act="Tanh"):
    """h' = act(Gemm(x, W, C=b1) + b2 + h·Rᵀ + b3): the bias in a Gemm's C and two more Adds."""
    H, I = body.H, body.I
    W, R = rand(seed, H, I), rand(seed + 1, H, H)
    xw = body.op("Gemm", x, body.const(W), body.const(rand(seed + 2, H), "b"), transB=1, beta=0.5)
    s = body.op("Add", body.op("Add", xw, body.const(rand(seed + 3, H), "b")), body.linear(hs, R))
    return body.op(act, body.op("Add", body.const(rand(seed + 4, H), "b"), s))


# -- the hand-written native op, for "equal to the native op with the same weights" -----------

def rnn_model(hidden=H, inputs=I, seq=None, batch=None):
    """A tanh RNN cell as a Scan over X [seq, batch, I] emitting h; ``seq``/``batch`` given: those
    dims static, else symbolic."""
    body = Body(hidden=hidden, inputs=inputs)
    y = rnn(body, "x", "h")
    body.nodes.append(h.make_node("Identity", [y], ["h_new"]))
    model = scan_model(body, [("h", "h_new", hidden)], ys=("h_new",))
    static = {k: v for k, v in (("seq", seq), ("batch", batch)) if v is not None}
    for value in list(model.graph.input) + list(model.graph.output):
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in static:
                dim.dim_value = static[dim.dim_param]
    return model


def native_model(kind, W, R, B, P=None, opset=17, **attrs):
    """X [seq, batch, I], h0 (, c0) -> Y0 [seq, batch, H], h_n (, c_n): one native op written by
    hand from weights in ONNX layout (one direction), with the Scan samples' names."""
    Hn = R.shape[1]
    In = W.shape[1]
    vi = h.make_tensor_value_info
    inits = [numpy_helper.from_array(np.asarray(v, np.float32)[None], k) for k, v in (("W", W), ("R", R), ("B", B))]
    ins = ["X", "W", "R", "B", "", "h0_3"]
    nodes = [h.make_node("Unsqueeze", ["h0", "ax0"], ["h0_3"])]
    if kind == "LSTM":
        ins.append("c0_3")
        nodes.append(h.make_node("Unsqueeze", ["c0", "ax0"], ["c0_3"]))
        if P is not None:
            ins.append("P")
            inits.append(numpy_helper.from_array(np.asarray(P, np.float32)[None], "P"))
    outs = ["Y4", "Yh"] + (["Yc"] if kind == "LSTM" else [])
    nodes.append(h.make_node(kind, ins, outs, hidden_size=Hn, **attrs))
    nodes += [h.make_node("Squeeze", ["Y4", "ax1"], ["Y0"]), h.make_node("Squeeze", ["Yh", "ax0"], ["h_n"])]
    if kind == "LSTM":
        nodes.append(h.make_node("Squeeze", ["Yc", "ax0"], ["c_n"]))
    inits += [numpy_helper.from_array(np.array([0], np.int64), "ax0"), numpy_helper.from_array(np.array([1], np.int64), "ax1")]
    inputs = [vi("X", TP.FLOAT, ["seq", "batch", In]), vi("h0", TP.FLOAT, ["batch", Hn])]
    outputs = [vi("h_n", TP.FLOAT, ["batch", Hn])]
    if kind == "LSTM":
        inputs.append(vi("c0", TP.FLOAT, ["batch", Hn]))
        outputs.append(vi("c_n", TP.FLOAT, ["batch", Hn]))
    outputs.append(vi("Y0", TP.FLOAT, ["seq", "batch", Hn]))
    g = h.make_graph(nodes, "native", inputs, outputs, initializer=inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


def assert_same_as_native(model, native, shapes=((16, 1), (50, 4)), rtol=1e-5, atol=1e-5):
    """``model`` (a fused or original Scan sample) and ``native`` give the same outputs, by
    name, in onnxruntime on feeds of each (T, B)."""
    import onnxruntime as ort

    run = lambda m, f: dict(zip([o.name for o in m.graph.output],  # noqa: E731
                                ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)))
    for T, B in shapes:
        (feed,) = feeds(native, T=T, B=B, seed=T + B)
        got, want = run(model, feed), run(native, feed)
        for name, value in want.items():
            np.testing.assert_allclose(got[name], value, rtol=rtol, atol=atol, err_msg=f"{name} at T={T}, B={B}")
