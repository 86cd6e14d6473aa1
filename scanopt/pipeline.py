"""The pipeline: runs passes in order over every graph level, to a fixed point, then
verifies the result numerically and rolls back rewrites that fail.

A round (each pass's ``order``, PIPELINE_ORDER): the normalizers loop_to_scan -> upgrade ->
canonicalize, then one walk of the chooser (scanopt.chooser) over the Scans, which per Scan asks
every form (fuse, linattn, linrec, distances, vectorize, hoist, unroll) at once and applies the
one it chooses, then cleanup. Among forms without numbers the order is the preference.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Callable, Iterable

import onnx

from scanopt.chooser import Chooser
from scanopt.cost import TARGETS
from scanopt.errors import ScanoptError
from scanopt.graph import NameAllocator, node_label
from scanopt.inspect import describe_scans
from scanopt.ir import export_model, import_model
from scanopt.pass_api import Pass, PassContext, ScanPass, op_nodes, pass_order, registered_passes, scan_nodes
from scanopt.protos import fed_inputs
from scanopt.report import PassTiming, Report, count_ops
from scanopt.shapes import ShapeTable, shared_inference
from scanopt.validate import default_opset, validate_model

MAX_ROUNDS = 8


def __getattr__(name: str):
    """``PIPELINE_ORDER``: the registered passes' names in pipeline order (each pass's ``order``)."""
    if name == "PIPELINE_ORDER":
        return pass_order()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def select_passes(passes: Iterable[str] | None = None, skip: Iterable[str] = ()) -> list[Pass]:
    """Instances of the chosen passes, in pipeline order. Unknown names are a ScanoptError."""
    registry = registered_passes()
    order = list(pass_order())
    wanted = list(order if passes is None else passes)
    unknown = [name for name in list(wanted) + list(skip) if name not in registry]
    if unknown:
        raise ScanoptError(f"unknown pass {', '.join(unknown)}; available: {', '.join(order)}")
    return [registry[name]() for name in order if name in wanted and name not in skip]


def optimize(
    model: onnx.ModelProto,
    *,
    passes: Iterable[str] | None = None,
    skip: Iterable[str] = (),
    verify: bool = True,
    inputs: list[dict] | None = None,
    engine: str = "auto",
    seeds: int = 2,
    options: dict | None = None,
    progress: Callable[[str], None] | None = None,
    validated: list[str] | None = None,
) -> tuple[onnx.ModelProto, Report]:
    """Optimize ``model``'s Scans; return the new model and the report.

    The input proto is never modified. A model none of whose passes changed anything is
    returned as the very same object. With ``verify`` (the default), the result is
    compared with the original numerically (``inputs``: a list of feed dicts, else
    synthesized over ``seeds`` seeds); a rewrite that fails is rolled back per Scan node
    and the report says so. ``validated``: the warnings of a validation the caller already
    ran on this very model (scanopt.load does), so it is not repeated: validating
    serializes the whole model.
    """
    with shared_inference():  # the passes' shapes and verification's feeds infer the original once
        result, report = _optimize(model, passes, skip, verify, inputs, engine, seeds, options, progress, validated)
    return _validated_result(model, result, report)


def _validated_result(model: onnx.ModelProto, result: onnx.ModelProto, report: Report) -> tuple[onnx.ModelProto, Report]:
    """The optimized model, if it passes the validation inputs pass (scanopt.validate);
    else the original, every rewrite rolled back and the reason reported: scanopt never
    writes a model it would refuse to read. Validation copies no big weight (hollow_copy)."""
    if result is model:
        return result, report
    try:
        validate_model(result, name="optimized model")
    except ScanoptError as exc:
        rolled = [f"{p} on {n}" for p, n in applied_keys(report)] or ["every rewrite"]
        report.verification = {
            "passed": False,
            "rolled_back": rolled,
            "summary": f"rolled back every rewrite: {exc}",
            "seconds": (report.verification or {}).get("seconds", 0.0),
        }
        _nothing_rewritten(report, "not applied: the optimized model failed validation")
        return model, report
    return result, report


def _nothing_rewritten(report: Report, detail: str) -> None:
    """Mark ``report`` as that of the unchanged original: no "applied" line may stand
    above a verification line saying nothing was rewritten."""
    report.modified = False
    report.ops_after = report.ops_before
    report.outcomes = [replace(o, applied=False, detail=detail) if o.applied else o for o in report.outcomes]


def _optimize(model, passes, skip, verify, inputs, engine, seeds, options, progress, validated):
    warnings = validate_model(model) if validated is None else list(validated)
    from scanopt.deploy import check_input_shapes, check_threads

    check_input_shapes(model, (options or {}).get("input_shapes"))  # before any work (functions, a migration)
    check_threads((options or {}).get("threads"))
    functions = _prepare_functions(model, select_passes(passes, skip), options or {}, verify, inputs, engine, seeds,
                                   progress)
    if functions is None:
        return _optimize_graphs(model, passes, skip, verify, inputs, engine, seeds, options, progress, warnings)
    # Verified against the original already: the rest builds on it.
    result = _optimize_graphs(functions.model, passes, skip, verify, inputs, engine, seeds, options, progress, warnings)
    return _report_functions(result, functions, model)


def _optimize_graphs(model, passes, skip, verify, inputs, engine, seeds, options, progress, warnings):
    """The passes over the main graph and the bodies in it (functions are settled before)."""
    chosen = select_passes(passes, skip)
    # options["target_opset"] (issue 4): the whole model moves to that opset first
    # (scanopt.migrate: the upgrade pass rewrites every Scan-8, onnx.version_converter the
    # rest). A migration is all or nothing, so it is verified on its own and raises when it
    # fails; the other passes then run on, and are rolled back against, the migrated model.
    original = model
    given = inputs  # the caller's feeds: only they imply deployment shapes, not those drawn below
    prefused = _fuse_before_migration(model, options or {}, chosen, verify, inputs, engine, seeds, progress)
    if prefused is not None:
        model = prefused[0]
        if inputs is None and verify:
            # The fused model's lengths feed a native op, which the synthesizer does not
            # read as sequence_lens: keep drawing inputs from the original's Scan-8.
            from scanopt.verify import runnable_feeds

            inputs = runnable_feeds(original, seeds=seeds, engine=engine)
    migration = _migrate(model, options or {}, chosen, verify, inputs, engine, seeds, progress)
    if migration is not None:
        model = migration.model
        if inputs is None and verify:
            # Same after a migration: the Scan-8 (its sequence_lens, its batch) is gone.
            from scanopt.verify import runnable_feeds

            inputs = runnable_feeds(original, seeds=seeds, engine=engine)
    options = _implied_shapes(options or {}, given, model)
    options, tuning = deploy_decisions(model, chosen, options, progress)
    if verify and inputs is None and options["input_shapes"]:
        inputs = declared_feeds(model, options["input_shapes"], seeds, engine)
    candidate, report = _run_passes(model, chosen, options, frozenset(), progress)
    report.tuning = tuning
    report.target = getattr(options.get("deployment_target"), "note", "")
    report.warnings = warnings + report.warnings
    if not report.modified or not verify:
        if report.modified:
            report.verification = {"passed": None, "summary": "not verified (verification disabled)"}
        result = (candidate if report.modified else model), report
    else:
        result = _verify_and_roll_back(model, candidate, report, chosen, options or {}, inputs, engine, seeds, progress)
    if migration is not None:
        _report_migration(result[1], migration, original, result[0])
    if prefused is not None:
        result[1].outcomes[:0] = [o for o in prefused[1].outcomes if o.applied]
        result[1].scans = prefused[1].scans + [s for s in result[1].scans if s not in prefused[1].scans]
        fused_check = (prefused[1].verification or {}).get("summary")
        if fused_check and result[1].verification is not None:
            summary = result[1].verification["summary"]
            result[1].verification["summary"] = f"fuse at opset {default_opset(original)}: {fused_check}; {summary}"
        result[1].modified = True
        result[1].ops_before = count_ops(original)
        result[1].ops_after = count_ops(result[0])
    target = options.get("deployment_target")
    if target is not None and target.model == "cuda":  # what CUDA graphs can capture of the output
        from scanopt.cuda_shapes import for_cuda  # Scan bodies the CUDA EP can plan (onnxruntime issue 27887)
        from scanopt.providers import capture_note

        result = for_cuda(model, result, verify=verify, inputs=inputs, engine=engine, seeds=seeds,
                          input_shapes=options.get("input_shapes"))

        result[1].target = f"{result[1].target}; {capture_note(result[0])}"
    return result


def _prepare_functions(model, chosen, options, verify, inputs, engine, seeds, progress):
    """Loop-holding model-local functions inlined or optimized in place (scanopt.functions)."""
    if not model.functions:
        return None
    from scanopt.functions import prepare_functions

    def run(body, shapes, positive=()):
        # the body's own deployment: the declared shapes its call sites give its inputs; the
        # inputs every caller passes values > 0 (scanopt.functions.positive_inputs; linattn reads them)
        body_options, _ = deploy_decisions(body, chosen, dict(options, input_shapes=shapes or None,
                                                              positive_inputs=frozenset(positive)), progress)
        return _run_passes(body, chosen, body_options, frozenset(), progress)

    def check(candidate):
        if not verify:
            return None
        from scanopt.verify import compare_models

        try:
            outcome = compare_models(model, candidate, inputs=inputs, engine=engine, seeds=seeds, keep_ort=True)
        except ScanoptError as exc:
            return False, str(exc)
        return outcome.passed, outcome.summary()

    return prepare_functions(model, run, check, options.get("input_shapes"))


def _report_functions(result, functions, original):
    """Fold what was done to functions into the report of the run over the prepared model."""
    optimized, report = result
    report.outcomes[:0] = functions.outcomes
    if functions.model is original:  # nothing done to functions: only their reasons to add
        return optimized, report
    report.modified = True
    report.ops_before = count_ops(original)
    report.ops_after = count_ops(optimized)
    if functions.summaries:
        verification = report.verification or {"passed": True, "rolled_back": []}
        done = "; ".join(functions.summaries)
        verification["summary"] = f"{done}; {verification['summary']}" if verification.get("summary") else done
        report.verification = verification
    elif report.verification is None:
        report.verification = {"passed": None, "summary": "not verified (verification disabled)"}
    return optimized, report


def _implied_shapes(options: dict, inputs, model) -> dict:
    """User feeds imply the deployment shapes (of the first feed set) unless declared."""
    if options.get("input_shapes") or not inputs:
        return options
    graph_inputs = {v.name for v in fed_inputs(model.graph)}
    shapes = {name: list(getattr(value, "shape", ())) for name, value in inputs[0].items() if name in graph_inputs}
    return dict(options, input_shapes=shapes or None)


def declared_feeds(model, shapes: dict, seeds: int, engine: str) -> list[dict] | None:
    """Verification feeds: one set at the declared shapes, then the usual synthesized seeds
    (None, i.e. synthesize as usual, when no input set runs at the declared shapes)."""
    from scanopt.deploy import shaped_model
    from scanopt.verify import runnable_feeds

    try:
        declared = runnable_feeds(shaped_model(model, shapes), seeds=1, engine=engine)
        return declared + runnable_feeds(model, seeds=seeds, engine=engine)
    except ScanoptError:
        return None


def deploy_decisions(model, chosen, options: dict, progress) -> tuple[dict, list[str]]:
    """Check the target and the deployment (``input_shapes``, ``threads``); measure each
    Scan's candidate forms at those shapes unless ``tune`` is False (scanopt.tune), and hand
    the choices and the deployment shapes to the cost policy (scanopt.cost)."""
    if options.get("target", "onnxruntime") not in TARGETS:
        raise ScanoptError(f"unknown target '{options['target']}' (choose from {', '.join(TARGETS)})")
    from scanopt.deploy import check_input_shapes, check_threads, shaped_model, tune_default

    from scanopt.portable import written_for
    from scanopt.providers import plan

    declared = check_input_shapes(model, options.get("input_shapes"))
    target = plan(options.get("execution_providers"))  # which provider the forms are ranked for, and how
    options = dict(options, input_shapes=declared, threads=check_threads(options.get("threads")),
                   deployment_target=None if target.cpu_only else target,
                   # the written model runs beyond onnxruntime (scanopt.portable); not for the forms
                   # scanopt.tune builds under target portable to time them for onnxruntime
                   portable_output="openvino" in written_for(options))
    tune_on = options.get("tune")
    if tune_on is None:
        tune_on = tune_default()
    # a provider that cannot run here is modelled, never measured on the CPU in its place
    tuning = tune_on and options.get("target", "onnxruntime") != "portable" and target.mode == "measured"
    if declared or tuning:
        model = _loops_as_scans(model, chosen)  # the Scans the passes will see, shaped and measured
    deployment = ShapeTable(shaped_model(model, declared)) if declared else None
    options["deployment"] = deployment
    if not tuning:
        return options, []
    from scanopt.observe import observed_deployment
    from scanopt.tune import tune, unknown_reads

    observed_notes = []
    if declared:  # a Scan input static inference leaves open: one run at the declared shapes gives it
        deployment, observed, observed_notes = observed_deployment(model, declared, deployment,
                                                                   unknown_reads(model, deployment), options)
        options.update(deployment=deployment, observed=observed)
    if progress:
        progress("timing the candidate forms of each Scan at the deployment shapes")
    measured, notes = tune(model, _run_passes, chosen, options, deployment, getattr(progress, "count", None))
    notes = observed_notes + notes
    options = dict(options, measured=measured)
    if _scans_in(model) > sum(1 for c in measured.values() if c.get("form")) and target.model == "cpu":  # some Scan is modelled: calibrate the model here (cached)
        import scanopt.tune
        from scanopt.calibrate import scales

        options["cost_scales"] = scales(options, _run_passes, chosen, scanopt.tune.measure, notes)
    return options, notes


def _loops_as_scans(model, chosen):
    """``model`` with the Loops loop_to_scan converts already converted (it runs first in the
    pipeline, and converts the same way every time, names included), so the Scans it makes get
    the deployment shapes and are measured like the model's own; else ``model`` itself."""
    first = [p for p in chosen if p.name == "loop_to_scan"]
    if not first or not any(n.op_type == "Loop" for g in _graphs(model) for n in g.node):
        return model
    converted, _ = _run_passes(model, first, {"target": "portable"}, frozenset(), None)
    return converted


