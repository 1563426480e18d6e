"""Starting the threads alloctrace runs inside a traced program, with signals left to the
program's threads.

The kernel gives a signal sent to the process (``kill``, Ctrl-C, a snapshot request, a
SIGTERM to end it) to any one thread that does not block it; it prefers the main thread, but
not when that one has a signal pending already, which happens under load. CPython runs Python
handlers in the main thread only, when that thread next checks. A signal taken by one of our
threads while the main thread waited in a system call (reading stdin, ``accept``) interrupted
nothing there, so its handler ran only once the main thread woke for another reason: a
snapshot request seen in CI waited 120 s unanswered, and Ctrl-C could have waited the same
way. So our threads start with the asynchronous signals blocked and keep them blocked: a
signal for the process reaches a thread of the program's, as it would without alloctrace.

The signals a fault raises in the thread itself stay unblocked: with them blocked the kernel
kills the process outright, before :mod:`faulthandler` could say where.

It imports no other alloctrace module.
"""

from __future__ import annotations

import signal
import threading

#: Raised by the faulting thread itself (synchronous): never blocked.
_FAULTS = frozenset(
    {
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGFPE,
        signal.SIGILL,
        signal.SIGTRAP,
        signal.SIGABRT,
        signal.SIGSYS,
    }
)


def start(thread: threading.Thread) -> None:
    """Start *thread* with every signal but the fault signals blocked in it.

    A new thread inherits the signal mask of the thread that starts it, so the signals are
    blocked here for the moment of the start, and the new thread never has them unblocked.
    A signal that comes meanwhile stays pending and is delivered once this thread's mask is
    restored.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - _FAULTS)
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
