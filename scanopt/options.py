"""The options of a run: every key :func:`scanopt.optimize` accepts, with its type,
default and meaning, and the check that refuses anything else before work starts.

Keys come from two places: the table below (run-wide options) and each registered
pass's ``tunables`` (key -> (type, help)), so a pass that adds a tunable is accepted,
and documented, without an edit here. A misspelled key raises with the closest key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from scanopt.errors import InvalidArgumentError, did_you_mean


@dataclass(frozen=True)
class Option:
    """One option: its accepted types, default (None: decided by its owner), one line of help."""

    key: str
    types: tuple[type, ...]
    default: Any
    doc: str
    choices: tuple = ()
    minimum: float | None = None
    owner: str = "pipeline"  # who gives it its meaning: pipeline, cost, or a pass name


RUN_OPTIONS = (
    Option("target", (str,), "onnxruntime",
           "onnxruntime: apply a rewrite only where the cost model does not predict it slower on "
           "onnxruntime CPU; portable: prefer native ops and loop-free forms regardless, written so that "
           "OpenVINO's CPU runtime also runs them (portable_runtimes)",
           choices=("onnxruntime", "portable"), owner="cost"),
    Option("portable_runtimes", (list, tuple), None,
           "with target portable: the runtimes the output must load and run equal in, of 'onnxruntime' and "
           "'openvino' (the CLI's --portable-runtime; None: both, OpenVINO's CPU runtime as scanopt.portable "
           "says; ['onnxruntime'] or []: every proven form applies as onnxruntime runs it)", owner="cost"),
    Option("target_opset", (int,), None,
           "move the whole model to this opset first (verified); lets upgrade rewrite Scan-8",
           minimum=1, owner="upgrade"),
    Option("unroll_max", (int,), None,
           "unroll Scans of at most this many static steps (None: the unroll pass's measured "
           "default, and the cost model decides; a number: applied as asked)", minimum=0, owner="unroll"),
    Option("upgrade_strategy", (str,), "auto",
           "force the upgrade strategy a, b or c (tests and benchmarks)",
           choices=("auto", "a", "b", "c"), owner="upgrade"),
    Option("input_shapes", (dict,), None,
           "{graph input name: [dims]}: the sizes the model will run at, for the cost model "
           "(optimize's ``input_shapes`` argument sets it)", owner="cost"),
    Option("threads", (int,), None,
           "intra-op threads the optimized model will run with; forms are measured at that count by wall "
           "time (None: one thread, thread CPU time, which a busy machine cannot inflate)",
           minimum=1, owner="cost"),
    Option("execution_providers", (list, tuple, str), None,
           "onnxruntime execution providers the model will run with, in priority order (full names or short "
           "forms: cpu, cuda, tensorrt, openvino, dml, coreml, ...): the forms are ranked for the first, "
           "measured where it runs here, else modelled (scanopt.providers); None: the CPU",
           owner="cost"),
    Option("tune", (bool,), None,
           "True: time each Scan's candidate forms and keep the fastest; False: never; "
           "None: decided automatically", owner="cost"),
    Option("measured", (dict,), None,
           "{(pass, Scan node name): measured speed-up}: replaces the cost model's prediction "
           "(tuning sets it; tests pass it)", owner="cost"),
    Option("tune_seconds", (float, int), None,
           "time budget of tuning for all Scans together, in seconds (None: the tuner's default)",
           minimum=0, owner="cost"),
    Option("tune_scan_seconds", (float, int), None,
           "time budget of tuning for one distinct Scan, in seconds (None: the tuner's default)",
           minimum=0, owner="cost"),
    Option("retune", (bool,), False,
           "True: measure every Scan again, ignoring (and overwriting) cached choices", owner="cost"),
    Option("tune_cache", (str,), None,
           "directory of the on-disk cache of measured forms, or 'off' (None: $SCANOPT_CACHE_DIR, "
           "else the user cache directory)", owner="cost"),
)


def known_options() -> dict[str, Option]:
    """Every accepted key: the run options, then each registered pass's tunables."""
    from scanopt.pass_api import registered_passes

    table = {o.key: o for o in RUN_OPTIONS}
    for name, cls in registered_passes().items():
        for key, (kind, doc) in cls.tunables.items():
            table.setdefault(key, Option(key, (kind,), None, doc, minimum=0 if kind in (int, float) else None,
                                         owner=name))
    return table


def check_options(options: Mapping | None) -> dict:
    """A checked copy of ``options``; raises InvalidArgumentError on the first key or value
    that is not accepted (unknown keys with the closest known key)."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise InvalidArgumentError(f"options must be a dict of option -> value, not {type(options).__name__}")
    table = known_options()
    checked = {}
    for key, value in options.items():
        spec = table.get(key)
        if spec is None:
            raise InvalidArgumentError(f"unknown option '{key}'{did_you_mean(key, table)}; known: {', '.join(table)}")
        if value is not None or spec.default is not None:
            _check_value(spec, value)
        checked[key] = value
    return checked


def _check_value(spec: Option, value) -> None:
    # bool is an int in Python, but True is no size: only a bool option takes one
    wrong_type = not isinstance(value, spec.types) or (isinstance(value, bool) and bool not in spec.types)
    if wrong_type and not (value is None and spec.default is None):
        names = " or ".join(t.__name__ for t in spec.types)
        raise InvalidArgumentError(f"option '{spec.key}' must be {names}, not {type(value).__name__} ({value!r})")
    if spec.choices and value not in spec.choices:
        raise InvalidArgumentError(f"unknown {spec.key} {value!r}{did_you_mean(value, spec.choices)} "
                                   f"(option '{spec.key}': choose from {', '.join(spec.choices)})")
    if spec.minimum is not None and value < spec.minimum:
        raise InvalidArgumentError(f"option '{spec.key}' must be at least {spec.minimum}, not {value!r}")


def describe_options(specs=None) -> str:
    """One line per key (default: every known key): name, type, default, help."""
    lines = []
    for spec in (known_options().values() if specs is None else specs):
        kind = " | ".join(t.__name__ for t in spec.types) + (" | None" if spec.default is None else "")
        lines.append(f"{spec.key} ({kind}, default {spec.default!r}): {spec.doc}")
    return "\n".join(lines)
