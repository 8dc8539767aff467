"""Cluster your own graph from Python: :func:`cluster`.

::

    from app import cluster

    result = cluster("fedkmeans", "graph/edges.csv", num_clients=4, num_clusters=3, seed=1)
    result.labels_frame()            # pandas: node ID, cluster
    result.metrics, result.reference, result.timing, result.communication, result.privacy

    # pre-split: one piece per party, each holding only its own data (no partitioner)
    result = cluster("kcagc", [columns_a, columns_b], num_clusters=7)

``data`` is anything :func:`fedgraphcore.data.formats.as_graph` takes (a ``GraphData`` /
``GraphCollection``, a PyG ``Data``, a ``networkx`` graph, scipy / numpy
arrays, a file or directory path), or a list of such pieces, one per party.
The run is the same ServerApp and ClientApp as ``python -m app.run``
(:func:`app.run.run_experiment`); in-memory data is never written to disk: it
is registered in this process (:mod:`fedgraphcore.data.memory`), which the in-process
engine reads, so only a path can also run on Flower's simulation engine.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from fedgraphcore.config import ConfigError
from fedgraphcore.data import memory
from fedgraphcore.data.params import dataset_kwargs
from fedgraphcore.data.parties import PARTIES, SHARED_NODES, family
from fedgraphcore.result import LABELS_FILE, REFERENCE_LABELS_FILE, REPORT_FILE, RESULT_FILE

if TYPE_CHECKING:
    from app.comparison import Comparison

#: Run-config keys given by :func:`cluster`'s own arguments.
ARGUMENT_KEYS = {"strategy": "strategy", "dataset": "data", "num-clients": "num_clients", "out-dir": "out_dir"}
DEFAULT_NUM_CLIENTS = 4


@dataclass
class Result:
    """One run's outcome: what ``result.json`` holds, with the labels and the user's IDs.

    Attributes
    ----------
    strategy : str
        The strategy that ran.
    labels : ndarray of int64, shape (n_items,)
        ``labels[i]`` is the cluster of the item ``ids[i]``; -1: the method gave it none.
    reference_labels : ndarray of int64, shape (n_items,), or None
        The centralised method's cluster of each item on the pooled data (None where it did not
        run: ``reference=false``, pre-split pieces, a method without a counterpart).
    ids : ndarray, shape (n_items,)
        The items' IDs: the user's node IDs, graph IDs for graph collections, or ``0..n-1``
        for k-hop subgraphs (numbered in centre order).
    item : {"node", "graph", "item"}
        What one row is.
    parties : ndarray of int or None
        Pre-split node and graph splits keep each party's items apart (two parties' items are
        different items even under the same ID): ``parties[i]`` is the index of the piece
        holding item i; None otherwise.
    metrics, reference, timing, communication, privacy : dict
        The sections of ``result.json``: quality against the labels the data carries, the
        centralised reference and its agreement, seconds per round, bytes and messages, and
        the privacy ledger (what left each client; epsilon and delta where noise was added).
    history : list of dict
        One entry per protocol round.
    config : dict
        The complete run-config of the run.
    notes : list of str
        What the data readers repaired or noticed (isolated nodes, dropped self-loops).
    path : Path or None
        The result.json written (None without ``out_dir``).
    report : Path or None
        The run's page, report.html, beside it (None without ``out_dir``).
    result : dict
        The whole of result.json.
    """

    strategy: str
    labels: np.ndarray
    ids: np.ndarray
    item: str
    parties: np.ndarray | None
    metrics: dict
    reference: dict | None
    timing: dict
    communication: dict
    privacy: dict
    history: list
    config: dict
    notes: list[str] = field(default_factory=list)
    path: Path | None = None
    result: dict = field(default_factory=dict, repr=False)
    reference_labels: np.ndarray | None = None
    report: Path | None = None

    def labels_frame(self):
        """A pandas DataFrame of (``party``,) ``node`` (or ``graph``), ``cluster`` and, where the
        centralised method ran, ``centralised``: one row per item, as labels.csv."""
        import pandas as pd

        columns = {} if self.parties is None else {"party": self.parties}
        centralised = {} if self.reference_labels is None else {"centralised": self.reference_labels}
        return pd.DataFrame({**columns, self.item: self.ids, "cluster": self.labels, **centralised})


def run_config(config: Mapping[str, Any] | None, keywords: Mapping[str, Any]) -> dict[str, Any]:
    """The run-config of ``config`` (keys as in ``pyproject.toml``) and the keyword arguments
    (``num_rounds=5`` is ``num-rounds``); a key given twice, or one :func:`cluster` takes as an
    argument, is a one-line ConfigError."""
    raw = dict(config or {})
    for name, value in keywords.items():
        key = name.replace("_", "-")
        if key in raw:
            raise ConfigError(f"run-config key '{key}' given twice (config={{'{key}': {raw[key]!r}}} and "
                              f"{name}={value!r}); valid: once")
        raw[key] = value
    for key in raw:
        if key in ARGUMENT_KEYS:
            raise ConfigError(f"run-config key '{key}' is cluster()'s argument {ARGUMENT_KEYS[key]}; valid: pass it "
                              "as that argument")
    return raw


def cluster(strategy: str, data, num_clients: int | None = None, *, config: Mapping[str, Any] | None = None,
            engine: str = "inprocess", out_dir: str | os.PathLike | None = None, quiet: bool = False,
            **keywords) -> Result:
    """Run ``strategy`` on ``data`` and return its :class:`Result`.

    Parameters
    ----------
    strategy : str
        A strategy of :data:`app.registry.STRATEGIES` (``fedkmeans``, ``kcagc``, ...).
    data : graph-like or list of graph-like
        One graph or collection (anything :func:`fedgraphcore.data.formats.as_graph` takes; a list of
        PyG ``Data`` is one collection: pass ``as_graph(graphs)``), split over ``num_clients``
        clients by the run's partitioner (``partitioner``, default the strategy's own). Or a
        list of pieces, one per party, each holding only its own share (``dataset =
        'parties'``, :mod:`fedgraphcore.data.parties`; the partitioner then only names the split
        family, e.g. ``vertical`` for pieces that are feature columns of the same nodes).
    num_clients : int, optional
        Clients to split ``data`` over (default 4); with pieces, None or their number.
    config : mapping, optional
        Run-config keys as in ``pyproject.toml`` (``{"fedkmeans.filter-order": 2}``);
        ``data.node-table``, ``data.label-column`` and ``data.weighted`` are the reader's
        options for ``data`` and every piece.
    engine : {"inprocess", "simulation"}
        ``simulation`` (Flower's engine) reads ``data`` from a path only.
    out_dir : path, optional
        Where result.json, labels.npy, labels.csv and the run's page report.html go (pre-split:
        each party's labels.csv and page in ``party-<i>/run-<run id>/``); None: nowhere, the
        Result holds everything.
    quiet : bool
        Show nothing while it runs: no progress and no summary (warnings and errors still show;
        the Result holds the summary's figures). Default False: the progress and the summary
        that ``python -m app.run`` shows.
    **keywords
        Simple run-config keys as keywords (``seed=3``, ``num_rounds=5``, ``num_clusters=4``).

    Returns
    -------
    Result
        Labels with the user's IDs, metrics, timing, traffic and the privacy ledger.

    Raises
    ------
    fedgraphcore.config.ConfigError
        One line naming the bad argument, key or value and the valid choices (also for data
        that cannot be read).
    fedgraphcore.wire.ProtocolError
        The run stopped: a client's reply was refused, a client left, a privacy policy refused
        a step; the message names the client and why.
    """
    from fedgraphcore.quiet import plain_console, silenced

    plain_console()  # the run's log lines without colour codes where they go to a file
    with silenced(quiet):
        return _cluster(strategy, data, num_clients, config, engine, out_dir, keywords)


def _cluster(strategy: str, data, num_clients: int | None, config, engine: str, out_dir, keywords) -> Result:
    """:func:`cluster`, its output already silenced or not."""
    from fedgraphcore.data.formats import as_graph
    from app.run import ENGINES

    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; valid choices: " + ", ".join(ENGINES))
    raw = run_config(config, keywords)
    options = dataset_kwargs(raw, PARTIES)  # data.node-table, data.label-column, data.weighted: the reader's
    options["node_table"] = options["node_table"] or None
    if isinstance(data, list):
        pieces = [as_graph(piece, boundary=True, **options) for piece in data]  # a node split's edges to others
        return _cluster_pieces(strategy, pieces, num_clients, raw, engine, out_dir)
    whole = as_graph(data, **options)
    if engine != "inprocess" and not isinstance(data, (str, os.PathLike)):
        raise ConfigError(f"engine={engine!r} with in-memory data; valid: 'inprocess', or a file path")
    return _cluster_whole(strategy, whole, data, num_clients, raw, engine, out_dir)


def _cluster_pieces(strategy: str, pieces: list, num_clients: int | None, raw: dict, engine: str, out_dir) -> Result:
    """:func:`cluster` on pre-split ``pieces``, one per party (in-process only)."""
    if not pieces:
        raise ConfigError("an empty list of pieces; valid: one piece per party")
    if num_clients not in (None, len(pieces)):
        raise ConfigError(f"num_clients={num_clients!r} with {len(pieces)} pieces; valid: None or {len(pieces)} "
                          "(one party per piece)")
    if engine != "inprocess":
        raise ConfigError(f"engine={engine!r} with pre-split pieces; valid: 'inprocess' (the pieces stay in "
                          "this process)")
    return _presplit(strategy, pieces, raw, out_dir)


def _cluster_whole(strategy: str, whole, data, num_clients: int | None, raw: dict, engine: str,
                   out_dir) -> Result:
    """:func:`cluster` on one graph or collection ``whole`` (read from ``data``, the user's object or
    path) split by the partitioner: given in memory on the in-process engine (named by the path it
    was read from, where there is one), else read from the path by the engine's clients."""
    clients = DEFAULT_NUM_CLIENTS if num_clients is None else num_clients
    path = str(data) if isinstance(data, (str, os.PathLike)) else None
    name = memory.register(whole, label=path) if engine == "inprocess" else path
    try:
        result, labels = _execute(strategy, name, clients, raw, out_dir, engine)
    finally:
        if memory.is_memory(name):
            memory.forget(name)
    if result["config"]["partitioner"] == "khop":  # the items are k-hop subgraphs, in centre order
        return _result(result, labels, np.arange(labels.size), None, item="item")
    return _result(result, labels, whole.keys, None)


def _presplit(strategy: str, pieces: list, raw: dict, out_dir) -> Result:
    """Each piece as one party's own data (module docstring of :mod:`fedgraphcore.data.parties`)."""
    names = [memory.register(piece) for piece in pieces]
    try:
        node_configs = [{"data": name, "partition-id": i, "num-partitions": len(pieces),
                         **({"out-dir": str(Path(out_dir).resolve() / f"party-{i}")} if out_dir else {})}
                        for i, name in enumerate(names)]
        result, labels = _execute(strategy, PARTIES, len(pieces), raw, out_dir, "inprocess", node_configs)
    finally:
        for name in names:
            memory.forget(name)
    if family(str(result["config"]["partitioner"])) in SHARED_NODES:
        return _result(result, labels, pieces[0].keys, None)
    return _result(result, labels, np.concatenate([p.keys for p in pieces]),
                   np.repeat(np.arange(len(pieces)), [len(p.keys) for p in pieces]))


def _execute(strategy, dataset, num_clients, raw, out_dir, engine, node_configs=None) -> tuple[dict, np.ndarray]:
    """Run it; return result.json's content (with ``reference_labels``, the centralised method's or
    None, and ``report``, the page's path) and the labels (written to ``out_dir``; without one,
    kept in memory, or on Flower's simulation engine, which hands them over in files, in a
    temporary directory removed afterwards)."""
    from app.run import run_experiment

    notes: list[str] = []

    def read(run: Path) -> tuple[dict, np.ndarray]:
        result = json.loads((run / RESULT_FILE).read_text())
        result["notes"] = notes  # the readers' notes (a party's stay out of result.json)
        reference = run / REFERENCE_LABELS_FILE
        result["reference_labels"] = np.load(reference) if reference.exists() else None
        result["report"] = str(run / REPORT_FILE) if (run / REPORT_FILE).exists() else None
        return result, np.load(run / LABELS_FILE)

    def run(out: Path, page: dict | None = None) -> Path:
        done = run_experiment(strategy, dataset, num_clients, {**raw, **(page or {})}, out, engine,
                              note=notes.append, node_configs=node_configs)
        return Path(done["path"])

    if out_dir is None and engine == "inprocess":
        result = run_experiment(strategy, dataset, num_clients, raw, None, engine, note=notes.append,
                                node_configs=node_configs, write=False)
        labels = result.pop("labels")
        return {**result, "notes": notes}, labels
    if out_dir is not None:
        path = run(Path(out_dir))
        result, labels = read(path.parent)
        result["path"] = str(path)
        return result, labels
    with tempfile.TemporaryDirectory(prefix="fedgraph-") as tmp:  # no page: the folder is gone after the run
        return read(run(Path(tmp) / "run", {"report": False}).parent)


def _result(result: dict, labels: np.ndarray, keys: np.ndarray, parties: np.ndarray | None,
            item: str | None = None) -> Result:
    item = item or ("graph" if result["config"]["partitioner"] == "graph-dirichlet" else "node")
    path = Path(result["path"]) if result.get("path") else None
    reference = result.pop("reference_labels", None)
    report = result.pop("report", None)
    return Result(strategy=result["strategy"], labels=np.asarray(labels, dtype=np.int64), ids=np.asarray(keys),
                  item=item, parties=parties, metrics=result["metrics"], reference=result["reference"],
                  timing=result["timing"], communication=result["communication"], privacy=result["privacy"],
                  history=result["history"], config=result["config"], notes=result["notes"], path=path,
                  result=result, reference_labels=None if reference is None else np.asarray(reference, dtype=np.int64),
                  report=Path(report) if report else None)


def compare(data, strategies: Sequence[str] | None = None, num_clients: int | None = None, *,
            config: Mapping[str, Any] | None = None, out_dir: str | os.PathLike | None = None,
            engine: str = "inprocess", quiet: bool = True, note: Callable[[str], None] | None = None,
            **keywords) -> Comparison:
    """Run every strategy that fits ``data`` (or ``strategies``) on it; the :class:`app.comparison.Comparison`.

    Parameters
    ----------
    data : str or graph-like
        A built-in dataset's name or a path (as ``--dataset``), or anything :func:`cluster` takes.
    strategies : sequence of str, optional
        The strategies to run (default: every one that fits the data).
    num_clients : int, optional
        Clients to split the data over (default 3).
    config, **keywords
        Run-config keys for every run (``num_clusters=3``, ``{"kcagc.mode": "paper"}``); a key of
        one strategy applies to that strategy only.
    out_dir : path, optional
        Where each run's folder (``<strategy>/``, with its page) and ``compare.html`` go; None: nowhere.
    engine : {"inprocess", "simulation"}
        As for :func:`cluster`.
    quiet : bool
        Leave out each run's progress and summary (default); ``note`` hears one line as each
        strategy starts and ends.

    Returns
    -------
    Comparison
        One row per strategy (``rows``, ``frame()``, ``table()``) and the page's ``path``.

    Raises
    ------
    fedgraphcore.config.ConfigError
        A strategy that does not exist, data that cannot be read, a bad key; one line.
    """
    from app.comparison import compare_runs
    from app.run import run_experiment

    return compare_runs(run_experiment, data, strategies, num_clients, run_config(config, keywords), out_dir, engine,
                        quiet, note)
