"""Built-in passes, installed as ``scanopt.passes``; importing this registers them.

One module per pass, a package (like ``fuse/``) where a pass needs several files. The
pipeline order lives in :mod:`scanopt.pipeline`.
"""

from scanopt.passes import canonicalize  # noqa: F401
from scanopt.passes import cleanup  # noqa: F401
from scanopt.passes import fuse  # noqa: F401
from scanopt.passes import linattn  # noqa: F401
from scanopt.passes import loop_to_scan  # noqa: F401
from scanopt.passes import loopfree  # noqa: F401
from scanopt.passes import unroll  # noqa: F401
from scanopt.passes import upgrade  # noqa: F401

# The loop-free passes moved into loopfree/ (issue 21); the paths people imported them by
# (`scanopt.passes.vectorize`, `.hoist`, `.lift`) still give the very same modules.
import sys as _sys  # noqa: E402

from scanopt.passes.loopfree import lift as _lift  # noqa: E402

for _name, _module in (("vectorize", loopfree.vectorize), ("hoist", loopfree.hoist), ("lift", _lift)):
    _sys.modules.setdefault(f"{__name__}.{_name}", _module)
    globals().setdefault(_name, _module)
