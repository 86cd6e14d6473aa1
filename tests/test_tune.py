"""Measuring candidate forms (scanopt.tune) with injected timings: which forms are built,
what is chosen, the cache, the deployment flags. No timed asserts: speed itself is
benchmarks/bench_policy.py's."""

from __future__ import annotations

import os
import re

import numpy as np
import onnx
import pytest

import scanopt
import scanopt.tune
from scanopt.timing import FormTime, Timings, decide, measure

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")
RNN = os.path.join(MODELS, "scan_rnn.onnx")  # I=3, H=4, dims seq and batch symbolic


class FakeTimer:
    """Stands in for scanopt.timing.measure: ``factors`` form -> time relative to the loop."""

    def __init__(self, factors=None, noise=0.02, scatter=1.0):
        self.factors, self.noise, self.calls, self.devices = dict(factors or {}), noise, [], []
        self.scatter = scatter  # each ratio's confidence interval: [ratio / scatter, ratio * scatter]

    def __call__(self, forms, feeds, *, threads, seconds, check_budget=True, patience=None, form_feeds=None, **device):
        self.calls.append((list(forms), {k: v.shape for k, v in feeds.items()}, threads))
        self.devices.append(device)  # a provider list other than the CPU's (scanopt.providers)
        def form(name):
            ratio = self.factors.get(name, 1.0)
            return FormTime(1e-3 * ratio, ratio, 0.0, ratio / self.scatter, ratio * self.scatter)

        return Timings({name: form(name) for name in forms}, self.noise, 9, "wall" if device else "thread CPU")


@pytest.fixture
def timer(monkeypatch, tmp_path):
    monkeypatch.setenv("SCANOPT_CACHE_DIR", str(tmp_path / "cache"))
    fake = FakeTimer()
    monkeypatch.setattr(scanopt.tune, "measure", fake)
    return fake


def run(path_or_model=RNN, **options):
    model = onnx.load(path_or_model) if isinstance(path_or_model, str) else path_or_model
    options.setdefault("tune", True)
    return scanopt.optimize(model, options=options, seeds=1)


def ops(model):
    """Top-level op types, a guard If's work branch in place of the If (a fused op sits behind
    an If on an empty input, a converted Loop behind another)."""
    from equivalence import top_ops

    return list(top_ops(model).elements())  # nested guards too (a converted Loop's, then the fused op's)


def test_the_readme_sample_fuses_when_the_native_rnn_measures_fastest_at_the_declared_shapes(timer):
    timer.factors = {"native": 0.3, "hoisted": 0.8}
    out, report = run(input_shapes={"X": [100, 8, 3]}, threads=1)
    (forms, feeds, threads), = timer.calls
    assert forms == ["loop", "native", "hoisted"] and feeds == {"X": (100, 8, 3), "h_0": (8, 4)} and threads == 1
    assert "RNN" in ops(out) and "Scan" not in ops(out)
    fuse = next(o for o in report.outcomes if o.pass_name == "fuse")
    assert fuse.expected.startswith("native applied: 0.3 ms vs loop 1 ms (3.33x), hoisted 0.8 ms; T=100 B=8 (declared)")
    assert "hoisted+native is native" in fuse.expected  # fusing leaves nothing to hoist: said so
    assert report.verification["passed"] is True
    assert report.tuning == ["scan_rnn: loop 1 ms, native 0.3 ms, hoisted 0.8 ms -> native (3.33x faster than the "
                             "loop; T=100 B=8 (declared), 9 rounds, noise 2%)"]
    assert [d.dim_param for d in out.graph.input[0].type.tensor_type.shape.dim][:2] == ["seq", "batch"]


def test_the_hoisted_loop_is_kept_where_it_measures_fastest(timer):
    timer.factors = {"native": 1.5, "hoisted": 0.8}
    out, report = run(input_shapes={"X": [100, 8, 3]})
    assert "Scan" in ops(out) and "RNN" not in ops(out)
    assert [o.pass_name for o in report.outcomes if o.applied and o.pass_name in ("fuse", "hoist")] == ["hoist"]


def test_an_advantage_within_the_noise_keeps_the_original(timer):
    timer.factors, timer.noise = {"native": 0.97, "hoisted": 0.99}, 0.04
    out, report = run(input_shapes={"X": [100, 8, 3]})
    assert not report.modified and ops(out) == ["Scan"]


