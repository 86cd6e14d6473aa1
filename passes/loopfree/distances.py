"""distances: pairwise squared euclidean distances as one GEMM, ‖x‖² − 2·x·qᵀ + ‖q‖² clamped at 0.

skl2onnx computes every distance-based estimator's distances (KNN with the euclidean and
sqeuclidean metrics, radius neighbors, LocalOutlierFactor, KNeighborsTransformer, KernelPCA
and GaussianProcess kernels on the RBF family) with a Scan over the training rows whose body is
``ReduceSumSquare(Sub(Q, x_t), axes=[-1], keepdims=0)`` with the query batch Q a pass-through
state; euclidean adds a Sqrt after the Scan, the kernels an Exp. Lifted as it is (vectorize),
that is a broadcast Sub over [rows, queries, features]; the GEMM form is how scikit-learn
computes euclidean distances itself, and 10-100x faster from a few queries on.
Manhattan and Minkowski bodies (Abs, Pow) have no product form and stay broadcast.

Where the distances reach only a ``TopK(smallest)`` whose values nobody reads (skl2onnx's
uniform KNN regressor and classifier: Transpose, Sqrt, TopK, then only the indices), the order
per query is all that is exposed: TopK reads ‖x‖² − 2·q·x directly (one Gemm), without ‖q‖²,
the clamp and the Sqrt, which change no order but by merging near-ties.

Numerics: the expansion cancels. In the rows' own dtype and about the origin a distance
comes out within about ``eps · (‖x‖² + ‖q‖²)`` of the exact one: for data far from the origin
(features near 1000, say) that is larger than the distances themselves, flips nearest
neighbours and, through a kernel's Sqrt and an ill-conditioned K⁻¹, moves a Gaussian process's
prediction by orders of magnitude. So both forms here centre rows and queries on the rows' mean
(distances do not change under a shift; onnxruntime folds the mean of fitted rows) and compute
the product in float64 whatever the rows' dtype: the cancellation is then about
``1e-16 · (‖x − c‖² + ‖q − c‖²)``, below the float32 loop's own rounding of each distance, also
after a Sqrt (a query equal to a training row comes out within about 1e-8 of 0, far under a
float32 ulp of the data's scale). The result is cast back to the rows' dtype and clamped at 0.
Exact ties (duplicate training rows) stay exact ties: their rows of the product are computed
alike, so TopK/ArgMin keep the loop's order (lower index first).

A pass of its own, before vectorize, so the cost policy and verification judge the two forms
apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_graphsurgeon as gs

from scanopt.graph import GraphLevel, constant_axes, identity_root
from scanopt.pass_api import Match, PassContext, ScanPass, Skip, register_pass
from scanopt.passes.loopfree.lift import LiftEmitter, changing_states, from_processing_order
from scanopt.protos import in_default_domain
from scanopt.rewrite import consumers, is_graph_output, place_appended, rebind_outputs, replacing
from scanopt.scan_view import ScanView


@dataclass(frozen=True)
class Distances(Match):
    """The body computes, per step, the squared distances of row x_t to every row of Q."""

    query_state: int | None  # index of the pass-through Scan state holding Q [queries, features]
    queries: gs.Tensor | None  # else Q itself: an outer value the body reads


@register_pass
class GemmDistances(ScanPass):
    name = "distances"
    order = 70
    loop_free = True
    summary = ("pairwise squared-distance Scans (skl2onnx) -> one GEMM: ‖x‖² − 2·x·qᵀ + ‖q‖² about the rows' mean in "
               "float64, clamped at 0")

    def match(self, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext) -> Match | Skip:
        if view.batched:
            return Skip("opset-8 batched Scan: distances handles Scan-9+ (the upgrade pass converts it first)")
        body = node.attrs["body"]
        if changing_states(body, view.num_states):
            return Skip("a state changes across iterations: not a map")
        if view.input_directions[0:1] == (1,) or (view.output_directions[0:1] == (1,) and ctx.opset < 10):
            return Skip("a reverse scan input (the rows read backwards): left to vectorize")
        found = find_distances(node, view)
        if found is None:
            metric = _elementwise_metric(node, view)
            if metric:
                return Skip(f"a {metric} distance (ReduceSum of {'Pow(Abs(Sub))' if metric != 'manhattan' else 'Abs(Sub)'}"
                            "): no matrix-product form exists for it; vectorize's broadcast form takes it")
            return Skip("not ReduceSumSquare(Sub(Q, x_t), last axis) with Q invariant and one scan input/output")
        queries = node.inputs[found.query_state] if found.query_state is not None else found.queries
        dtype = ctx.shapes.dtype(node.inputs[view.num_states])
        if view.input_ranks[0] != 2 or ctx.shapes.rank(queries) != 2:
            return Skip("the rows and queries must be matrices [n, features] (Gemm is 2-D)")
        if dtype is None or dtype.type not in (np.float32, np.float64):
            return Skip(f"rows of type {dtype}: float32 and float64 only (the expansion's rounding is stated for those)")
        return found

    def rewrite(self, node: gs.Node, match: Match, level: GraphLevel, ctx: PassContext) -> str:
        assert isinstance(match, Distances)
        graph = level.graph
        view = ScanView.from_gs(node, ctx.opset, ctx.shapes)
        n = view.num_states
        position, start, build = replacing(node, graph, ctx.names)
        e = LiftEmitter(build, ctx.opset, steps=None)
        queries = node.inputs[match.query_state] if match.query_state is not None else match.queries
        rows = node.inputs[n]
        dtype = ctx.shapes.dtype(rows)
        ranking = order_only_topk(node.outputs[n], graph)
        if ranking is not None:  # only TopK's indices are read: the order of ‖x‖² − 2·q·x suffices
            topk, _ = ranking
            topk.inputs[0] = emit_order_scores(e, rows, queries, dtype)
            rebind_outputs(node, list(node.inputs[:n]) + [None], graph)
            for dead in ranking[1]:
                graph.nodes.remove(dead)
            added = place_appended(graph, position, start - 1 - len(ranking[1]))
            return (f"pairwise squared distances ranked by one matrix product ‖x‖² − 2·q·x (centred on the rows' "
                    f"mean, in float64): TopK reads only the order (its values unused), so ‖q‖², the clamp and the "
                    f"Sqrt go ({added} nodes, no Scan left)")
        squared = emit_distances(e, rows, queries, dtype)
        rebind_outputs(node, list(node.inputs[:n]) + [from_processing_order(e, squared, view, 0, 1)], graph)
        added = place_appended(graph, position, start - 1)
        return (f"pairwise squared distances as one matrix product (centred on the rows' mean, in float64), "
                f"clamped at 0 ({added} nodes, no Scan left)")


def _elementwise_metric(node: gs.Node, view) -> str:
    """"manhattan" or "minkowski" when the body's one output is skl2onnx's
    ReduceSum(Abs(Sub)) or ReduceSum(Pow(Abs(Sub), p)), else "": named in the skip reason."""
    body = node.attrs["body"]
    if view.num_scan_outputs != 1:
        return ""
    chain = []
    t = identity_root(body.outputs[view.num_states])
    while len(t.inputs) == 1 and len(chain) < 4:
        chain.append(t.inputs[0].op)
        t = t.inputs[0].inputs[0] if t.inputs[0].inputs else t
        if chain[-1] == "Sub":
            break
    return {("ReduceSum", "Abs", "Sub"): "manhattan", ("ReduceSum", "Pow", "Abs", "Sub"): "minkowski"}.get(tuple(chain), "")


def find_distances(node: gs.Node, view) -> Distances | None:
    """The pattern of the module docstring in ``node``'s body, or None."""
    body = node.attrs["body"]
    n = view.num_states
    if view.num_scan_inputs != 1 or view.num_scan_outputs != 1 or view.input_axes[0] != 0:
        return None
    result = identity_root(body.outputs[n])
    reduce = result.inputs[0] if len(result.inputs) == 1 else None
    if reduce is None or reduce.op != "ReduceSumSquare" or not in_default_domain(reduce.domain):
        return None
    if int(reduce.attrs.get("keepdims", 1)) != 0 or constant_axes(reduce) not in ([1], [-1]):
        return None
    diff = reduce.inputs[0]
    sub = diff.inputs[0] if len(diff.inputs) == 1 else None
    if sub is None or sub.op != "Sub" or len(diff.outputs) != 1:
        return None
    element = body.inputs[n]
    sides = [identity_root(t) for t in sub.inputs]
    if element not in sides:
        return None
    other = sides[1 - sides.index(element)]
    states = [i for i in range(n) if body.inputs[i] is other and identity_root(body.outputs[i]) is other]
    if states:
        return Distances(states[0], None)
    produced = {id(t) for nd in body.nodes for t in nd.outputs}
    if id(other) in produced or any(other is t for t in body.inputs):
        return None
    return Distances(None, other)


