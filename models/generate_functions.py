"""Regenerate the model-local function samples in models/functions/ (onnxscript 0.7 scripts
in functions_onnxscript.py; needs ``pip install onnxscript``):

- fn_rnn_twice:       a tanh-RNN Scan in function layers.rnn_layer, called twice (two weights)
- fn_rnn_if_branches: the same function called from both branches of an If
- fn_rnn_once:        the same function called once (optimize inlines it)
- fn_map_twice:       a map Scan (relu(x W)) in function layers.relu_map, called twice
- fn_loop_twice:      a tanh RNN written ``for i in range(Shape(xs)[0])`` over ``Gather(xs, i)``
                      (a Loop) in function layers.rnn_loop_layer, called twice
- fn_scan_symbolic_carry: a Scan no form takes (h = tanh(h * x)) in function layers.gated_state,
                      its body's state typed [B, 16], called twice with static [2, 16]: onnxruntime
                      issue 27887's shape (scanopt inlines it and writes B = 2 for the CUDA EP)

    python models/generate_functions.py
"""

from __future__ import annotations

import os

import onnx

from generate import HERE

OUT = os.path.join(HERE, "functions")


def main():
    from functions_onnxscript import MODELS

    os.makedirs(OUT, exist_ok=True)
    for name, script in MODELS.items():
        onnx.save(script.to_model_proto(), os.path.join(OUT, f"{name}.onnx"))


if __name__ == "__main__":
    main()
