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
    if target < source:
        raise ScanoptError(f"the model is at opset {source}; scanopt does not lower it to {target}")


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
    staged, outcomes = _rewrite_scan8(model, source, target_opset, dict(options or {}), denied)
    return Migration(_convert(staged, model, source, target_opset), source, target_opset, outcomes)


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

    result = compare_models(model, migration.model, inputs=inputs, engine=engine, seeds=seeds)
    migration.verification = {"passed": result.passed, "summary": result.summary(), "details": result.to_dict()}
    if not result.passed:
        raise VerificationError(
            f"the model moved to opset {target_opset} is not equivalent to the original "
            f"({result.summary()}); nothing written"
        )
    return migration


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


def _convert(staged: onnx.ModelProto, original: onnx.ModelProto, source: int, target: int) -> onnx.ModelProto:
    staged = adapt(staged, source, target, _all_names(staged))
    if staged.ir_version < 4 and _has_initializers(staged):
        # IR 3 wants every initializer to be a graph input too, and the converter treats an
        # initializer that is not one (the upgrade pass's constants) as undefined
        staged = _copy(staged)
        staged.ir_version = 4
    before = _all_names(staged)
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
