"""The Flower ServerApp (Message API).

``run_server`` is the whole server side of one experiment: validate the
run-config, connect to the clients (``hello`` handshake), run the configured
strategy, evaluate its clustering against the ground truth and against the
centralised reference on the pooled data, and write ``result.json``. With
``dataset = 'parties'`` the server holds no data at all: it sends every party
the labels of its own items (where the method did not already) and writes the
strategy's own metrics and the cluster sizes, the reference skipped.
"""

from __future__ import annotations

import logging
import time
from logging import ERROR, INFO, WARNING
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from flwr.app import Context
from flwr.common.logger import FLOWER_LOGGER, log
from flwr.serverapp import Grid, ServerApp

from app import registry
from fedgraphcore.config import ConfigError, RunConfig, SharedConfig
from fedgraphcore.data import memory
from fedgraphcore.data.datasets import DataProfile, dataset_label
from fedgraphcore.data.params import data_root, dataset_kwargs
from fedgraphcore.data.evaluation import load_evaluation
from fedgraphcore.data.parties import PARTIES
from fedgraphcore.data.shards import server_data
from fedgraphcore.data.types import GraphCollection
from app.engine import EngineStopped, EngineWatch
from fedgraphcore.errors import FedGraphError
from fedgraphcore.journal import Journal
from fedgraphcore.metrics import agreement, evaluate
from fedgraphcore.quality import assess
from fedgraphcore.result import check_out_dir, default_out_dir, summary_table, write_result
from fedgraphcore.session import ServerSession
from fedgraphcore.wire import LABELS, ReplySpec, ValueSpec
from fedgraphcore.transport import pack


def evaluation_data(config: RunConfig):
    """What the server scores against: the ``eval-file`` in a deployment,
    else the pooled dataset (simulation), used for evaluation and the
    centralised reference only, never sent to a client."""
    shared = SharedConfig.of(config)
    if shared.eval_file:
        return load_evaluation(shared.eval_file, dataset_label(shared.dataset))
    return server_data(
        dataset=shared.dataset,
        seed=shared.seed,
        data_root=data_root(config),
        dataset_kwargs=dataset_kwargs(config.as_dict()),
    )


def _score(labels: np.ndarray, data) -> dict:
    """Metrics of ``labels`` against the data's labels and graph. Items labelled -1 (no client
    returned a label for them) are left out, and ``coverage`` says which share was scored."""
    graphs = isinstance(data, GraphCollection)
    known = labels >= 0
    if known.all():
        return evaluate(labels, y_true=data.y) if graphs else evaluate(labels, y_true=data.y, adj=data.adj)
    idx = np.flatnonzero(known)
    y = None if data.y is None else data.y[idx]
    scores = evaluate(labels[idx], y_true=y) if graphs else evaluate(labels[idx], y_true=y, adj=data.adj[idx][:, idx])
    scores["coverage"] = float(known.mean())
    return scores


def _side_by_side(protocol_s: float, rounds: list[dict]) -> dict:
    """``parallel_s``: the protocol time with the clients on their own machines, from a
    grid that ran them one after another (the in-process grid): in every round only the
    slowest client's seconds count instead of all of them. Network latency is not added."""
    if not rounds or any("client_sum_s" not in r for r in rounds):
        return {}
    return {"parallel_s": protocol_s - sum(r["client_sum_s"] - r["client_max_s"] for r in rounds)}


def _reference(strategy, data, labels: np.ndarray, score) -> tuple[dict, np.ndarray | None]:
    """The ``reference`` section: the centralised method (``method``) on the pooled data, its
    metrics (``score``) and its ``agreement`` with ``labels``; ``skipped`` with the reason when
    it is not computed (``reference=false``, an eval-file without the pooled data). Also its
    labels (None where it did not run)."""
    reference: dict = {"method": strategy.reference_method()}
    if not strategy.shared.reference:
        return {**reference, "skipped": "reference=false"}, None
    if data.meta.get("evaluation") == "labels-only":
        return {**reference, "skipped": "the eval-file holds labels only (no pooled data to run it on); "
                                        "python -m app.data.prepare --eval-contents full writes the pooled data"}, None
    started = time.perf_counter()
    ref_labels = strategy.reference(data)
    if ref_labels is None:
        return {**reference, "skipped": f"strategy '{strategy.name}' has no centralised counterpart"}, None
    ref_labels = np.asarray(ref_labels, dtype=np.int64)
    known = labels >= 0
    return {**reference, **score(ref_labels), "time_s": time.perf_counter() - started,
            "agreement": agreement(ref_labels[known], labels[known])}, ref_labels