def test_a_rerun_reads_the_cache_and_writes_the_same_bytes(timer):
    timer.factors = {"native": 0.3}
    first, _ = run(input_shapes={"X": [16, 1, 3]})
    second, report = run(input_shapes={"X": [16, 1, 3]})
    assert len(timer.calls) == 1
    assert first.SerializeToString() == second.SerializeToString()
    assert "cached" in next(o for o in report.outcomes if o.pass_name == "fuse").expected
    run(input_shapes={"X": [16, 2, 3]})  # other shapes: measured anew
    run(input_shapes={"X": [16, 1, 3]}, threads=2)  # other thread count: measured anew
    assert len(timer.calls) == 3


def test_identical_scans_are_measured_once(timer):
    timer.factors = {"native": 0.3}
    model = onnx.load(RNN)
    twin = onnx.NodeProto()
    twin.CopyFrom(model.graph.node[0])
    twin.name = "scan_rnn_2"
    renames = {o: o + "_2" for o in twin.output}
    twin.output[:] = [renames[o] for o in twin.output]
    model.graph.node.append(twin)
    model.graph.output.extend(onnx.helper.make_tensor_value_info(renames[v.name], v.type.tensor_type.elem_type, None)
                              for v in list(model.graph.output))
    out, report = run(model, input_shapes={"X": [32, 4, 3]})
    assert len(timer.calls) == 1 and ops(out).count("RNN") == 2


def test_unknown_deployment_dims_are_modelled_with_the_model_calibrated_once_on_the_machine(timer):
    out, report = run()
    assert any("deployment shape of 'h_0' unknown: [?,4]" in line for line in report.tuning), report.tuning
    # no form of this Scan was timed: only the calibration cells (scanopt.calibrate), 4 points
    assert len(timer.calls) == 4 and all(forms[:1] == ["loop"] and "native" not in forms for forms, _, _ in timer.calls)
    fuse = next(o for o in report.outcomes if o.pass_name == "fuse")
    assert "T, B unknown" in (fuse.expected or fuse.detail)
    assert "calibrated on this machine (native x" in (fuse.expected or fuse.detail)
    run()
    assert len(timer.calls) == 4  # cached
    out, report = run(tune=False)  # --no-tune: the committed constants, no calibration
    fuse = next(o for o in report.outcomes if o.pass_name == "fuse")
    assert "committed constants" in (fuse.expected or fuse.detail) and len(timer.calls) == 4


def test_user_feeds_imply_the_shapes(timer, tmp_path):
    timer.factors = {"native": 0.3}
    rng = np.random.default_rng(0)
    feeds = {"X": rng.standard_normal((7, 2, 3)).astype(np.float32), "h_0": np.zeros((2, 4), np.float32)}
    scanopt.optimize(onnx.load(RNN), inputs=[feeds], options={"tune": True})
    (forms, shapes, _), = timer.calls
    assert shapes == {"X": (7, 2, 3), "h_0": (2, 4)}


def test_declared_shapes_reach_verification(monkeypatch, timer):
    import scanopt.verify

    seen = []
    real = scanopt.verify.compare_models

    def spy(*args, **kwargs):
        seen.append([{k: v.shape for k, v in feeds.items()} for feeds in kwargs.get("inputs") or []])
        return real(*args, **kwargs)

    monkeypatch.setattr(scanopt.verify, "compare_models", spy)
    timer.factors = {"native": 0.3}
    run(input_shapes={"X": [11, 5, 3]})
    assert seen and {"X": (11, 5, 3), "h_0": (5, 4)} in seen[0]
    assert len(seen[0]) > 1  # the usual synthesized seeds still run too


def test_no_tune_never_measures(timer):
    out, report = run(input_shapes={"X": [100, 8, 3]}, tune=False)
    assert timer.calls == [] and report.tuning == []


def test_the_default_measures_where_shapes_are_known(monkeypatch, timer):
    monkeypatch.setenv("SCANOPT_TUNE", "1")
    timer.factors = {"native": 0.3}
    scanopt.optimize(onnx.load(RNN), options={"input_shapes": {"X": [16, 1, 3]}}, verify=False)
    assert len(timer.calls) == 1


