"""Fork safety of the device runtimes portconv calls itself (Note [fork]): one RuntimeGuard per runtime."""
from __future__ import annotations

import os
from collections.abc import Callable

from .errors import BackendUnavailable

# Note [fork]
# A device runtime does not survive fork. PoCL: the first clFinish of a child forked after its parent used OpenCL
# waits on driver threads that fork did not copy, and a fresh context hangs the same way. CUDA (and ROCm): a child
# forked after its parent initialised the driver cannot use it (CUDA's documentation leaves it undefined; calls fail
# or hang). A RuntimeGuard records whether this process used its runtime (use(), before every first contact) and,
# through an at-fork hook, marks itself forked in a child of a process that had, or that was itself such a child:
# ``forked`` is inherited down the process tree. The runtime is never called again in a forked process: the
# backend's probe answers no with ``reason`` (new automatic plans go elsewhere), and any call that would reach the
# runtime, a plan the parent made and cached included, raises BackendUnavailable at once with the cause and the fix.
# The child never releases the parent's runtime objects either (that is a runtime call too): they stay referenced.
# ``inherited`` covers use by others: it says, in a child, whether the parent used the runtime outside portconv
# (torch's own CUDA initialisation), read when the guard is made and after every fork. A child started with 'spawn'
# or 'forkserver' is a fresh process and uses the runtime as usual.


class RuntimeGuard:
    """Note [fork]: whether this process may call one device runtime, and the error where it may not."""

    def __init__(self, runtime: str, why: str, inherited: Callable[[], bool] | None = None):
        self.runtime = runtime
        self.reason = (f"this process was forked after its parent used {runtime}, and {why}; start such workers "
                       "with the 'spawn' or 'forkserver' method (torch.multiprocessing, "
                       "DataLoader(multiprocessing_context='spawn')), or fork before the parent first uses "
                       f"{runtime} (through portconv or otherwise), or use another backend in the children")
        self._inherited = inherited
        self.used = False
        self.forked = bool(inherited and inherited())
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._after_fork_in_child)

    def _after_fork_in_child(self) -> None:
        self.forked = self.forked or self.used or bool(self._inherited and self._inherited())

    def check(self, who: str) -> None:
        """Raise BackendUnavailable (``who``: the backend or kernels named in the message) in a forked process."""
        if self.forked:
            raise BackendUnavailable(f"portconv's {who}: {self.reason}")

    def use(self, who: str) -> None:
        """check(), then mark the runtime used by this process: call before every first contact with it."""
        self.check(who)
        self.used = True