def deliver_labels(session: ServerSession, labels: np.ndarray) -> None:
    """``labels`` step of a run on the parties' own data: each party gets the labels of its own
    items only (its slice of the positions, in its row order), where the method has not sent
    them already. A party that fails to take them is recorded and dropped; the others keep theirs."""
    if any(r["action"] == LABELS for r in session.stats.rounds):
        return
    contents = {node: pack({"labels": labels[session.offsets[node]: session.offsets[node] + session.items[node]]})
                for node in session.node_ids}
    session.exchange(LABELS, contents, ReplySpec(numbers={"received": ValueSpec(whole=True, low=0)}),
                     require_all=False)


def parties_outcome(strategy, labels: np.ndarray, metrics: dict) -> tuple[np.ndarray, dict, dict, None]:
    """Labels, metrics and reference of a run on the parties' own data, which the server cannot
    score: the strategy's own metrics and the cluster sizes."""
    known = labels[labels >= 0]
    sizes = np.bincount(known) if known.size else np.zeros(0, dtype=np.int64)
    scores = {**metrics, "cluster_sizes": [int(v) for v in sizes], "items": int(labels.size),
              "coverage": float(known.size / labels.size) if labels.size else 0.0}
    return labels, scores, {"method": strategy.reference_method(),
                            "skipped": f"dataset '{PARTIES}': the server holds no pooled data and no ground truth"}, None


def evaluate_output(strategy, output, data, num_items: int) -> tuple[np.ndarray, dict, dict, np.ndarray | None]:
    """The labels of ``output`` laid out over the data's items, their metrics against the data's
    labels and graph (or the strategy's ``truth``), the centralised reference beside them and its
    labels (None where it did not run)."""
    if output.truth is not None:
        labels = np.asarray(output.labels, dtype=np.int64)
        score = lambda predicted: evaluate(predicted, y_true=output.truth)  # noqa: E731
    else:
        labels = output.dense_labels(num_items)
        score = lambda predicted: _score(predicted, data)  # noqa: E731
    metrics = {**score(labels), **output.metrics}
    reference, ref_labels = _reference(strategy, data, labels, score)
    if "agreement" in reference:
        metrics["cluster_similarity"] = reference["agreement"]["cluster_similarity"]
    return labels, metrics, reference, ref_labels


