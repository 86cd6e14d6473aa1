"""Built-in passes, installed as ``scanopt.passes``; importing this registers them.

One module per pass, a package (like ``fuse/``) where a pass needs several files. The
pipeline order lives in :mod:`scanopt.pipeline`.
"""

from scanopt.passes import canonicalize  # noqa: F401
from scanopt.passes import cleanup  # noqa: F401
from scanopt.passes import fuse  # noqa: F401
from scanopt.passes import loop_to_scan  # noqa: F401
from scanopt.passes import loopfree  # noqa: F401
from scanopt.passes import unroll  # noqa: F401
from scanopt.passes import upgrade  # noqa: F401
