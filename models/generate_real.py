"""Regenerate models/real/: Scan models as other projects write them (issue 10's corpus).

    python models/generate_real.py            # needs onnxscript for the os_* files

- ``ort_*``: the cases of onnxruntime's Scan unit tests (scan_test.cc), built by
  tests/ort_scan_cases.py (the same builders the reference-executor tests use), at opsets
  8, 9, 11 and 16, with and without shapes in the main graph and in the body.
- ``backend_*``: onnx's backend Scan test models, taken from the test-case code shipped in
  the onnx package (onnx.backend.test.case.node.scan; its data/node folder is not in every
  wheel), i.e. the same protos as test_scan_sum/model.onnx and friends.
- ``os_*``: Scans authored with onnxscript (``pip install onnxscript``); one without
  output annotations, so its graph outputs carry no type, as onnxscript writes them.
- ``nested_*``: Scan-8 inside Loop and If bodies, and a zero-length Scan-9 (onnxruntime
  cannot run it; the reference executor can), hand-written.

Running it twice writes byte-identical files.
"""

from __future__ import annotations

import os
import sys

import onnx
from onnx import TensorProto as TP
from onnx import helper as oh

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "real")
sys.path.insert(0, os.path.join(HERE, "..", "tests"))

from ort_scan_cases import (  # noqa: E402
    counting_concat_split_body,
    counting_concat_split_model,
    crossing_model,
    scan8_model,
    scan9_model,
)
from reference_helpers import make_model  # noqa: E402

ORT_OPSETS = (8, 9, 11, 16)


def ort_cases() -> dict[str, onnx.ModelProto]:
    models = {}
    for opset in ORT_OPSETS:
        for main in (False, True):
            for sub in (True, False):
                body = counting_concat_split_body(opset, dims_in_main=main, dims_in_sub=sub, types_in_sub=sub)
                name = f"ort_short_sequence_o{opset}_{'main' if main else 'nomain'}_{'sub' if sub else 'nosub'}"
                models[name] = counting_concat_split_model(opset, body, dims_in_main=main)
        body = counting_concat_split_body(opset, outer_scope_add=True)
        models[f"ort_outer_scope_o{opset}_nomain"] = counting_concat_split_model(opset, body)
        models[f"ort_mixed_types_o{opset}"] = crossing_model(opset, [TP.FLOAT, TP.INT64], [1])
        models[f"ort_unknown_dim_o{opset}"] = crossing_model(opset, [TP.FLOAT], ["input_size"], dim_param="param")
    for opset in (9, 16):
        body = counting_concat_split_body(opset, dims_in_sub=False, types_in_sub=False, scalar_state=True)
        models[f"ort_scalar_state_o{opset}_nomain"] = counting_concat_split_model(opset, body, scalar_state=True)
    models["ort_scan8_lens_o8"] = scan8_model(3, 2, with_lens=True)
    models["ort_scan8_lens_reverse_o8"] = scan8_model(2, 2, with_lens=True, directions=[1, 1])
    models["ort_reversed_input_o11"] = scan9_model(11, scan_input_directions=[0, 1])
    models["ort_reversed_output_o11"] = scan9_model(11, scan_output_directions=[0, 1, 1, 0])
    for opset in (11, 16):
        models[f"ort_transpose_input_o{opset}"] = scan9_model(opset, scan_input_axes=[1, -1])
        models[f"ort_transpose_output_o{opset}"] = scan9_model(opset, scan_output_axes=[1, -1, 0, 0])
    return models


def backend_cases() -> dict[str, onnx.ModelProto]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the collector imports every op's cases
        from onnx.backend.test.case.node import collect_testcases

        cases = collect_testcases("Scan")
    return {f"backend_{case.name}": case.model for case in cases}


def onnxscript_cases() -> dict[str, onnx.ModelProto]:
    sys.path.insert(0, HERE)
    from real_onnxscript import MODELS

    return {name: function.to_model_proto() for name, function in MODELS.items()}


