"""onnxscript scripts for models/generate_heldout_4.py (needs ``pip install onnxscript``). A module
of its own: onnxscript resolves the names a script uses (FLOAT, op) from its module's globals.
Forms at the top level of a model (not in a function, which models/functions_onnxscript.py holds):
- os_for_ema:        ``for i in range(T): h = 0.9 h + 0.1 xs[i]`` (a Loop over op.Gather(xs, i)
                     carrying only h: the final EMA)
- os_while_halving:  ``while cond: x = x * 0.5; cond = ReduceMax(|x|) > 1`` (a Loop whose condition
                     the body computes from the data: must stay a Loop)
"""

from onnxscript import FLOAT, script
from onnxscript import opset17 as op


@script(default_opset=op)
def os_for_ema(xs: FLOAT["T", "B", 4], h0: FLOAT["B", 4]) -> FLOAT["B", 4]:
    h = h0
    for i in range(op.Gather(op.Shape(xs), 0)):
        h = op.Add(op.Mul(h, op.Constant(value_float=0.9)), op.Mul(op.Gather(xs, i), op.Constant(value_float=0.1)))
    return h


@script(default_opset=op)
def os_while_halving(x0: FLOAT["B", 4]) -> FLOAT["B", 4]:
    x = x0
    cond = op.Greater(op.ReduceMax(op.Abs(x), keepdims=0), op.Constant(value_float=1.0))
    while cond:
        x = op.Mul(x, op.Constant(value_float=0.5))
        cond = op.Greater(op.ReduceMax(op.Abs(x), keepdims=0), op.Constant(value_float=1.0))
    return x


MODELS = {f.name: f for f in (os_for_ema, os_while_halving)}
