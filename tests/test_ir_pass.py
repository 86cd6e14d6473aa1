"""scanopt.ir_pass: the pipeline as an onnx_ir pass returning onnx_ir's PassResult(model,
modified), for conversion pipelines built on onnx_ir (torch.onnx.export(dynamo=True),
onnxscript). Skipped where onnx_ir is not installed."""

from __future__ import annotations

import os

import onnx
import pytest

import scanopt
from equivalence import assert_equivalent, top_ops
from scanopt.errors import InvalidArgumentError

ir = pytest.importorskip("onnx_ir")

MODELS = os.path.join(os.path.dirname(__file__), "..", "models")


def _ir_model(name: str):
    return ir.serde.deserialize_model(onnx.load(os.path.join(MODELS, name)))


def test_the_pass_returns_onnx_irs_pass_result_with_a_new_equivalent_model():
    model = _ir_model("scan_rnn.onnx")
    before = ir.serde.serialize_model(model).SerializeToString()
    scan_pass = scanopt.ir_pass(options={"target": "portable"})
    result = scan_pass(model)
    assert isinstance(result, ir.passes.PassResult) and result.modified
    assert result.model is not model and isinstance(result.model, ir.Model)
    assert ir.serde.serialize_model(model).SerializeToString() == before  # the input is left as it was
    out = ir.serde.serialize_model(result.model)
    assert "RNN" in top_ops(out)
    assert_equivalent(onnx.load(os.path.join(MODELS, "scan_rnn.onnx")), out)
    assert scan_pass.report.verification["passed"] is True


def test_nothing_to_do_is_not_modified():
    result = scanopt.ir_pass(passes=["canonicalize"])(_ir_model("scan_rnn.onnx"))
    assert result.modified is False


def test_the_pass_runs_in_an_onnx_ir_pass_manager_after_another_pass():
    common = pytest.importorskip("onnx_ir.passes.common")
    manager = ir.passes.PassManager([common.RemoveUnusedNodesPass(),
                                     scanopt.ir_pass(options={"target": "portable"}, verify=False)])
    result = manager(_ir_model("scan_gru.onnx"))
    assert result.modified and "GRU" in top_ops(ir.serde.serialize_model(result.model))


def test_arguments_are_checked_when_the_pass_is_made():
    with pytest.raises(InvalidArgumentError, match="unknown option 'unrol_max'"):
        scanopt.ir_pass(options={"unrol_max": 2})
    with pytest.raises(InvalidArgumentError, match="did you mean 'options'"):
        scanopt.ir_pass(option={"target": "portable"})


def test_a_torch_dynamo_export_goes_through_the_pass_to_a_saved_model(tmp_path):
    """The README recipe: torch.onnx.export(dynamo=True) -> scanopt.ir_pass -> save."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    try:
        from torch._higher_order_ops import scan
    except ImportError:
        pytest.skip("this torch has no scan higher-order op")
    import numpy as np

    class Rnn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ih, self.hh = torch.nn.Linear(3, 4), torch.nn.Linear(4, 4)

        def forward(self, x, h0):
            def step(h, x_t):
                h = torch.tanh(self.ih(x_t) + self.hh(h))
                return h, h.clone()

            h_n, y = scan(step, h0, x)
            return y, h_n

    torch.manual_seed(0)
    module, x, h0 = Rnn().eval(), torch.randn(5, 2, 3), torch.randn(2, 4)
    try:
        program = torch.onnx.export(module, (x, h0), dynamo=True, verbose=False)
    except Exception as exc:  # noqa: BLE001 - an exporter that cannot lower scan here is not scanopt's test
        pytest.skip(f"torch.onnx.export(dynamo=True) failed: {type(exc).__name__}")
    result = scanopt.ir_pass(options={"target": "portable"})(program.model)
    assert result.modified
    program.model = result.model
    path = tmp_path / "rnn.opt.onnx"
    program.save(str(path))
    saved = onnx.load(str(path))
    assert "RNN" in {n.op_type for n in saved.graph.node} and "Scan" not in {n.op_type for n in saved.graph.node}
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = dict(zip([i.name for i in session.get_inputs()], (x.numpy(), h0.numpy())))
    with torch.no_grad():
        expected = [t.numpy() for t in module(x, h0)]
    for got, want in zip(session.run(None, feeds), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
