"""What ``--target portable`` writes so that a runtime other than onnxruntime loads and runs it.

The runtime checked is OpenVINO's CPU runtime (2026.4; ``benchmarks/check_openvino.py`` runs
every sample and the shared table's models through it, ``tests/test_portable.py`` pins each
construct below). onnxruntime takes every construct listed here; OpenVINO does not:

Scans (its ONNX frontend makes each a TensorIterator):
- A Scan body may read from enclosing graphs only constants (initializers, Constant nodes). A
  graph input or computed value read there fails the conversion ("Conversion is failed for:
  Scan-17": the frontend counts it as a body input the Scan node does not feed).
- Each body input needs its element type declared: the frontend gives a scan input's body
  input the shape of the slice but not its type, so an untyped one stays dynamic and the CPU
  plugin refuses the model ("Memory has not been allocated", "object is not initialized", a
  ReduceSum "Unsupported input type dynamic" downstream).
- Scans loop_to_scan made of the loops a form chose (linrec's chunk loops) were the two cases
  above, and a two-pass one ran wrong where its Loop runs right: under portable those loops
  stay Loops (passes/loop_to_scan; the Loop form is 10-20% slower on onnxruntime there).
- A select of a final state read off fuse's empty-input If (``Where(T > 0, Squeeze(Y_h), h0)``)
  beside other loops came back as garbage; fuse writes that If's empty branch as the initial
  states instead, with no select after it (passes/fuse/glue.py; for every target now).
- fuse's per-step LSTM cell state read its gates off one product of that If's Y over all
  gates, sliced: wrong on every run whose shapes grew OpenVINO's memory (a product of an If's
  output wider than it, added to another); under portable one product pair per gate
  (passes/fuse/cell_states.py).
- An If whose branches give outputs of different ranks does not load; loop_to_scan's zero-step
  guard gives its empty branch the result's rank for every target (passes/loop_to_scan/zero_steps.py).
Native ops (:func:`native_refusal`):
- LinearAttention (opset 27): no conversion ("No conversion rule found for operations:
  LinearAttention-27"), so linattn is not applied; the Scan is left to the other forms.
- RNN, GRU and LSTM run with the activations Sigmoid, Tanh and Relu only; any other
  (LeakyRelu, Softsign, HardSigmoid, Affine, ...) and the model does not load.
- LSTM's ``input_forget=1`` and its peepholes (input P) are ignored: the outputs are wrong.

Under ``--target portable`` (the pipeline sets ``options["portable_output"]`` from :func:`written_for`;
the option ``portable_runtimes=["onnxruntime"]`` (the CLI's ``--portable-runtime onnxruntime``)
or ``[]`` turns this off and leaves target portable's other meaning, every proven form applied,
which tests of a form's rewrite use):
:func:`make_portable` runs after the passes and writes every Scan so (each non-constant value
its body reads from outside becomes an initializer where constants compute it, else a state
the body passes through unchanged, one Identity copy per step; each untyped body input gets the
type of the value it is bound to), and the
chooser does not apply a form whose native op :func:`native_refusal` refuses (the report says
why; the loop, or the next form, stays). The default target (onnxruntime) writes neither.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx_graphsurgeon as gs

from scanopt.constexpr import ConstantFolder
from scanopt.graph import dtype_of, is_op, node_label, outer_captures, walk_graphs
from scanopt.pass_api import NodeOutcome, PassContext, scan_nodes
from scanopt.rewrite import stored_in

NAME = "portable"  # the report's name for these edits (a tidy step, like cleanup)
RUNTIME = "OpenVINO's CPU runtime"
OPENVINO_ACTIVATIONS = ("Sigmoid", "Tanh", "Relu")
RUNTIMES = ("onnxruntime", "openvino")  # what options["portable_runtimes"] may name (the CLI's --portable-runtime)
# ops OpenVINO's ONNX frontend has no conversion for ("No conversion rule found for operations"):
# op -> the opset that defines it
OPENVINO_UNCONVERTED = {"LinearAttention": 27}
OPENVINO_CHECKED = "OpenVINO 2026.4"
FOLD_MAX_ELEMENTS = 1 << 22  # a captured constant expression up to this size becomes an initializer


def written_for(options: dict) -> tuple[str, ...]:
    """The runtimes a run's output must run in besides the default target's onnxruntime: with
    target portable, ``options["portable_runtimes"]`` (None: every one in RUNTIMES; [] or
    onnxruntime alone: none beyond it, which keeps target portable's other meaning, every
    proven form applied), else none."""
    if options.get("target") != "portable":
        return ()
    given = options.get("portable_runtimes")
    if given is None:
        given = RUNTIMES
    unknown = [r for r in given if r not in RUNTIMES]
    if unknown:
        from scanopt.errors import InvalidArgumentError

        raise InvalidArgumentError(f"unknown portable runtime {unknown[0]!r} (option 'portable_runtimes': "
                                   f"choose from {', '.join(RUNTIMES)})")
    return tuple(r for r in dict.fromkeys(given) if r != "onnxruntime")


def native_refusal(op: str, attrs: dict, optional_inputs: tuple[str, ...] = ()) -> str | None:
    """Why a portable runtime does not run the native op ``op`` (a recurrent op, LinearAttention) with ``attrs`` (and
    the optional inputs named in ``optional_inputs``, e.g. ``("P",)``) as onnxruntime does, or
    None where it does."""
    if op in OPENVINO_UNCONVERTED:
        return (f"{OPENVINO_CHECKED} has no conversion for {op}-{OPENVINO_UNCONVERTED[op]} "
                f"(--portable-runtime onnxruntime writes it)")
    others = [a for a in attrs.get("activations", ()) if a not in OPENVINO_ACTIVATIONS]
    if others:
        return (f"{RUNTIME} does not load {op} with the {others[0]} activation (it runs "
                f"{', '.join(OPENVINO_ACTIVATIONS)} only)")
    if op == "LSTM" and attrs.get("input_forget"):
        return f"{RUNTIME} ignores LSTM's input_forget=1 (coupled input and forget gates): wrong outputs"
    if op == "LSTM" and "P" in optional_inputs:
        return f"{RUNTIME} ignores LSTM's peepholes (input P): wrong outputs"
    return None


def match_refusal(match) -> str | None:
    """Why a portable runtime would not run what ``match`` (a form's proposal) writes, or None:
    each native op the form says it writes (``Match.native_ops``) checked."""
    for op, attrs, optional in match.native_ops():
        why = native_refusal(op, attrs, tuple(optional))
        if why is not None:
            return why
    return None


def make_portable(graph: gs.Graph, ctx: PassContext, infer: Callable[[], object] | None = None) -> list[NodeOutcome]:
    """Write every Scan of ``graph`` (any depth) the way the module docstring says; one applied
    outcome per Scan changed. ``infer()`` gives a ShapeTable of the graph as it now is, asked
    only for a value whose element type neither gs nor the run's table knows (a value a
    rewrite emitted). A Scan-8 keeps its captures (a state there has a batch axis the
    captured value lacks); a Scan whose label is denied ``portable`` is left as it is."""
    outcomes = []
    table = []  # the inferred ShapeTable, made once when first needed
    folder = ConstantFolder(ctx.opset)

    def dtype(t: gs.Tensor, *names: str):
        found = dtype_of(t) or ctx.shapes.dtype(t)
        if found is None and infer is not None:
            if not table:
                table.append(infer())
            for name in (t.name,) + names:
                elem = table[0].elem_type_of(name) if table[0] is not None else None
                if elem:
                    found = _np(elem)
                    break
        return found

    for level, node in list(scan_nodes(graph)):  # outermost first: an outer Scan's new states reach inner ones
        label = node_label(node)
        if (NAME, label) in ctx.denied or not node.outputs:
            continue
        done = []
        if ctx.opset >= 9 and _as_counted_loop(node, level.graph, ctx, dtype):
            outcomes.append(NodeOutcome(NAME, label, level.path, True,
                                        f"the body reads no scan element: written as a Loop of the scan inputs' "
                                        f"length ({RUNTIME} runs such a Scan once)"))
            continue
        folded = _fold_captures(node, graph, ctx, folder)
        if folded:
            done.append(f"the body read {_names(folded)} from outside, computed from constants: read as "
                        f"initializer(s) ({RUNTIME}'s Scan reads only constants from enclosing graphs)")
        if ctx.opset >= 9:
            passed = _pass_captures_in(node, ctx, dtype)
            if passed:
                done.append(f"the body read {_names(passed)} from outside: passed in as state(s) it passes through "
                            f"unchanged ({RUNTIME}'s Scan reads only constants from enclosing graphs)")
        typed = _type_body_inputs(node, dtype)
        if typed:
            done.append(f"declared the element type of body input(s) {_names(typed)} ({RUNTIME} needs it)")
        if done:
            outcomes.append(NodeOutcome(NAME, label, level.path, True, "; ".join(done)))
    outcomes += _copy_outputs_read_in_bodies(graph, ctx)
    return outcomes


def _copy_outputs_read_in_bodies(graph: gs.Graph, ctx: PassContext) -> list[NodeOutcome]:
    """Nodes in bodies read a copy (an Identity in the main graph) of each value that is also
    a graph output: OpenVINO's ONNX frontend (its default graph iterator; ``ONNX_ITERATOR=0``
    loads it) refused a fallback Scan inside an If that read a graph output ("'then' and 'else'
    branches have to have the same number of outputs"), and read a copy it loaded."""
    if (NAME, "graph outputs") in ctx.denied:
        return []
    top = {id(n) for n in graph.nodes}
    copied = []
    for value in {id(t): t for t in graph.outputs}.values():
        inside = [n for n in value.outputs if id(n) not in top]
        if not inside or _is_constant(value):
            continue
        copy = gs.Variable(ctx.names.fresh(f"{value.name}_read"), dtype=value.dtype, shape=value.shape)
        for reader in inside:
            for i, t in enumerate(reader.inputs):
                if t is value:
                    reader.inputs[i] = copy
        node = gs.Node("Identity", name=ctx.names.fresh(f"{value.name}_copy"), inputs=[value], outputs=[copy])
        producer = value.inputs[0] if len(value.inputs) == 1 else None
        at = next((i + 1 for i, n in enumerate(graph.nodes) if n is producer), 0)
        graph.nodes.insert(at, node)
        top.add(id(node))
        copied.append(value)
    if not copied:
        return []
    return [NodeOutcome(NAME, "graph outputs", "", True,
                        f"bodies read {_names(copied)} through a copy: {RUNTIME} refused an If whose branch read a "
                        f"graph output")]


def _as_counted_loop(node: gs.Node, graph: gs.Graph, ctx: PassContext, dtype) -> bool:
    """A Scan whose body reads none of its scan elements (a counter split off beside a fused
    cell, say) becomes ``Loop(M = its scan inputs' length)`` over the same states, its scan
    outputs the Loop's stacked ones; done where each scan output is stacked forward on axis 0
    (a Loop's only way). Whether done."""
    body = node.attrs["body"]
    n_scan = int(node.attrs["num_scan_inputs"])
    n_states = len(node.inputs) - n_scan
    elements = body.inputs[n_states:]
    if n_scan == 0 or any(t.outputs for t in elements) or any(o is t for o in body.outputs for t in elements):
        return False
    n_out = len(body.outputs) - n_states
    axes = node.attrs.get("scan_output_axes", [0] * n_out)
    ranks = [_rank_or(body.outputs[n_states + k], None) for k in range(n_out)]  # -(rank + 1) is axis 0 too
    if any(int(a) != 0 and (r is None or int(a) != -r - 1) for a, r in zip(axes, ranks)):
        return False
    if any(int(d) for d in node.attrs.get("scan_output_directions", [])):
        return False
    source = node.inputs[n_states]
    axis = int(node.attrs.get("scan_input_axes", [0] * n_scan)[0])
    if axis < 0:
        rank = _rank_or(source, None)
        if rank is None:
            return False
        axis += rank
    shape = gs.Variable(ctx.names.fresh("loop_shape"), dtype=np.int64, shape=[None])
    trips = gs.Variable(ctx.names.fresh("loop_trips"), dtype=np.int64, shape=[])
    where = gs.Constant(ctx.names.fresh("loop_axis"), np.asarray(axis, np.int64))
    step = gs.Variable(ctx.names.fresh("loop_step"), dtype=np.int64, shape=[])
    cond = gs.Variable(ctx.names.fresh("loop_cond"), dtype=np.bool_, shape=[])
    cond_out = gs.Variable(ctx.names.fresh("loop_cond_out"), dtype=np.bool_, shape=[])
    for inner, outer in zip(body.inputs[:n_states], node.inputs[:n_states]):
        if dtype_of(inner) is None:
            inner.dtype = dtype(outer, inner.name)
    body.nodes.append(gs.Node("Identity", name=ctx.names.fresh("loop_keep_going"), inputs=[cond], outputs=[cond_out]))
    body.inputs[:] = [step, cond] + body.inputs[:n_states]
    body.outputs[:] = [cond_out] + body.outputs
    at = next(i for i, n in enumerate(graph.nodes) if n is node)
    count = [gs.Node("Shape", name=ctx.names.fresh("loop_shape"), inputs=[source], outputs=[shape]),
             gs.Node("Gather", name=ctx.names.fresh("loop_length"), attrs={"axis": 0}, inputs=[shape, where],
                     outputs=[trips])]
    states, outputs = list(node.inputs[:n_states]), list(node.outputs)
    node.inputs.clear()
    node.outputs.clear()
    loop = gs.Node("Loop", name=node.name, inputs=[trips, gs.Variable.empty()] + states, outputs=outputs,
                   attrs={"body": body})
    graph.nodes[at:at + 1] = count + [loop]
    return True


def _rank_or(t: gs.Tensor, default):
    return len(t.shape) if t.shape is not None else default


def _fold_captures(node: gs.Node, top: gs.Graph, ctx: PassContext, folder: ConstantFolder) -> list[gs.Tensor]:
    """Each non-constant value the Scan body reads from outside that a constant subgraph
    computes (a weight hoisted out of the loop, ``Sigmoid(w)`` lifted by linrec), up to
    FOLD_MAX_ELEMENTS, read as a new initializer instead: no copy per step."""
    body = node.attrs["body"]
    folded = []
    inside = None
    for value in outer_captures(body):
        if _is_constant(value):
            continue
        array = folder.value(value)
        if array is None or array.size > FOLD_MAX_ELEMENTS:
            continue
        inside = inside or {id(n) for level in walk_graphs(body) for n in level.graph.nodes}
        const = gs.Constant(ctx.names.fresh(f"{value.name}_folded"), np.asarray(array))
        stored_in(top, [const])
        for reader in list(value.outputs):
            if id(reader) in inside:
                for i, t in enumerate(reader.inputs):
                    if t is value:
                        reader.inputs[i] = const
        folded.append(value)
    return folded


def _pass_captures_in(node: gs.Node, ctx: PassContext, dtype) -> list[gs.Tensor]:
    """Make each non-constant value the Scan body reads from outside a pass-through state."""
    body = node.attrs["body"]
    captured = [t for t in outer_captures(body) if not _is_constant(t)]
    if not captured:
        return []
    inside = {id(n) for level in walk_graphs(body) for n in level.graph.nodes}
    n_states = len(node.inputs) - int(node.attrs["num_scan_inputs"])
    for k, value in enumerate(captured):
        kind = dtype(value)
        shape = value.shape
        state = gs.Variable(ctx.names.fresh(f"{value.name}_in"), dtype=kind, shape=shape)
        copy = gs.Variable(ctx.names.fresh(f"{value.name}_through"), dtype=kind, shape=shape)
        for reader in list(value.outputs):
            if id(reader) in inside:
                for i, t in enumerate(reader.inputs):
                    if t is value:
                        reader.inputs[i] = state
        for i, t in enumerate(body.outputs):  # a body output must be computed in the body
            if t is value:
                body.outputs[i] = _identity(body, ctx, state, kind, shape, f"{value.name}_out")
        body.nodes.append(gs.Node("Identity", name=ctx.names.fresh(f"{value.name}_pass"), inputs=[state],
                                  outputs=[copy]))
        at = n_states + k
        body.inputs.insert(at, state)
        body.outputs.insert(at, copy)
        node.inputs.insert(at, value)
        node.outputs.insert(at, gs.Variable(ctx.names.fresh(f"{value.name}_final"), dtype=kind, shape=shape))
    return captured


def _type_body_inputs(node: gs.Node, dtype) -> list[gs.Tensor]:
    """Give each body input without an element type the type of the value it is bound to."""
    body = node.attrs["body"]
    typed = []
    for inner, outer in zip(body.inputs, node.inputs):
        if dtype_of(inner) is not None:
            continue
        found = dtype(outer, inner.name)
        if found is not None:
            inner.dtype = found
            typed.append(inner)
    return typed


def _identity(body: gs.Graph, ctx: PassContext, value: gs.Tensor, kind, shape, hint: str) -> gs.Variable:
    out = gs.Variable(ctx.names.fresh(hint), dtype=kind, shape=shape)
    body.nodes.append(gs.Node("Identity", name=ctx.names.fresh(f"{hint}_copy"), inputs=[value], outputs=[out]))
    return out


def _is_constant(t: gs.Tensor) -> bool:
    """An initializer or a Constant node's value: what OpenVINO reads from an enclosing graph."""
    return isinstance(t, gs.Constant) or (len(t.inputs) == 1 and is_op(t.inputs[0], "Constant"))


def _np(elem: int) -> np.dtype | None:
    import onnx

    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem))
    except (KeyError, TypeError, ValueError):
        return None


def _names(values: list[gs.Tensor]) -> str:
    return ", ".join(f"'{v.name}'" for v in values)
