"""Moving a whole model to a newer opset (:func:`migrate`), and why in this order. A Scan-9 is valid only in a model
whose opset is >= 9, onnx.version_converter cannot convert a Scan-8 (it refuses
``sequence_lens`` and, for batch > 1 or a symbolic batch, drops the batch axis from the
graph's inputs), and it would re-convert anything already written at the target opset
(its Scan 8->9 adapter fires on every node named Scan). So:

1. The upgrade pass rewrites every Scan-8, at every level, while the model is still at
   its source opset. Every node it emits is written at the *target* opset and put in
   the private domain :data:`HOLD_DOMAIN`, which the converter leaves alone. The
   original Scan-8 bodies stay in the default domain, inside held nodes.
2. onnx.version_converter moves the model from the source to the target opset. It
   converts default-domain nodes at every level it can reach, and it does not enter the
   bodies of held nodes; so each body of a held node is lifted into a model of its own
   (its outer-scope reads become typed inputs), converted, and put back, recursively.
3. Held nodes return to the default domain, the opset import says the target, and the
   names the converter invented are made unique model-wide (onnx 1.23's converter
   reuses ``_v_N`` names in nested graphs, which breaks SSA).

Around the converter: ops it converts wrongly are rewritten first by
:mod:`scanopt.opset_adapters` (held like the upgrade pass's nodes); an IR-3 model moves to
IR 4 before converting (the converter takes an initializer IR 3 does not list as a graph
input for undefined: the upgrade pass's Squeeze axes from opset 13); the graph's declared
inputs and outputs are put back (the converter writes the shapes it inferred into them).
The caller verifies the result numerically against the original; tests/test_upgrade_matrix.py
proves every op family at every nesting level.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import onnx

from scanopt.emit import HOLD_DOMAIN, MIN_TARGET, NEWEST_TARGET
from scanopt.errors import ScanoptError, UnsupportedModelError
from scanopt.external_data import has_marks, hollow
from scanopt.graph import NameAllocator
from scanopt.opset_adapters import adapt
from scanopt.pass_api import NodeOutcome
from scanopt.protos import attribute_graphs, in_default_domain, outer_names, walk_proto_graphs

# -- migration -------------------------------------------------------------------------


@dataclass
class Migration:
    """The migrated model and what the upgrade pass did to each Scan-8."""

    model: onnx.ModelProto
    source_opset: int
    target_opset: int
    outcomes: list = field(default_factory=list)  # NodeOutcome per Scan-8
    verification: dict | None = None  # set by migrate_verified

    @property
    def changed(self) -> bool:
        return self.source_opset != self.target_opset


@functools.lru_cache(maxsize=None)
def newest_target() -> int:
    """The newest opset scanopt migrates to: the newest the installed onnx knows that the
    installed onnxruntime also loads (probed once with a one-node model, never assumed
    per release: onnxruntime 1.31 stops at 26, 1.32 loads 28)."""
    try:
        import onnxruntime as ort
    except ImportError:  # pragma: no cover - onnxruntime is a dependency
        return NEWEST_TARGET
    options = ort.SessionOptions()
    options.log_severity_level = 4
    for opset in range(NEWEST_TARGET, MIN_TARGET - 1, -1):
        value = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
        graph = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["x"], ["y"])], "probe", [value],
                                       [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])])
        probe = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)], ir_version=7)
        try:
            ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
        except Exception:  # noqa: BLE001 - onnxruntime's errors share no useful base class
            continue
        return opset
    return MIN_TARGET


def check_target(source: int | None, target: int) -> None:
    """Raise a ScanoptError unless ``target`` is a valid migration target for ``source``."""
    if not MIN_TARGET <= target <= newest_target():
        raise ScanoptError(
            f"--target-opset {target} is out of range: scanopt moves models to opsets "
            f"{MIN_TARGET}..{newest_target()} (the newest that the installed onnxruntime loads)"
        )
    if source is None:
        raise UnsupportedModelError("the model imports no ai.onnx opset; there is nothing to migrate")


def migrate(
    model: onnx.ModelProto, target_opset: int, *, options: dict | None = None, denied: frozenset = frozenset()
) -> Migration:
    """``model`` moved to ``target_opset``: every Scan-8 rewritten by the upgrade pass,
    every other op converted by onnx.version_converter. Not verified numerically here.

    Raises ScanoptError (nothing returned) when a Scan-8 cannot be rewritten or the
    converter cannot convert some other op. ``options``: pass options (e.g.
    ``upgrade_strategy``). ``denied``: (pass, node) pairs whose rewrite failed
    verification; such a Scan-8 cannot stay, so that is an error too.
    """
    from scanopt.validate import default_opset

    source = default_opset(model)
    check_target(source, target_opset)
    if source == target_opset:
        return Migration(model, source, target_opset)
    if target_opset < source:
        check_lowering(model, source, target_opset)
    staged, outcomes = _rewrite_scan8(model, source, target_opset, dict(options or {}), denied)
    adapted: list = []
    converted = _convert(staged, model, source, target_opset, adapted)
    outcomes += [NodeOutcome("linattn", node, path, True, line) for path, node, line in adapted]
    return Migration(converted, source, target_opset, outcomes)


# ops scanopt writes in an older form itself when a model moves below their opset (opset_adapters)
LOWERED_BY_SCANOPT = {"LinearAttention"}


def check_lowering(model: onnx.ModelProto, source: int, target: int) -> None:
    """Raise a ScanoptError unless ``model`` can move down from ``source`` to ``target``: every
    default-domain op, at every level, has the same form at ``target`` (the same schema, or a
    newer one that only takes more types: same inputs, outputs and attributes with their
    defaults), or is one scanopt writes in an older form itself (LinearAttention as a Scan).
    The model is then only renumbered (:func:`_renumbered`), and verification checks the values."""
    seen: set = set()
    for g in walk_proto_graphs(model.graph):
        for node in g.node:
            op = node.op_type
            key = (op, frozenset(a.name for a in node.attribute if (op, a.name) in INERT_WHEN_UNSET))
            if key in seen or not in_default_domain(node.domain) or op in LOWERED_BY_SCANOPT:
                continue
            seen.add(key)
            problem = _changed_form(op, source, target, key[1])
            if problem:
                raise ScanoptError(f"the model is at opset {source}; scanopt does not lower it to {target}: "
                                   f"{problem} (scanopt lowers a model only where its ops keep their form, "
                                   "and writes LinearAttention as a Scan)")


# attributes added to an op that, left unset, change nothing for the types its older forms take
# (Range-27's stash_type: "Has no effect for other types" than float16/bfloat16, which Range-11 lacks)
INERT_WHEN_UNSET = {("Range", "stash_type")}


def _changed_form(op: str, source: int, target: int, set_attrs: frozenset = frozenset()) -> str | None:
    """Why ``op`` at ``source`` is not the same op at ``target``, or None. ``set_attrs``: the
    node's attributes among :data:`INERT_WHEN_UNSET` (the others of that set are left out)."""
    try:
        new = onnx.defs.get_schema(op, source)
    except onnx.defs.SchemaError:
        return None  # not an onnx op: the converter and the checker say what it is
    try:
        old = onnx.defs.get_schema(op, target)
    except onnx.defs.SchemaError:
        return f"'{op}' (opset {new.since_version}) does not exist at opset {target}"
    if old.since_version == new.since_version:
        return None

    def form(schema):
        params = [(p.name, p.option, p.is_homogeneous) for p in list(schema.inputs) + list(schema.outputs)]
        attrs = sorted((name, a.type, a.required, a.default_value.SerializeToString())
                       for name, a in schema.attributes.items()
                       if (op, name) not in INERT_WHEN_UNSET or name in set_attrs)
        return params, attrs, schema.min_input, schema.max_input, schema.min_output, schema.max_output

    if form(old) == form(new):
        return None
    versions = sorted({s.since_version for s in onnx.defs.get_all_schemas_with_history()
                       if s.name == op and in_default_domain(s.domain)
                       and old.since_version < s.since_version <= source})
    for version in versions:  # the first one whose form differs from the target's: where it changed
        if form(onnx.defs.get_schema(op, version)) != form(old):
            return f"'{op}' changed form at opset {version} (its opset-{old.since_version} form differs)"
    return None  # pragma: no cover - the newest one differs