def _graphs(model):
    from scanopt.protos import walk_proto_graphs

    return walk_proto_graphs(model.graph)


def _scans_in(model) -> int:
    from scanopt.protos import walk_proto_graphs

    return sum(1 for g in walk_proto_graphs(model.graph) for n in g.node if n.op_type == "Scan")


def _fuse_before_migration(model, options, chosen, verify, inputs, engine, seeds, progress):
    """With a target opset, fuse recurrent Scan-8 cells while the model is still at its
    source opset: the native ops take ``sequence_lens`` directly, whereas after the
    upgrade the Scan is masked and no longer matches a cell. Returns (model, report) when
    something fused and verified, else None."""
    if options.get("target_opset") is None or (default_opset(model) or 0) >= 9:
        return None
    fuse = [p for p in chosen if p.name == "fuse"]
    if not fuse:
        return None
    if progress:
        progress("fusing recurrent Scan-8 cells before the migration")
    fused, report = _run_passes(model, fuse, options, frozenset(), progress)
    if not report.modified:
        return None
    if verify:
        fused, report = _verify_and_roll_back(model, fused, report, fuse, options, inputs, engine, seeds, progress)
        if not report.modified:
            return None
    return fused, report


def _migrate(model, options, chosen, verify, inputs, engine, seeds, progress):
    """The verified migration asked for by options["target_opset"], or None (issue 4)."""
    target = options.get("target_opset")
    if target is None:
        return None
    if not any(p.name == "upgrade" for p in chosen):
        raise ScanoptError("--target-opset needs the upgrade pass, which is not selected")
    from scanopt.migrate import migrate_verified

    if progress:
        progress(f"moving the model to opset {target}")
    migration = migrate_verified(model, target, options=options, verify=verify, inputs=inputs, engine=engine, seeds=seeds)
    return migration if migration.changed else None


