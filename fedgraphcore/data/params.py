"""Run-config keys of the data layer and their mapping to Python kwargs.

The lead declares ``dataset``, ``partitioner``, ``seed`` and ``num-clusters``;
this module declares everything else the data layer reads. Keys are grouped
by prefix: ``sbm.*`` and ``circles.*`` are dataset parameters (kwargs of
:func:`fedgraphcore.data.load_dataset`), ``data.*`` the options of a dataset given by
path (kwargs of :func:`fedgraphcore.data.formats.read_graph`), ``partition.*`` and
``khop.*`` are partitioner parameters (kwargs of :func:`fedgraphcore.data.partition.partition`).
"""

from __future__ import annotations

from typing import Any, Mapping

from fedgraphcore.config import ConfigError, Param, SharedConfig

from .datasets import DATASET_PARAMS, FILE_DATASETS, PATH_PARAMS, is_builtin
from .partition import COMMUNITY_METHODS, PARTITION_PARAMS, PARTITIONERS, RUN_CONFIG_KEYS, VERTICAL_SPLITS

#: The run-config's seed (data generation, partitioning and the protocol, :class:`fedgraphcore.config.SharedConfig`);
#: also ``python -m app.data.prepare --seed``.
SEED = next(p for p in SharedConfig.params() if p.key == "seed")

DATA_PARAMS: list[Param] = [
    Param("data-root", str, "",
          "folder with the raw datasets (empty: $FEDGRAPH_DATA_ROOT, else ../shared/datasets); a built-in "
          "dataset in none is downloaded into the user cache ($FEDGRAPH_CACHE_DIR)"),
    # A dataset given by path (fedgraphcore.data.formats.read_graph's options).
    Param("data.node-table", str, "",
          "path dataset: node table of an edge list (ID column, numeric features, optional label column); "
          "empty: DIR/nodes.csv when the dataset is a directory DIR"),
    Param("data.label-column", str, "label",
          "path dataset: the label column of the node table or graphs.csv (networkx: the node attribute; .mat: "
          "the variable); the default 'label' is used when present"),
    Param("data.weighted", bool, True,
          "path dataset: edge weights from a weight column or the adjacency values; false: every edge weight 1"),
    # Synthetic attributed SBM (default: small, fast, clearly clustered).
    Param("sbm.nodes", int, 1000, "SBM: number of nodes", low=2, high=100_000_000),
    Param("sbm.blocks", int, 4, "SBM: number of planted blocks (clusters)", low=1, high=10_000),
    Param("sbm.p-in", float, 0.05, "SBM: edge probability inside a block", low=0.0, high=1.0),
    Param("sbm.p-out", float, 0.005, "SBM: edge probability between blocks", low=0.0, high=1.0),
    Param("sbm.features", int, 16, "SBM: feature dimension (0: no features)", low=0, high=100_000),
    Param("sbm.signal", float, 5.0,
          "SBM: distance between block feature means in noise std units (0: uninformative)",
          low=0.0, high=1e6),
    # Concentric circles.
    Param("circles.samples", int, 1000, "circles: number of points", low=2, high=10_000_000),
    Param("circles.noise", float, 0.05, "circles: Gaussian noise std", low=0.0, high=10.0),
    Param("circles.factor", float, 0.5, "circles: inner/outer radius ratio", low=0.0, high=0.99),
    # Partitioners.
    Param("partition.overlap", float, 0.0,
          "node-*: fraction of nodes also given to one other client; edge: each edge goes to "
          "round(overlap * clients) clients (at least 1); the less each client holds, the further a "
          "federated result from the centralised one", low=0.0, high=1.0, primary=True),
    Param("partition.boundary", bool, True,
          "node-*: each client also holds its nodes' edges to nodes another client holds (boundary "
          "edges, as each organisation knows its own nodes' edges); false drops cut edges (the papers' "
          "node splits)", primary=True),
    Param("partition.replicas", int, 0,
          "edge: clients per edge r (0: derive from partition.overlap)", low=0, high=100_000),
    Param("partition.with-features", bool, False, "edge: also give every client the node features"),
    Param("partition.alpha", float, 0.5,
          "*-dirichlet: Dirichlet concentration of the label skew (small: strong skew)",
          low=1e-4, high=1e6),
    Param("partition.min-size", int, 2,
          "*-dirichlet: minimum items per client (the split is redrawn until met)", low=0, high=10_000_000),
    Param("partition.community", str, "louvain",
          "node-community: louvain (networkx, seeded) or spectral (balanced min-cut, METIS-style)",
          choices=COMMUNITY_METHODS),
    Param("partition.split", str, "contiguous", "vertical: feature blocks contiguous or random",
          choices=VERTICAL_SPLITS),
    Param("partition.sizes", str, "",
          "vertical: comma-separated feature block sizes, one per client (empty: near-equal)"),
    Param("khop.hops", int, 2, "khop: radius of the subgraph around each centre", low=1, high=10),
    Param("khop.centres", int, 0, "khop: number of centre nodes over all clients (0: all nodes)",
          low=0, high=100_000_000),
    Param("khop.max-nodes", int, 0, "khop: cap on subgraph size (0: no cap)", low=0, high=10_000_000),
]