def migrate_verified(
    model: onnx.ModelProto,
    target_opset: int,
    *,
    options: dict | None = None,
    verify: bool = True,
    inputs=None,
    engine: str = "auto",
    seeds: int = 2,
) -> Migration:
    """:func:`migrate`, then compare the result with ``model`` numerically.

    A migration is all or nothing (a Scan-8 cannot stay in an opset-9+ model), so a
    failed comparison raises VerificationError instead of rolling anything back.
    """
    from scanopt.errors import VerificationError

    migration = migrate(model, target_opset, options=options)
    if not migration.changed:
        return migration
    if not verify:
        migration.verification = {"passed": None, "summary": "not verified (verification disabled)"}
        return migration
    from scanopt.verify import compare_models

    result = compare_models(model, migration.model, inputs=inputs, engine=engine, seeds=seeds,
                            input_ranges=_lowered_input_ranges(model, migration))
    migration.verification = {"passed": result.passed, "summary": result.summary(), "details": result.to_dict()}
    if not result.passed:
        raise VerificationError(
            f"the model moved to opset {target_opset} is not equivalent to the original "
            f"({result.summary()}); nothing written"
        )
    return migration


def _lowered_input_ranges(model: onnx.ModelProto, migration: Migration) -> dict | None:
    """The ranges the inputs of a lowered LinearAttention are meant for (its log decay <= 0, its
    beta in [0, 1]), where graph inputs feed them as they are: verification draws them there."""
    if not migration.target_opset < 27 <= migration.source_opset:
        return None
    from scanopt.passes.linattn.to_scan import INPUT_RANGES

    fed = {v.name for v in model.graph.input}
    ranges = {}
    for g in walk_proto_graphs(model.graph):
        for node in g.node:
            if node.op_type == "LinearAttention" and in_default_domain(node.domain):
                for index, bounds in INPUT_RANGES.items():
                    if index < len(node.input) and node.input[index] in fed:
                        ranges[node.input[index]] = bounds
    return ranges or None


