"""fedgraph-clustering: federated graph clustering on Flower.

``from app import cluster`` (see :mod:`app.api`) runs a strategy on your own
graph from Python, ``from app import compare`` every strategy that fits it (see
:mod:`app.comparison`); imported on first use, so that ``import app`` stays light.
"""

__all__ = ["Result", "cluster", "compare", "Comparison"]


def __getattr__(name: str):
    if name in ("Result", "cluster", "compare"):
        from app import api

        return getattr(api, name)
    if name == "Comparison":
        from app import comparison

        return comparison.Comparison
    raise AttributeError(f"module 'app' has no attribute {name!r}")
