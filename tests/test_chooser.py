"""The chooser (scanopt/chooser.py) is the one place a form is chosen (issue 28): no pass imports
the cost policy or calls another pass, normalizers never ask, and the cost policy is asked only
through it."""

from __future__ import annotations

import ast
import inspect
import os

import builders as b
import cell_builders as cb

from scanopt import chooser as chooser_module
from scanopt.cost import CostPolicy
from scanopt.pass_api import form_name, pass_order, registered_passes
from scanopt.pipeline import optimize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _imports(path: str) -> set[str]:
    tree = ast.parse(open(path).read())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def _calls(path: str) -> set[str]:
    """Names called in ``path`` (``f(...)`` and ``x.f(...)`` as "f")."""
    tree = ast.parse(open(path).read())
    return {getattr(n.func, "attr", getattr(n.func, "id", "")) for n in ast.walk(tree) if isinstance(n, ast.Call)}


def _pass_sources() -> list[str]:
    return [os.path.join(folder, name) for folder, _, names in os.walk(os.path.join(ROOT, "passes"))
            for name in names if name.endswith(".py")]


def test_no_pass_imports_the_cost_policy_or_looks_up_another_pass():
    for path in _pass_sources():
        imports = _imports(path)
        assert not {i for i in imports if i == "scanopt.cost" or i.startswith("scanopt.cost.")}, path
        assert "scanopt.chooser" not in imports or path.endswith("fission.py"), path  # fission asks it what pieces get
        assert "registered_passes" not in _calls(path), path
        assert "decide" not in _calls(path), path


def test_only_the_chooser_asks_the_cost_policy(monkeypatch):
    callers = []
    real = CostPolicy.decide

    def spy(self, form, *args, **kwargs):
        callers.append((inspect.stack()[1].frame.f_globals["__name__"], form.name, form.kind))
        return real(self, form, *args, **kwargs)

    monkeypatch.setattr(CostPolicy, "decide", spy)
    optimize(_short_rnn(), verify=False)
    optimize(b.scan9_sum(steps="T"), verify=False)
    assert callers and {module for module, _, _ in callers} == {"scanopt.chooser"}
    assert {kind for _, _, kind in callers} == {"form"}  # a normalizer never asks


def test_every_pass_has_a_kind_and_the_normalizers_run_first():
    registry = registered_passes()
    kinds = {name: cls.kind for name, cls in registry.items()}
    assert set(kinds.values()) == {"normalizer", "form"}
    assert {n for n, k in kinds.items() if k == "normalizer"} == {"loop_to_scan", "upgrade", "canonicalize", "cleanup"}
    order = list(pass_order())
    forms = [n for n in order if kinds[n] == "form"]
    assert order[:3] == ["loop_to_scan", "upgrade", "canonicalize"] and order[-1] == "cleanup"
    assert order[3:-1] == forms
    assert forms.index("fuse") < forms.index("unroll")  # unrolling destroys the cells fuse matches


def test_form_names_come_from_the_passes():
    assert form_name(()) == "loop"
    assert form_name(["fuse"]) == "native" and form_name(["linattn"]) == "LinearAttention"
    assert form_name(["hoist", "fuse"]) == "hoisted+native"
    assert form_name(["fuse", "linrec"]) == "native+linrec"
    assert form_name(["a_later_pass"]) == "a_later_pass"


def _short_rnn():
    return cb.rnn_model(hidden=4, inputs=3, seq=3, batch=2)


def test_a_chooser_without_a_policy_still_defers():
    """A pass used alone (no cost policy) applies every proposal, but a form still defers to one
    it names in ``defers_to`` that takes the Scan: unroll leaves a cell to fuse when fuse runs."""
    from scanopt.graph import NameAllocator
    from scanopt.ir import import_model
    from scanopt.pass_api import PassContext
    from scanopt.passes.unroll.unroll_pass import Unroll
    from scanopt.shapes import ShapeTable

    assert Unroll.defers_to == ("fuse",) and chooser_module.Chooser(None).portable
    model = _short_rnn()
    details = {}
    for selected in (("fuse", "unroll"), ("unroll",)):
        graph = import_model(model)
        ctx = PassContext(opset=17, names=NameAllocator(graph), shapes=ShapeTable(model), selected=selected)
        result = Unroll()(graph, ctx)
        details[selected] = (result.modified, [o.detail for o in result.outcomes])
    assert details[("fuse", "unroll")] == (False, ["left to fuse: it becomes a native op"])
    assert details[("unroll",)][0] and details[("unroll",)][1][0].startswith("unrolled 3 steps")


