"""The core library of federated graph clustering: data, protocols, privacy and the transport.

Everything a method needs below its Flower strategy and client: the data layer (``data``), each
method's protocol math and wire format (``protocols``), privacy mechanisms and accounting
(``privacy``), the run-config (``config``), the message schema (``wire``), the server's transport
and session (``transport``, ``session``, ``journal``), quality and results (``metrics``,
``result``, ``report``). It imports nothing of the Flower app above it (``app``, ``strategies``,
``clients``); see docs/architecture.md.
"""
