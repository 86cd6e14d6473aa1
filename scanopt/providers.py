"""The deployment target's execution providers: their names, whether this onnxruntime can
run them, and the cost model of a provider that cannot be measured here.

A target is an onnxruntime provider list in priority order (``--execution-provider``,
repeatable; options["execution_providers"]), beside the thread count and the input shapes
(:mod:`scanopt.deploy`). Names are onnxruntime's (``onnxruntime.get_all_providers()``,
case-insensitive) or their short forms (the name without ``ExecutionProvider``: ``cpu``,
``cuda``, ``tensorrt``, ``openvino``, ``dml``, ``coreml``, ...; also ``trt``, ``directml``).
The first provider is the one each Scan's forms are ranked for (:func:`plan`):

- **measured** when this onnxruntime offers it and a device answers (a one-node session
  created with the list keeps it first): :mod:`scanopt.tune` times the forms in sessions
  made with the list, and :func:`placement` names the nodes onnxruntime left to another
  provider (fallbacks), which the report shows;
- else **modelled** for that provider when scanopt has its model (:data:`COST_MODELS`: the
  CPU's is :mod:`scanopt.cost`'s committed constants; CUDA's is :func:`cuda_seconds`;
  TensorRT's loops run on its CUDA fallback, so it takes CUDA's);
- else the **portable preference** (native ops and loop-free forms), as ``--target portable``.

The CPU provider alone (the default) is what scanopt did before targets existed, unchanged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from scanopt.errors import InvalidArgumentError, did_you_mean

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
SUFFIX = "ExecutionProvider"
ALIASES = {"trt": "TensorrtExecutionProvider", "directml": "DmlExecutionProvider", "ov": "OpenVINOExecutionProvider"}
# onnxruntime 1.32's get_all_providers(), for an onnxruntime that cannot be imported
KNOWN = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "MIGraphXExecutionProvider", "OpenVINOExecutionProvider",
         "DnnlExecutionProvider", "VitisAIExecutionProvider", "QNNExecutionProvider", "NnapiExecutionProvider",
         "VSINPUExecutionProvider", "JsExecutionProvider", "CoreMLExecutionProvider", "DmlExecutionProvider",
         "RknpuExecutionProvider", "WebNNExecutionProvider", "WebGpuExecutionProvider", "XnnpackExecutionProvider",
         "CANNExecutionProvider", "AzureExecutionProvider", "ROCMExecutionProvider", "CPUExecutionProvider")


def short_name(provider: str) -> str:
    """``CUDAExecutionProvider`` -> ``cuda``."""
    return (provider[: -len(SUFFIX)] if provider.endswith(SUFFIX) else provider).lower()


def known_providers() -> dict[str, str]:
    """{lower-case name or short form: onnxruntime's full name} for every provider onnxruntime knows."""
    try:
        import onnxruntime as ort

        names = list(dict.fromkeys(list(ort.get_all_providers()) + list(KNOWN)))
    except Exception:  # noqa: BLE001 - no onnxruntime: the names are still the names
        names = list(KNOWN)
    table = {}
    for full in names:
        table[full.lower()] = full
        table.setdefault(short_name(full), full)
    for alias, full in ALIASES.items():
        table.setdefault(alias, full)
    return table


def resolve(names) -> tuple[str, ...]:
    """onnxruntime's full names for ``names`` (a name, a comma-separated string, or a list), in
    order, repeats dropped; an unknown name raises InvalidArgumentError (one line, naming the
    known short forms). None or empty: the CPU provider."""
    if names is None:
        return (CPU,)
    if isinstance(names, str):
        names = [part for part in names.split(",")]
    try:
        names = list(names)
    except TypeError:
        raise InvalidArgumentError(f"execution providers must be a name or a list of names, not {names!r}") from None
    table = known_providers()
    resolved = []
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise InvalidArgumentError(f"execution provider {name!r} is not a name")
        full = table.get(name.strip().lower())
        if full is None:
            shorts = sorted({short_name(f) for f in table.values()})
            raise InvalidArgumentError(f"unknown execution provider '{name}'{did_you_mean(name.strip().lower(), table)}; "
                                       f"known: {', '.join(shorts)} (or onnxruntime's full names, e.g. {CUDA})")
        if full not in resolved:
            resolved.append(full)
    return tuple(resolved) or (CPU,)


def available_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())


