"""fedgraph-clustering: federated graph clustering on Flower.

``from app import cluster`` (see :mod:`app.api`) runs a strategy on your own
graph from Python; imported on first use, so that ``import app`` stays light.
"""

__all__ = ["Result", "cluster"]


def __getattr__(name: str):
    if name in __all__:
        from app import api

        return getattr(api, name)
    raise AttributeError(f"module 'app' has no attribute {name!r}")
