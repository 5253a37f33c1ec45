"""``python -m sandhold`` runs the CLI."""

import os
import sys

# -m puts the working directory first on sys.path: the sandbox may write there, and a
# json.py planted in it would run here, outside the sandbox, at the next lazy import
if sys.path and sys.path[0] in ("", os.getcwd()):
    del sys.path[0]

from sandhold.cli import main

sys.exit(main())
