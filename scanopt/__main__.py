"""``python -m scanopt`` runs the command line."""

import sys

from scanopt.cli import main

sys.exit(main())
