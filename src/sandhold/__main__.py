"""``python -m sandhold`` runs the CLI."""

import sys

from sandhold.cli import main

sys.exit(main())
