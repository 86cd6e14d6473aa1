"""Property tests: random Scan-8 models (random bodies, batch, lengths, directions, target
opset) upgrade to models that compute the same numbers on onnxruntime and on the reference
executor. The bodies mix ops the batch-polymorphism proof accepts with operand ranks that
make it decline, so both strategy (b) and the fallback (c) are exercised, and any unsound
acceptance by the proof shows up as a numeric mismatch."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from builders import vi
from equivalence import assert_equivalent, assert_valid
from scanopt.errors import ScanoptError
from scanopt.migrate import migrate, migrate_verified
from scanopt.verify import compare_models

TARGETS = (9, 10, 11, 13, 16, 18, 21, 26)


class BodyMaker:
    """Draws body nodes while tracking every value's per-item shape with numpy stand-ins."""

    def __init__(self, data):
        self.data = data
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.pool: dict[str, np.ndarray] = {}  # name -> zeros of the per-item shape
        self.count = 0

    def draw(self, strategy):
        return self.data.draw(strategy)

    def fresh(self, hint):
        self.count += 1
        return f"{hint}{self.count}"

    def const(self, shape):
        name = self.fresh("c")
        rng = np.random.default_rng(self.count)
        self.inits.append(numpy_helper.from_array(rng.uniform(-0.7, 0.7, shape).astype(np.float32), name))
        return name

    def ints(self, values):
        name = self.fresh("i")
        self.inits.append(numpy_helper.from_array(np.asarray(values, np.int64), name))
        return name

    def emit(self, op, inputs, like, **attrs):
        out = self.fresh(op.lower())
        self.nodes.append(h.make_node(op, inputs, [out], **attrs))
        self.pool[out] = like
        return out

    def pick(self):
        return self.draw(st.sampled_from(sorted(self.pool)))

    def step(self):
        """One random op on random pool values."""
        v = self.pick()
        x = self.pool[v]
        r = x.ndim
        kind = self.draw(st.sampled_from(["unary", "const", "pair", "matmul", "lmatmul", "reduce", "transpose",
                                          "softmax", "concat", "unsqueeze", "reshape", "gather", "expand", "gemm"]))
        if kind == "unary":
            return self.emit(self.draw(st.sampled_from(["Tanh", "Relu", "Neg", "Sigmoid", "Abs"])), [v], x)
        if kind == "const":  # a weight of lower, equal or higher rank: higher breaks (b)
            lead = self.draw(st.sampled_from([[], [], [2]]))
            keep = self.draw(st.integers(0, r)) if not lead else r
            shape = lead + list(x.shape[r - keep:])
            y = np.zeros(np.broadcast_shapes(x.shape, tuple(shape)), np.float32)
            return self.emit(self.draw(st.sampled_from(["Add", "Mul", "Sub", "Max"])), [v, self.const(shape)], y)
        if kind == "pair":
            w = self.pick()
            try:
                y = np.zeros(np.broadcast_shapes(x.shape, self.pool[w].shape), np.float32)
            except ValueError:
                return None
            return self.emit(self.draw(st.sampled_from(["Add", "Mul", "Sub"])), [v, w], y)
        if kind == "matmul" and r >= 1:
            k = x.shape[-1]
            shape = self.draw(st.sampled_from([[k, 2], [k], [2, k, 3]]))
            try:  # a batched weight's leading 2 must broadcast with x's leading dims
                y = np.matmul(x, np.zeros(shape, np.float32))
            except ValueError:
                return None
            return self.emit("MatMul", [v, self.const(shape)], y)
        if kind == "lmatmul" and r >= 1:
            k = x.shape[-2] if r >= 2 else x.shape[0]
            shape = self.draw(st.sampled_from([[3, k], [k]]))  # with a rank-1 item, (b) must decline
            return self.emit("MatMul", [self.const(shape), v], np.matmul(np.zeros(shape, np.float32), x))
        if kind == "reduce" and r >= 1:
            keep = self.draw(st.integers(0, 1))
            if self.draw(st.booleans()):
                return self.emit("ReduceSum", [v], np.sum(x, keepdims=bool(keep)), keepdims=keep)
            axis = self.draw(st.integers(-r, r - 1))
            return self.emit("ReduceMean", [v], np.mean(x, axis=axis, keepdims=bool(keep)), axes=[axis], keepdims=keep)
        if kind == "transpose" and r >= 2:
            if self.draw(st.booleans()):
                return self.emit("Transpose", [v], np.transpose(x))
            perm = self.draw(st.permutations(list(range(r))))
            return self.emit("Transpose", [v], np.transpose(x, perm), perm=list(perm))
        if kind == "softmax" and r >= 1:
            # Last axis only: onnx.reference runs Softmax-1 with opset-13 semantics (no
            # coercion to 2-D), so for other axes its two engines disagree on the original.
            return self.emit("Softmax", [v], x, axis=r - 1)
        if kind == "concat" and r >= 1:
            axis = self.draw(st.integers(0, r - 1))
            return self.emit("Concat", [v, v], np.concatenate([x, x], axis=axis), axis=axis)
        if kind == "unsqueeze":
            axis = self.draw(st.integers(0, r))
            u = self.emit("Unsqueeze", [v], np.expand_dims(x, axis), axes=[axis])
            return self.emit("Squeeze", [u], x, axes=[axis]) if self.draw(st.booleans()) else u
        if kind == "reshape" and r >= 1:
            return self.emit("Reshape", [v, self.ints([-1])], x.reshape(-1))
        if kind == "gather" and r >= 1:
            axis = self.draw(st.integers(0, r - 1))
            return self.emit("Gather", [v, self.ints([0])], np.take(x, [0], axis=axis), axis=axis)
        if kind == "expand":
            shape = self.draw(st.sampled_from([list(x.shape), [2] + list(x.shape)]))
            return self.emit("Expand", [v, self.ints(shape)], np.broadcast_to(x, shape))
        if kind == "gemm" and r == 2:
            w, c = self.const([x.shape[1], 2]), self.const([2])
            return self.emit("Gemm", [v, w, c], np.zeros((x.shape[0], 2), np.float32))
        return None