def test_a_measurement_the_noise_leaves_open_falls_to_the_model_says_so_and_is_not_cached(timer):
    timer.factors, timer.noise, timer.scatter = {"native": 0.6, "hoisted": 0.9}, 0.4, 3.0
    out, report = run(input_shapes={"X": [100, 8, 3]})
    assert report.tuning[0].startswith("scan_rnn: measured loop 1 ms, native 0.6 ms, hoisted 0.9 ms: undecided under "
                                       "noise 40% after 9 rounds"), report.tuning
    assert report.tuning[0].endswith("(T=100 B=8 (declared)); modelled instead"), report.tuning
    fuse = next(o for o in report.outcomes if o.pass_name == "fuse")
    text = fuse.expected or fuse.detail
    assert text.startswith("measured loop 1 ms") and "(modelled: " in text and not fuse.measured, text
    run(input_shapes={"X": [100, 8, 3]})
    scan = [forms for forms, _, _ in timer.calls if "native" in forms]  # the others calibrate the model
    assert len(scan) == 2  # not cached: measured again


def test_retune_measures_again_and_overwrites_the_cache(timer):
    timer.factors = {"native": 0.3}
    run(input_shapes={"X": [16, 1, 3]})
    run(input_shapes={"X": [16, 1, 3]})
    assert len(timer.calls) == 1
    timer.factors = {"native": 1.5, "hoisted": 0.5}
    _, report = run(input_shapes={"X": [16, 1, 3]}, retune=True)
    assert len(timer.calls) == 2 and "-> hoisted" in report.tuning[0]
    _, report = run(input_shapes={"X": [16, 1, 3]})  # the new choice was written over the old
    assert len(timer.calls) == 2 and "-> hoisted" in report.tuning[0] and "cached" in report.tuning[0]


def test_a_form_needs_an_advantage_beyond_the_noise():
    def timings(ratio, spread, noise, rounds=25):
        return Timings({"loop": FormTime(1.0, 1.0, 0.0), "native": FormTime(ratio, ratio, spread)}, noise, rounds, "wall")

    assert decide(timings(0.9, 0.0, 0.02)).form == "native"
    assert decide(timings(0.97, 0.0, 0.05)).form == "loop"  # the A/A pair differs by more than that
    assert decide(timings(0.9, 0.2, 0.02)).form == "loop"  # too scattered for 25 rounds to tell
    assert decide(timings(0.9, 0.2, 0.02, rounds=2500)).form == "native"


def test_measure_runs_every_form_interleaved_with_an_aa_control():
    """The real timer on a tiny model: every form gets a median and a ratio to the loop."""
    model = onnx.load(RNN)
    feeds = {"X": np.ones((4, 1, 3), np.float32), "h_0": np.zeros((1, 4), np.float32)}
    result = measure({"loop": model, "same": model}, feeds, threads=1, seconds=0.3)
    assert list(result.forms) == ["loop", "same"] and result.rounds >= 5 and result.clock == "thread CPU"
    assert result.forms["loop"].ratio == 1.0 and result.forms["same"].seconds > 0 and result.noise >= 0.02


@pytest.mark.parametrize("flag, why", [
    ("Y:1,2,3", "no such input"), ("X:1,2", "rank 2 given"), ("X:1,2,5", "dim 2 is 3 in the model, 5 given"),
    ("X:a,2,3", "whole numbers"), ("X", "expected NAME:D0,D1"),
])
def test_bad_input_shapes_exit_2_with_one_line_and_write_nothing(cli, tmp_path, flag, why):
    out = tmp_path / "o.onnx"
    result = cli("optimize", RNN, out, "--input-shape", flag)
    assert result.code == 2 and why in result.err and len(result.err.strip().splitlines()) == 1
    assert not out.exists()


def test_cli_flags(cli, tmp_path, timer):
    timer.factors = {"native": 0.3}
    out = tmp_path / "o.onnx"
    result = cli("optimize", RNN, out, "--input-shape", "X:20,2,3", "--input-shape", "h_0:2,4", "--threads", "1", "--tune")
    assert result.code == 0, result.err
    assert timer.calls[0][1:] == ({"X": (20, 2, 3), "h_0": (2, 4)}, 1)
    assert cli("optimize", RNN, out, "--threads", "0").code == 2
    assert cli("optimize", RNN, out, "--tune", "--no-tune").code == 2
    assert cli("optimize", RNN, out, "--input-shape", "X:20,2,3", "--input-shape", "X:21,2,3").code == 2
    inspected = cli("inspect", RNN, "--input-shape", "X:20,2,3", "--input-shape", "h_0:2,4", "--threads", "1", "--tune")
    assert inspected.code == 0 and "native applied" in inspected.out
    assert len(timer.calls) == 1  # inspect read the cache optimize filled


