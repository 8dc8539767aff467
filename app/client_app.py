"""The Flower ClientApp: one ``@app.query(action)`` handler per protocol step.

Each handler validates the run-config, finds this node's shard (a shard file
named by the node-config key ``shard`` in a deployment, or the partition
``partition-id`` of ``num-partitions`` built from the dataset in simulation,
cached per process; with ``dataset = 'parties'`` the party's own data named by
the node-config key ``data``, see :mod:`fedgraphcore.data.parties`) and hands the
message to the configured method's client class. Whatever the client must keep
between steps lives in ``context.state``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from app import registry
from fedgraphcore.config import ConfigError, RunConfig, SharedConfig
from fedgraphcore.data.datasets import dataset_label, is_builtin
from fedgraphcore.data.params import data_root, dataset_kwargs, partition_kwargs
from fedgraphcore.data.memory import is_memory
from fedgraphcore.data.parties import DATA_KEY, OUT_KEY, PARTIES, PARTITION_KEY, party_node_shard
from fedgraphcore.party_outputs import taken
from fedgraphcore.data.shards import client_shard, load_shard_file
from fedgraphcore.data.types import Shard
from fedgraphcore.disclosure import disclosing, log_failure, party_failure
from app.engine import speed_up_runtime_in_simulation
from fedgraphcore.privacy.policy import PrivacyRefusal
from fedgraphcore.files import unwritable
from fedgraphcore.transport import refusal, unpack
from fedgraphcore.wire import HELLO, LABELS

PARTY_STATE = "party"
#: with this environment variable set to 1 (``deploy.flower_shim.TIMING_SETTING``), every
#: message leaves a line on stderr saying when its process started and ran the handler
#: (wall-clock seconds; ``benchmarks/deployment.py`` reads them from the SuperNode log)
TIMING_SETTING = "FEDGRAPH_TIMING"


def check_party_data(config: RunConfig, node_config: Mapping[str, Any]) -> list[str]:
    """A party's own data (node config ``data``) has what the strategy uses (one graph or a
    collection, edges, features, no edge weights where the method counts every edge as 1):
    a one-line ConfigError naming the data otherwise (its public part without the data's path).
    Returns the reader's notes."""
    from fedgraphcore.data.datasets import DataProfile
    from fedgraphcore.data.memory import shown
    from fedgraphcore.data.parties import load_piece, read_options, reads_boundary

    spec = str(node_config.get(DATA_KEY) or "")
    piece = load_piece(spec, read_options(node_config), reads_boundary(config.as_dict()))
    dataset = "in-memory piece" if spec.startswith("memory:") else spec
    named = RunConfig({**config.as_dict(), "dataset": dataset})

    def public(err: ConfigError) -> str:  # the server hears what the data lacks, not its path
        return "data check failed: " + str(err).replace(f"dataset {shown(dataset)}", "the party's data")

    with disclosing(public):
        registry.get(SharedConfig.of(config).strategy).strategy.check_data(named, DataProfile.of(piece))
    return list(piece.meta.get("notes", []))


def join_parties(config: RunConfig, context: Context, hello: RecordDict) -> None:
    """The ``hello`` of a party (``dataset = 'parties'``): keep its partition id in ``context.state``
    for the rest of the run, its node config's ``partition-id`` or else the one the server
    assigned (by Flower node id), check its data fits the strategy and its out-dir can take
    this run's labels.csv (``<out-dir>/run-<run id>/``) now, not at the end of the run."""
    node_config, state = context.node_config, context.state
    _, values = unpack(hello)
    parts = int(values["num_partitions"])
    given = node_config.get(PARTITION_KEY)
    pid = values["partition_id"] if given is None else given
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < parts:
        raise ConfigError(f"node config {PARTITION_KEY}={pid!r}; valid: a whole number 0..{parts - 1} for the {parts} "
                          "parties of this run", public=f"node config '{PARTITION_KEY}', rule 'a whole number "
                                                        f"0..{parts - 1}'")
    if node_config.get("num-partitions", parts) != parts:
        raise ConfigError(f"node config num-partitions={node_config['num-partitions']!r}, but the run has {parts} "
                          "parties", public=f"node config 'num-partitions', rule '{parts}, the run's parties'")
    if node_config.get(OUT_KEY):
        check_party_out_dir(str(node_config[OUT_KEY]), context.run_id)
    state[PARTY_STATE] = ConfigRecord({"partition_id": int(pid), "num_partitions": parts})
    node_shard(config, node_config, state)  # the data is read and split as the run will use it
    check_party_data(config, node_config)


def check_party_out_dir(out: str, run_id: int | None = None) -> None:
    """A party's out-dir can take the labels.csv of run ``run_id``: writable, and none there yet
    (``run_id`` None: writable)."""
    problem = unwritable(Path(out))
    if problem is not None:
        raise ConfigError(f"node config {OUT_KEY}: {problem}; valid: a writable directory for labels.csv",
                          public=f"node config '{OUT_KEY}', rule 'a writable directory'")
    existing = None if run_id is None else taken(out, run_id)
    if existing is not None:
        raise ConfigError(f"node config {OUT_KEY}: {str(existing)!r} exists; valid: one labels.csv per run",
                          public=f"node config '{OUT_KEY}', rule 'one labels.csv per run'")


def party_partition(state: RecordDict | None) -> tuple[int, int]:
    """(partition id, number of parties) of a party, kept by :func:`join_parties`."""
    if state is None or PARTY_STATE not in state.config_records:
        raise ConfigError(f"dataset={PARTIES!r}: a message before the hello handshake; valid: hello first",
                          public="a step before the hello handshake")
    record = state.config_records[PARTY_STATE]
    return int(record["partition_id"]), int(record["num_partitions"])


def node_shard(config: RunConfig, node_config: Mapping[str, Any], state: RecordDict | None = None) -> Shard:
    """This node's shard: its own file in a deployment, its own data (``dataset = 'parties'``;
    ``state`` holds its partition id), else its partition."""
    shared = SharedConfig.of(config)
    if shared.dataset == PARTIES:
        return party_node_shard(config.as_dict(), node_config, *party_partition(state))
    if node_config.get(DATA_KEY):
        raise ConfigError(f"node config '{DATA_KEY}' is read with dataset={PARTIES!r} only, but this run uses "
                          f"dataset={config['dataset']!r}",
                          public=f"node config '{DATA_KEY}', rule 'with dataset {PARTIES} only'")
    if node_config.get("shard"):
        # refuses a shard cut from another dataset or by another partitioner; the run's dataset by its
        # name alone: a run-config path is never looked at on a member's disk
        return load_shard_file(str(node_config["shard"]), dataset=dataset_label(shared.dataset, disk=False),
                               partitioner=shared.partitioner)
    return run_data_shard(config, node_config)


#: what the server hears when a node cannot read the data the run names by path, whatever the cause
RUN_PATH_UNREADABLE = "the run's dataset could not be read on this node (its log says why)"


def run_data_shard(config: RunConfig, node_config: Mapping[str, Any]) -> Shard:
    """The partition ``partition-id`` of the run's own dataset (a node that names no data of its own:
    simulation). Where the run names files (a dataset path, ``data-root``, ``data.node-table``),
    any failure to read them reaches the server as :data:`RUN_PATH_UNREADABLE`, the same whatever
    lies at those paths."""
    dataset, values = SharedConfig.of(config).dataset, config.as_dict()
    names_files = values["data-root"] or values["data.node-table"] or not (is_builtin(dataset) or is_memory(dataset))
    try:
        with disclosing(lambda err: f"split refused: {err}"):  # the run's dataset and split: the server's choice
            return _partition_of_run_data(config, node_config)
    except Exception as err:
        if not names_files:
            raise
        raise ConfigError(f"{type(err).__name__}: {err}", public=RUN_PATH_UNREADABLE) from err


def _partition_of_run_data(config: RunConfig, node_config: Mapping[str, Any]) -> Shard:
    shared = SharedConfig.of(config)
    values = config.as_dict()
    return client_shard(
        dataset=shared.dataset,
        partitioner=shared.partitioner,
        partition_id=int(node_config["partition-id"]),
        num_partitions=int(node_config["num-partitions"]),
        seed=shared.seed,
        data_root=data_root(config),
        dataset_kwargs=dataset_kwargs(values),
        partition_kwargs=partition_kwargs(shared.partitioner, values),
    )


def keep_member_record(context: Context, action: str, request: RecordDict, reply: RecordDict,
                       shared: SharedConfig) -> None:
    """A party with an out-dir keeps what each reply carried; when its labels come (the run's last
    step), it writes its own page beside its labels.csv (:mod:`fedgraphcore.report.member`)."""
    from fedgraphcore.data.parties import family
    from fedgraphcore.party_outputs import run_dir
    from fedgraphcore.report.member import record_sent, write_member_page

    record_sent(context, action, reply)
    if action == LABELS:
        item = "graph" if family(shared.partitioner) == "graphs" else "node"
        write_member_page(run_dir(context.node_config[OUT_KEY], context.run_id), context, shared.strategy,
                          unpack(request)[0]["labels"], item)


def process_started_at() -> float:
    """Wall-clock time this process started (Linux: its start in clock ticks since boot)."""
    with open("/proc/self/stat") as stat:
        ticks = int(stat.read().rpartition(")")[2].split()[19])  # field 22, starttime
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def log_timing(action: str, entered: float) -> None:
    """One line: when this process started, entered and left the handler of ``action``, and the
    CPU seconds it used so far."""
    print(f"fedgraph-timing clientapp {action} started={process_started_at():.3f} entered={entered:.6f} "
          f"left={time.time():.6f} cpu={time.process_time():.3f}", file=sys.stderr, flush=True)


def build_client_app(overrides: Mapping[str, Any] | None = None) -> ClientApp:
    """A ClientApp whose run-config is ``context.run_config`` updated by ``overrides``.

    ``flwr run`` passes the config through the context; ``app.run`` and the
    in-process grid pass it as ``overrides`` (``run_simulation`` gives the
    context an empty run-config).
    """
    overrides = dict(overrides or {})
    app = ClientApp()

    def make_handler(action: str) -> Callable[[Message, Context], Message]:
        def handler(message: Message, context: Context) -> Message:
            entered = time.time()
            where = f"node {context.node_id}, run {context.run_id}"
            try:
                reply = handle(message, context)
            except PrivacyRefusal as err:  # a decision: a reply naming the rule; the party's log has the detail
                log_failure(err, action, where)
                return Message(refusal(err.rule), reply_to=message)
            except Exception as err:  # the server hears its public part only; the party's log has it all
                raise party_failure(err, action, where) from None
            if os.environ.get(TIMING_SETTING) == "1":
                log_timing(action, entered)
            return reply

        def handle(message: Message, context: Context) -> Message:
            with disclosing(lambda err: f"run config refused: {err}"):  # the server's own values, by name only
                config = registry.validate({**context.run_config, **overrides}, disk=False)
            shared = SharedConfig.of(config)
            client_cls = registry.get(shared.strategy).client
            if action == HELLO and shared.dataset == PARTIES and PARTY_STATE not in context.state.config_records:
                join_parties(config, context, message.content)  # once: a second hello is the client's to refuse
            shard = node_shard(config, context.node_config, context.state)
            client = client_cls(shard, config, context)
            content = client.handle(action, message.content)
            if shared.dataset == PARTIES and context.node_config.get(OUT_KEY):
                keep_member_record(context, action, message.content, content, shared)
            return Message(content, reply_to=message)

        handler.__name__ = f"on_{action}"
        return handler

    steps = {action: train for entry in registry.STRATEGIES.values()
             for action, (_, train) in entry.client.steps().items()}
    for action, train in sorted(steps.items()):
        (app.train if train else app.query)(action)(make_handler(action))
    return app


app = build_client_app()
speed_up_runtime_in_simulation()  # flwr run's simulation process loads this module before its runtime starts
