"""linattn: a Scan whose state is a matrix per head updated by one of LinearAttention's rules
becomes one ``LinearAttention`` node (opset 27).

Recognized (modules :mod:`algebra`, :mod:`rules`): one state S [*b, dk, dv] (b: none, one axis
taken as the batch, or [B, H]; or stored [*b, dv, dk]), every scan output c·(q·S'), and S'
one of linear, gated, delta, gated_delta in any of the ways the algebra reads. Top-level and
nested Scans of opset 9+ whose model is at opset 27 or more (its own, or ``--target-opset``).

Emitted: the step values (keys, values, queries, decay and β) lifted over all steps by the rules
of :mod:`scanopt.passes.loopfree.lift`, laid out [B, T, H*d] (H = the head axis when b has two
axes, else 1), the decay in log space (Exp(g) gives g, a sigmoid log-sigmoid = −Softplus(−x), a
constant its log), ``scale`` the output's constant (1 where none). onnxruntime 1.32 runs the op
through its function body, whose Reshape refuses an empty batch or zero steps (and so would a
Reshape of ours): the lifted values are padded by one zero step / batch row exactly when that axis
is empty (a zero key adds nothing, a zero log-decay keeps the state) and the outputs sliced back.

Declined with the reason: opset < 27, float16/bfloat16 states (the loop rounds S every step),
float64 (the op takes float, float16, bfloat16), a state whose dk, dv (and H) are not static,
and every body the rules do not prove.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.constexpr import ConstantFolder
from scanopt.emit import INT64_MAX
from scanopt.graph import GraphLevel, identity_root
from scanopt.pass_api import Match, PassContext, ScanPass, Skip, register_pass
from scanopt.passes.linattn.algebra import BodyAlgebra, Lifted, NotAttention
from scanopt.passes.linattn.rules import Rule, classify
from scanopt.passes.loopfree.lift import (
    Declined, LiftEmitter, LiftPlan, Value, changing_states, element_value, emit_nodes, from_processing_order,
    needed_nodes, plan_nodes, to_processing_order,
)
from scanopt.protos import POSITIVE_OPS, SELECTING_OPS, in_default_domain
from scanopt.rewrite import place_appended, rebind_outputs, replacing
from scanopt.scan_view import ScanView

OPSET = 27


@dataclass
class LinattnMatch(Match):
    view: ScanView
    rule: Rule
    plan: LiftPlan
    rank: int
    dk: int
    dv: int
    heads: int  # 1 unless the state has two batch axes [B, H]

    def native_ops(self):
        """LinearAttention, which a portable runtime must convert (scanopt.portable)."""
        return (("LinearAttention", {}, ()),)


@register_pass
class Linattn(ScanPass):
    name = "linattn"
    order = 50
    form = "LinearAttention"
    loop_free = True
    needs_measurement = ("onnxruntime 1.32 CPU runs LinearAttention through its function body (itself a Scan): "
                         "1.1x the time of a one-node loop (issue 32), 0.14-0.24x that of Einsum bodies "
                         "(benchmarks/bench_linattn.py), so only a measurement at the model's shapes can tell")
    summary = "matrix-state linear attention (linear, gated, delta, gated_delta) -> one LinearAttention (opset 27)"

    def match(self, node: gs.Node, view: ScanView, level: GraphLevel, ctx: PassContext) -> Match | Skip:
        if ctx.opset < OPSET:
            return Skip(f"LinearAttention is opset {OPSET}; the model is at opset {ctx.opset} (--target-opset {OPSET} "
                        "moves it)")
        if view.batched:
            return Skip("opset-8 batched Scan")
        body = node.attrs["body"]
        n = view.num_states
        changing = changing_states(body, n)
        if n != 1 or changing != [0]:
            return Skip(f"{n} states ({len(changing)} changing): LinearAttention carries one matrix state")
        s_in, s_out = body.inputs[0], identity_root(body.outputs[0])
        shape = ctx.shapes.shape(s_in) or ctx.shapes.shape(node.inputs[0])
        if shape is None or not 2 <= len(shape) <= 4:
            return Skip("the state's rank is unknown or not 2-4 ([*batch, dk, dv] with at most two batch axes)")
        shape = _static_dims(shape, (s_in, node.inputs[0]), ctx)
        rank = len(shape)
        dtype = ctx.shapes.dtype(s_in) or ctx.shapes.dtype(node.inputs[0])
        if dtype is None or dtype.type != np.float32:
            return Skip(f"the state is {dtype}: LinearAttention here takes float32 states (float16 loops round the "
                        "state every step; float64 is not an input type of the op)")
        if rank == 4 and not isinstance(shape[1], (int, np.integer)):
            return Skip("the head axis of the state [B, H, dk, dv] is not static (q_num_heads needs it)")
        if not all(isinstance(d, (int, np.integer)) and d > 0 for d in shape[-2:]):
            return Skip(f"the state's last two dims {list(shape[-2:])} are not static")
        new_state = {id(t) for t in _identity_chain(body.outputs[0])}
        depends = _depends_on(body, s_in)
        outer = {id(body.inputs[n + j]): (node.inputs[n + j], view.input_axes[j], view.input_directions[j], j)
                 for j in range(view.num_scan_inputs)}
        hoisted: dict = {}
        try:
            update = BodyAlgebra(s_in, set(), lambda t: id(t) in depends, ctx.shapes.shape, rank, outer,
                                 hoisted).read(s_out)
            reader = BodyAlgebra(s_in, new_state, lambda t: id(t) in depends, ctx.shapes.shape, rank, outer, hoisted)
            outputs = [reader.read(t) for t in body.outputs[1:]]
            rule = classify(update, outputs)
        except NotAttention as exc:
            return Skip(f"not linear attention: {exc}")
        dk, dv = (int(shape[-1]), int(shape[-2])) if rule.transposed else (int(shape[-2]), int(shape[-1]))
        scan_inputs = {id(body.inputs[n + j]): node.inputs[n + j] for j in range(view.num_scan_inputs)}
        positive = ctx.options.get("positive_inputs", ())
        for c in rule.decay[1] if rule.decay else ():
            if (_through_views(c.tensor, "Exp") is None and _through_views(c.tensor, "Sigmoid") is None
                    and not _positive(c.tensor, scan_inputs, positive)):
                return Skip(f"the decay '{c.tensor.name}' is not exp(g), a sigmoid or a positive constant: "
                            "LinearAttention takes it in log space, and its log is not known to exist")
        roots = {id(body.inputs[n + j]): element_value(view, j, body.inputs[n + j], ctx.shapes)
                 for j in range(view.num_scan_inputs)}
        wanted = _leaves(rule)
        try:
            plan = plan_nodes(needed_nodes(body, wanted), roots, ctx.opset, ctx.shapes.shape)
        except Declined as exc:
            return Skip(f"the step values are not lifted: {exc}")
        for t in (rule.keys, rule.values) + ((rule.query,) if rule.query is not None else ()):
            if not isinstance(t, Lifted) and plan.value(t, ctx.shapes.shape).rank != rank - 1:
                return Skip(f"'{t.name}' is not a per-head vector of rank {rank - 1}")
        for t in wanted:
            if plan.value(t, ctx.shapes.shape).rank is None:
                return Skip(f"the rank of '{t.name}' is unknown")
        heads = int(shape[1]) if rank == 4 else 1
        return LinattnMatch(view, rule, plan, rank, dk, dv, heads)

    def rewrite(self, node: gs.Node, match: Match, level: GraphLevel, ctx: PassContext) -> str:
        assert isinstance(match, LinattnMatch)
        graph, view, rule, plan = level.graph, match.view, match.rule, match.plan
        position, start, build = replacing(node, graph, ctx.names)
        body = node.attrs["body"]
        n = view.num_states
        log_decays = _log_decay_inputs(rule, {id(body.inputs[n + j]): node.inputs[n + j]
                                              for j in range(view.num_scan_inputs)})
        e = LiftEmitter(build, ctx.opset, steps=lambda: e.length(scanned[0]))
        scanned = [to_processing_order(e, node.inputs[n + j], view, j) for j in range(view.num_scan_inputs)]
        mapping = {id(body.inputs[n + j]): x for j, x in enumerate(scanned)}
        emit_nodes(plan.steps, e, mapping)
        nb = match.rank - 2
        s0 = node.inputs[0]
        if rule.transposed:
            s0 = e.op("Transpose", [s0], perm=list(range(nb)) + [nb + 1, nb])
        heads_of = e.slice(e.op("Shape", [s0]), [0], [nb], [0]) if nb else None

        def lifted(t):
            value = plan.value(t, ctx.shapes.shape)
            x = mapping.get(id(t), t)
            return x if value.per_step else e.over_steps(x, value.rank)

        def vector(t, width):  # [T, *b, d] expanded over the state's batch axes
            x = to_processing_order(e, t.x, view, t.j) if isinstance(t, Lifted) else lifted(t)
            if nb:
                steps = e.length(x)
                x = e.op("Expand", [x, e.op("Concat", [steps, heads_of, e.ints("width", [width])], axis=0)])
            return x

        def coefficient(const, coefs, per_row=False):  # [T, *b] (per_row: [T, *b, dk])
            x = e.const("one", np.asarray(const, np.float32))
            x = e.over_steps(x, 0)
            x = e.pad(x, nb + (1 if per_row else 0))
            for c in coefs:
                value = plan.value(c.tensor, ctx.shapes.shape)
                ci = lifted(c.tensor)
                ci = e.pad(ci, c.context - value.rank)  # broadcast as the body does
                tail = c.context - nb - (1 if per_row else 0)
                ci = e.squeeze(ci, list(range(-tail, 0))) if tail else ci
                x = e.op("Mul", [x, ci])
            shape = [e.length(x)] + ([heads_of] if nb else []) + ([e.ints("dk", [match.dk])] if per_row else [])
            return e.op("Expand", [x, e.op("Concat", shape, axis=0)])

        keys, values = vector(rule.keys, match.dk), vector(rule.values, match.dv)
        query = vector(rule.query, match.dk) if rule.query is not None else keys
        write_const, write_coefs = rule.write
        inputs = [query, keys]
        decay = beta = None
        if rule.name in ("linear", "gated"):
            if write_coefs or write_const != 1.0:
                values = e.op("Mul", [values, e.unsqueeze(coefficient(write_const, write_coefs), [-1])])
        else:
            beta = coefficient(write_const, write_coefs)
        if rule.decay is not None:
            decay = _log_decay(e, rule, coefficient, match, ctx)
        # Pad an empty step or batch axis by one zero row (module docstring), slice it off after.
        lead = 1 + min(nb, 1)  # [T] or [T, B] lead the lifted values
        dims = e.slice(e.op("Shape", [query]), [0], [lead], [0])
        need = e.op("Sub", [e.ints("one", [1] * lead), e.op("Min", [dims, e.ints("one", [1] * lead)])])
        zero = e.const("zero", np.zeros([], np.float32))

        def padded(x, rank):
            pads = e.op("Concat", [e.ints("zero", [0] * rank), need, e.ints("zero", [0] * (rank - lead))], axis=0)
            return e.op("Pad", [x, pads, zero])

        query, keys, values = (padded(x, nb + 2) for x in (query, keys, values))
        decay = None if decay is None else padded(decay, nb + 1 + (1 if rule.per_key_decay else 0))
        beta = None if beta is None else padded(beta, nb + 1)
        if nb:
            pads = e.op("Concat", [e.ints("zero", [0] * (nb + 2)), e.slice(need, [1], [2], [0]),
                                   e.ints("zero", [0] * (nb + 1))], axis=0)
            s0 = e.op("Pad", [s0, pads, zero])
        to_op = _layout(e, nb, match.heads)
        q_op, k_op, v_op = (to_op.packed(x) for x in (query, keys, values))
        s_op = to_op.state(s0)
        g_op = None if decay is None else (to_op.packed(decay) if rule.per_key_decay else to_op.scalar(decay))
        b_op = None if beta is None else to_op.scalar(beta)
        op_inputs = [q_op, k_op, v_op, s_op, g_op if g_op is not None else gs.Variable.empty(),
                     b_op if b_op is not None else gs.Variable.empty()]
        while op_inputs[-1].name == "":
            op_inputs.pop()
        y_op, s_new = e.op("LinearAttention", op_inputs, n_outputs=2, q_num_heads=match.heads,
                           kv_num_heads=match.heads, update_rule=rule.name, scale=float(rule.scale))
        final = to_op.state_back(s_new)
        if nb:
            final = e.op("Slice", [final, e.ints("zero", [0]), e.slice(dims, [1], [2], [0]), e.ints("axes", [0])])
        if rule.transposed:
            final = e.op("Transpose", [final], perm=list(range(nb)) + [nb + 1, nb])
        outputs = []
        if rule.query is not None:
            y = to_op.unpacked(y_op, match.dv)
            y = e.op("Slice", [y, e.ints("zero", [0] * lead), dims, e.ints("axes", list(range(lead)))])
            outputs.append(from_processing_order(e, y, view, 0, match.rank - 1))
        rebind_outputs(node, [final] + outputs, graph)
        for name in log_decays:
            ctx.input_ranges[name] = (None, 0.0, "linattn reads it as a log decay g (the state decays by exp(g) <= 1; "
                                      "past 0 it grows without bound in every form)")
        added = place_appended(graph, position, start - 1)
        where = " (state stored transposed)" if rule.transposed else ""
        decay_kind = " per key" if rule.per_key_decay else ""
        return (f"{rule.name}{decay_kind} linear attention{where} -> LinearAttention (H={match.heads}, dk={match.dk}, "
                f"dv={match.dv}, scale={rule.scale:g}; {added} nodes, no Scan left)")


def _log_decay(e, rule: Rule, coefficient, match, ctx):
    """log a over all steps: [T, *b] (per key: [T, *b, dk])."""
    const, coefs = rule.decay
    terms = []
    if const != 1.0:
        terms.append(coefficient(float(np.log(np.float32(const))), (), rule.per_key_decay))
    for c in coefs:
        exp = _through_views(c.tensor, "Exp")
        if exp is not None:
            arg = exp
            terms.append(_scaled(coefficient, c, arg, match, rule))
            continue
        sig = _through_views(c.tensor, "Sigmoid")
        if sig is not None:
            terms.append(("sigmoid", _scaled(coefficient, c, sig, match, rule)))
            continue
        # behind views, the hoisted Exp of a scan input, a positive constant (_positive): its Log
        terms.append(("log", coefficient(1.0, (c,), rule.per_key_decay)))
    total = None
    for t in terms:
        if isinstance(t, tuple) and t[0] == "log":  # exp(g) behind views: log(exp(g)), within an ulp of g
            t = e.op("Log", [t[1]])
        elif isinstance(t, tuple):  # log sigmoid(x) = -softplus(-x)
            t = e.op("Neg", [e.op("Softplus", [e.op("Neg", [t[1]])])])
        total = t if total is None else e.op("Add", [total, t])
    return total


def _scaled(coefficient, c, arg, match, rule):
    from scanopt.passes.linattn.algebra import Coef

    return coefficient(1.0, (Coef(arg, c.key, c.per_row, c.context),), rule.per_key_decay)


def _through_views(t: gs.Tensor, op: str):
    """x when ``t`` is op(x) (through Identity, Unsqueeze, Squeeze applied after it), else None.
    Views after the op keep the elements, so the log of the view is the view of x: ``t``'s
    shape is what the coefficient broadcasts by, so x must have t's shape: only a direct op."""
    node = t.inputs[0] if len(t.inputs) == 1 else None
    if node is not None and node.op == op and in_default_domain(node.domain):
        return node.inputs[0]
    return None


