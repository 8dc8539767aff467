"""The data layer's documented commands: ``python -m app.data.prepare``, ``python -m app.data.check``.

The data layer itself is :mod:`fedgraphcore.data`.
"""