def test_library_checks_the_deployment_options_before_any_work():
    from scanopt.errors import ScanoptError

    model = onnx.load(RNN)
    for options, why in (({"input_shapes": {"nope": [1]}}, "no such input"),
                         ({"input_shapes": {"X": [4, -1, 3]}}, "0 or more"),
                         ({"input_shapes": {"X": "4,1,3"}}, "must be a list of whole numbers"),
                         ({"threads": 0}, "at least 1"), ({"threads": 1.5}, "must be int")):
        with pytest.raises(ScanoptError, match=why):
            scanopt.optimize(model, options=options)


def test_upgrade_and_inspect_take_the_deployment_flags(cli, tmp_path):
    scan8 = os.path.join(MODELS, "scan8_sum.onnx")  # inputs initial [batch, 2], x [batch, seq, 2]
    out = tmp_path / "u.onnx"
    good = cli("upgrade", scan8, out, "--target-opset", "17", "--input-shape", "x:3,40,2", "--report", tmp_path / "r.json")
    assert good.code == 0, good.err
    import json

    assert json.loads((tmp_path / "r.json").read_text())["verification"]["passed"] is True
    bad = cli("upgrade", scan8, tmp_path / "v.onnx", "--target-opset", "17", "--input-shape", "x:3,40,5")
    assert bad.code == 2 and "dim 2 is 2 in the model, 5 given" in bad.err and not (tmp_path / "v.onnx").exists()
    assert cli("inspect", RNN, "--input-shape", "Q:1").code == 2


def test_every_pass_that_rewrites_the_scan_is_a_candidate_form(timer):
    """Static and short: the unrolled form is timed against the loop, and chosen when fastest."""
    import builders

    timer.factors = {"unrolled": 0.5}
    out, report = run(builders.scan9_sum(steps=3))
    (forms, feeds, _), = timer.calls
    assert forms == ["loop", "unrolled"] and feeds == {"s0": (2,), "X": (3, 2)}
    assert "Scan" not in ops(out)
    assert report.tuning[0].startswith("scan_sum: loop 1 ms, unrolled 0.5 ms -> unrolled (2.00x faster than the loop; "
                                       "T=3 B=1 (static)")


def test_a_loop_that_loop_to_scan_converts_is_measured_at_the_declared_shapes_like_a_scan(timer):
    """The Scan a TorchScript for-loop becomes exists only after loop_to_scan runs: the
    deployment decisions see the model with its Loops converted, so it is measured too."""
    timer.factors = {"native": 0.3, "hoisted": 0.8}
    model = onnx.load(os.path.join(MODELS, "loops", "ts_rnn_iter.onnx"))
    x = next(v for v in model.graph.input if len(v.type.tensor_type.shape.dim) == 3)
    out, report = run(model, input_shapes={x.name: [16, 4, x.type.tensor_type.shape.dim[2].dim_value]}, threads=1)
    assert timer.calls and timer.calls[0][0][0] == "loop"
    assert "RNN" in ops(out) and "Loop" not in ops(out)
    fuse = next(o for o in report.outcomes if o.pass_name == "fuse" and o.applied)
    assert fuse.expected.startswith("native applied: 0.3 ms vs loop 1 ms")


def test_the_report_reads_a_scan8s_length_from_axis_1_and_a_scan9s_from_its_scan_axis():
    """Scan-8 scans axis 1 (axis 0 is the batch); a Scan-9 its scan_input_axes: the
    report's T and B come from the reading the cost policy uses (cost.scan_dims)."""
    import builders

    from scanopt.tune import _where

    scan8 = builders.scan8_sum(batch=5, steps=3, seq_lens=False)
    node = scan8.graph.node[0]
    shapes = {name: (1, shape) for name, shape in (("s0", (5, 2)), ("X", (5, 3, 2)))}
    assert _where(node, 8, shapes) == "T=3 B=5"
    scan9 = builders.scan9_sum(steps=7, scan_input_axes=[1])
    node = scan9.graph.node[0]
    x = node.input[-1]
    assert _where(node, 11, {x: (1, (2, 7))}) == "T=7 B=1"