def _choice(form, passes, times):
    return {"form": form, "verdict": "faster", "passes": passes, "times": times, "noise": 0.02, "rounds": 9,
            "clock": "thread CPU", "where": "T=200 B=8 (static)", "same": {}, "threads": 1}


def test_a_measured_form_that_fails_verification_gives_way_to_the_next_fastest():
    times = {"loop": 1.0, "distances": 0.1, "vectorized": 0.3}
    choice = _choice("distances", ["distances"], times)
    assert chooser_module.next_choice(choice, set()) is choice
    assert chooser_module.next_choice(choice, {"fuse"}) is choice
    after = chooser_module.next_choice(choice, {"distances"})
    assert (after["form"], after["passes"]) == ("vectorized", ["vectorize"])
    assert "distances failed verification" in after["where"]
    for denied in ({"distances", "vectorize"}, {"distances"}):
        slow = dict(times, vectorized=1.2) if denied == {"distances"} else times
        after = chooser_module.next_choice(_choice("distances", ["distances"], slow), denied)
        assert (after["form"], after["passes"]) == ("loop", [])  # nothing left beats the loop


def test_after_a_rollback_the_pipeline_writes_the_next_measured_form():
    """skl2onnx's GP (models/gpr): distances' product form fails verification at the rows the
    Scan reads; where the measurement had it fastest and vectorize next, vectorize is written
    (before: the loop stayed, the measured choice naming only distances)."""
    import onnx

    model = onnx.load(os.path.join(ROOT, "models", "gpr", "gpr_dot_rbf_white_200.onnx"))
    measured = {"Sc_Scan": _choice("distances", ["distances"], {"loop": 1.0, "distances": 0.1, "vectorized": 0.3})}
    out, report = optimize(model, options={"measured": measured, "tune": False})
    fates = {o.pass_name: (o.applied, o.detail) for o in report.outcomes if o.pass_name in ("distances", "vectorize")}
    assert fates["distances"] == (False, "rolled back: failed verification"), fates
    assert fates["vectorize"][0], fates
    assert not any(n.op_type == "Scan" for n in out.graph.node)


# -- the walk: per Scan, every proposal collected once ------------------------------------------

_PURE_SAMPLES = ("linrec/torch_mamba_minimal_wide.onnx", "scan_lstm.onnx", "scan_nested.onnx", "scan_rnn.onnx",
                 "skl_knn_regressor.onnx", "scan8_sum_seqlens.onnx")


def test_a_proposal_touches_neither_the_graph_nor_the_names():
    """Every form's ``match`` on every Scan of samples where the forms propose (mamba-minimal's,
    where linrec tries the Scan with its input producers taken in, a cell, a nested Scan, a
    distance map): the model exports to the same bytes and no fresh name is taken (before,
    linrec's trial Scan took names that the rewrites after it then could not have)."""
    import onnx

    from scanopt.graph import NameAllocator
    from scanopt.ir import export_model, import_model
    from scanopt.pass_api import PassContext, scan_nodes
    from scanopt.scan_view import ScanView
    from scanopt.shapes import ShapeTable
    from scanopt.validate import default_opset

    registry = registered_passes()
    forms = [name for name in pass_order() if registry[name].kind == "form"]
    proposed = set()
    for sample in _PURE_SAMPLES:
        model = onnx.load(os.path.join(ROOT, "models", sample))
        graph = import_model(model)
        ctx = PassContext(opset=default_opset(model), names=NameAllocator(graph), shapes=ShapeTable(model),
                          selected=tuple(registry))
        taken = []
        real_fresh = ctx.names.fresh
        ctx.names.fresh = lambda hint, taken=taken, real_fresh=real_fresh: taken.append(hint) or real_fresh(hint)
        before = export_model(graph, model).SerializeToString(deterministic=True)
        for level, node in list(scan_nodes(graph)):
            view = ScanView.from_gs(node, ctx.opset, ctx.shapes)
            for name in forms:
                found = registry[name]().match(node, view, level, ctx)
                assert not taken, (sample, name, taken)
                if not hasattr(found, "reason"):
                    proposed.add(name)
        assert export_model(graph, model).SerializeToString(deterministic=True) == before, sample
    assert {"fuse", "linrec", "hoist", "unroll", "distances"} <= proposed  # the samples exercise them