def emit_distances(e, rows: gs.Tensor, queries: gs.Tensor, dtype: np.dtype) -> gs.Tensor:
    """[rows, queries] squared distances of ``rows`` [R, F] to ``queries`` [Q, F], clamped at 0,
    in ``dtype`` (computed centred, in float64: the module docstring's numerics).

    One product of augmented operands, [−2q, 1, ‖q‖²] · [x, ‖x‖², 1]ᵀ, so no pass over the
    [Q, R] result but the clamp; the rows' side is constant for a fitted model (onnxruntime
    folds it). Computed as [Q, R] and transposed: the consumer skl2onnx emits is a Transpose
    back to [Q, R], which onnxruntime cancels with this one."""
    rows, queries = _centred(e, rows, queries, dtype)
    one = e.const("one", np.ones([1, 1], np.float64))
    ones_rows = e.op("Expand", [one, _rows_by_one(e, rows)])
    ones_queries = e.op("Expand", [one, _rows_by_one(e, queries)])
    row_side = e.op("Concat", [rows, _sum_squares(e, rows, keep=1), ones_rows], axis=1)
    scaled = e.op("Mul", [queries, e.const("minus_two", np.array(-2, np.float64))])
    query_side = e.op("Concat", [scaled, ones_queries, _sum_squares(e, queries, keep=1)], axis=1)
    # MatMul by the transposed row side, a constant for a fitted model that onnxruntime folds and
    # prepacks (bench_linrec: 0.37 ms against 0.43 ms for Gemm(transB=1) at 2,000 x 64)
    squared = e.op("MatMul", [query_side, e.op("Transpose", [row_side], perm=[1, 0])])  # [Q, R]
    clamped = e.op("Relu", [squared])
    return e.op("Transpose", [_cast(e, clamped, np.float64, dtype)], perm=[1, 0])


