"""The in-sandbox agent and its transport-neutral protocol (docs/agent-protocol.md).

``protocol`` is the sans-I/O frame and field codec both sides share; ``main`` is
the agent itself, which the host starts inside the sandbox. Nothing here is
imported by ``import sandhold`` or the CLI.
"""