def _positive(t: gs.Tensor, scan_inputs: dict, positive_inputs=()) -> bool:
    """True when every element of ``t`` is exp(x), sigmoid(x) or softplus(x) (positive, or 0
    where it underflows: its log -inf decays to 0 as the loop's 0 does), a positive constant, or
    a graph input named in ``positive_inputs`` (a function body's input every caller passes a
    sigmoid or exp output: scanopt.functions.positive_inputs), read through ops that only select
    elements (views, Transpose, Slice, Gather, Split...) and from a scan input to the outer
    tensor it slices (``scan_inputs``: id of the body input -> outer input): a decay that hoist
    moved out of the loop as ``Exp`` of the whole sequence."""
    found = _selected_from(t, scan_inputs, stop=POSITIVE_OPS)
    if isinstance(found, gs.Node):
        return True
    if isinstance(found, gs.Variable) and not found.inputs and found.name and found.name in positive_inputs:
        return True
    value = None if found is None else ConstantFolder().value(found)
    return value is not None and np.asarray(value).size > 0 and np.asarray(value).dtype.kind == "f" \
        and bool(np.all(np.asarray(value) > 0))


def _selected_from(t: gs.Tensor, scan_inputs: dict, stop=()):
    """Where the elements of ``t`` come from, through SELECTING_OPS and scan inputs:
    the first node of an op in ``stop``, else the tensor reached (a constant, a graph input, a
    computed value), or None past 64 steps."""
    for _ in range(64):
        if id(t) in scan_inputs:
            t = scan_inputs[id(t)]
            continue
        node = t.inputs[0] if len(t.inputs) == 1 else None
        if node is None or not in_default_domain(node.domain) or not node.inputs:
            return t
        if node.op in stop:
            return node
        if node.op not in SELECTING_OPS or ConstantFolder().value(t) is not None:
            return t
        t = node.inputs[0]
    return None