def session_providers(providers) -> list[str]:
    """The provider list a session is created with: ``providers`` and the CPU provider last
    (onnxruntime falls back to it anyway; named, the fallback is explicit)."""
    return list(providers) + ([CPU] if CPU not in providers else [])


def device_answers(provider: str) -> str | None:
    """None when a session created with ``[provider, CPU]`` keeps ``provider`` (a device
    answers), else why not (one line)."""
    if provider == CPU:
        return None
    import onnx
    import onnxruntime as ort

    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "probe", [x], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 13)], ir_version=8)
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        made = ort.InferenceSession(model.SerializeToString(), options, providers=session_providers([provider]))
    except Exception as exc:  # noqa: BLE001 - a provider whose library or device is missing
        return f"a session with it fails ({str(exc).splitlines()[0][:120]})"
    if made.get_providers()[0] != provider:
        return "onnxruntime created the session without it (no device answered)"
    return None


@dataclass(frozen=True)
class Target:
    """Where the chosen forms will run, and how scanopt ranks them for it."""

    providers: tuple[str, ...]  # onnxruntime's full names, priority order
    mode: str  # "measured", "modelled" or "portable" (the portable preference)
    model: str | None  # the cost model's name (COST_MODELS) when modelled
    note: str  # the report's line: the target and how its forms are ranked
    unavailable: str | None = None  # why the first provider cannot be measured here

    @property
    def primary(self) -> str:
        return self.providers[0]

    @property
    def cpu_only(self) -> bool:
        return self.providers == (CPU,)

    @property
    def label(self) -> str:
        """The target in words, for verdicts: ``onnxruntime CPU``, ``onnxruntime CUDA (modelled)``."""
        return "onnxruntime CPU" if self.primary == CPU else f"onnxruntime {short_name(self.primary).upper()}"

    def session_providers(self) -> list[str]:
        return session_providers(self.providers)


# cost models by provider: how a provider that cannot be measured here is ranked
COST_MODELS = {CPU: "cpu", CUDA: "cuda", "TensorrtExecutionProvider": "cuda"}
SOURCE = "fitted to onnxruntime-gpu 1.31.1 on an H100; constants and their source: scanopt/providers.py CudaConstants"


def plan(providers=None, *, available: list[str] | None = None, probe=device_answers) -> Target:
    """The target for ``providers`` (names as :func:`resolve` takes them): measured where the
    first is available and a device answers, else modelled, else the portable preference.
    ``available`` and ``probe`` are onnxruntime's by default (tests pass their own)."""
    providers = resolve(providers)
    first = providers[0]
    if first == CPU:
        return Target(providers, "measured", "cpu", "")
    have = available_providers() if available is None else list(available)
    why = probe_line(first, have) if first not in have else probe(first)
    name = short_name(first)
    if why is None:
        listed = " > ".join(short_name(p) for p in session_providers(providers))
        return Target(providers, "measured", COST_MODELS.get(first),
                      f"{name}: measured in sessions with providers {listed}; nodes another provider took are listed")
    model = COST_MODELS.get(first)
    if model == "cuda":
        note = (f"{name}: {why}; modelled for {'CUDA' if first == CUDA else name + ' (its loops run on CUDA)'}, "
                f"not measured (scanopt's CUDA model, {SOURCE})")
        return Target(providers, "modelled", model, note, why)
    note = (f"{name}: {why}; scanopt has no cost model for it: native ops and loop-free forms preferred "
            "(the portable preference), not measured")
    return Target(providers, "portable", None, note, why)


# -- placement: which provider onnxruntime gave each node ----------------------------------


def placement(session, feeds: dict) -> dict[str, list[str]]:
    """{provider: [node names]} from one profiled run of ``session`` (made with
    ``enable_profiling``): onnxruntime's profile records each kernel's provider, subgraph
    nodes included. A node run by several providers' kernels counts under each."""
    session.run(None, feeds)
    path = session.end_profiling()
    try:
        with open(path, encoding="utf-8") as handle:
            events = json.load(handle)
    finally:
        try:
            os.remove(path)
        except OSError:
            pass
    found: dict[str, list[str]] = {}
    for event in events:
        args = event.get("args") or {}
        if event.get("cat") != "Node" or "provider" not in args:
            continue
        name = str(event.get("name", "")).rsplit("_kernel_time", 1)[0]
        if not event.get("name", "").endswith("_kernel_time"):
            continue
        names = found.setdefault(args["provider"], [])
        if name not in names:
            names.append(name)
    return found


