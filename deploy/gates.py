"""A process started ahead of what it needs, waiting for the starting process's go-ahead.

:func:`deploy.federation.LocalFederation.start_federation` starts the SuperLink, the gateway,
the registration of the SuperNodes' keys and the SuperNodes at once: each imports its code
(seconds of CPU) while the others start, then waits at a :class:`Gate` (a pipe) until what it
needs is up: the registration until the SuperLink serves, a SuperNode
(:func:`deploy.flower_shim.join_after_gate`) until its key is registered and the gateway serves.
The wait is an event (a byte written, or the pipe closed because the starting process ended),
never a timer.
"""

from __future__ import annotations

import os
import select

#: the environment variable naming the read end of a process's gate
GATE_SETTING = "FEDGRAPH_GATE"


class Gate:
    """One process's gate: a pipe whose read end it inherits (:meth:`environ`, ``pass_fds``)."""

    def __init__(self) -> None:
        self.read_end, self.write_end = os.pipe()

    def environ(self) -> dict[str, str]:
        """What the process's environment adds (start it with ``pass_fds=(gate.read_end,)``)."""
        return {GATE_SETTING: str(self.read_end)}

    def handed_over(self) -> None:
        """The process holds the read end: close this process's copy."""
        os.close(self.read_end)

    def open(self) -> None:
        """Let the process go on (once; a process that has ended is no error)."""
        if self.write_end is None:
            return
        try:
            os.write(self.write_end, b"g")
        except BrokenPipeError:
            pass
        os.close(self.write_end)
        self.write_end = None


def taken(environ=os.environ) -> int | None:
    """This process's gate (the read end's descriptor), taken out of ``environ`` and not inherited
    by what it starts; None if it was started without one."""
    if GATE_SETTING not in environ:
        return None
    gate = int(environ.pop(GATE_SETTING))
    os.set_inheritable(gate, False)
    return gate


def pass_through(gate: int | None) -> None:
    """Wait until ``gate`` (:func:`taken`) is opened or its writer is gone; None: go on at once."""
    if gate is None:
        return
    select.select([gate], [], [])
    os.close(gate)