_BY_KEY = {p.key: p for p in DATA_PARAMS}

#: run-config key -> (section, kwarg) for dataset parameters.
_DATASET_KEYS = {
    "sbm": {"sbm.nodes": "nodes", "sbm.blocks": "blocks", "sbm.p-in": "p_in", "sbm.p-out": "p_out",
            "sbm.features": "features", "sbm.signal": "signal"},
    "circles": {"circles.samples": "samples", "circles.noise": "noise", "circles.factor": "factor"},
}

#: run-config key -> kwarg of a dataset given by path.
_PATH_KEYS = {"data.node-table": "node_table", "data.label-column": "label_column", "data.weighted": "weighted"}

assert all(set(v.values()) == set(DATASET_PARAMS[k]) for k, v in _DATASET_KEYS.items())
assert set(_PATH_KEYS.values()) == set(PATH_PARAMS)


def _dataset_keys(dataset: str) -> dict[str, str]:
    return _DATASET_KEYS.get(dataset, {}) if is_builtin(dataset) else _PATH_KEYS


def data_keys_read(dataset: str, partitioner: str) -> set[str]:
    """The data run-config keys that ``dataset`` and ``partitioner`` read (the others have no effect)."""
    keys = set(_dataset_keys(dataset)) | {RUN_CONFIG_KEYS[kw] for kw in PARTITION_PARAMS[partitioner]}
    return keys | ({"data-root"} if dataset in FILE_DATASETS else set())


def _value(config_values: Mapping[str, Any], key: str) -> Any:
    p = _BY_KEY[key]
    try:
        raw = config_values[key]
    except KeyError:
        return p.default
    return p.coerce(raw)


def data_root(config_values: Mapping[str, Any]) -> str | None:
    """``data-root`` from the config (None when empty: use the env/default fallback)."""
    v = _value(config_values, "data-root")
    return v or None


def dataset_kwargs(config_values: Mapping[str, Any], dataset: str | None = None) -> dict:
    """kwargs for ``load_dataset(dataset, data_root=..., seed=..., **kwargs)``.

    Only the keys of ``dataset`` (default: ``config_values['dataset']``) are
    returned, e.g. ``{'nodes': 1000, 'blocks': 4, ...}`` for sbm, ``{}`` for
    cora and ``{'node_table': '', 'label_column': 'label', 'weighted': True}``
    for a path. ``data-root`` and ``seed`` are not included (see :func:`data_root`).
    """
    if dataset is None:
        try:
            dataset = config_values["dataset"]
        except KeyError:
            raise ConfigError("missing config key 'dataset'") from None
    return {kw: _value(config_values, key) for key, kw in _dataset_keys(str(dataset)).items()}


def partition_kwargs(partitioner: str, config_values: Mapping[str, Any]) -> dict:
    """kwargs for ``partition(data, partitioner, num_clients, seed=..., **kwargs)``:
    only the parameters ``partitioner`` uses, e.g. ``{'overlap': 0.0, 'alpha': 0.5,
    'min_size': 2}`` for node-dirichlet."""
    if partitioner not in PARTITIONERS:
        raise ConfigError(f"unknown partitioner {partitioner!r}; valid choices: " + ", ".join(PARTITIONERS))
    return {kw: _value(config_values, RUN_CONFIG_KEYS[kw]) for kw in PARTITION_PARAMS[partitioner]}
