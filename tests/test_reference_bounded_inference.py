"""The reference executor's zero-length Scan infers its body's output types within
scanopt.inference's bounds: a body declaring a Range of 10**12 steps once took minutes and
every byte allowed (onnx's data propagation made one element per step)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from scanopt.engines import run


def _zero_length_scan(limit: int) -> onnx.ModelProto:
    """A Scan whose scan output y = Cast(Range(0, limit)) * x declares no shape: with no
    step to run, the executor infers it (its length is ``limit``)."""
    vi = h.make_tensor_value_info
    n = h.make_node

    def const(name, value):
        return n("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.int64)))

    body = h.make_graph(
        [const("zero", 0), const("limit", limit), const("one", 1), n("Range", ["zero", "limit", "one"], ["r"]),
         n("Cast", ["r"], ["rf"], to=TP.FLOAT), n("Add", ["s", "x"], ["s2"]), n("Mul", ["rf", "x"], ["y"])],
        "body", [vi("s", TP.FLOAT, [1]), vi("x", TP.FLOAT, [1])], [vi("s2", TP.FLOAT, [1]), vi("y", TP.FLOAT, None)])
    graph = h.make_graph([n("Scan", ["s0", "X"], ["s_n", "Y"], num_scan_inputs=1, body=body)], "g",
                         [vi("s0", TP.FLOAT, [1]), vi("X", TP.FLOAT, ["T", 1])],
                         [vi("s_n", TP.FLOAT, [1]), vi("Y", TP.FLOAT, None)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)


FEEDS = {"s0": np.array([0.5], np.float32), "X": np.zeros((0, 1), np.float32)}


def test_a_zero_length_scan_gets_its_inferred_output_shape():
    out = run(_zero_length_scan(5000), FEEDS, "reference")
    assert out["Y"].shape == (0, 5000) and out["Y"].dtype == np.float32
    np.testing.assert_array_equal(out["s_n"], [0.5])


HUGE = """
import resource, sys
import numpy as np
import scanopt.engines, scanopt.reference
sys.path.insert(0, sys.argv[1])
from test_reference_bounded_inference import FEEDS, _zero_length_scan
vm = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmSize')) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + 1024 * 2**20, resource.RLIM_INFINITY))
out = scanopt.engines.run(_zero_length_scan(10**12), FEEDS, "reference")
print(out["Y"].shape)
"""


def test_a_body_declaring_a_huge_range_is_inferred_in_bounded_time_and_memory():
    import os

    done = subprocess.run([sys.executable, "-c", HUGE, os.path.dirname(__file__)], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-1500:]
    assert done.stdout.split("\n")[-2] == f"(0, {10**12})"
