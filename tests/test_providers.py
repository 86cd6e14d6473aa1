"""The deployment target's execution provider (scanopt.providers, issue 30): names and flags,
the CPU's choice unchanged, a provider absent here modelled and said so, the CUDA model
against the measured table it was fitted to, the nodes another provider took. The GPU's own
measurement runs only where onnxruntime offers CUDA (skipped otherwise, with the reason)."""

from __future__ import annotations

import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import scanopt
from equivalence import top_ops
from test_tune import FakeTimer
import scanopt.providers as providers
import scanopt.tune
from scanopt.cost import MODEL_MARGIN, range_choice
from scanopt.errors import InvalidArgumentError
from scanopt.providers import CPU, CUDA, cuda_seconds, plan, resolve

sys.path.insert(0, os.path.dirname(__file__))
import cell_builders as cb  # noqa: E402

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")
RNN = os.path.join(MODELS, "scan_rnn.onnx")  # I=3, H=4, dims seq and batch symbolic
HAS_CUDA = CUDA in ort.get_available_providers()
NO_CUDA = "CUDAExecutionProvider is not in onnxruntime.get_available_providers() (no GPU build or device here)"


def cell(kind, I, H, lbr=0):
    body = cb.Body(hidden=H, inputs=I)
    states, y = cb.cell(kind, body, **({"lbr": lbr} if kind == "GRU" else {}))
    return cb.scan_model(body, states, ys=(y,))


def ops(model):
    """Top-level op types, behind the empty-input guards too (equivalence.top_ops)."""
    return list(top_ops(model).elements())


# -- names and flags -------------------------------------------------------------------------


def test_short_and_full_names_resolve_in_priority_order_without_repeats():
    assert resolve(["cuda", "CPU"]) == (CUDA, CPU)
    assert resolve("CUDAExecutionProvider,cpu") == (CUDA, CPU)
    assert resolve(["tensorrt", "trt", "cuda"]) == ("TensorrtExecutionProvider", CUDA)
    assert resolve(["openvino", "dml", "coreml", "directml"]) == (
        "OpenVINOExecutionProvider", "DmlExecutionProvider", "CoreMLExecutionProvider")
    assert resolve(None) == (CPU,)


def test_an_unknown_name_is_one_line_naming_the_known_ones():
    with pytest.raises(InvalidArgumentError) as caught:
        resolve(["cudaa"])
    text = str(caught.value)
    assert "\n" not in text and "did you mean" in text and "known: " in text and "cuda" in text and "openvino" in text


def test_the_library_refuses_an_unknown_provider_before_any_work():
    with pytest.raises(InvalidArgumentError, match="unknown execution provider 'gpu'"):
        scanopt.optimize(onnx.load(RNN), options={"execution_providers": ["gpu"]})


def test_the_flag_repeats_and_an_unknown_name_exits_2_in_one_line(cli, tmp_path):
    out = tmp_path / "o.onnx"
    ok = cli("optimize", RNN, out, "--no-tune", "--execution-provider", "cuda", "--execution-provider",
             "CPUExecutionProvider", "--input-shape", "X:100,8,3")
    assert ok.code == 0, ok
    assert "target cuda: not available here" in ok.out
    bad = cli("optimize", RNN, out, "--execution-provider", "cuda", "--execution-provider", "nope")
    lines = bad.err.strip().splitlines()
    assert bad.code == 2 and len(lines) == 1 and "unknown execution provider 'nope'" in lines[0]
    assert "known: " in lines[0] and "tensorrt" in lines[0] and "Traceback" not in bad.err


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here: nothing falls back")
def test_run_with_an_absent_provider_says_so_in_one_line_and_runs_on_the_cpu(cli):
    result = cli("run", RNN, "--execution-provider", "cuda")
    assert result.code == 0, result
    assert result.err.strip().splitlines() == [result.err.strip()]
    assert "cuda: not available here" in result.err and "running on cpu instead" in result.err
    assert "outputs:" in result.out
    same = cli("verify", RNN, RNN, "--execution-provider", "cuda", "--seeds", "1")
    assert same.code == 0 and "running on cpu instead" in same.err


