"""Built-in passes, installed as scanopt.passes."""