def _report_migration(report: Report, migration, original, final) -> None:
    """Fold the migration into the report of the passes that ran after it (issue 4)."""
    report.outcomes[:0] = migration.outcomes
    report.modified = True
    report.ops_before = count_ops(original)
    report.ops_after = count_ops(final)
    before = onnx.defs.get_schema("Scan", migration.source_opset).since_version
    for scan in report.scans:  # described after the move: say which version the model had
        if scan["version"] != before:
            scan["migrated_from"] = before
    moved = f"opset {migration.source_opset} -> {migration.target_opset}: {migration.verification['summary']}"
    if report.verification is None:
        report.verification = dict(migration.verification, summary=moved)
    else:
        report.verification["summary"] = f"{moved}; then {report.verification['summary']}"


def _run_passes(model, chosen: list[Pass], options: dict, denied: frozenset, progress,
                shapes: ShapeTable | None = None) -> tuple[onnx.ModelProto, Report]:
    """``shapes``: a ShapeTable of this very ``model`` (read-only), to skip inferring it again."""
    report = Report(passes=[p.name for p in chosen], ops_before=count_ops(model))
    if not report.ops_before["Scan"] + report.ops_before["Loop"]:  # nothing to do: skip the import and inference
        report.ops_after = report.ops_before
        return model, report
    graph = import_model(model)
    with _long_lived_frozen():
        return _run_imported(model, graph, chosen, options, denied, progress, shapes, report)


