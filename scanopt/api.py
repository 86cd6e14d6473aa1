"""The library entry point: :func:`optimize` checks every argument, then runs the pipeline.

The pipeline (:mod:`scanopt.pipeline`) trusts its caller; this layer is what a user calls,
so every argument it cannot use raises :class:`scanopt.InvalidArgumentError` (a
ScanoptError and a ValueError) before any work, instead of returning the model unchanged
with the reason in the report text.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Callable

import onnx

from scanopt.errors import InvalidArgumentError, did_you_mean
from scanopt.options import RUN_OPTIONS, check_options, describe_options
from scanopt.protos import fed_inputs
from scanopt.report import Report

_ENGINE_ALIASES = {"onnxruntime": "ort", "ref": "reference", "onnx": "reference"}


def optimize(
    model_or_path: onnx.ModelProto | str | os.PathLike,
    *,
    passes: Iterable[str] | str | None = None,
    skip: Iterable[str] | str = (),
    verify: bool = True,
    input_shapes: Mapping[str, Iterable[int]] | None = None,
    inputs: Mapping | list[Mapping] | None = None,
    engine: str = "auto",
    seeds: int = 2,
    options: Mapping | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[onnx.ModelProto, Report]:
    """Optimize the Scans of a model; return ``(optimized model, report)``.

    ``model_or_path``: a ModelProto (never modified: the result is a new proto, or the
    very same object when nothing changed) or a file path; a model whose weights are in
    external data is read with them left in their file until the end, and returned as an
    ordinary proto with its weights inline (save it with :func:`scanopt.save_model`).
    ``passes`` / ``skip``: pass names (a list, or one comma-separated string); default all,
    in pipeline order. ``verify``: compare the result with the original numerically and roll
    back rewrites that fail (default True). Either way the result must pass the validation
    inputs pass (onnx.checker and scanopt's checks); if it does not, the original is returned
    and the report's verification says why. ``inputs``: feed dicts to verify on (else
    synthesized over ``seeds`` seeds, at least 1). ``engine``: auto, ort, reference or both.
    ``input_shapes``: {graph input name: [dims]} the model will run at (options["input_shapes"]).
    ``progress``: called with a line per phase. Every invalid argument raises
    InvalidArgumentError, a ScanoptError.

    ``options`` keys (type, default: meaning):

    {options}

    and each pass's tunables: fission (canonicalize), fuse_layout (fuse), linrec_chunk, linrec_min_steps,
    linrec_max_state, linrec_form, linrec_attention_chunk, linrec_dispatch_below (linrec), unroll_max_nodes, unroll_max_bytes (unroll),
    vectorize_max_bytes (vectorize, hoist); ``scanopt.options.describe_options()``
    lists every key with its type, default and meaning. An unknown key raises, naming the
    closest known one.
    """
    from scanopt.pipeline import optimize as run_pipeline

    arguments = check_arguments(passes=passes, skip=skip, verify=verify, input_shapes=input_shapes, inputs=inputs,
                                engine=engine, seeds=seeds, options=options, progress=progress)
    model, warnings, from_file = _model(model_or_path)
    if arguments["options"].get("input_shapes") is not None:
        from scanopt.deploy import check_input_shapes
        from scanopt.errors import ScanoptError

        try:  # the pipeline checks them too; here they are an argument error, raised before any work
            check_input_shapes(model, arguments["options"]["input_shapes"])
        except ScanoptError as exc:
            raise InvalidArgumentError(str(exc)) from None
    for feeds in arguments["inputs"] or ():
        _check_feeds(model, feeds)
    result, report = run_pipeline(model, **arguments, validated=warnings)
    if from_file:
        from scanopt.external_data import has_marks, inlined

        if has_marks(result):  # weights still point into the input's file: make it an ordinary proto
            result = inlined(result)
    return result, report


# the run options only: listing the passes' tunables here would import every pass with scanopt
optimize.__doc__ = optimize.__doc__.replace("{options}", describe_options(RUN_OPTIONS).replace("\n", "\n    "))


def check_arguments(*, passes=None, skip=(), verify=True, input_shapes=None, inputs=None, engine="auto", seeds=2,
                    options=None, progress=None) -> dict:
    """:func:`optimize`'s keyword arguments checked and normalized for the pipeline (all but
    the model: input_shapes names are checked against it later)."""
    checked = check_options(options)
    if input_shapes is not None:
        checked["input_shapes"] = input_shapes
    if checked.get("input_shapes") is not None:
        checked["input_shapes"] = _input_shapes(checked["input_shapes"])
    if checked.get("execution_providers") is not None:
        from scanopt.providers import resolve

        checked["execution_providers"] = list(resolve(checked["execution_providers"]))  # unknown names raise
    if not isinstance(verify, bool):
        raise InvalidArgumentError(f"verify must be True or False, not {verify!r}")
    if progress is not None and not callable(progress):
        raise InvalidArgumentError(f"progress must be callable, not {type(progress).__name__}")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 1:
        raise InvalidArgumentError(f"seeds must be a whole number of at least 1, not {seeds!r}")
    return {"passes": _pass_names(passes, "passes"), "skip": _pass_names(skip, "skip") or (), "verify": verify,
            "inputs": _feeds(inputs), "engine": _engine(engine), "seeds": seeds, "options": checked,
            "progress": progress}


def _model(model_or_path) -> tuple[onnx.ModelProto, list[str] | None, bool]:
    """(model, validation warnings or None when not yet validated, read from a file)."""
    if isinstance(model_or_path, onnx.ModelProto):
        return model_or_path, None, False
    if isinstance(model_or_path, (str, os.PathLike)):
        from scanopt.model_io import load

        loaded = load(os.fspath(model_or_path))  # big weights stay in their file while the passes run
        return loaded.model, loaded.warnings, True
    raise InvalidArgumentError(f"expected an onnx.ModelProto or a file path, not {type(model_or_path).__name__}")


def _pass_names(names, what: str) -> list[str] | None:
    if names is None:
        return None
    if isinstance(names, str):
        names = [part.strip() for part in names.split(",") if part.strip()]
    try:
        names = list(names)
    except TypeError:
        raise InvalidArgumentError(f"{what} must be a list of pass names, not {type(names).__name__}") from None
    from scanopt.pipeline import select_passes

    available = [p.name for p in select_passes()]
    for name in names:
        if name not in available:
            raise InvalidArgumentError(
                f"{what}: unknown pass {name!r}{did_you_mean(name, available)}; available: {', '.join(available)}")
    return names


def _engine(engine) -> str:
    from scanopt.verify import ENGINE_CHOICES

    if engine in ENGINE_CHOICES:
        return engine
    hint = f" (did you mean '{_ENGINE_ALIASES[engine]}'?)" if engine in _ENGINE_ALIASES else did_you_mean(engine, ENGINE_CHOICES)
    raise InvalidArgumentError(f"unknown engine {engine!r}{hint}; choose from {', '.join(ENGINE_CHOICES)}")


def _input_shapes(shapes) -> dict[str, list[int]]:
    if not isinstance(shapes, Mapping):
        raise InvalidArgumentError(f"input_shapes must be a dict of input name -> [dims], not {type(shapes).__name__}")
    checked = {}
    for name, dims in shapes.items():
        try:
            dims = list(dims)
        except TypeError:
            dims = None
        if not isinstance(name, str) or dims is None or any(
                isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in dims):
            raise InvalidArgumentError(f"input_shapes[{name!r}] must be a list of whole numbers (sizes 0 or more), not {shapes[name]!r}")
        checked[name] = dims
    return checked


def _known_inputs(model: onnx.ModelProto, shapes: dict, what: str = "input_shapes") -> None:
    names = [v.name for v in fed_inputs(model.graph)]
    for name in shapes:
        if name not in names:
            raise InvalidArgumentError(
                f"{what}: the model has no input {name!r}{did_you_mean(name, names)}; its inputs: {', '.join(names)}")


def _check_feeds(model: onnx.ModelProto, feeds: dict) -> None:
    """A feed set names every input the model needs, nothing else, with numeric arrays: else
    verification could not run and the rewrites would be dropped with the reason in the report."""
    import numpy as np

    _known_inputs(model, feeds, "inputs")
    missing = [name for name in [v.name for v in fed_inputs(model.graph)] if name not in feeds]
    if missing:
        raise InvalidArgumentError(f"inputs: no value for {', '.join(map(repr, missing))} (give every model input, "
                                   "or leave inputs out to synthesize them)")
    for name, value in feeds.items():
        if np.asarray(value).dtype.kind not in "biufc":
            raise InvalidArgumentError(f"inputs[{name!r}] must be a numeric or bool array, not {type(value).__name__}")
    from scanopt.errors import ScanoptError
    from scanopt.inputs import check_feeds

    try:  # dtypes, ranks, static dims and shared symbolic dims, as the CLI checks --inputs
        check_feeds(model, feeds)
    except ScanoptError as exc:
        raise InvalidArgumentError(f"inputs: {exc}") from None


def _feeds(inputs) -> list[dict] | None:
    if inputs is None:
        return None
    sets = [inputs] if isinstance(inputs, Mapping) else inputs
    if not isinstance(sets, (list, tuple)) or not all(isinstance(s, Mapping) for s in sets) or not sets:
        raise InvalidArgumentError("inputs must be a dict of input name -> array, or a non-empty list of them")
    return [dict(s) for s in sets]
