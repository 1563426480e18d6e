"""Changing a signal's handler to ``SIG_IGN`` or ``SIG_DFL`` without CPython's race.

``signal.signal(n, SIG_IGN)`` runs the handlers of signals already recorded, then changes the
kernel's action, then CPython's table. A signal that comes in between is recorded with no
Python handler left to run: CPython prints ``OSError: Signal n ignored due to race
condition`` on stderr, and under ``SIG_DFL`` the signal is lost instead of ending the process.
:func:`set_handler` changes the kernel's action first, which closes that window.
"""

from __future__ import annotations

import signal


def set_handler(signum: int, handler):
    """``signal.signal(signum, handler)``, safe against a signal arriving meanwhile; returns
    the previous handler. Must run in the main thread, as ``signal.signal`` must."""
    if handler in (signal.SIG_IGN, signal.SIG_DFL):
        import threading

        # signal.signal's own check, done before we touch the kernel's action.
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("signal only works in main thread of the main interpreter")
        from alloctrace import _native

        _native._set_signal_disposition(signum, handler == signal.SIG_IGN)
    return signal.signal(signum, handler)
