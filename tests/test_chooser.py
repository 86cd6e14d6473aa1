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