def _rewrite_scan8(model, source: int, target: int, options: dict, denied: frozenset):
    from scanopt.graph import is_topologically_sorted, walk_graphs
    from scanopt.ir import export_model, import_model
    from scanopt.pass_api import PassContext, registered_passes, scan_nodes
    from scanopt.shapes import ShapeTable

    if source != 8:  # Scan-8 exists only at opset 8
        return model, []
    graph = import_model(model)
    if not any(True for _ in scan_nodes(graph)):
        return model, []
    upgrade = registered_passes()["upgrade"]()
    ctx = PassContext(
        opset=source,
        names=NameAllocator(graph),
        shapes=ShapeTable(model),
        options={**options, "target_opset": target},
        denied=denied,
    )
    result = upgrade(graph, ctx)
    kept = [o for o in result.outcomes if not o.applied]
    if kept:
        listed = "; ".join(f"'{o.node}'{f' in {o.path}' if o.path else ''}: {o.detail}" for o in kept)
        raise ScanoptError(f"cannot move the model to opset {target}: {len(kept)} Scan-8 node(s) stay ({listed})")
    for level in walk_graphs(graph):  # new nodes were appended: restore order, change nothing else
        if not is_topologically_sorted(level.graph):
            level.graph.toposort(recurse_subgraphs=False)
    return export_model(graph, model), result.outcomes


