"""Register SuperNode public keys with Flower's own ``flwr supernode register``, all in one process.

``python -m deploy.registration CONNECTION KEY.pub ...`` runs Flower's CLI command ``flwr
supernode register KEY.pub CONNECTION`` once per key in this one interpreter: a ``flwr`` process
costs about 1.5 s of CPU to start, so registering four keys one process each cost six. It prints
what Flower prints, and for a key Flower did not register one line ``not registered: KEY.pub
(why)``; the exit code is 1 when any key was not registered, else 0. Started with a gate
(:mod:`deploy.gates`), it imports Flower's CLI, then waits at the gate before it registers.
"""

from __future__ import annotations

import sys

from deploy import gates

NOT_REGISTERED = "not registered"


def register(connection: str, key: str) -> str | None:
    """Flower's ``flwr supernode register key connection``; why it failed, or None."""
    from flwr.cli.app import app

    try:
        app(["supernode", "register", key, connection], standalone_mode=False)
    except SystemExit as exit_:  # Flower's CLI exits on its own errors, after printing them
        if exit_.code not in (0, None):
            return f"exit code {exit_.code}"
    except Exception as err:  # click's errors, raised rather than printed outside standalone mode
        return f"{type(err).__name__}: {err}"
    return None


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m deploy.registration CONNECTION KEY.pub ...", file=sys.stderr)
        return 2
    from flwr.cli.app import app  # noqa: F401 - imported while the SuperLink starts, before its gate opens

    gates.pass_through(gates.taken())
    failed = 0
    for key in argv[1:]:
        why = register(argv[0], key)
        if why is not None:
            print(f"{NOT_REGISTERED}: {key} ({why})", flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
