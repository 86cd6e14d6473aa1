"""Hostile bytes never give a traceback: byte-flip mutants of the committed sample models
end as exit 0/1, or exit 2 with one line free of raw control characters.

Deterministic (fixed seed) and bounded: a few dozen mutants per command, some seconds.
``SCANOPT_FUZZ_N=1000`` runs that many per command (the bar: 1,000 mutants, 0 findings);
``python tests/fuzz_models.py 1000 --commands optimize,inspect,run,verify`` prints a table.
"""

from __future__ import annotations

import os
import re

import numpy as np
import onnx
import pytest

import builders as b
import fuzz_models
import scanopt

N = int(os.environ.get("SCANOPT_FUZZ_N", "100"))


@pytest.mark.parametrize("command", ["optimize", "inspect", "run", "verify"])
def test_byte_flip_mutants_give_no_traceback(tmp_path, command):
    codes, findings = fuzz_models.fuzz(N, (command,), seed=0, work=str(tmp_path))[command]
    assert not findings, "\n".join(f"{label}: {problem}" for label, problem in findings[:3])
    assert sum(codes.values()) == N


def test_the_mutants_are_deterministic_and_mutated():
    first, again = list(fuzz_models.mutants(20, seed=3)), list(fuzz_models.mutants(20, seed=3))
    assert first == again
    changed = 0
    for label, data in first:
        with open(os.path.join(fuzz_models.ROOT, label.split("#")[0]), "rb") as handle:
            original = handle.read()
        assert len(data) == len(original)
        changed += data != original  # a flip may, rarely, write a byte back as it was
    assert changed >= 18


# The known hostile forms, each built on purpose (the fuzzer finds them only by chance).


def _refused(cli, tmp_path, data, expect, commands=("optimize", "inspect", "run", "verify")):
    path = tmp_path / "m.onnx"
    path.write_bytes(data)
    for command in commands:
        argv = fuzz_models.command_line(command, str(path), str(tmp_path))
        result = cli(*argv)
        assert result.code == 2, (command, result)
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("scanopt: ") and expect in lines[0], (command, result.err)
        assert not (tmp_path / "out.onnx").exists()


def _serialized_with(model, old: bytes, new: bytes) -> bytes:
    data = model.SerializeToString()
    assert data.count(old) == 1
    return data.replace(old, new)


def test_invalid_utf8_in_a_name(cli, tmp_path):
    m = b.scan9_sum(steps=3)
    m.graph.node[0].name = "scan_QQ"
    _refused(cli, tmp_path, _serialized_with(m, b"scan_QQ", b"scan_\xff\xfe"), "'scan_\\xff\\xfe' is not valid UTF-8")


def test_invalid_utf8_in_a_dim_param(cli, tmp_path):
    m = b.scan9_sum(steps="TT_QQ")
    data = m.SerializeToString().replace(b"TT_QQ", b"TT_\xe8Q")
    _refused(cli, tmp_path, data, "is not valid UTF-8")


def test_invalid_utf8_in_a_string_attribute(cli, tmp_path):
    """Attribute strings are bytes in onnx.proto (protobuf does not check them);
    onnx-graphsurgeon decodes them as UTF-8 (the fuzzer found it in an LSTM's activations)."""
    m = b.scan9_sum(steps=3)
    m.graph.node[0].attribute.append(onnx.helper.make_attribute("note", "ab_QQ"))
    _refused(cli, tmp_path, _serialized_with(m, b"ab_QQ", b"ab_\x80Q"),
             "attribute 'note' holds a string that is not valid UTF-8 ('ab_\\x80Q')")


def test_an_unknown_tensor_data_type(cli, tmp_path):
    m = b.scan9_sum(steps=3)
    m.graph.input[1].type.tensor_type.elem_type = 111
    _refused(cli, tmp_path, m.SerializeToString(), "value 'X': data type 111 is not one onnx knows")


def test_a_negative_declared_dim(cli, tmp_path):
    m = b.scan9_sum(steps=3)
    m.graph.input[1].type.tensor_type.shape.dim[0].dim_value = -3
    _refused(cli, tmp_path, m.SerializeToString(), "value 'X': declares a negative dim (-3)")


def test_a_scan_attribute_of_the_wrong_type(cli, tmp_path):
    m = b.scan9_sum(steps=3, scan_input_directions=[0])
    attr = next(a for a in m.graph.node[0].attribute if a.name == "scan_input_directions")
    attr.type = onnx.AttributeProto.UNDEFINED
    _refused(cli, tmp_path, m.SerializeToString(), "attribute 'scan_input_directions' is of type UNDEFINED, not INTS")


