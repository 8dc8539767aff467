"""Data layer: datasets, partitioners and per-client shards (see docs/architecture.md).

``load_dataset(name, data_root=None, seed=0, **params)`` returns a
:class:`GraphData` or :class:`GraphCollection`; ``fedgraphcore.data.partition.partition``
cuts it into per-client :class:`Shard` objects; ``fedgraphcore.data.shards`` caches,
writes and loads shards.
"""

from .datasets import DATASETS, DatasetNotFound, load_dataset, resolve_data_root
from .types import GraphCollection, GraphData, Shard

__all__ = [
    "DATASETS",
    "DatasetNotFound",
    "GraphCollection",
    "GraphData",
    "Shard",
    "load_dataset",
    "resolve_data_root",
]
