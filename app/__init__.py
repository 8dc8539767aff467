"""fedgraph-clustering: federated graph clustering on Flower.

``from app import cluster`` (see :mod:`app.api`) runs a strategy on your own
graph from Python, ``from app import compare`` (see :mod:`app.comparison`) every
strategy that fits it; imported on first use, so that ``import app`` stays light.
"""

__all__ = ["Result", "cluster", "compare", "Comparison"]


def __getattr__(name: str):
    if name in ("Result", "cluster"):
        from app import api

        return getattr(api, name)
    if name in ("compare", "Comparison"):
        from app import comparison

        return getattr(comparison, name)
    raise AttributeError(f"module 'app' has no attribute {name!r}")