def test_an_optional_typed_value_is_unsupported(cli, tmp_path):
    m = b.scan9_sum(steps=3)
    body = m.graph.node[0].attribute[0].g
    body.input[0].type.Clear()
    body.input[0].type.optional_type.SetInParent()
    _refused(cli, tmp_path, m.SerializeToString(), "is declared with optional type")


def test_an_unexpected_error_while_checking_is_one_line_naming_the_file(cli, tmp_path, monkeypatch):
    """The last resort behind the checks above: whatever else onnx raises on hostile bytes."""
    import scanopt.model_io

    def boom(*args, **kwargs):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    monkeypatch.setattr(scanopt.model_io, "validate_model", boom)
    path = tmp_path / "m.onnx"
    path.write_bytes(b.scan9_sum(steps=3).SerializeToString())
    result = cli("inspect", path)
    assert result.code == 2 and result.err.count("\n") == 1
    assert result.err.startswith(f"scanopt: {path}: not a valid model (UnicodeDecodeError while checking it")


@pytest.mark.parametrize("leave_open", ["empty type", "elem_type 0"])
@pytest.mark.parametrize("where", ["input", "output"])
def test_a_body_value_whose_type_leaves_the_dtype_open_is_accepted(cli, tmp_path, leave_open, where):
    """Missing information, not a contradiction: every command runs (gs records such a dtype as
    0 or an empty message, which the passes took for a dtype)."""
    m = b.scan9_sum(steps=3)
    value = getattr(m.graph.node[0].attribute[0].g, where)[1]
    if leave_open == "empty type":
        value.type.Clear()
        value.type.SetInParent()
    else:
        value.type.tensor_type.elem_type = 0
        value.type.tensor_type.ClearField("shape")
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    for command in ("optimize", "inspect", "run", "verify"):
        result = cli(*fuzz_models.command_line(command, str(path), str(tmp_path)))
        assert result.code == 0, (command, result)


def test_a_body_output_whose_type_has_no_kind_is_written(cli, tmp_path):
    """Fuzz seed 13, mutant 854: the outer body's output of models/scan_nested.onnx, its type
    message flipped into fields onnx does not know (no tensor, sequence or map kind left). gs
    imports it with no kind; a pass gave it a dtype, and gs's exporter, which has no case for a
    dtype without a kind, raised UnboundLocalError."""
    m = onnx.load(os.path.join(fuzz_models.ROOT, "models", "scan_nested.onnx"))
    (value,) = [v for v in m.graph.node[0].attribute[0].g.output if v.name == "total_out"]
    value.type.ParseFromString(b"\x08\x04\x08\x01\x12\x00")  # the mutant's bytes: varints, an unknown field 2
    assert value.type.WhichOneof("value") is None
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    for command in ("optimize", "inspect", "run", "verify"):
        result = cli(*fuzz_models.command_line(command, str(path), str(tmp_path)))
        assert result.code == 0, (command, result)
    written = onnx.load(tmp_path / "out.onnx")
    onnx.checker.check_model(written, full_check=True)


@pytest.mark.parametrize("form", ["raw_data", "float_data"])
def test_a_tensor_whose_data_does_not_fill_its_dims(cli, tmp_path, form):
    """In a body's Constant, which onnx.checker does not size-check (numpy_helper then failed
    to reshape it inside the fuse pass)."""
    m = b.scan9_sum(steps=3)
    body = m.graph.node[0].attribute[0].g
    value = onnx.TensorProto(name="k", data_type=onnx.TensorProto.FLOAT, dims=[3])
    if form == "raw_data":
        value.raw_data = np.arange(5, dtype=np.float32).tobytes()
    else:
        value.float_data.extend([1.0, 2.0, 3.0, 4.0, 5.0])
    body.node.insert(0, onnx.helper.make_node("Constant", [], ["k"], value=value))
    body.node[1].input[1] = "k_x"
    body.node.insert(1, onnx.helper.make_node("Mul", ["x", "k"], ["k_x"]))
    said = "holds 20 bytes, but dims [3] need 12" if form == "raw_data" else "holds 5 float_data entries, but dims [3] need 3"
    _refused(cli, tmp_path, m.SerializeToString(), f"tensor 'k': its data {said}")


# Structure-level mutants (issue 33, F1): valid protobuf, broken meaning. Each command ends as
# exit 0/1, or exit 2 with one line; a rewrite never meets a traceback.
N_STRUCTURE = int(os.environ.get("SCANOPT_FUZZ_STRUCTURE_N", "200"))


