"""Random Scans whose main graph declares no shapes at all (the builders of
test_reference_scan_random: every state and scan input undeclared, element ranks 0-3, axes
including negative ones, Scan-8 batches with and without sequence_lens): the synthesizer
must derive inputs they run on from the body declarations alone, for every seed."""

from __future__ import annotations

from hypothesis import given, settings

from scanopt.verify import compare_models
from test_reference_scan_random import SETTINGS, build8, build9, cases8, cases9


def assert_self_verifies(model):
    result = compare_models(model, model, seeds=2)
    assert result.passed, result.summary()
    assert not any("the original fails at" in note for note in result.notes), result.notes  # no fallback needed


@settings(max_examples=25, **SETTINGS)
@given(cases9(min_length=1))
def test_random_scan9_without_main_graph_shapes_gets_runnable_inputs(case):
    model, _, _ = build9(case)
    assert_self_verifies(model)


@settings(max_examples=20, **SETTINGS)
@given(cases8(min_len=1))
def test_random_scan8_without_main_graph_shapes_gets_runnable_inputs(case):
    model, _, _ = build8(case)
    assert_self_verifies(model)