def fallbacks(model, feeds: dict, providers, threads: int | None = None) -> list[str]:
    """The nodes of ``model`` onnxruntime did not give the first of ``providers`` (a session
    made with the list, one profiled run)."""
    import onnxruntime as ort

    from scanopt.engines import ort_source

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    options.log_severity_level = 3
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(_profile_dir(), "scanopt-placement")
    model_bytes, kept = ort_source(model, options)
    made = ort.InferenceSession(model_bytes, options, providers=session_providers(providers))
    made.scanopt_weights = kept
    placed = placement(made, feeds)
    first = list(providers)[0]
    return [f"{name} ({short_name(p)})" for p, names in placed.items() if p != first for name in names]


def _profile_dir() -> str:
    import tempfile

    return tempfile.gettempdir()


# -- the CUDA model ------------------------------------------------------------------------


@dataclass(frozen=True)
class CudaConstants:
    """Seconds (and FLOP/s) of onnxruntime's CUDA EP, fitted by hand to the table of
    ../shared/perf/GPU-AND-QUIET-CPU.md (onnxruntime-gpu 1.31.1, one H100, numpy feeds
    through ``session.run``: host copies included). Per cell (T×B×I×H, body nodes):

    - a Scan's step: RNN (7 body nodes) 66, 72, 54 µs; LSTM (16) 117, 94, 121, 142 µs; GRU
      (20) 177, 180 µs; running sum (2) 15, EMA (6) 26, minGRU (8) 63, selective scan (15) 64 µs:
      ``scan_step + body_nodes * node`` (5 + 8/node µs), whatever the width, plus the body's
      FLOPs at ``flops_loop`` (small: the LSTM 512×64×512×512 step is 142 µs, not more);
    - a native RNN/GRU/LSTM: 2.2–2.9 ms at T=100 (B ≤ 8, H ≤ 128), 4.1 ms at T=200, 17.4 ms at
      T=1000: ``run + T * native_step``; 29 ms for LSTM 512×64×512×512: its recurrent FLOPs at
      ``flops_native``;
    - a native GRU with linear_before_reset=0 (cuDNN computes the reset gate after the
      matmul, lbr=1; onnxruntime's lbr=0 path is slow): 2.6 ms at 100×4×64×128, 318 ms at
      512×64×512×512 (3.4× slower than the Scan): recurrent FLOPs at ``flops_gru_lbr0``;
    - loop-free forms: EMA 1.5 ms, minGRU 2.3 ms, selective scan 5.2 ms (T=1024–2048): no
      per-step cost; ``run + nodes * node``, FLOPs at ``flops_native``;
    - an unrolled step: not measured on CUDA; its nodes are counted at a loop body's ``node``
      cost (no gain but the step's own ``scan_step``).
    """

    run: float = 3.0e-4  # one session.run: launch, host copies of feeds and fetches
    scan_step: float = 5.0e-6  # a Scan iteration's own cost (host-side control flow)
    node: float = 8.0e-6  # one node of a loop body, launched from the host per step
    flops_loop: float = 1.0e13  # a loop body's matmuls
    native_step: float = 1.8e-5  # a native RNN/GRU/LSTM step
    flops_native: float = 3.5e12  # the native kernels' (and a whole-sequence matmul's) FLOPs
    flops_gru_lbr0: float = 1.7e11  # ... a native GRU's with linear_before_reset=0


CUDA_CONSTANTS = CudaConstants()
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}


