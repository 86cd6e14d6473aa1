"""scanopt: verified rewrites for the ONNX Scan operator."""

__version__ = "0.1.0"