def _asked_in_walks(monkeypatch, model, **kwargs):
    """{(pass, Scan): how often its match was called by the chooser's walks} over one optimize."""
    from scanopt.pass_api import node_label

    registry = registered_passes()
    walking = []
    asked: dict = {}
    real_walk = chooser_module.Chooser.walk

    def walk(self, graph, forms, ctx):
        walking.append(True)
        try:
            return real_walk(self, graph, forms, ctx)
        finally:
            walking.pop()

    monkeypatch.setattr(chooser_module.Chooser, "walk", walk)
    for name, cls in registry.items():
        if cls.kind != "form":
            continue

        def match(self, node, view, level, ctx, _real=cls.match, _name=name):
            if walking:
                key = (_name, node_label(node))
                asked[key] = asked.get(key, 0) + 1
            return _real(self, node, view, level, ctx)

        monkeypatch.setattr(cls, "match", match)
    out, report = optimize(model, verify=False, **kwargs)
    return asked, report


def test_the_walk_asks_every_form_once_per_scan(monkeypatch):
    """A short RNN Scan: fuse wins, and yet every other form was asked, once (before, the forms
    ran one after another: those after fuse were never asked, the modelled ones were asked
    again for each verdict)."""
    asked, report = _asked_in_walks(monkeypatch, _short_rnn())
    registry = registered_passes()
    label = next(o.node for o in report.outcomes if o.pass_name == "fuse")
    assert [o.pass_name for o in report.outcomes if o.applied] == ["fuse"]
    forms = {name for name, cls in registry.items() if cls.kind == "form"}
    assert asked == {(name, label): 1 for name in forms}


def _outcome(report, pass_name):
    found = [o for o in report.outcomes if o.pass_name == pass_name]
    assert len(found) == 1, found
    return found[0]


def test_a_proposal_that_lost_says_its_measured_time_against_the_winners():
    import onnx

    model = onnx.load(os.path.join(ROOT, "models", "scan_rnn.onnx"))
    times = {"loop": 1e-3, "native": 2e-4, "hoisted": 5e-4}
    measured = {"scan_rnn": _choice("native", ["fuse"], times)}
    out, report = optimize(model, verify=False, options={"measured": measured, "tune": False})
    assert _outcome(report, "fuse").applied
    hoist = _outcome(report, "hoist")
    assert not hoist.applied and hoist.kept == "native"
    assert hoist.detail == "not chosen: hoisted (0.5 ms vs native's 0.2 ms, measured)"


def test_a_proposal_that_lost_says_its_modelled_time_against_the_winners():
    """No shapes: the model ranks native against hoisted; the hoisted proposal's line gives both
    modelled times, the loser's the larger."""
    import re

    import onnx

    model = onnx.load(os.path.join(ROOT, "models", "scan_lstm.onnx"))
    out, report = optimize(model, verify=False, options={"tune": False})
    assert _outcome(report, "fuse").applied
    hoist = _outcome(report, "hoist")
    found = re.fullmatch(r"not chosen: hoisted \(([\d.]+)x the loop's time vs native's ([\d.]+)x, modelled\)", hoist.detail)
    assert found, hoist.detail
    assert float(found.group(1)) > float(found.group(2))
    assert "not chosen: hoisted" in report.format(verbose=True)


def test_without_numbers_the_preference_order_decides_and_says_so():
    """--target portable: every form applies, so neither has numbers; on skl2onnx's k-NN distance
    map both distances and vectorize propose, distances (earlier in the preference order) is
    written, and vectorize's line says why it lost."""
    import onnx

    model = onnx.load(os.path.join(ROOT, "models", "skl_knn_regressor.onnx"))
    out, report = optimize(model, verify=False, options={"target": "portable", "tune": False})
    assert _outcome(report, "distances").applied
    vectorize = _outcome(report, "vectorize")
    assert not vectorize.applied and vectorize.kept == "distances"
    assert vectorize.detail.startswith("not chosen: vectorized (distances goes first: without numbers for both")
    # a deferral is the reason it gives where it has one: unroll leaves a short cell to fuse
    out, report = optimize(_short_rnn(), verify=False, options={"target": "portable", "tune": False})
    assert _outcome(report, "unroll").detail == "not chosen: unrolled (left to fuse: it becomes a native op)"