def _convert(staged: onnx.ModelProto, original: onnx.ModelProto, source: int, target: int,
             adapted: list | None = None) -> onnx.ModelProto:
    """``adapted`` receives (graph path, node, line) for each node scanopt's adapters rewrote
    and report (LinearAttention written as a Scan)."""
    staged = adapt(staged, source, target, _all_names(staged), types=lambda: _known_types(staged), outcomes=adapted)
    if staged.ir_version < 4 and _has_initializers(staged):
        # IR 3 wants every initializer to be a graph input too, and the converter treats an
        # initializer that is not one (the upgrade pass's constants) as undefined
        staged = _copy(staged)
        staged.ir_version = 4
    before = _all_names(staged)
    if target < source:  # check_lowering: every op keeps its form, so only the number changes
        converted = _renumbered(staged, target)
    else:
        types = _known_types(staged)
        converted = _run_converter(staged, target, source, "")
        pending = list(_held_bodies(converted.graph))
        while pending:
            root = pending.pop(0)
            _convert_lifted(root, staged, types, source, target)
            pending += list(_held_bodies(root))
    for g in walk_proto_graphs(converted.graph):
        for node in g.node:
            if node.domain == HOLD_DOMAIN:
                node.domain = ""
    imports = [o for o in converted.opset_import if o.domain != HOLD_DOMAIN]
    del converted.opset_import[:]
    converted.opset_import.extend(imports)
    _rename_new_names(converted, before)
    _restore_signature(original, converted)
    if converted.ir_version < 4 and _has_initializers(converted):
        converted.ir_version = 4  # the converter's own constants (e.g. Squeeze axes at 13)
    _check_signature(original, converted)
    try:
        onnx.checker.check_model(_checkable(converted))
    except onnx.checker.ValidationError as exc:
        first = str(exc).strip().splitlines()[0]
        if "Field 'shape' of 'type' is required" not in first:
            raise ScanoptError(f"migration to opset {target} produced an invalid model: {first}") from None
    return converted


def _renumbered(model: onnx.ModelProto, target: int) -> onnx.ModelProto:
    """``model`` importing the default domain at ``target``, where every op it holds has the same
    form (:func:`check_lowering`; onnx.version_converter has no downward adapter for most ops that
    only gained types, e.g. Shape 13 -> 12). An op whose types at ``target`` exclude the model's is
    a ScanoptError naming it."""
    lowered = _copy(model)
    for o in lowered.opset_import:
        if in_default_domain(o.domain):
            o.version = target
    check = _copy(lowered)
    for g in walk_proto_graphs(check.graph):
        for node in g.node:
            if node.domain == HOLD_DOMAIN:
                node.domain = ""
    del check.opset_import[:]
    check.opset_import.extend(o for o in lowered.opset_import if o.domain != HOLD_DOMAIN)
    try:
        onnx.shape_inference.infer_shapes(_checkable(check), check_type=True, strict_mode=True)
    except Exception as exc:  # noqa: BLE001 - InferenceError, ValidationError
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ScanoptError(f"the model does not hold at opset {target}: {detail}") from None
    return lowered