def _log_decay_inputs(rule: Rule, scan_inputs: dict) -> list[str]:
    """Names of the graph inputs the decay is exp() of, elements selected as they are (the
    builders' and model builders' ``g`` fed as it is): drawn <= 0 in verification."""
    names = []
    for c in rule.decay[1] if rule.decay else ():
        exp = _selected_from(c.tensor, scan_inputs, stop=("Exp",))
        if isinstance(exp, gs.Node):
            source = _selected_from(exp.inputs[0], scan_inputs)
            if isinstance(source, gs.Variable) and not source.inputs and source.name:
                names.append(source.name)
    return names


class _layout:
    """Between [T, *b, d] (processing order) and the op's [B, T, H*d] and [B, H, dk, dv]."""

    def __init__(self, e, nb: int, heads: int):
        self.e, self.nb, self.heads = e, nb, heads

    def packed(self, x):
        e = self.e
        if self.nb == 0:
            return e.unsqueeze(x, [0])
        if self.nb == 1:
            return e.op("Transpose", [x], perm=[1, 0, 2])
        x = e.op("Transpose", [x], perm=[1, 0, 2, 3])
        width = e.op("Mul", [e.slice(e.op("Shape", [x]), [3], [4], [0]), e.ints("heads", [self.heads])])
        return e.op("Reshape", [x, e.op("Concat", [e.ints("bt", [0, 0]), width], axis=0)])

    def scalar(self, x):  # [T, *b] -> [B, T, H]
        e = self.e
        if self.nb == 0:
            return e.unsqueeze(x, [0, 2])
        if self.nb == 1:
            return e.unsqueeze(e.op("Transpose", [x], perm=[1, 0]), [2])
        return e.op("Transpose", [x], perm=[1, 0, 2])

    def state(self, s):
        if self.nb == 2:
            return s
        return self.e.unsqueeze(s, [0, 1] if self.nb == 0 else [1])

    def state_back(self, s):
        if self.nb == 2:
            return s
        return self.e.squeeze(s, [0, 1] if self.nb == 0 else [1])

    def unpacked(self, y, dv: int):  # [B, T, H*dv] -> [T, *b, dv]
        e = self.e
        if self.nb == 0:
            return e.squeeze(y, [0])
        if self.nb == 1:
            return e.op("Transpose", [y], perm=[1, 0, 2])
        y = e.op("Reshape", [y, e.ints("bthd", [0, 0, self.heads, dv])])
        return e.op("Transpose", [y], perm=[1, 0, 2, 3])