def cuda_seconds(form: str, kind: str, p: dict, body_nodes: int, lifted: int = 2,
                 c: CudaConstants = CUDA_CONSTANTS) -> float:
    """Modelled seconds of one ``session.run`` of ``form`` (loop, fuse, hoist, unroll, or a
    loop-free form) on the CUDA EP at sizes ``p`` (T, B, I, H, K; ``lbr``: a GRU's
    linear_before_reset; ``cells``: LSTM per-step cell states fuse recomputes)."""
    T, B, I, H, K = (max(int(p.get(k) or 1), 1) for k in ("T", "B", "I", "H", "K"))
    g = GATES.get(kind, 1)
    inproj, rec = 2 * B * I * H * g, 2 * B * H * H * g
    step = c.scan_step + body_nodes * c.node
    if form == "loop":
        return c.run + T * (step + (inproj + rec) / c.flops_loop)
    if form == "hoist":
        kept = max(body_nodes - lifted, 1) + 1  # + the new scan input's per-step slice
        return c.run + lifted * c.node + T * inproj / c.flops_native + T * (c.scan_step + kept * c.node + rec / c.flops_loop)
    if form == "fuse":
        rate = c.flops_gru_lbr0 if kind == "GRU" and not p.get("lbr") else c.flops_native
        native = c.run + 2 * c.node + T * inproj / c.flops_native + T * (c.native_step + rec / rate)
        cells = int(p.get("cells") or 0)  # the per-step cell state: a three-node Scan over T
        return native + cells * (12 * c.node + T * (c.scan_step + 3 * c.node))
    if form == "unroll":
        return c.run + T * ((body_nodes + K) * c.node + (inproj + rec) / c.flops_loop)
    # a loop-free form (vectorize, linrec, distances): its nodes once, its FLOPs at full rate
    return c.run + 3 * body_nodes * c.node + T * (inproj + rec) / c.flops_native


def model_seconds(model: str, form: str, kind: str, p: dict, body_nodes: int, lifted: int = 2) -> float:
    """Modelled seconds of ``form`` under the provider model ``model`` (only "cuda" here:
    the CPU's model is :func:`scanopt.cost.model_seconds` with its constants)."""
    if model == "cuda":
        return cuda_seconds(form, kind, p, body_nodes, lifted)
    raise ValueError(f"no provider model '{model}'")



def form_fallbacks(forms: dict, feeds: dict, providers, threads: int | None = None) -> dict[str, list[str]]:
    """{form: nodes another provider took} for the measured forms (the report lists them); a
    form whose placement cannot be read gets the reason instead of names."""
    found = {}
    for name, model in forms.items():
        try:
            found[name] = fallbacks(model, feeds, providers, threads)
        except Exception as exc:  # noqa: BLE001 - placement is a report detail, never a failure
            found[name] = [f"placement unknown: {str(exc).splitlines()[0][:100]}"]
    return found


def run_providers(names) -> tuple[list[str], str | None]:
    """(the session provider list ``scanopt run``/``verify`` use, a line to print or None):
    the named providers this onnxruntime offers, in order, then the CPU's; a first provider it
    does not run is said in one line, with what runs instead."""
    providers = resolve(names)
    if providers == (CPU,):
        return [CPU], None
    have = available_providers()
    first = providers[0]
    why = probe_line(first, have)
    kept = [p for p in providers if p in have and (p != first or why is None)]
    listed = " > ".join(short_name(p) for p in session_providers(kept))
    return session_providers(kept), (None if why is None else f"{short_name(first)}: {why}; running on {listed} instead")


def probe_line(provider: str, have: list[str]) -> str | None:
    """Why ``provider`` cannot run here (one line), or None."""
    if provider == CPU:
        return None
    if provider not in have:
        import onnxruntime as ort

        return (f"not available here (onnxruntime {getattr(ort, '__version__', '?')} offers "
                f"{', '.join(short_name(p) for p in have) or 'none'})")
    return device_answers(provider)


CONTROL_FLOW = ("If", "Loop", "Scan")


def capture_note(model) -> str:
    """Whether onnxruntime can capture ``model`` in a CUDA graph (``enable_cuda_graph``): it
    cannot capture If, Loop or Scan (onnxruntime issue 9978), at any depth, model-local
    functions included (onnxruntime inlines them)."""
    from collections import Counter

    from scanopt.protos import model_nodes

    found = Counter(n.op_type for n in model_nodes(model) if n.op_type in CONTROL_FLOW and n.domain in ("", "ai.onnx"))
    if not found:
        return "no If, Loop or Scan left: capturable in a CUDA graph"
    listed = ", ".join(f"{found[op]} {op}" for op in CONTROL_FLOW if found[op])
    why = " (an If: an empty-input guard or a run-time dispatch; inputs of static non-empty shape need no guard)" \
        if found["If"] else ""
    return f"not capturable in a CUDA graph: {listed}{why} (onnxruntime issue 9978)"
