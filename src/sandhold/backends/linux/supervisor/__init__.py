"""The creation-time supervisor for Linux sandboxes (F-BE-5): seccomp user notification.

``supervisor.Supervisor`` answers, from one thread, every call a sandboxed tree
makes that could create a name, performing each one itself after asking
``sandhold.policy.creation``; ``emulate`` is how (over ``resolve``, ``checks``,
``opens``, ``names``, ``sockets``), ``notify`` the kernel
interface, ``landlock`` the write-only Landlock domain beside it, and ``run`` the
whole sequence as a program. See docs/supervisor.md.

Nothing here is imported by the CLI's start-up path; import the submodules
directly (this package imports nothing on purpose).
"""