@st.composite
def scan8_models(draw):
    data = draw(st.data())
    maker = BodyMaker(data)
    item = tuple(draw(st.lists(st.sampled_from([2, 3]), min_size=1, max_size=2)))
    n = draw(st.integers(1, 2))
    m = draw(st.integers(1, 2))
    states = [f"s{i}" for i in range(n)]
    scans = [f"x{j}" for j in range(m)]
    for name in states + [f"{x}_t" for x in scans]:
        maker.pool[name] = np.zeros(item, np.float32)
    for _ in range(draw(st.integers(1, 5))):
        maker.step()
    same = [v for v, x in maker.pool.items() if x.shape == item]
    state_outs = []
    for s in states:  # a state keeps its shape: s + (a same-shaped value)
        state_outs.append(maker.emit("Add", [s, draw(st.sampled_from(sorted(same)))], np.zeros(item, np.float32)))
        maker.pool.pop(state_outs[-1])
    k = draw(st.integers(0, 2))
    scan_outs = [maker.emit("Identity", [maker.pick()], None) for _ in range(k)]

    body = h.make_graph(
        maker.nodes, "body",
        [vi(s, list(item)) for s in states] + [vi(f"{x}_t", list(item)) for x in scans],
        [vi(o, None) for o in state_outs + scan_outs],
    )
    # Declared output shapes from onnx shape inference on the body alone.
    probe = h.make_model(h.make_graph(list(body.node), "probe", list(body.input), list(body.output),
                                      initializer=maker.inits), opset_imports=[h.make_opsetid("", 8)], ir_version=4)
    inferred = onnx.shape_inference.infer_shapes(probe, strict_mode=True)
    out_shapes = [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in inferred.graph.output]
    del body.output[:]
    body.output.extend(vi(o, shp) for o, shp in zip(state_outs + scan_outs, out_shapes))

    batch = draw(st.sampled_from([1, 2, 3, "B"]))
    steps = draw(st.sampled_from([1, 3, "T"]))
    lens = draw(st.booleans())
    directions = draw(st.lists(st.integers(0, 1), min_size=m, max_size=m))
    node = h.make_node("Scan", ["lens" if lens else ""] + [f"{s}_0" for s in states] + scans,
                       [f"{s}_final" for s in states] + [f"y{j}" for j in range(k)], name="scan8",
                       num_scan_inputs=m, body=body, directions=directions)
    inputs = ([vi("lens", [batch], TP.INT64)] if lens else []) + [vi(f"{s}_0", [batch, *item]) for s in states]
    inputs += [vi(x, [batch, steps, *item]) for x in scans]
    outputs = [vi(f"{s}_final", [batch, *item]) for s in states]
    outputs += [vi(f"y{j}", [batch, steps, *shp]) for j, shp in enumerate(out_shapes[n:])]
    graph = h.make_graph([node], "main", inputs, outputs, initializer=maker.inits)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=4), lens, batch, steps


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=scan8_models(), target=st.sampled_from(TARGETS), force_c=st.booleans())
def test_random_scan8_upgrades_equivalently(case, target, force_c):
    original, lens, batch, steps = case
    migration = migrate(original, target, options={"upgrade_strategy": "c"} if force_c else None)
    (outcome,) = migration.outcomes
    assert outcome.applied and outcome.detail.startswith("strategy (")
    assert_valid(migration.model)
    if not compare_models(original, migration.model, engine="both", seeds=2).passed:
        # The full-spec reference executor is the judge of the upgrade itself; a mismatch only
        # onnxruntime shows is onnxruntime's (1.32's optimizer folds Transpose -> MatMul with a
        # 1-D operand into a wrong FusedMatMul once the body is a Scan-9:
        # test_onnxruntime_fused_matmul_probe), and verification must then refuse the migration.
        assert_equivalent(original, migration.model, engine="reference", seeds=2)
        with pytest.raises(ScanoptError):
            migrate_verified(original, target, options={"upgrade_strategy": "c"} if force_c else None)
    if lens:  # lengths 0..T, including 0, on the reference executor (onnxruntime refuses 0)
        b = batch if isinstance(batch, int) else 3
        t = steps if isinstance(steps, int) else 2
        rng = np.random.default_rng(0)
        feeds = {"lens": np.array([0, t, t // 2][:b] if b > 1 else [0], np.int64)}
        for value in original.graph.input[1:]:
            shape = [b if d.dim_param == "B" else t if d.dim_param == "T" else d.dim_value
                     for d in value.type.tensor_type.shape.dim]
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
        result = compare_models(original, migration.model, inputs=feeds, engine="reference")
        assert result.passed, result.format()


def test_onnxruntime_fused_matmul_probe():
    """Why the test above lets verification refuse a migration onnxruntime alone miscomputes:
    probes whether the installed onnxruntime's optimizer gets Transpose(s) @ c with a 1-D c
    wrong (1.32 does), and asserts verification catches a candidate it gets wrong."""
    import onnxruntime as ort

    c = np.array([1.5, -2.0], np.float32)
    s = np.array([[1, 2], [3, 4]], np.float32)
    graph = h.make_graph([h.make_node("Transpose", ["s"], ["t"]), h.make_node("MatMul", ["t", "c"], ["y"])], "g",
                         [vi("s", [2, 2])], [vi("y", [2])], [numpy_helper.from_array(c, "c")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=7)
    got = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"s": s})[0]
    if np.allclose(got, s.T @ c):
        pytest.skip("this onnxruntime computes Transpose -> MatMul with a 1-D operand right")
    result = compare_models(model, model, engine="both", seeds=1)
    assert not result.passed  # onnxruntime and the reference executor disagree: never silently accepted


def test_a_migration_only_onnxruntime_miscomputes_is_refused_and_the_reference_agrees():
    """The example hypothesis found: a Scan-8 body Transpose(s) @ c with a 1-D c. Upgraded, it
    is right by the reference executor; onnxruntime 1.32 miscomputes the Scan-9 body, so
    ``migrate_verified`` must refuse it (the user's onnxruntime would run it wrong)."""
    body = h.make_graph(
        [h.make_node("Transpose", ["s0"], ["t"]), h.make_node("MatMul", ["t", "c2"], ["m"]),
         h.make_node("Add", ["s0", "s0"], ["a"]), h.make_node("Identity", ["m"], ["y"])], "body",
        [vi("s0", [2, 2]), vi("x0_t", [2, 2])], [vi("a", [2, 2]), vi("y", [2])])
    node = h.make_node("Scan", ["", "s0_0", "x0"], ["s0_final", "y0"], body=body, num_scan_inputs=1, directions=[0])
    graph = h.make_graph([node], "main", [vi("s0_0", [1, 2, 2]), vi("x0", [1, 1, 2, 2])],
                         [vi("s0_final", [1, 2, 2]), vi("y0", [1, 1, 2])],
                         [numpy_helper.from_array(np.array([0.7, -1.3], np.float32), "c2")])
    original = h.make_model(graph, opset_imports=[h.make_opsetid("", 8)], ir_version=4)
    migrated = migrate(original, 9).model
    assert_equivalent(original, migrated, engine="reference", seeds=2)
    if compare_models(original, migrated, engine="both", seeds=2).passed:
        pytest.skip("this onnxruntime runs the upgraded body right")
    with pytest.raises(ScanoptError, match="not equivalent"):
        migrate_verified(original, 9)