@contextmanager
def _long_lived_frozen():
    """Keep Python's cycle collector off what lives through the whole run (the imported
    graph and whatever the caller holds): a full collection walks every tracked object, and a run over a wide
    model triggers more of them the wider it is (at 3,000 Scans they were a third of the
    run). Frozen objects are still freed by reference counting; the freeze is undone at the
    end. Left alone when the caller froze objects itself or turned collection off."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _run_imported(model, graph, chosen, options, denied, progress, shapes, report) -> tuple[onnx.ModelProto, Report]:
    opset = default_opset(model)
    ctx = PassContext(
        opset=opset or 0,
        names=NameAllocator(graph),
        shapes=shapes if shapes is not None else ShapeTable(model),
        options=options,
        denied=denied,
        selected=tuple(p.name for p in chosen),
        chooser=Chooser.from_options(options, denied),
        progress=getattr(progress, "count", None),  # a scanopt.progress.Progress also counts Scans
    )
    has_scan = any(True for _ in scan_nodes(graph)) or any(True for _ in op_nodes(graph, "Loop"))
    report.scans = describe_scans(graph, ctx) if has_scan else []
    if not has_scan:
        report.ops_after = report.ops_before
        return model, report
    for round_number in range(1, MAX_ROUNDS + 1):
        report.rounds = round_number
        changed = False
        for stage in stages(chosen):
            if isinstance(stage, list):  # the forms: one walk of the chooser over the Scans
                if progress:
                    progress(f"round {round_number}: forms")
                walked = ctx.chooser.walk(graph, stage, ctx)
                for form in stage:
                    report.timings.append(PassTiming(form.name, walked.seconds[form.name], form.name in walked.modified))
                    report.add_outcomes(walked.outcomes[form.name])
                changed |= bool(walked.modified)
                continue
            if progress:
                progress(f"round {round_number}: {stage.name}")
            start = time.perf_counter()
            result = stage(graph, ctx)
            report.timings.append(PassTiming(stage.name, time.perf_counter() - start, result.modified))
            report.add_outcomes(result.outcomes)
            changed |= result.modified
            if result.modified and stage.name == "loop_to_scan":
                _describe_converted(graph, ctx, report)
        report.modified |= changed
        if not changed:
            break
    if options.get("portable_output"):  # after the passes: how every Scan left is written
        from scanopt.portable import make_portable

        made = make_portable(graph, ctx, lambda: ShapeTable(export_model(graph, model)))
        report.add_outcomes(made)
        report.modified |= bool(made)
    report.input_ranges.update(ctx.input_ranges)
    report.loop_reads += [r for r in ctx.loop_reads if r not in report.loop_reads]
    if not report.modified:
        report.ops_after = report.ops_before
        return model, report
    remaining = {(node_label(node), level.path) for level, node in scan_nodes(graph)}
    for scan in report.scans:  # a Scan can go with another's rewrite (a bidirectional partner)
        scan["kept"] = (scan["node"], scan["graph_path"]) in remaining
    optimized = export_model(graph, model)
    report.ops_after = count_ops(optimized)
    return optimized, report


def stages(chosen: list[Pass]) -> list:
    """``chosen`` (in pipeline order) as a round runs it: each normalizer alone, and each run of
    consecutive form passes that propose per Scan (ScanPass) as one list, which the chooser
    walks together (scanopt.chooser). A form without ``match`` runs alone in its place."""
    found: list = []
    for scan_pass in chosen:
        if scan_pass.kind == "form" and isinstance(scan_pass, ScanPass):
            if found and isinstance(found[-1], list):
                found[-1].append(scan_pass)
            else:
                found.append([scan_pass])
        else:
            found.append(scan_pass)
    return found


def _describe_converted(graph, ctx: PassContext, report: Report) -> None:
    """Scans that Loops became join the report's Scans (marked ``from_loop``): the summary
    counts them and says why each stays a Scan, as for the model's own."""
    known = {(s["node"], s["graph_path"]) for s in report.scans}
    for scan in describe_scans(graph, ctx):
        if (scan["node"], scan["graph_path"]) not in known:
            scan["from_loop"] = True
            report.scans.append(scan)


