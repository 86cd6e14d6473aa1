"""``scanopt run MODEL``: run a model on given or synthesized inputs; show or save its outputs."""

from __future__ import annotations

import argparse

import numpy as np

from scanopt.cli.common import input_files
from scanopt.cli.deploy_args import add_provider_argument, session_providers
from scanopt.cli.feeds import feed_files, user_feeds
from scanopt.cli.interrupts import committing
from scanopt.engines import EngineError, ort_miscomputes, prepare
from scanopt.errors import printable
from scanopt.inputs import synthesize_inputs
from scanopt.isolated import screen_original
from scanopt.model_io import load
from scanopt.outputs import OutputPlan

EPILOG = """\
examples:
  scanopt run model.onnx
  scanopt run model.onnx --inputs feeds.npz --engine reference
  scanopt run model.onnx --input X=x.npy --input lens=lens.npy --out outputs.npz
  scanopt run model.onnx --seed 3 --engine ort

Without --inputs/--input, inputs are synthesized from the model's signature for
--seed (symbolic dims bound consistently, Scan-8 sequence_lens within the sequence
length). Inputs you do not give are synthesized for --seed, with the sizes your
arrays give their symbolic dims; --input overrides the same name in --inputs. --engine auto uses onnxruntime when it can load the model, else
the reference executor.

exit codes: 0 ok, 1 synthesized inputs would exceed the memory budget (pass --inputs),
2 bad input or usage (also a model that fails to run)
"""


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """--inputs and --input, shared with `scanopt verify`."""
    parser.add_argument("--inputs", metavar="FILE.npz", help="feeds by input name, in one .npz archive")
    parser.add_argument(
        "--input", action="append", default=[], metavar="NAME=FILE.npy", help="one feed from a .npy file (repeatable)"
    )


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a model and show or save its outputs",
        description="Run MODEL once on given or synthesized inputs and print each output (or save them).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("model", metavar="MODEL", help="the .onnx model to run")
    add_input_arguments(parser)
    parser.add_argument("--engine", choices=("auto", "ort", "reference"), default="auto", help="default: auto")
    parser.add_argument("--seed", type=int, default=0, metavar="N", help="seed for synthesized inputs (default 0)")
    parser.add_argument("--out", metavar="FILE.npz", help="save the outputs here (atomically) instead of printing")
    add_provider_argument(parser, help="run onnxruntime sessions with this execution provider (repeatable, in priority "
                                       "order; full names or cpu, cuda, ...; one it does not offer here is said in one "
                                       "line and the CPU runs instead); default cpu")
    parser.set_defaults(func=run)


def run(args) -> int:
    with session_providers(args.execution_provider):
        return _run(args)


def _run(args) -> int:
    loaded = load(args.model)
    model = loaded.model
    files = feed_files(args.inputs, args.input)
    if args.out:  # fail before running, not after
        plan = OutputPlan(input_files(loaded, "MODEL") + files, committing=committing)
        plan.claim(args.out, "--out")
    made = {}

    def inputs_for(engine: str):
        """(feeds, their source in words) for a run with ``engine``, made once per engine."""
        if engine not in made:
            given, synthesized = user_feeds(model, npz=args.inputs, arrays=args.input, seeds=[args.seed], engine=engine)
            if given is None:
                made[engine] = synthesize_inputs(model, args.seed, engine=engine), f"synthesized, seed {args.seed}"
            else:
                made[engine] = given[0], "given" + (f"; {', '.join(synthesized)} synthesized, seed {args.seed}"
                                                    if synthesized else "")
        return made[engine]

    outputs, engine = None, None
    if args.engine == "ort" or (args.engine == "auto" and not ort_miscomputes(model)):
        # its run in onnxruntime happens in a child, where onnxruntime dying on it is survivable;
        # on the CPU the child's outputs are the answer (no session of it here at all)
        feeds, source = inputs_for("ort")
        where = f"on seed {args.seed}'s synthesized inputs" if source.startswith("synth") else "on the given inputs"
        ran: list | None = [] if not args.execution_provider else None
        screen_original(model, feeds, where, outputs=ran)
        if ran and len(ran) == len(model.graph.output):
            outputs, engine = dict(zip((o.name for o in model.graph.output), ran)), "ort"
    if outputs is None:
        runner = prepare(model, args.engine, path=args.model)
        feeds, source = inputs_for(runner.engine)
        try:
            outputs = runner(feeds)
        except EngineError:
            if args.engine != "auto" or runner.engine != "ort" or source.startswith("synth"):
                raise
            runner = prepare(model, "reference")  # inputs onnxruntime refuses, such as a sequence length 0
            outputs = runner(feeds)
        engine = runner.engine
    if args.out:
        plan.write([(args.out, _npz_writer(outputs))])
        print(f"wrote {len(outputs)} output(s) to {args.out} (engine {engine})")
        return 0
    print(f"engine: {engine}")
    print(f"inputs ({source}):")
    print(_table(feeds))
    print("outputs:")
    print(_table(outputs))
    return 0


def _npz_writer(outputs: dict[str, np.ndarray]):
    def write(staged: str) -> None:
        with open(staged, "wb") as handle:  # a handle, so numpy does not append ".npz"
            np.savez(handle, **outputs)

    return write


def _table(arrays: dict[str, np.ndarray]) -> str:
    rows = [(printable(name), *_row(a)) for name, a in arrays.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(3)] if rows else [0, 0, 0]
    return "\n".join("  " + "  ".join(v.ljust(w) for v, w in zip(r[:3], widths)) + "  " + r[3] for r in rows)


SHOWN = 6  # arrays with at most this many elements are printed in full


def _row(value) -> tuple[str, str, str]:
    """(type, shape, values) of one value: a tensor, or a sequence such as a ZipMap's list of
    {class: probability} maps (onnxruntime returns those as Python lists and dicts)."""
    if isinstance(value, np.ndarray):
        return str(value.dtype), str(tuple(value.shape)), printable(summarize(value))
    if isinstance(value, (list, tuple)):
        kinds = sorted({"map" if isinstance(v, dict) else type(v).__name__ for v in value})
        shown = ", ".join(printable(repr(v)) for v in value[:2])
        text = f"[{shown}{', ...' if len(value) > 2 else ''}]"
        return f"seq({'|'.join(kinds) or 'empty'})", f"({len(value)},)", text[:200]
    return type(value).__name__, "", printable(repr(value))[:200]


def summarize(array: np.ndarray) -> str:
    """A short description of the values: all of them when few, else range and mean."""
    if array.size == 0:
        return "empty"
    if array.size <= SHOWN or array.dtype.kind in "OUS":
        values = array.ravel()[:SHOWN]
        text = " ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in values.tolist())
        return f"[{text}{' ...' if array.size > SHOWN else ''}]"
    if array.dtype == np.bool_:
        return f"{int(np.count_nonzero(array))} of {array.size} true"
    values = array.astype(np.complex128 if array.dtype.kind == "c" else np.float64)
    finite = values[np.isfinite(values)]
    text = f"min {finite.real.min():.4g} max {finite.real.max():.4g} mean {finite.mean():.4g}" if finite.size else ""
    nonfinite = array.size - finite.size
    return (text + (f" ({nonfinite} inf/nan)" if nonfinite else "")).strip()
