"""The one root of every error this app raises on purpose: :class:`FedGraphError`.

Its message is one line meant for the user. ``exit_code`` is what ``python -m app.run`` and
``python -m deploy`` exit with: 2 for a setting or an input to fix (:class:`fedgraphcore.config.ConfigError`
and its kinds: a data file, a shard, a key file), 1 for a run that stopped (a protocol step, secure
aggregation, the engine). The server and the command-line tools catch this class and print its
line; any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class FedGraphError(Exception):
    """An error this app raises on purpose, with a one-line message meant for the user."""

    exit_code = 1