def applied_keys(report: Report) -> list[tuple[str, str]]:
    """(pass, node) pairs that a pass rewrote, in order, cleanup excluded."""
    keys = []
    for o in report.outcomes:
        if o.applied and o.pass_name != "cleanup" and (o.pass_name, o.node) not in keys:
            keys.append((o.pass_name, o.node))
    return keys


@dataclass
class _Verdict:
    passed: bool
    summary: str
    details: dict | None = None


def _verify_and_roll_back(model, candidate, report, chosen, options, inputs, engine, seeds, progress):
    """Verify ``candidate``; on a failure find the rewrites to blame and roll them back.

    Suspects are found per node in one extra comparison (:func:`_blame`: the outputs
    and inputs of every top-level node holding a rewrite are compared; a node whose
    outputs differ while its inputs agree is at fault), then only the suspects are
    bisected against the rest: a failure among N rewrites costs a constant number of
    pipeline runs and verifications. Where blame cannot tell (the candidate does not
    run, a changed signature), every key is bisected: O(k log N) runs for k failing
    rewrites. Time spent verifying is reported apart.
    """
    from scanopt.verify import SignatureMismatchError, compare_models

    spent = [0.0]
    ranges = dict(report.input_ranges)  # the first run's: every trial below is judged on the same feeds
    loop_reads = list(report.loop_reads)

    def check(result_model) -> _Verdict:
        if progress:
            progress("verifying")
        start = time.perf_counter()
        try:
            outcome = compare_models(model, result_model, inputs=inputs, engine=engine, seeds=seeds, keep_ort=True,
                                     input_ranges=ranges, loop_reads=loop_reads)
        except SignatureMismatchError as exc:  # a rewrite changed the model's interface
            return _Verdict(False, str(exc))
        finally:
            spent[0] += time.perf_counter() - start
        return _Verdict(outcome.passed, outcome.summary(), outcome.to_dict())

    try:
        verdict = check(candidate)
    except ScanoptError as exc:  # the original itself cannot be run on synthesized inputs
        report.verification = {
            "passed": None,
            "rolled_back": [f"{p} on {n}" for p, n in applied_keys(report)],
            "summary": f"cannot verify, so nothing was rewritten: {str(exc).removeprefix('cannot verify: ')}",
            "seconds": round(spent[0], 4),
        }
        _nothing_rewritten(report, "not applied: the model cannot be verified")
        return model, report
    if verdict.passed:
        report.verification = {"passed": True, "rolled_back": [], "summary": verdict.summary,
                               "details": verdict.details, "seconds": round(spent[0], 4)}
        return candidate, report
    keys = applied_keys(report)
    start = time.perf_counter()
    shapes = ShapeTable(model)  # one inference for every re-run below (same model, read-only)
    suspects = _blame(model, candidate, report, inputs, engine, seeds, shapes, loop_reads) or keys
    spent[0] += time.perf_counter() - start

    def passes_with(allowed: list) -> bool:
        trial, trial_report = _run_passes(model, chosen, options, frozenset(k for k in keys if k not in allowed), progress, shapes)
        return not trial_report.modified or check(trial).passed

    accepted = [k for k in keys if k not in suspects]
    _bisect(suspects, accepted, passes_with)
    rejected = [k for k in keys if k not in accepted]
    final, final_report = _run_passes(model, chosen, options, frozenset(rejected), progress, shapes)
    final_report.warnings = report.warnings
    final_report.tuning, final_report.target = report.tuning, report.target  # set on the first run's report
    final_verdict = check(final) if final_report.modified else None
    if final_verdict is not None and not final_verdict.passed:
        # Rewrites that pass alone fail together: keep nothing.
        rejected = keys
        final, final_report = model, report
        final_report.modified = False
        final_report.ops_after = final_report.ops_before
        final_verdict = None
    rolled = [f"{p} on {n}" for p, n in rejected]
    final_report.verification = {
        "passed": False,
        "rolled_back": rolled,
        "summary": f"rolled back {len(rolled)} rewrite(s) that failed verification: {', '.join(rolled)}"
        + (f"; the rest verified ({final_verdict.summary})" if final_verdict is not None else ""),
        "details": verdict.details,
        "seconds": round(spent[0], 4),
    }
    return (final if final_report.modified else model), final_report


