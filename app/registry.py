"""Strategy registry and the full run-config schema.

``STRATEGIES`` maps each strategy name to its (server Strategy class, client
class); a method plugs in by adding one line here. :func:`validate` checks a
raw run-config against the keys shared by all methods, the data keys and every
strategy's own keys, then the chosen strategy's cross-key rules.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any, Mapping

from fedgraphcore.config import ConfigError, NoiseConfig, Param, RunConfig, Schema, SecAggConfig, SharedConfig
from fedgraphcore.data.datasets import DATASETS, check_dataset_value, is_builtin
from fedgraphcore.data.params import DATA_PARAMS, data_keys_read
from fedgraphcore.data import memory
from fedgraphcore.data.parties import PARTIES
from fedgraphcore.data.partition import PARTITIONERS
from fedgraphcore.transport import POLL_MODES
from clients.fedavg_dmon import FedAvgDMoNClient
from clients.fedkmeans import FedKMeansClient
from strategies.fedavg_dmon import FedAvgDMoN
from strategies.fedkmeans import FedKMeans
from clients.fedspectral import FedSpectralClient, FedSpectralPlusClient
from strategies.fedspectral import FedSpectral, FedSpectralPlus
from clients.gw_ldp import GWLDPClient
from strategies.gw_ldp import GWLDP
from clients.fedsc import FedSCClient
from strategies.fedsc import FedSC
from clients.kcagc import KCAGCClient
from strategies.kcagc import KCAGC, KCAGCBasic


@dataclass(frozen=True)
class Entry:
    strategy: type
    client: type


STRATEGIES: dict[str, Entry] = {
    "fedkmeans": Entry(FedKMeans, FedKMeansClient),
    "gw-ldp": Entry(GWLDP, GWLDPClient),
    "fedspectral": Entry(FedSpectral, FedSpectralClient),
    "fedspectral-plus": Entry(FedSpectralPlus, FedSpectralPlusClient),
    "fedavg-dmon": Entry(FedAvgDMoN, FedAvgDMoNClient),
    "fedsc": Entry(FedSC, FedSCClient),
    "kcagc": Entry(KCAGC, KCAGCClient),
    "kcagc-basic": Entry(KCAGCBasic, KCAGCClient),
}


def check_dataset(dataset: str) -> None:
    """The ``dataset`` value: a built-in name, a path (:func:`fedgraphcore.data.datasets.check_dataset_value`),
    the reserved ``parties``, or data registered in this process (``memory:...``, :mod:`fedgraphcore.data.memory`)."""
    if dataset == PARTIES:
        return
    if memory.is_memory(dataset):
        memory.lookup(dataset)
        return
    check_dataset_value(dataset)


def check_dataset_name(dataset: str) -> None:
    """The ``dataset`` value as a member checks a run-config it received: by its spelling alone, never
    by what lies at a path on the member's disk (a refusal that did would tell the server whether a
    file exists there). A path passes; an empty value is a one-line ConfigError."""
    if dataset == PARTIES or memory.is_memory(dataset) or is_builtin(dataset):
        return
    if not dataset:
        raise ConfigError(f"invalid value '' for 'dataset'; valid: a built-in dataset ({', '.join(DATASETS)}), "
                          f"'{PARTIES}', or a path")


def get(name: str) -> Entry:
    """The registered entry for ``name``, or a one-line ConfigError."""
    if name not in STRATEGIES:
        raise ConfigError(f"unknown strategy {name!r}; valid choices: " + ", ".join(STRATEGIES))
    return STRATEGIES[name]


def core_params(disk: bool = True) -> list[Param]:
    """Keys every method shares, as :class:`fedgraphcore.config.SharedConfig`, :class:`fedgraphcore.config.SecAggConfig`
    and :class:`fedgraphcore.config.NoiseConfig` declare them (secure aggregation's and the noise seed after
    ``transport``), with
    what only the layers above fedgraphcore.config know: the strategy names, the partitioners, the reply
    polling modes and the dataset check (``disk`` False: :func:`check_dataset_name`)."""
    supplied = {"strategy": {"choices": tuple(STRATEGIES)},
                "dataset": {"check": check_dataset if disk else check_dataset_name},
                "partitioner": {"choices": ("auto",) + tuple(PARTITIONERS)}, "transport": {"choices": POLL_MODES}}
    shared = [replace(p, **supplied.get(p.key, {})) for p in SharedConfig.params()]
    at = [p.key for p in shared].index("transport") + 1
    return [*shared[:at], *SecAggConfig.params(), *NoiseConfig.params(), *shared[at:]]


@lru_cache(maxsize=2)
def schema(disk: bool = True) -> Schema:
    s = Schema()
    s.add(core_params(disk))
    s.add(DATA_PARAMS)
    for entry in STRATEGIES.values():
        s.add(entry.strategy.params)
    return s


def params_read(strategy: str, dataset: str, partitioner: str) -> dict[str, list[Param]]:
    """The keys a run of ``strategy`` on ``dataset`` split by ``partitioner`` (``auto``: the
    strategy's own) reads, in schema order, by group: ``shared`` (the keys every method shares,
    less those the strategy ignores), ``strategy`` (its own and borrowed keys) and ``data``
    (the dataset's and the partitioner's)."""
    cls = get(strategy).strategy
    if partitioner == "auto":
        partitioner = cls.partitioners[0]
    params = schema().params
    data = data_keys_read(dataset, partitioner)
    return {
        "shared": [p for p in core_params() if p.key not in cls.ignores],
        "strategy": [*cls.params, *cls.borrowed],
        "data": [p for key, p in params.items() if key in data],
    }


def keys_read(config: RunConfig) -> list[str]:
    """The keys the run ``config`` reads (see :func:`params_read`), in schema order."""
    shared = SharedConfig.of(config)
    groups = params_read(shared.strategy, shared.dataset, shared.partitioner)
    read = {p.key for group in groups.values() for p in group}
    return [key for key in schema().params if key in read]


def unused_keys(config: RunConfig, keys) -> list[str]:
    """Those of ``keys`` that neither the strategy, nor the dataset, nor the partitioner of
    ``config`` reads: setting them has no effect."""
    read = set(keys_read(config))
    return [k for k in keys if k not in read]


def validate(raw: Mapping[str, Any], disk: bool = True) -> RunConfig:
    """Typed, complete, checked config; ``partitioner=auto`` resolved. ``disk`` False: as a member
    checks the run-config a server sent, without looking at its own disk (:func:`check_dataset_name`)."""
    config = schema(disk).validate(raw)
    strategy = get(SharedConfig.of(config).strategy).strategy
    strategy.check(config)
    values = config.as_dict()
    if values["partitioner"] == "auto":
        values["partitioner"] = strategy.partitioners[0]
    return RunConfig(values)