# -- the CPU: today's choice -----------------------------------------------------------------


@pytest.fixture
def timer(monkeypatch, tmp_path):
    monkeypatch.setenv("SCANOPT_CACHE_DIR", str(tmp_path / "cache"))
    fake = FakeTimer({"native": 0.3, "hoisted": 0.8})
    monkeypatch.setattr(scanopt.tune, "measure", fake)
    return fake


@pytest.mark.parametrize("tune", [True, False])
def test_the_cpu_provider_chooses_exactly_as_without_a_provider(timer, tune):
    model = onnx.load(RNN)
    base = {"tune": tune, "input_shapes": {"X": [100, 8, 3]}, "threads": 1, "tune_cache": "off"}
    plain, plain_report = scanopt.optimize(model, options=base, seeds=1)
    named, named_report = scanopt.optimize(model, options=dict(base, execution_providers=["cpu"]), seeds=1)
    assert plain.SerializeToString(deterministic=True) == named.SerializeToString(deterministic=True)
    assert plain_report.tuning == named_report.tuning and named_report.target == ""
    assert [o.expected for o in plain_report.outcomes] == [o.expected for o in named_report.outcomes]
    if tune:
        assert len(timer.calls) == 2 and timer.devices == [{}, {}]  # the CPU's call, unchanged


# -- CUDA absent: modelled, and said so ---------------------------------------------------------


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here: it is measured, not modelled")
def test_cuda_absent_is_modelled_never_measured_on_the_cpu_and_the_report_says_so(timer):
    model = cell("RNN", 64, 128)
    out, report = scanopt.optimize(model, options={"execution_providers": ["cuda", "cpu"], "tune": True,
                                                   "input_shapes": {"X": [100, 4, 64]}}, verify=False)
    assert timer.calls == []  # the CPU is not timed in the GPU's place
    assert report.target.startswith("cuda: not available here (onnxruntime ")
    assert "modelled for CUDA, not measured" in report.target and "CudaConstants" in report.target
    assert "target cuda: not available here" in report.format()
    assert report.to_dict()["target"] == report.target
    fuse = next(o for o in report.outcomes if o.pass_name == "fuse")
    assert fuse.applied and "CUDA model, not measured" in fuse.expected


def test_a_provider_without_a_model_gets_the_portable_preference_and_says_so():
    target = plan(["openvino"], available=[CPU])
    assert target.mode == "portable" and "no cost model" in target.note and "not measured" in target.note
    out, report = scanopt.optimize(cell("RNN", 64, 128), options={"execution_providers": ["openvino"]},
                                   input_shapes={"X": [100, 4, 64]}, verify=False)
    assert "RNN" in ops(out) and "openvino: not available here" in report.target


def test_tensorrt_absent_is_modelled_by_cuda():
    target = plan(["tensorrt", "cuda"], available=[CPU])
    assert target.mode == "modelled" and target.model == "cuda" and "its loops run on CUDA" in target.note


# -- the CUDA decision differs from the CPU's where the model says so -----------------------------


def test_rnn_100x4x64x128_stays_a_loop_for_the_cpu_and_goes_native_for_cuda():
    # measured (../shared/perf/GPU-AND-QUIET-CPU.md): native 0.43x on one CPU thread, 2.44x on CUDA
    model = cell("RNN", 64, 128)
    shapes = {"X": [100, 4, 64]}
    on_cpu, _ = scanopt.optimize(model, input_shapes=shapes, options={"threads": 1}, verify=False)
    on_cuda, report = scanopt.optimize(model, input_shapes=shapes, verify=False,
                                       options={"threads": 1, "execution_providers": ["cuda"]})
    assert "RNN" not in ops(on_cpu) and "Scan" in ops(on_cpu)
    assert "RNN" in ops(on_cuda) and "Scan" not in ops(on_cuda)


