"""A server probing a member's disk through the run-config: whatever lies at a path it names (a
file, a directory, nothing), the member answers the same. A member (a node whose node config
names its own data: ``shard`` or ``data``) never resolves a run-config path; a node that reads the
run's own data (simulation) answers a failed read of it in one line whatever the cause."""

from __future__ import annotations

import pytest
from flwr.app import Message

from app.client_app import build_client_app
from fedgraphcore.data import prepare
from app.inprocess import FIRST_CLIENT_NODE_ID, InProcessGrid
from app.registry import check_dataset_name
from fedgraphcore.transport import pack
from fedgraphcore.wire import HELLO

NODE = FIRST_CLIENT_NODE_ID


def what_the_server_reads(node_config: dict, run_config: dict) -> str:
    """The error text a member sends back for a hello under ``run_config`` (the server's own
    values, as a deployed ClientApp receives them: no local overrides)."""
    grid = InProcessGrid(build_client_app(), 1, [node_config], record=True)
    grid.contexts[NODE].run_config = dict(run_config)
    grid.push_messages([Message(pack(values={}), dst_node_id=NODE, message_type=f"query.{HELLO}")])
    [reply] = grid.pulled if grid.pulled else grid.pull_messages([m.metadata.message_id for m in grid.pushed])
    assert reply.has_error(), "the probe was answered as a step"
    return reply.error.reason


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> str:
    out = tmp_path_factory.mktemp("shards")
    prepare.run(["--dataset", "sbm", "--partitioner", "node-random", "--num-clients", "2", "--out", str(out),
                 "--set", "sbm.nodes=60"])
    return str(out / "client-0.npz")


def _states(target):
    """Put an existing file, an existing directory, then nothing at ``target``."""
    target.write_text("root:$6$secret:19000:0:99999:7:::\n")
    yield "a file"
    target.unlink()
    target.mkdir()
    (target / "id_rsa").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    yield "a directory"
    (target / "id_rsa").unlink()
    target.rmdir()
    yield "nothing"


@pytest.mark.parametrize("key", ["dataset", "data-root", "data.node-table"])
@pytest.mark.parametrize("member", ["shard", "data", "the run's data"])
def test_a_server_learns_nothing_of_what_lies_at_a_path_it_names(tmp_path, shard, member, key):
    """The server names one path in the run-config and asks again with a file, a directory and
    nothing there (the operator probing for ``/etc/shadow`` or ``~/.ssh``): every answer is the
    same text."""
    target = tmp_path / "probe" / "shadow"
    target.parent.mkdir()
    node_config = {"shard": {"shard": shard}, "data": {"data": str(tmp_path / "party"), "partition-id": 0},
                   "the run's data": {"partition-id": 0, "num-partitions": 2}}[member]
    run = {"strategy": "fedkmeans", "num-clients": 2, "dataset": str(target), "partitioner": "node-random"}
    if key != "dataset":
        run = {**run, "dataset": "cora" if key == "data-root" else str(tmp_path / "graph.csv"), key: str(target)}
    answers = {state: what_the_server_reads(node_config, run) for state in _states(target)}
    assert len(set(answers.values())) == 1, answers
    assert str(tmp_path) not in next(iter(answers.values())) or key == "dataset"


def test_a_member_checks_a_path_dataset_by_its_name_alone(tmp_path):
    """The member's check of the run's ``dataset`` reads no disk: a path passes by its spelling
    whether or not anything lies there; an empty value is refused naming the valid choices."""
    for path in (tmp_path / "x.csv", tmp_path, tmp_path / "missing" / "y"):
        check_dataset_name(str(path))
    check_dataset_name("cora")
    with pytest.raises(Exception, match="valid: a built-in dataset"):
        check_dataset_name("")