def vi(name, shape, elem=TP.FLOAT):
    return oh.make_tensor_value_info(name, elem, shape)


def scan8_sum_body(prefix: str) -> onnx.GraphProto:
    return oh.make_graph(
        [oh.make_node("Add", [f"{prefix}s", f"{prefix}x"], [f"{prefix}s2"]),
         oh.make_node("Identity", [f"{prefix}s2"], [f"{prefix}y"])],
        f"{prefix}body",
        [vi(f"{prefix}s", [2]), vi(f"{prefix}x", [2])],
        [vi(f"{prefix}s2", [2]), vi(f"{prefix}y", [2])],
    )


def nested_cases() -> dict[str, onnx.ModelProto]:
    # Loop (opset 8) whose body runs a Scan-8 over the captured X, carrying its final state.
    scan = oh.make_node("Scan", ["", "acc", "X"], ["acc2", "ys"], body=scan8_sum_body("in_"), num_scan_inputs=1)
    loop_body = oh.make_graph(
        [scan, oh.make_node("Identity", ["cond"], ["cond_out"])],
        "loop_body",
        [vi("i", [], TP.INT64), vi("cond", [], TP.BOOL), vi("acc", None)],
        [vi("cond_out", [], TP.BOOL), vi("acc2", None)],
    )
    loop = oh.make_node("Loop", ["trips", "keep_going", "s0"], ["s_final"], body=loop_body)
    in_loop = make_model(
        8, [loop],
        [vi("trips", [], TP.INT64), vi("keep_going", [], TP.BOOL), vi("s0", ["B", 2]), vi("X", ["B", "T", 2])],
        [vi("s_final", ["B", 2])],
    )

    # If (opset 8): a forward Scan-8 with sequence_lens in one branch, a reverse one in the other.
    then_body = oh.make_graph(
        [oh.make_node("Scan", ["lens", "s0", "X"], ["t_s", "t_y"], body=scan8_sum_body("t_"), num_scan_inputs=1)],
        "then", [], [vi("t_s", ["B", 2]), vi("t_y", ["B", "T", 2])],
    )
    else_body = oh.make_graph(
        [oh.make_node("Scan", ["lens", "s0", "X"], ["e_s", "e_y"], body=scan8_sum_body("e_"), num_scan_inputs=1,
                      directions=[1])],
        "else", [], [vi("e_s", ["B", 2]), vi("e_y", ["B", "T", 2])],
    )
    branch = oh.make_node("If", ["flag"], ["s_final", "ys"], then_branch=then_body, else_branch=else_body)
    in_if = make_model(
        8, [branch],
        [vi("flag", [], TP.BOOL), vi("lens", ["B"], TP.INT64), vi("s0", ["B", 2]), vi("X", ["B", "T", 2])],
        [vi("s_final", ["B", 2]), vi("ys", ["B", "T", 2])],
    )

    # A zero-length Scan-9: onnxruntime fails to run it, the reference executor returns the
    # initial state and an empty scan output.
    zero = oh.make_node("Scan", ["s0", "X"], ["s_final", "Y"], body=scan8_sum_body("z_"), num_scan_inputs=1)
    zero_length = make_model(11, [zero], [vi("s0", [2]), vi("X", [0, 2])], [vi("s_final", [2]), vi("Y", [0, 2])])
    return {"nested_scan8_in_loop_o8": in_loop, "nested_scan8_in_if_o8": in_if, "scan9_zero_length_o11": zero_length}


def main() -> None:
    os.makedirs(OUT, exist_ok=True)
    models = {**ort_cases(), **backend_cases(), **nested_cases()}
    try:
        models.update(onnxscript_cases())
    except ImportError:
        print("onnxscript is not installed: keeping the committed os_* files", file=sys.stderr)
    for name, model in sorted(models.items()):
        with open(os.path.join(OUT, f"{name}.onnx"), "wb") as handle:
            handle.write(model.SerializeToString(deterministic=True))
    print(f"wrote {len(models)} models to {OUT}")


if __name__ == "__main__":
    main()
