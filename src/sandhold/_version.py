"""The one version string of sandhold.

Rules:
- This line is the version: pyproject.toml reads it (``[tool.hatch.version]``) for the
  package metadata, and the CLI and proxy mode import it; no other copy exists.
- Plain assignment, no imports: read on every ``--version`` and cheap to import.
"""

__version__ = "0.1.0"