@pytest.mark.parametrize("command", ["optimize", "inspect", "run", "verify"])
def test_structure_mutants_give_no_traceback(tmp_path, command):
    n = N_STRUCTURE if command == "optimize" else N_STRUCTURE // 4
    codes, findings = fuzz_models.fuzz(n, (command,), seed=1, work=str(tmp_path), kind="structure")[command]
    assert not findings, "\n".join(f"{label}: {problem}" for label, problem in findings[:3])
    assert sum(codes.values()) == n


def test_structure_mutants_are_deterministic_valid_protobuf_and_reach_the_passes():
    first, again = list(fuzz_models.structure_mutants(40, seed=2)), list(fuzz_models.structure_mutants(40, seed=2))
    assert first == again
    kinds = {how for label, _ in first for how in label.rsplit(":", 1)[1].split("+")}
    assert len(kinds) >= 10
    for _, data in first:
        onnx.ModelProto().ParseFromString(data)  # structure, not bytes: always parses


def _sample(path):
    return onnx.load(os.path.join(fuzz_models.ROOT, "models", path))


def _no_traceback(tmp_path, model, commands=("optimize", "inspect", "run", "verify")):
    """Every command on ``model``: None, or the first finding (a traceback, a second line)."""
    data = model.SerializeToString()
    for command in commands:
        codes = {}
        with fuzz_models.memory_limit():
            problem = fuzz_models.run_one(command, data, str(tmp_path), codes)
        assert problem is None, f"{command}: {problem}"
    return codes


def _graphs(model):
    from scanopt.protos import walk_proto_graphs

    return walk_proto_graphs(model.graph)


@pytest.mark.parametrize("path", ["cells/torch_scan_lstm_hc_flip.onnx", "heldout_mamba/ssm_ref_dyn.onnx"])
def test_an_empty_transpose_perm(tmp_path, path):
    """gs's exporter cannot type an empty list attribute (scanopt/ir.py), and linrec's
    absorption indexed it (passes/loopfree/absorb.py)."""
    model = _sample(path)
    transposes = [n for g in _graphs(model) for n in g.node if n.op_type == "Transpose"]
    for node in transposes:
        for a in node.attribute:
            if a.name == "perm":
                del a.ints[:]
    _no_traceback(tmp_path, model)


def test_an_empty_list_attribute_survives_the_round_trip_through_graphsurgeon():
    from scanopt.ir import export_model, import_model

    model = b.scan9_sum(steps=3)
    model.graph.node.append(onnx.helper.make_node("Transpose", ["Y"], ["Yt"], name="t"))
    model.graph.node[-1].attribute.append(onnx.AttributeProto(name="perm", type=onnx.AttributeProto.INTS))
    model.graph.node[-1].attribute.append(onnx.AttributeProto(name="note", type=onnx.AttributeProto.FLOATS))
    graph = import_model(model)
    for _ in range(2):  # exporting twice: the graph is left as it was
        out = export_model(graph, model)
        attrs = {a.name: a for a in out.graph.node[-1].attribute}
        assert attrs["perm"].type == onnx.AttributeProto.INTS and not attrs["perm"].ints
        assert attrs["note"].type == onnx.AttributeProto.FLOATS and not attrs["note"].floats


def test_a_sequence_at_index_that_is_empty(tmp_path):
    """passes/fuse/cuts.py read index[0] of an empty constant."""
    model = _sample("cells/torch_gru_cell_noopt.onnx")
    body = next(a.g for a in model.graph.node[0].attribute if a.name == "body")
    index = next(n.input[1] for n in body.node if n.op_type == "SequenceAt")
    constant = next(n for n in body.node if n.op_type == "Constant" and n.output[0] == index)
    constant.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(np.array([], np.int64)))
    # onnxruntime itself dies on this model (SIGSEGV in SequenceAt): its first run happens in
    # the child process (scanopt.isolated.screen_original), so every command ends in one line
    _no_traceback(tmp_path, model)
    out, report = scanopt.optimize(model, verify=False, seeds=1)
    fuse = [o for o in report.outcomes if o.pass_name == "fuse"]
    assert fuse and not fuse[0].applied and "index has 0 values, not one" in fuse[0].detail, fuse


@pytest.mark.parametrize("shape", [(), (1,)])
def test_an_initializer_shadowing_the_input_with_a_lower_rank(tmp_path, shape):
    """passes/fuse/directions.py took the batch axis of a rank-0/1 scanned value."""
    model = _sample("tf2onnx/dynamic_rnn_concat_tanh.onnx")
    name = model.graph.input[0].name
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(shape, np.float32), name))
    _no_traceback(tmp_path, model)