def test_per_step_producers_only_the_scan_reads_are_measured_with_it(timer):
    """mamba-minimal's export computes deltaA and deltaB_u for every step before its Scan (Einsums,
    Exp, the exporter's Softplus threshold, the permutes): linrec takes them into its steps, so
    each form is timed with them, fed from the projections they read, and the measured choice
    rewrites the model with them taken in."""
    timer.factors = {"linrec": 0.4}
    model = onnx.load(os.path.join(MODELS, "linrec", "torch_mamba_minimal_wide.onnx"))
    out, report = run(model, input_shapes={"x": [1, 40, 64]}, threads=1)
    (forms, feeds, _), = timer.calls
    assert "linrec" in forms and "x" in feeds and not {"permute", "permute_1", "exp_1"} & set(feeds), feeds
    assert set(feeds) >= {"split_with_sizes_split_1", "split_with_sizes_split_2"}  # B's and C's projections
    linrec = next(o for o in report.outcomes if o.pass_name == "linrec" and o.applied)
    assert "taken into the steps" in linrec.detail and linrec.expected.startswith("linrec applied: 0.4 ms")
    assert "Einsum" not in ops(out)


def test_a_producer_read_elsewhere_is_not_taken_along():
    import linrec_builders as lb

    model = lb.mamba_precomputed(T=12, read_a=True)
    scan = next(n for n in model.graph.node if n.op_type == "Scan")
    taken = [n.op_type for n in scanopt.tune.producers(scan, model)]
    assert taken == ["Einsum", "Transpose", "Transpose", "Transpose"], taken  # deltaB_u's Einsum, the permutes


def test_a_scan_too_slow_to_time_whole_is_timed_shortened_and_extrapolated(monkeypatch, tmp_path):
    """The real timer with a budget one run of the full length exceeds: the same Scan (same
    widths and batch) is timed at 16 and 32 steps (8 and 16 where a round of those is over the
    budget: a loaded machine) and extrapolated per step to its length."""
    import linrec_builders as lb

    monkeypatch.setenv("SCANOPT_CACHE_DIR", str(tmp_path / "cache"))
    model = lb.mingru(T=2048, I=64, H=64, B=2)
    out, report = run(model, tune_scan_seconds=0.02)
    line = report.tuning[0]
    shortened = re.search(r"measured at T=(\d+) and T=(\d+), extrapolated per step to T=2048", line)
    assert shortened and shortened.groups() in {("16", "32"), ("8", "16")} and "not measured" not in line, line
    applied = any(o.pass_name == "linrec" and o.applied for o in report.outcomes)
    won = re.search(r" -> (\S+) \(", line)  # what the extrapolated timings chose (load may blur a 0.02 s budget)
    if won:
        assert applied is ("linrec" in won.group(1)), line
    else:  # undecided under the noise: modelled, and the model applies a loop-free form
        assert "undecided" in line and applied, line


def rnn_chain(count: int) -> onnx.ModelProto:
    """``count`` copies of the README's RNN Scan in a chain (each one's final state starts the
    next), every value, weight and body named apart: identical Scans, names differing."""
    base = onnx.load(RNN)
    nodes, inits, state = [], [], "h_0"
    for k in range(count):
        scan = onnx.NodeProto()
        scan.CopyFrom(base.graph.node[0])
        rename = {t.name: f"{t.name}_{k}" for t in base.graph.initializer}
        body = scan.attribute[0].g
        body.name = f"rnn_body_{k}"
        for value in list(body.input) + list(body.output):
            rename.setdefault(value.name, f"{value.name}_{k}")
            value.name = rename[value.name]
        for n in body.node:
            n.input[:] = [rename.setdefault(x, f"{x}_{k}") for x in n.input]
            n.output[:] = [rename.setdefault(x, f"{x}_{k}") for x in n.output]
        scan.name = f"rnn_{k}"
        scan.input[:] = [state, "X"]
        scan.output[:] = [f"h_{k + 1}", f"Y_{k}"]
        state = f"h_{k + 1}"
        nodes.append(scan)
        for t in base.graph.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(t)
            copy.name = rename[t.name]
            inits.append(copy)
    out = onnx.helper.make_tensor_value_info(state, onnx.TensorProto.FLOAT, None)
    graph = onnx.helper.make_graph(nodes, "chain", list(base.graph.input), [out], initializer=inits)
    return onnx.helper.make_model(graph, opset_imports=list(base.opset_import), ir_version=base.ir_version)


