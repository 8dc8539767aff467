"""The Flower ClientApp: one ``@app.query(action)`` handler per protocol step.

Each handler validates the run-config, finds this node's shard (a shard file
named by the node-config key ``shard`` in a deployment, or the partition
``partition-id`` of ``num-partitions`` built from the dataset in simulation,
cached per process) and hands the message to the configured method's client
class. Whatever the client must keep between steps lives in ``context.state``.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from app import registry
from app.config import RunConfig
from app.data.datasets import dataset_label
from app.data.params import dataset_kwargs, partition_kwargs
from app.data.shards import client_shard, load_shard_file
from app.data.types import Shard
from clients.base import ClusteringClient


def node_shard(config: RunConfig, node_config: Mapping[str, Any]) -> Shard:
    """This node's shard: its own file in a deployment, else its partition."""
    if node_config.get("shard"):
        # refuses a shard cut from another dataset or by another partitioner
        return load_shard_file(str(node_config["shard"]), dataset=dataset_label(str(config["dataset"])),
                               partitioner=str(config["partitioner"]))
    values = config.as_dict()
    partitioner = str(config["partitioner"])
    return client_shard(
        dataset=str(config["dataset"]),
        partitioner=partitioner,
        partition_id=int(node_config["partition-id"]),
        num_partitions=int(node_config["num-partitions"]),
        seed=int(config["seed"]),
        data_root=str(config["data-root"]) or None,
        dataset_kwargs=dataset_kwargs(values),
        partition_kwargs=partition_kwargs(partitioner, values),
    )


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
            config = registry.validate({**context.run_config, **overrides})
            client_cls = registry.get(str(config["strategy"])).client
            shard = node_shard(config, context.node_config)
            client = client_cls(shard, config, context)
            return Message(client.handle(action, message.content), reply_to=message)

        handler.__name__ = f"on_{action}"
        return handler

    queries = set(ClusteringClient.common_actions)
    trains = set()
    for entry in registry.STRATEGIES.values():
        queries.update(entry.client.actions)
        trains.update(entry.client.train_actions)
    for action in sorted(queries):
        app.query(action)(make_handler(action))
    for action in sorted(trains):
        app.train(action)(make_handler(action))
    return app


app = build_client_app()
