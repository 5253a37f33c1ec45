"""``python -P -m sandhold`` runs the CLI.

Without ``-P`` (``PYTHONSAFEPATH``), ``python -m`` looks for ``sandhold`` in the
working directory before anywhere else: where a sandbox may write, it could leave a
``sandhold`` package that then runs instead of this one, unconfined. That cannot be
caught from here once it happened, so an unsafe invocation is refused every time,
before it becomes a habit.
"""

import sys

if not sys.flags.safe_path:
    sys.stderr.write(
        "sandhold: run it as `python -P -m sandhold` (or the `sandhold` command): without "
        "-P, python -m looks for sandhold in the working directory first, where a sandbox "
        "may have written one\n"
    )
    sys.exit(2)

from sandhold.cli import exit_with, main

exit_with(main())