@pytest.mark.parametrize("path", ["while_loops/ts_while_from_1.onnx", "loops/tf_scan_rnn.onnx"])
def test_a_loop_whose_body_and_node_counts_disagree_is_refused(cli, tmp_path, path):
    """loop_to_scan's zero-step guard raised ValueError ("a guard writes 2 outputs: its branches
    give 1 and 2") on a Loop with an output more than its body gives (structure mutants of seed
    1: ts_while_from_1 #3464, an extra Loop output) or a body output fewer (tf_scan_rnn #2756):
    onnx's Loop inference, which onnxruntime runs on load, refuses both, and so does scanopt."""
    model = _sample(path)
    loop = next(n for g in _graphs(model) for n in g.node if n.op_type == "Loop")
    body = next(a.g for a in loop.attribute if a.name == "body")
    if path.startswith("while"):
        loop.output.append(loop.output[0] + "_extra")
    else:
        del body.output[-1]
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    expected = f"body has {len(body.output)} outputs; expected 1 + {len(loop.output)} = {1 + len(loop.output)}"
    for command in ("optimize", "inspect", "run", "verify"):
        result = cli(*fuzz_models.command_line(command, str(src), str(tmp_path)))
        assert result.code == 2, (command, result)
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and "Loop node" in lines[0] and expected in lines[0], (command, result.err)
    assert not (tmp_path / "out.onnx").exists()


@pytest.mark.parametrize("change", ["body input", "node inputs"])
def test_a_loop_with_a_body_input_count_onnx_refuses(tmp_path, change):
    from scanopt.errors import InvalidModelError
    from scanopt.validate import validate_model

    model = _sample("while_loops/ts_while_from_1.onnx")
    loop = next(n for g in _graphs(model) for n in g.node if n.op_type == "Loop")
    body = next(a.g for a in loop.attribute if a.name == "body")
    if change == "body input":
        del body.input[-1]
        said = f"body has {len(body.input)} inputs; expected 2 + N"
    else:
        del loop.input[1:]
        said = "has 1 inputs; it needs at least 2"
    with pytest.raises(InvalidModelError, match=re.escape(said)):
        validate_model(model)


def test_a_function_call_the_inliner_refuses(tmp_path):
    """scanopt/functions.py let onnx's inliner's RuntimeError through (a call with more
    actuals than the function has formals)."""
    model = _sample("functions/fn_rnn_once.onnx")
    model.graph.node[0].input.append(model.graph.node[0].input[0])
    _no_traceback(tmp_path, model)


def test_an_overflowing_constant_is_folded_to_inf_without_a_warning(recwarn):
    """scanopt/constexpr.py: Exp of a large constant (folded through onnx's reference
    evaluator) printed numpy's RuntimeWarning, a second line on stderr beside a refusal's one."""
    import onnx_graphsurgeon as gs

    from scanopt.constexpr import ConstantFolder

    big = gs.Constant("big", np.array([1000.0], np.float32))
    out = gs.Variable("e", dtype=np.float32)
    gs.Node("Exp", inputs=[big], outputs=[out])
    assert np.isposinf(ConstantFolder(17).value(out)).all()  # as onnxruntime computes it
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_a_small_differential_fuzz_finds_no_difference():
    """tests/fuzz_differential.py at 8 models (the full run: --count 2000): each original and
    optimized model run in a child at 5 regimes (seed, large values, empty dimension,
    sequence_lens / trip count 0, NaN/inf at the middle step), no difference."""
    import fuzz_differential

    result = fuzz_differential.fuzz(8, seed=0, log=None)
    assert result["counts"]["rewritten"] >= 4 and result["counts"]["runs compared"] >= 16, result["counts"]
    assert not result["findings"], result["findings"]


def test_the_differential_comparison_catches_a_nan_and_a_shape():
    """The judge itself: a NaN where the original is finite, another shape, a crash after a
    clean run are findings; a failure after the original's failure is not."""
    import fuzz_differential as fd

    ok = ("ok", {"y": np.array([1.0, np.inf], np.float32)})
    assert fd.compare(ok, ok) is None
    assert "NaN" in fd.compare(ok, ("ok", {"y": np.array([np.nan, np.inf], np.float32)}))
    assert "shape" in fd.compare(ok, ("ok", {"y": np.zeros(3, np.float32)}))
    assert "infinities" in fd.compare(ok, ("ok", {"y": np.array([1.0, -np.inf], np.float32)}))
    assert "crash" in fd.compare(ok, ("crash", "signal 6"))
    assert fd.compare(("error", "bad"), ("error", "worse")) is None
    assert fd.compare(("error", "bad"), ("crash", "signal 8")) is not None