def _bisect(keys: list, accepted: list, passes_with: Callable[[list], bool]) -> None:
    """Add to ``accepted`` the keys that verify together with it (group testing)."""
    if not keys:
        return
    if passes_with(accepted + keys):
        accepted.extend(keys)
        return
    if len(keys) == 1:
        return
    middle = len(keys) // 2
    _bisect(keys[:middle], accepted, passes_with)
    _bisect(keys[middle:], accepted, passes_with)


def _anchor(outcome) -> str:
    """The label of the top-level node holding ``outcome``'s node (itself at the top)."""
    if not outcome.path:
        return outcome.node
    return outcome.path.split(" > ")[0].rsplit("/", 1)[0]


def _blame(model, candidate, report, inputs, engine, seeds, shapes: ShapeTable | None = None,
           loop_reads=()) -> list[tuple[str, str]]:
    """The applied rewrites whose top-level node computes wrong outputs from right inputs.

    Both models are run once with the outputs and inputs of every top-level node that
    holds a rewrite exposed as extra graph outputs (rewrites keep the names of the
    values around the node they replace). Returns [] when that cannot decide, and
    every key when no rewrite can be cleared.
    """
    from scanopt.protos import attribute_graphs, outer_names, proto_node_label
    from scanopt.verify import compare_models

    keys = applied_keys(report)
    anchors = {}
    for o in report.outcomes:
        if o.applied and (o.pass_name, o.node) in keys:
            anchors.setdefault((o.pass_name, o.node), _anchor(o))
    by_label = {proto_node_label(node): node for node in model.graph.node}
    shapes = shapes if shapes is not None else ShapeTable(model)
    produced = {o for graph in (model.graph, candidate.graph) for n in graph.node for o in n.output if o}
    in_candidate = {o for n in candidate.graph.node for o in n.output if o}
    listed = {v.name for v in model.graph.output} | {v.name for v in candidate.graph.output}
    sides: dict[str, tuple[set, set]] = {}
    probes: dict[str, int] = {}
    for label in set(anchors.values()):
        node = by_label.get(label)
        if node is None:
            return []
        reads = set(node.input) | {n for a in node.attribute for g in attribute_graphs(a) for n in outer_names(g)}
        sides[label] = ({o for o in node.output if o}, {r for r in reads if r in produced})
        for name in sides[label][0] | sides[label][1]:
            elem = shapes.elem_type_of(name)
            if name in in_candidate and name not in listed and elem:
                probes[name] = elem
    added = [onnx.helper.make_tensor_value_info(name, elem, None) for name, elem in sorted(probes.items())]
    try:
        with _extra_outputs(model, added), _extra_outputs(candidate, added):
            outcome = compare_models(model, candidate, inputs=inputs, engine=engine, seeds=seeds, keep_ort=True,
                                     loop_reads=loop_reads)
    except ScanoptError:
        return []
    if any(c.error for c in outcome.comparisons):
        return []
    wrong = {c.name for comp in outcome.comparisons for c in comp.checks if not c.passed}
    guilty = {label for label, (outs, ins) in sides.items() if outs & wrong and not ins & wrong}
    return [k for k in keys if anchors[k] in guilty]


class _extra_outputs:
    """Temporarily list ``values`` as outputs of ``model`` (restored on exit: the
    caller's proto is never left modified, and no copy of its weights is made)."""

    def __init__(self, model: onnx.ModelProto, values: list):
        self.model, self.values = model, values

    def __enter__(self):
        self.count = len(self.model.graph.output)
        self.model.graph.output.extend(self.values)
        return self.model

    def __exit__(self, *exc):
        del self.model.graph.output[self.count:]
        return False