def test_a_scan_the_winner_moves_is_decided_by_the_later_forms_in_the_same_walk():
    """minGRU on a symbolic length: linrec writes its chunked form behind If(T < 128), the Scan
    moved whole into the then branch; hoist (after linrec in the order) hoists that Scan in the
    same walk, as when the passes ran one after another, not a round later (which would let
    canonicalize rewrite it first and write another model)."""
    import onnx

    model = onnx.load(os.path.join(ROOT, "models", "linrec", "torch_mingru_dyn.onnx"))
    out, report = optimize(model, verify=False, options={"tune": False})
    applied = [(o.pass_name, o.path) for o in report.outcomes if o.applied]
    assert ("linrec", "") in applied
    hoisted = [path for name, path in applied if name == "hoist"]
    assert hoisted and hoisted[0].endswith("/then_branch"), applied
    first_round = report.timings[:len(report.passes)]
    assert {t.name: t.modified for t in first_round}["hoist"], first_round


_SEQUENTIAL_SAMPLES = ("fission/dyn_scan_lstm_ema.onnx", "linrec/torch_mingru_dyn.onnx", "heldout_mamba/mambapy_seq_dyn.onnx",
                       "cells/torch_scan_lstm_hc.onnx", "scan_lstm.onnx", "scan_nested.onnx", "skl_knn_regressor.onnx",
                       "heldout/scan8_tf_lstm_b3_fwd.onnx")


def test_the_walk_writes_what_the_forms_one_after_another_wrote(monkeypatch):
    """The same bytes as each form's own pass over the model in pipeline order (what the pipeline
    did before the walk), on samples where the walk must take care: a fused piece and a linrec
    piece on one level (the level sorted where fuse's pass ended), a Scan moved into linrec's
    dispatch, a Scan linrec's absorption emitted, the cell-state loop fuse emits for an LSTM
    returning c per step (linrec takes it), a nested Scan, a distance map, a Scan-8 cell."""
    import onnx

    for sample in _SEQUENTIAL_SAMPLES:
        _same_as_one_after_another(monkeypatch, onnx.load(os.path.join(ROOT, "models", sample)), {}, sample)


def _same_as_one_after_another(monkeypatch, model, options: dict, what: str) -> None:
    from scanopt import pipeline

    walked, _ = optimize(model, verify=False, options=dict(options, tune=False))
    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "stages", lambda chosen: list(chosen))  # every pass alone, in order
        alone, _ = optimize(model, verify=False, options=dict(options, tune=False))
    assert walked is not model, what
    assert walked.SerializeToString(deterministic=True) == alone.SerializeToString(deterministic=True), what


def test_a_body_a_rewrite_left_unsorted_is_sorted_before_its_scan_is_read(monkeypatch):
    """A Scan-8 GRU with sequence_lens moved to opset 11 (strategy c: a Scan over the batch items
    around one Scan per item): fuse rewrites the inner Scan, leaving the outer body out of
    topological order; hoist's match reads that body in order and, unsorted, proposed a lift the
    validator then refused (every rewrite rolled back). Sorted first, as fuse's own pass did at
    its end, the outer Scan is declined and the inner GRU stays."""
    body = cb.Body(batch=False, opset=8)
    states, h_new = cb.cell("GRU", body)
    model = cb.scan8_model(body, states, ys=[h_new], reverse=True)
    options = {"target_opset": 11, "upgrade_strategy": "c"}
    _same_as_one_after_another(monkeypatch, model, options, "scan8 GRU per item")
    out, report = optimize(model, verify=False, options=dict(options, tune=False))
    assert not any("failed validation" in o.detail for o in report.outcomes), report.outcomes


def test_a_form_whose_match_raises_proposes_nothing_and_says_why(monkeypatch):
    """Asking every form about every Scan must not let one form's bug stop the run: its
    proposal is a skip with the error's first line; the other forms still decide."""
    import onnx

    from scanopt.passes.fuse.fuse_pass import Fuse

    def broken(self, node, view, level, ctx):
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(Fuse, "match", broken)
    model = onnx.load(os.path.join(ROOT, "models", "scan_rnn.onnx"))
    out, report = optimize(model, verify=False, options={"tune": False})
    assert _outcome(report, "fuse").detail == "cannot judge this Scan (RuntimeError: boom)"
    assert any(o.pass_name == "hoist" for o in report.outcomes)  # the forms after it were asked