def run_server(grid: Grid, raw_config: Mapping[str, Any], write: bool = True, announce: bool = True) -> dict:
    """Run one experiment over ``grid``; return the result dict (also written; with ``write=False``
    not, and holding the labels, ``labels``: :func:`app.run.run_experiment`). The summary is
    logged, with the paths written where ``announce`` (``python -m app.run`` prints them itself)."""
    started = time.perf_counter()
    config = registry.validate(raw_config)
    data = _checked_data(config)
    values = with_cluster_count(config, data)
    out_dir = SharedConfig.of(config).out_dir
    if out_dir:
        check_out_dir(Path(out_dir))
    journal = Journal.open(config)  # a resume refused before anything is sent
    session = ServerSession(grid, config)
    strategy_cls = registry.get(SharedConfig.of(config).strategy).strategy
    values["num-clients"] = len(session.connect(lambda clients: strategy_cls.hello_ask(RunConfig(values), clients)))
    config = session.config = RunConfig(values)
    if journal:
        journal.begin(session)
    shared = SharedConfig.of(config)
    warnings = strategy_cls.check_shards(session.clients)
    for text in warnings:
        log(WARNING, "warning: %s", text)
    strategy = strategy_cls(config)
    setup_rounds = len(session.stats.rounds)
    output, party_labels, protocol_s = _run_protocol(strategy, session)
    labels, metrics, reference, ref_labels = (parties_outcome(strategy, party_labels, output.metrics) if data is None
                                              else evaluate_output(strategy, output, data, _num_items(data)))
    result = {
        "strategy": shared.strategy,
        "dataset": shared.dataset,
        "dataset_name": memory.described(shared.dataset),
        "num_clients": shared.num_clients,
        "config": {key: config[key] for key in registry.keys_read(config)},
        "metrics": metrics,
        "reference": reference,
        "quality": assess(shared.strategy, shared.dataset, config.as_dict(), metrics, reference,
                          int(np.unique(labels[labels >= 0]).size), warnings),
        "timing": _timing(started, protocol_s, session.stats.rounds, setup_rounds),
        "communication": {**session.stats.as_dict(), "rejected": session.rejects,
                          "dropped": [{"node": n, **d} for n, d in session.dropped.items()],
                          "rejoined": session.rejoined},
        "privacy": session.ledger.to_dict(),
        "history": output.history,
        "notes": [] if data is None else data.meta.get("notes", []),  # a party's notes stay with it
        **({"resumed": journal.summary()} if journal and journal.resumed else {}),
    }
    if not write:  # the labels stay in memory (app.api.cluster without out_dir)
        log(INFO, "%s", summary_table(result))
        return {**result, "labels": labels, "reference_labels": ref_labels}
    result = _write(result, shared, (labels, ref_labels), output, data, announce)
    if journal:
        journal.finish()
    return result


def _checked_data(config: RunConfig):
    """The data the server scores against (:func:`evaluation_data`), None on the parties' own data;
    the pooled dataset is checked against the strategy (a dataset given by path only here)."""
    shared = SharedConfig.of(config)
    if shared.dataset == PARTIES:
        return None
    data = evaluation_data(config)
    if not shared.eval_file:
        registry.get(shared.strategy).strategy.check_data(config, DataProfile.of(data))
    return data


def _num_items(data) -> int:
    """The graphs of a collection, else the nodes of the graph."""
    return len(data.y) if isinstance(data, GraphCollection) else data.num_nodes


def with_cluster_count(config: RunConfig, data) -> dict:
    """The run-config's values, ``num-clusters = 0`` replaced by the number of classes in ``data``
    (a one-line ConfigError for data without labels)."""
    values = config.as_dict()
    if values["num-clusters"] == 0:
        values["num-clusters"] = int(np.unique(data.y[data.y >= 0]).size) if data.y is not None else 0
        if values["num-clusters"] < 1:
            raise ConfigError(f"dataset {memory.shown(config['dataset'])} has no labels; valid: num-clusters >= 1 "
                              "(the number of clusters to find)")
    return values


def _run_protocol(strategy, session: ServerSession):
    """The strategy's protocol over ``session``: its output, on the parties' own data the labels of
    the server's positions (delivered to the parties, :func:`deliver_labels`; else None), and the
    protocol's seconds."""
    protocol_start = time.perf_counter()
    labels = None
    try:
        output = strategy.run(session)
        if session.parties:
            labels = output.dense_labels(session.num_positions())
            deliver_labels(session, labels)
    finally:
        session.progress.close()
    return output, labels, time.perf_counter() - protocol_start


def _timing(started: float, protocol_s: float, rounds: list[dict], setup_rounds: int) -> dict:
    """The ``timing`` section: the whole run since ``started``, the protocol and its rounds (those
    after the first ``setup_rounds``, the handshake's)."""
    protocol_rounds = rounds[setup_rounds:]
    return {
        "total_s": time.perf_counter() - started,
        "protocol_s": protocol_s,
        **_side_by_side(protocol_s, protocol_rounds),
        "handshake_s": rounds[0]["seconds"],
        "rounds": len(protocol_rounds),
        "per_round_s": [r["seconds"] for r in protocol_rounds],
        "per_round": protocol_rounds,
    }