def test_identical_scans_named_apart_are_measured_once_and_reported_in_one_line(timer):
    timer.factors = {"native": 0.3}
    counted = []
    out, report = scanopt.optimize(rnn_chain(40), options={"tune": True}, input_shapes={"X": [4, 1, 3], "h_0": [1, 4]},
                                   seeds=1, progress=_Counter(counted))
    assert len(timer.calls) == 1 and ops(out).count("RNN") == 40
    assert report.tuning == ["40 Scans (rnn_0, ...): loop 1 ms, native 0.3 ms, hoisted 1 ms -> native "
                             "(3.33x faster than the loop; T=4 B=1 (declared), 9 rounds, noise 2%, measured once)"]
    assert (0, 40) in counted and (40, 40) in counted  # the Scans counted while timing
    assert len(report.format().splitlines()) <= 30


class _Counter:
    """A progress callback that records its counters."""

    def __init__(self, seen):
        self.seen = seen

    def __call__(self, phase):
        pass

    def count(self, done, total):
        self.seen.append((done, total))


def test_a_scan_of_50_steps_is_cut_to_16_and_32_steps_and_one_of_20_is_not():
    """The two cuts (16 and 32 steps) need only a length over 32 (T=50 was refused as short)."""
    import linrec_builders as lb

    from scanopt.tune_short import shortened

    for steps_total, cuts in ((50, {16: 16, 32: 32}), (20, {16: 16, 32: None})):
        model = lb.mingru(T=steps_total, I=8, H=8, B=2)
        shapes = {v.name: (1, tuple(d.dim_value for d in v.type.tensor_type.shape.dim)) for v in model.graph.input}
        for steps, want in cuts.items():
            found = shortened(model, model.graph.node[0], 17, shapes, steps)
            if want is None:
                assert isinstance(found, str) and "already short" in found
            else:
                short, cut, total = found
                assert total == steps_total and cut["X"][1] == (want, 2, 8)
                assert [d.dim_value for d in short.graph.input[1].type.tensor_type.shape.dim] == [want, 2, 8]


class BigModelTimer:
    """Stands in for scanopt.timing.measure on a big model: with the budget check on, any run
    longer than ``fits`` steps is over the budget; a form's time is its steps times its factor."""

    def __init__(self, fits, factors):
        self.fits, self.factors, self.calls = fits, factors, []

    def __call__(self, forms, feeds, *, threads, seconds, check_budget=True, patience=None, form_feeds=None):
        from scanopt.timing import AA, summarize

        steps = {name: (form_feeds or {}).get(name, feeds)["X"].shape[0] for name in forms}
        self.calls.append((sorted(set(steps.values())), check_budget))
        if check_budget and max(steps.values()) > self.fits:
            return f"one run of every form takes 3.00 s, over the time budget of {seconds:g} s"
        samples = {name: [1e-4 * steps[name] * self.factors.get(name.split(" @")[0], 1.0)] * 9 for name in forms}
        first = next(iter(forms))
        samples[AA] = list(samples[first])
        return summarize(samples, "thread CPU")


@pytest.mark.parametrize("fits, cut", [(32, "T=16 and T=32"), (16, "T=8 and T=16"), (4, "T=8 and T=16, extrapolated per step to T=512 (one round over the 2 s budget, timed anyway)")])
def test_a_big_lstm_is_measured_shortened_even_where_16_steps_are_over_the_budget(monkeypatch, tmp_path, fits, cut):
    """LSTM T=512 B=64 (widths small here: the timer says what a wide one costs): the full length
    is over the budget, so it is timed at 16/32 steps, else 8/16, else 8/16 with the check relaxed,
    and the form measured fastest is chosen (not modelled)."""
    from cell_builders import Body, cell, scan_model

    monkeypatch.setenv("SCANOPT_CACHE_DIR", str(tmp_path / "cache"))
    body = Body(hidden=8, inputs=8)
    states, h_new = cell("LSTM", body)
    model = scan_model(body, states, ys=(h_new,))
    timer = BigModelTimer(fits, {"native": 0.4, "hoisted": 0.9})
    monkeypatch.setattr(scanopt.tune, "measure", timer)
    shapes = dict({"X": [512, 64, 8]}, **{f"{s}0": [64, 8] for s, _, _ in states})
    out, report = scanopt.optimize(model, options={"tune": True}, input_shapes=shapes, seeds=1)
    line = next(line for line in report.tuning if "-> " in line or "not measured" in line)
    assert f"measured at {cut}" in line and "extrapolated per step to T=512" in line and "-> native" in line, line
    assert "LSTM" in ops(out) and "Scan" not in ops(out)
    assert timer.calls[0] == ([512], True)  # the full length was tried first