def _checkable(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model``, or a copy without the bytes of weights left in their file (the checker looks
    for their file relative to the working directory, not the model's folder)."""
    if not has_marks(model):
        return model
    copy = _copy(model)
    hollow(copy)
    return copy


def _run_converter(model: onnx.ModelProto, target: int, source: int, where: str) -> onnx.ModelProto:
    try:
        return onnx.version_converter.convert_version(model, target)
    except Exception as exc:  # noqa: BLE001 - the converter raises RuntimeError/ValidationError/...
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ScanoptError(
            f"onnx.version_converter cannot convert {where or 'the model'} from opset {source} to {target}: {detail}"
        ) from None


def _held_bodies(graph: onnx.GraphProto):
    """Bodies of held nodes directly reachable from ``graph`` without entering another
    held node: the graphs the converter did not convert."""
    for node in graph.node:
        for attr in node.attribute:
            for sub in attribute_graphs(attr):
                if node.domain == HOLD_DOMAIN:
                    yield sub
                else:
                    yield from _held_bodies(sub)


def _needs_conversion(graph: onnx.GraphProto) -> bool:
    """True if a default-domain node is reachable without entering a held node."""
    for node in graph.node:
        if node.domain == HOLD_DOMAIN:
            continue
        if in_default_domain(node.domain):
            return True
        if any(_needs_conversion(sub) for attr in node.attribute for sub in attribute_graphs(attr)):
            return True
    return False


def _convert_lifted(root: onnx.GraphProto, staged: onnx.ModelProto, types: dict, source: int, target: int) -> None:
    """Convert ``root`` (a held node's body) in place, as a model of its own."""
    if not _needs_conversion(root):
        return
    captured = [n for n in outer_names(root)]
    inputs = list(root.input) + [_value_info(name, types) for name in captured]
    lifted_graph = onnx.helper.make_graph(
        list(root.node), root.name or "body", inputs, list(root.output),
        initializer=list(root.initializer), value_info=list(root.value_info),
    )
    lifted = onnx.helper.make_model(lifted_graph, opset_imports=list(staged.opset_import))
    lifted.ir_version = staged.ir_version
    converted = _run_converter(lifted, target, source, f"the body '{root.name}'")
    captured_set = set(captured)
    _replace(root.node, converted.graph.node)
    _replace(root.initializer, converted.graph.initializer)
    _replace(root.value_info, [v for v in converted.graph.value_info if v.name not in captured_set])


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _replace(field, items) -> None:
    items = list(items)
    del field[:]
    field.extend(items)


def _value_info(name: str, types: dict) -> onnx.ValueInfoProto:
    value = onnx.ValueInfoProto(name=name)
    if name in types:
        value.type.CopyFrom(types[name])
    return value


def _known_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """name -> type for every value whose type is declared or inferable, at every level."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # noqa: BLE001 - a hint only
        inferred = model
    types: dict[str, onnx.TypeProto] = {}
    for g in walk_proto_graphs(inferred.graph):
        for value in list(g.input) + list(g.output) + list(g.value_info):
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                types.setdefault(value.name, value.type)
        for init in g.initializer:
            types.setdefault(init.name, onnx.helper.make_tensor_type_proto(init.data_type, list(init.dims)))
    return types


def _all_names(model: onnx.ModelProto) -> set[str]:
    names: set[str] = set()
    for g in walk_proto_graphs(model.graph):
        names.update(v.name for v in list(g.input) + list(g.output) + list(g.value_info))
        names.update(i.name for i in g.initializer)
        for node in g.node:
            names.update(node.input)
            names.update(node.output)
    names.discard("")
    return names


def _rename_new_names(model: onnx.ModelProto, before: set[str]) -> None:
    """Give every value the converter invented a model-wide unique name (scoped renaming:
    a graph's readers, nested graphs included, follow the definition they see)."""
    fresh = NameAllocator.from_names(_all_names(model)).fresh

    def visit(g: onnx.GraphProto, inherited: dict[str, str]) -> None:
        mapping = dict(inherited)
        local = [o for n in g.node for o in n.output if o] + [i.name for i in g.initializer]
        for name in local:
            if name not in before:
                mapping[name] = fresh("opset_" + name.lstrip("_"))
            else:
                mapping.pop(name, None)
        for init in g.initializer:
            init.name = mapping.get(init.name, init.name)
        for value in g.value_info:
            value.name = mapping.get(value.name, value.name)
        for node in g.node:
            node.input[:] = [mapping.get(n, n) for n in node.input]
            node.output[:] = [mapping.get(n, n) for n in node.output]
            for attr in node.attribute:
                for sub in attribute_graphs(attr):
                    visit(sub, mapping)
        for out in g.output:
            out.name = mapping.get(out.name, out.name)

    visit(model.graph, {})


def _has_initializers(model: onnx.ModelProto) -> bool:
    return any(g.initializer for g in walk_proto_graphs(model.graph))


def _restore_signature(original: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """The converter writes the shapes it inferred into the graph's inputs and outputs; a
    migrated model declares exactly what the original did."""
    for kind in ("input", "output"):
        ours, theirs = getattr(original.graph, kind), getattr(converted.graph, kind)
        if [v.name for v in ours] == [v.name for v in theirs]:
            _replace(theirs, ours)


def _check_signature(original: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """The graph's inputs and outputs must keep names, types and shapes exactly."""
    for kind in ("input", "output"):
        ours = [v.SerializeToString() for v in getattr(original.graph, kind)]
        theirs = [v.SerializeToString() for v in getattr(converted.graph, kind)]
        if ours != theirs:
            raise ScanoptError(f"migration changed the model's graph {kind}s; refusing to write it (a scanopt bug)")