def test_gru_lbr0_at_b64_h512_keeps_the_scan_for_cuda_where_lbr1_goes_native():
    # measured: the native GRU (lbr 0) 512x64x512x512 is 0.29x the Scan on CUDA
    shapes = {"X": [512, 64, 512]}
    kept, report = scanopt.optimize(cell("GRU", 512, 512, lbr=0), input_shapes=shapes, verify=False,
                                    options={"execution_providers": ["cuda"]}, passes=["canonicalize", "fuse"])
    assert "GRU" not in ops(kept)
    fuse = next(o for o in report.outcomes if o.pass_name == "fuse")
    assert "on onnxruntime CUDA" in fuse.detail and "not measured" in fuse.detail
    fused, _ = scanopt.optimize(cell("GRU", 512, 512, lbr=1), input_shapes=shapes, verify=False,
                                options={"execution_providers": ["cuda"]}, passes=["canonicalize", "fuse"])
    assert "GRU" in ops(fused)


# The cells of ../shared/perf/GPU-AND-QUIET-CPU.md: (kind, T, B, I, H, body nodes, lbr, Scan ms on
# CUDA, native's speed-up over the Scan there); the model is pinned to them.
CUDA_TABLE = [("RNN", 100, 8, 3, 4, 7, 0, 6.6, 2.36), ("LSTM", 100, 8, 3, 4, 16, 0, 11.7, 4.46),
              ("RNN", 100, 4, 64, 128, 7, 0, 7.2, 2.44), ("GRU", 100, 4, 64, 128, 20, 0, 17.7, 6.82),
              ("LSTM", 100, 4, 64, 128, 16, 0, 9.4, 4.26), ("LSTM", 200, 16, 128, 256, 16, 0, 24.2, 5.88),
              ("GRU", 50, 64, 256, 256, 20, 1, 7.1, 3.31), ("LSTM", 512, 64, 512, 512, 16, 0, 72.6, 2.48),
              ("GRU", 512, 64, 512, 512, 20, 0, 92.4, 0.29), ("RNN", 1000, 1, 128, 128, 7, 0, 54.5, 3.13)]


@pytest.mark.parametrize("kind,T,B,I,H,nodes,lbr,scan_ms,native", CUDA_TABLE)
def test_the_cuda_model_picks_the_measured_winner_of_each_cell(kind, T, B, I, H, nodes, lbr, scan_ms, native):
    p = dict(T=T, B=B, I=I, H=H, K=1, lbr=lbr)
    loop = cuda_seconds("loop", kind, p, nodes)
    assert 0.7 < loop * 1e3 / scan_ms < 1.45  # the Scan's time within the model's stated error
    ratios = {f: [MODEL_MARGIN[f] * cuda_seconds(f, kind, p, nodes) / loop] for f in ("fuse", "hoist")}
    best, _ = range_choice(ratios)
    assert best == ("fuse" if native > 1 else "loop")


# -- what another provider took ------------------------------------------------------------------