def _static_dims(shape: list, tensors, ctx: PassContext) -> list:
    """``shape`` with each dim that is not a number taken from where the model fixes it: the
    declared or inferred type of the state (the body's, the outer initial value's), else the dims
    the model's ops prove equal to a fixed size (``ConstantOfShape(Concat(Shape(q)[1], ...))``:
    TorchScript's zero state of a loop is sized from its inputs' shapes)."""
    found = list(shape)
    for axis, d in enumerate(found):
        if isinstance(d, (int, np.integer)) and d > 0:
            continue
        for t in tensors:
            declared = ctx.shapes.type_of(t.name)[1]
            size = declared[axis] if declared is not None and len(declared) == len(found) else None
            if not (isinstance(size, (int, np.integer)) and size > 0):
                size = ctx.shapes.dims.size(t.name, axis)
            if isinstance(size, (int, np.integer)) and size > 0:
                found[axis] = int(size)
                break
    return found


def _leaves(rule: Rule) -> list[gs.Tensor]:
    """The body values the rewrite lifts (a :class:`Lifted` vector is outside already)."""
    found = [t for t in (rule.keys, rule.values) + ((rule.query,) if rule.query is not None else ())
             if not isinstance(t, Lifted)]
    found += [c.tensor for c in rule.write[1]]
    for c in (rule.decay[1] if rule.decay else ()):
        arg = _through_views(c.tensor, "Exp") or _through_views(c.tensor, "Sigmoid")
        found.append(arg if arg is not None else c.tensor)
    return found


def _identity_chain(t: gs.Tensor) -> list[gs.Tensor]:
    chain = [t]
    while chain[-1] is not identity_root(chain[-1]):
        chain.append(chain[-1].inputs[0].inputs[0])
    return chain


def _depends_on(body: gs.Graph, state: gs.Tensor) -> set[int]:
    """id() of the body values computed from ``state``."""
    found = {id(state)}
    for nd in body.nodes:
        if any(id(t) in found for t in nd.inputs):
            found.update(id(t) for t in nd.outputs)
    return found