def _write(result: dict, shared: SharedConfig, labels: tuple[np.ndarray, np.ndarray | None], output, data,
           announce: bool = True) -> dict:
    """Write ``result`` and ``labels`` (the federated ones and the centralised method's, or None) to
    the run's out-dir (default: a fresh one under results/) with the run's page, log the summary
    (and, ``announce``, the paths), and return ``result`` with its ``path`` and ``report``."""
    out_dir = shared.out_dir or default_out_dir(shared.strategy, dataset_label(shared.dataset))
    # labels.csv names the user's IDs where the labels are the data's own items, else (k-hop subgraphs) the items';
    # on the parties' own data the server knows positions only (each party writes its IDs' labels itself)
    if data is None:
        keys, column = None, "position"
    elif output.truth is None:
        keys, column = data.keys, "graph" if isinstance(data, GraphCollection) else "node"
    else:
        keys, column = None, "item"
    path = write_result(result, out_dir, labels[0], keys, column, reference=labels[1])
    result["path"] = str(path)
    result["report"] = write_run_report(path.parent, data, labels[0], output, shared) if shared.report else None
    written = f"\nresult: {path}" + (f"\nreport: {result['report']}" if result["report"] else "")
    log(INFO, "%s%s", summary_table(result), written if announce else "")  # its title line beside the level
    return result


def write_run_report(run: Path, data, labels: np.ndarray, output, shared: SharedConfig) -> str | None:
    """The run's page (:mod:`fedgraphcore.report`) beside its result, and what it draws of the data; its path.
    A page that cannot be written is a warning: the result is kept (``python -m app.report RUN``)."""
    from fedgraphcore.report import build_view, write_report
    from fedgraphcore.report.view import VIEW_FILE, dense_distances

    try:
        distances = None
        if output.distances is not None:
            distances = (output.distances if output.truth is not None
                         else dense_distances(output.distances, output.ids, labels.size))
        build_view(data, labels, output.truth, distances, shared.seed).save(run / VIEW_FILE)
        return str(write_report(run, registry.get(shared.strategy).strategy.summary))
    except Exception as err:  # the result is written: a page that fails must not lose it
        log(WARNING, "warning: the run's page was not written (%s: %s); the result is kept", type(err).__name__, err)
        return None


class _ReportedInOneLine(logging.Filter):
    """Drops Flower's report of ``error``, which the ServerApp has logged in one line: the record
    carrying it with its traceback ("ServerApp raised an exception", "Simulation raised an
    exception") and the exit-code notice after it. Flower still marks the run failed with the
    message as its reason (``flwr ls``)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__()
        self.error, self.seen = error, False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is self.error:
            self.seen = True
            return False
        return not (self.seen and record.getMessage().startswith("Exit Code: "))


def build_server_app(overrides: Mapping[str, Any] | None = None, errors: list | None = None,
                     watch: EngineWatch | None = None, announce: bool = True) -> ServerApp:
    """A ServerApp whose run-config is ``context.run_config`` updated by ``overrides``.

    ``errors``: a list that receives the exception that stopped the run (Flower's
    simulation engine only logs it), for the caller to report once the engine is done;
    a config error then ends the ServerApp quietly. Without it (``flwr run``) every
    error propagates, so that Flower marks the run as failed with its reason; a
    :class:`fedgraphcore.errors.FedGraphError` (its message says it all) is logged as the line
    ``python -m app.run`` prints, without Flower's traceback. ``watch`` (:func:`app.engine.simulate`): the grid it gives stops
    the run once the engine has failed, and it is told when the ServerApp ends. ``announce``: the
    summary logs the paths written (:func:`run_server`)."""
    overrides = dict(overrides or {})
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        try:
            run_server((watch or EngineWatch()).grid(grid), {**context.run_config, **overrides},
                       announce=announce)
        except Exception as err:
            if errors is None:
                if isinstance(err, FedGraphError):
                    log(ERROR, "error: %s", err)
                    FLOWER_LOGGER.addFilter(_ReportedInOneLine(err))
                raise
            errors.append(err)  # the caller reports it once the engine is done
            if not isinstance(err, (ConfigError, EngineStopped)):  # stopped: the caller knows why
                raise  # the engine stops the clients too
        finally:
            if watch is not None:
                watch.server_done.set()

    return app


app = build_server_app()