def test_placement_names_each_nodes_provider_and_the_cpu_provider_has_no_fallbacks():
    model = onnx.load(RNN)
    feeds = {"X": np.zeros((5, 2, 3), np.float32), "h_0": np.zeros((2, 4), np.float32)}
    assert providers.fallbacks(model, feeds, [CPU]) == []


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here: its nodes do not fall back")
def test_a_provider_that_cannot_take_the_nodes_shows_them_as_fallbacks():
    model = onnx.load(RNN)
    feeds = {"X": np.zeros((5, 2, 3), np.float32), "h_0": np.zeros((2, 4), np.float32)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # onnxruntime warns that the provider is not available
        left = providers.fallbacks(model, feeds, [CUDA])
    assert left and all(name.endswith("(cpu)") for name in left)
    assert any(name.startswith("scan_rnn") for name in left)


@pytest.mark.skipif(HAS_CUDA, reason="CUDA is available here: the real device path runs below")
def test_a_measured_device_times_with_its_provider_list_and_reports_the_fallbacks(timer, monkeypatch):
    real = providers.plan
    monkeypatch.setattr(providers, "plan", lambda names: real(names, available=[CUDA, CPU], probe=lambda p: None))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out, report = scanopt.optimize(onnx.load(RNN), options={"execution_providers": ["cuda"], "tune": True,
                                                                "input_shapes": {"X": [100, 8, 3]}}, seeds=1)
    ((forms, _, _),), (device,) = timer.calls, timer.devices
    assert device == {"providers": [CUDA, CPU]}
    assert report.target.startswith("cuda: measured in sessions with providers cuda > cpu")
    assert "RNN" in ops(out)
    assert "loop left on another provider: " in report.tuning[0] and "(cpu)" in report.tuning[0]


@pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)
def test_cuda_measured_on_the_gpu(tmp_path):  # pragma: no cover - needs a GPU
    out, report = scanopt.optimize(cell("RNN", 64, 128), options={"execution_providers": ["cuda"], "tune": True,
                                                                  "tune_cache": "off"},
                                   input_shapes={"X": [100, 4, 64]}, seeds=1)
    assert report.target.startswith("cuda: measured")
    assert report.tuning and " -> " in report.tuning[0]
    assert "RNN" in ops(out)  # 2.44x on an H100


def test_the_summary_names_the_provider_a_decline_was_modelled_for():
    _, report = scanopt.optimize(cell("GRU", 512, 512, lbr=0), input_shapes={"X": [512, 64, 512]}, verify=False,
                                 options={"execution_providers": ["cuda"]}, passes=["canonicalize", "fuse"])
    text = report.format()
    assert "predicted slower on onnxruntime CUDA (" in text and "onnxruntime CPU" not in text


def test_under_cuda_the_report_says_whether_the_output_is_capturable_in_a_cuda_graph():
    """CUDA graphs cannot capture If, Loop or Scan (onnxruntime issue 9978): a running sum over a
    static length becomes one CumSum (capturable); a cell over a dynamic X is fused behind an
    empty-input If (not capturable, and the line says what is left)."""
    import linrec_builders as lb

    _, report = scanopt.optimize(lb.running_sum(T=16, H=4), verify=False, options={"execution_providers": ["cuda"]})
    assert "no If, Loop or Scan left: capturable in a CUDA graph" in report.target, report.target
    body = cb.Body(hidden=4, inputs=3)
    y = cb.gru(body, "x", "h")
    model = cb.scan_model(body, [("h", y, 4)], ys=(y,))
    _, report = scanopt.optimize(model, verify=False, options={"execution_providers": ["cuda"]})
    assert "not capturable in a CUDA graph: 1 If" in report.target, report.target
    _, report = scanopt.optimize(model, verify=False)
    assert "CUDA graph" not in report.format()  # the CPU target says nothing of it


@pytest.mark.parametrize("name", ["running_sum", "ema", "mingru", "mamba", "linear_attention"])
def test_the_cuda_model_writes_the_loop_free_form_of_the_tables_recurrences(name):
    """The shared table's five loop-free cells (running sum, EMA, minGRU, selective scan, decayed
    linear attention): on CUDA the loop-free form measured 1.0-35x the Scan (a Scan step costs
    launches whatever its width), so with --execution-provider cuda the model writes it (with the
    10 recurrent cells above: the model's pick is the table's fastest in 15 of 15)."""
    import linrec_builders as lb

    model = getattr(lb, name)(T=64)
    out, report = scanopt.optimize(model, options={"execution_providers": ["cuda"]})
    assert [o.pass_name for o in report.outcomes if o.applied and o.pass_name == "linrec"] == ["linrec"], report.format()
    assert report.verification["passed"] is True
    assert "Scan" not in top_ops(out)
