"""What a party tells the server when it cannot answer a step, and what it keeps to itself.

An exception raised while a party answers a step has two parts. Its public part goes to the
server in Flower's error reply: which rule, file kind or setting failed
(``data check failed: nodes.csv, rule 'finite features'``; ``node config 'out-dir', rule 'a
writable directory'``; a privacy-policy refusal names its rule only). Its message, which may
name the party's values, node IDs and paths, goes to the party's own log only (the SuperNode's
or the ClientApp's stderr, logger :data:`LOGGER` at ERROR). An exception without a public part
(a bug) crosses as its type name and the step.

A local user (``python -m app.data.check``, :func:`app.api.cluster` on the user's own data) sees
the whole message: those paths read the data before any server is involved.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Callable, Iterator

from fedgraphcore.config import ConfigError
from fedgraphcore.errors import FedGraphError

#: the party's own log; a SuperNode passes its ClientApp's stderr to its log
LOGGER = logging.getLogger("fedgraph.party")


class PartyError(FedGraphError):
    """A step a party could not answer; its message is the public part only (what the server receives)."""


def public_part(err: BaseException) -> str | None:
    """What the server may know of ``err``: its ``public`` text (a privacy refusal's: its rule), else None."""
    public = getattr(err, "public", None)
    return str(public) if public else None


def disclosed(err: BaseException, step: str) -> str:
    """The error text a party sends the server for ``err`` raised in ``step``: its public part,
    else its type name and the step."""
    return public_part(err) or f"{type(err).__name__} in step '{step}' (the party's log has the details)"


def log_failure(err: BaseException, step: str, where: str) -> None:
    """Log ``err`` in full on the party (``where``: which node and run; a traceback where it has no
    public part, i.e. a bug)."""
    LOGGER.error("%s, step '%s': %s: %s", where, step, type(err).__name__, err,
                 exc_info=err if public_part(err) is None else None)


def party_failure(err: BaseException, step: str, where: str) -> PartyError:
    """Log ``err`` in full on the party (:func:`log_failure`) and return the :class:`PartyError`
    to raise in its place."""
    log_failure(err, step, where)
    return PartyError(disclosed(err, step))


@contextmanager
def disclosing(public: str | Callable[[ConfigError], str]) -> Iterator[None]:
    """A ConfigError raised inside without a public part gets ``public`` (or ``public(err)``) as one;
    its message is unchanged for a local user."""
    try:
        yield
    except ConfigError as err:
        if getattr(err, "public", None) is None:
            err.public = public(err) if callable(public) else public
        raise