def _centred(e, rows: gs.Tensor, queries: gs.Tensor, dtype: np.dtype) -> tuple[gs.Tensor, gs.Tensor]:
    """``rows`` and ``queries`` in float64, less the rows' mean: the expansion's cancellation
    then scales with the data's spread, not its distance from the origin."""
    rows, queries = _cast(e, rows, dtype, np.float64), _cast(e, queries, dtype, np.float64)
    if e.opset >= 18:
        mean = e.op("ReduceMean", [rows, e.ints("axes", [0])], keepdims=1)
    else:
        mean = e.op("ReduceMean", [rows], axes=[0], keepdims=1)
    return e.op("Sub", [rows, mean]), e.op("Sub", [queries, mean])


def _cast(e, x: gs.Tensor, source: np.dtype, target: np.dtype) -> gs.Tensor:
    """``x`` (of dtype ``source``) as ``target``; itself where they agree."""
    if np.dtype(source) == np.dtype(target):
        return x
    return e.op("Cast", [x], to=onnx.helper.np_dtype_to_tensor_dtype(np.dtype(target)))


def order_only_topk(distances: gs.Tensor, graph: gs.Graph) -> tuple[gs.Node, list[gs.Node]] | None:
    """(TopK, the nodes between it and the Scan) when the [rows, queries] distances are read only
    by skl2onnx's ``Transpose → [Sqrt] → TopK(smallest, last axis)`` and TopK's values are read
    by nobody: only the order per query is exposed, else None.

    Sqrt and the clamp are monotone, ‖q‖² is the same along a query's row: none changes the
    order but by merging values closer than the expansion's own rounding (near-ties, which may
    already swap; exact ties of duplicate rows stay exact)."""
    transpose = _only_reader(distances, graph)
    if transpose is None or transpose.op != "Transpose" or list(transpose.attrs.get("perm", [])) != [1, 0]:
        return None
    chain = [transpose]
    reader = _only_reader(transpose.outputs[0], graph)
    if reader is not None and reader.op == "Sqrt":
        chain.append(reader)
        reader = _only_reader(reader.outputs[0], graph)
    if reader is None or reader.op != "TopK" or reader.inputs[0] is not chain[-1].outputs[0]:
        return None
    values = reader.outputs[0]
    if (int(reader.attrs.get("largest", 1)) != 0 or int(reader.attrs.get("axis", -1)) not in (-1, 1)
            or consumers(values) or is_graph_output(values, graph)):
        return None
    return reader, chain


def _only_reader(tensor: gs.Tensor, graph: gs.Graph) -> gs.Node | None:
    """The one default-domain node of ``graph`` reading ``tensor``, which is no graph output."""
    readers = consumers(tensor)
    if len(readers) != 1 or is_graph_output(tensor, graph) or not any(readers[0] is x for x in graph.nodes):
        return None
    return readers[0] if in_default_domain(readers[0].domain) else None


def emit_order_scores(e, rows: gs.Tensor, queries: gs.Tensor, dtype: np.dtype) -> gs.Tensor:
    """[queries, rows] ‖x‖² − 2·q·x (centred, in float64): a query's squared distances less its
    own ‖q‖², in the same order. MatMul + a constant row, which onnxruntime fuses into one Gemm."""
    rows, queries = _centred(e, rows, queries, dtype)
    scaled = e.op("Mul", [queries, e.const("minus_two", np.array(-2, np.float64))])
    product = e.op("MatMul", [scaled, e.op("Transpose", [rows], perm=[1, 0])])
    return e.op("Add", [product, e.op("Transpose", [_sum_squares(e, rows, keep=1)], perm=[1, 0])])


def _rows_by_one(e, x: gs.Tensor) -> gs.Tensor:
    """int64 [rows of x, 1]."""
    return e.op("Concat", [e.slice(e.op("Shape", [x]), [0], [1], [0]), e.ints("one", [1])], axis=0)


def _sum_squares(e, x: gs.Tensor, keep: int) -> gs.Tensor:
    if e.opset >= 18:
        return e.op("ReduceSumSquare", [x, e.ints("axes", [1])], keepdims=keep)
    return e.op("ReduceSumSquare", [x], axes=[1], keepdims=keep)
