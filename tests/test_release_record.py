"""A member's release record and the protocol's order and count (fedgraphcore/privacy/releases.py, clients/steps.py).

The record keeps every reply per member and dataset over runs and restarts (JSON lines, arrays in
``.npz`` read without pickle); the guard answers hello once, each step at most as often as the
run's protocol needs it, a request sent again with its first reply; the policy's ``label-releases``
caps a dataset's label replies over runs. Every reply of every strategy says what a server learns
from it, in the code and on the privacy page.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import RecordDict

from fedgraphcore.config import ConfigError
from fedgraphcore.privacy.releases import ReleaseRecord, dataset_key, record_dir, server_learns
from fedgraphcore.protocols import fedkmeans
from app.registry import STRATEGIES
from rogue_server import Member, shard_files

ROOT = Path(__file__).resolve().parents[1]
DATA = {"sbm.nodes": 60, "sbm.features": 4, "sbm.blocks": 3, "sbm.p-in": 0.3, "sbm.p-out": 0.02}
RUN = {"dataset": "sbm", "partitioner": "node-random", "num-clients": 3, "seed": 0, "reference": False,
       "strategy": "fedkmeans", "num-clusters": 2, "num-rounds": 3, "fedkmeans.restarts": 2, **DATA}


@pytest.fixture(scope="module")
def shard(tmp_path_factory) -> Path:
    return shard_files(tmp_path_factory.mktemp("shards"), 3, **DATA)[0]


@pytest.fixture
def member(shard, tmp_path):
    copy = tmp_path / shard.name
    copy.write_bytes(shard.read_bytes())
    return lambda node_config=None, **raw: Member({**RUN, **raw}, {"shard": str(copy), **(node_config or {})})


def step(centres: np.ndarray, starts=(0,)) -> dict[str, np.ndarray]:
    """A ``kmeans_step`` request advancing ``starts`` (one start: ``centres`` k x f)."""
    return {"starts": np.asarray(starts, dtype=np.int64), "centres": centres.reshape(len(starts), *centres.shape[-2:])}


def test_the_record_keeps_lines_per_dataset_and_arrays_without_pickle(tmp_path):
    key = dataset_key("sbm", np.arange(5), (5, 0))
    assert key != dataset_key("sbm", np.arange(1, 6), (5, 0)) and key == dataset_key("sbm", np.arange(5), (5, 0))
    record = ReleaseRecord(record_dir(tmp_path / "l.jsonl"), RecordDict(), key)
    other = ReleaseRecord(record.directory, RecordDict(), "other")
    with record.locked():
        record.append(7, "fedkmeans", "kmeans_assign", "ab", labels=3)
    other.append(8, "fedkmeans", "hello", "cd")
    assert [(r["run"], r["labels"]) for r in record.records()] == [(7, 3)] and len(other.records()) == 1
    record.save_arrays("audit", basis=np.eye(3))
    np.testing.assert_array_equal(record.load_arrays("audit")["basis"], np.eye(3))
    assert other.load_arrays("audit") is None
    (record.directory / "records.jsonl").write_text('{"run": 1}\n')
    with pytest.raises(ConfigError, match=r"l.jsonl.releases/records.jsonl, line 1: not a release record"):
        record.records()
    in_context = ReleaseRecord(None, RecordDict(), key)
    in_context.append(1, "fedkmeans", "kmeans_assign", "ab", labels=2)
    in_context.save_arrays("audit", basis=np.ones(2))
    assert len(in_context.records()) == 1 and in_context.load_arrays("audit")["basis"].tolist() == [1.0, 1.0]


def test_a_request_sent_again_gets_its_first_reply_and_no_second_line(member):
    m = member()
    hello = m.send("hello", values={"k": 2, "seed": 0})
    centres = hello.arrays["centres"][:2]
    first, again = (m.send(fedkmeans.KMEANS_STEP, step(centres)) for _ in range(2))
    np.testing.assert_array_equal(first.arrays["stats"], again.arrays["stats"])
    assert m.send("hello", values={"k": 2, "seed": 0}).values == hello.values
    record = next(Path(m.node_config["shard"]).parent.glob("*.releases"))
    lines = (record / "records.jsonl").read_text().splitlines()
    assert [line.split('"action": "')[1].split('"')[0] for line in lines] == ["hello", "kmeans_step"]


def test_each_step_at_most_as_often_as_the_run_needs_and_a_restarted_node_continues(member):
    m = member()
    assert m.send(fedkmeans.KMEANS_STEP, step(np.zeros((2, 4)))).refused == "protocol-order"
    assert m.send("hello", values={"k": 2, "seed": 0}).answered
    assert m.send("hello", values={"k": 2, "seed": 1}).refused == "protocol-order"
    for i in range(3):
        assert m.send(fedkmeans.KMEANS_STEP, step(np.full((2, 4), float(i)))).answered
    assert m.send(fedkmeans.KMEANS_STEP, step(np.full((2, 4), 9.0))).refused == "protocol-count"
    m.restart()  # the same run, a fresh context: the record says what was answered
    assert m.send("hello", values={"k": 2, "seed": 1}).refused == "protocol-order"
    assert m.send("hello", values={"k": 2, "seed": 0}).answered
    assert m.send(fedkmeans.KMEANS_STEP, step(np.full((2, 4), 8.0))).refused == "protocol-count"


def test_the_final_centres_follow_from_the_last_step_and_a_total_holding_the_members_counts(member):
    m = member()
    m.send("hello", values={"k": 2, "seed": 0})
    centres = np.array([[-1.0, 0, 0, 0], [1.0, 0, 0, 0]])
    other = centres[::-1].copy()
    stats = m.send(fedkmeans.KMEANS_STEP, step(np.stack([centres, other]), starts=[0, 1])).arrays["stats"]
    assign = lambda c, total, start=0: m.send(fedkmeans.KMEANS_ASSIGN, {"centres": c, "stats": total}, {"start": start})
    assert assign(centres + 1, stats[0]).refused == "server-input"
    assert assign(centres, stats[0], start=1).refused == "server-input"  # another start's centres
    assert assign(other, stats[1], start=2).refused == "server-input"  # a start beyond fedkmeans.restarts
    short = stats[0].copy()
    short[8] -= 1  # fewer rows in cluster 0 than this member sent alone
    assert assign(centres, short).refused == "server-input"
    labels = assign(centres, stats[0]).arrays["labels"]
    sums, counts, _, _ = fedkmeans.split_statistics(stats[0], 2)
    expected = fedkmeans.assign(m.features(), fedkmeans.update_centres(centres, sums, counts))[0]
    np.testing.assert_array_equal(labels, expected)
    assert assign(other, stats[1], start=1).refused == "protocol-count"


def test_label_releases_caps_a_datasets_label_replies_over_runs(member):
    m = member({"privacy.all.label-releases": 1})
    for run in range(2):
        m.new_run()
        m.send("hello", values={"k": 2, "seed": 0})
        centres = np.array([[-1.0, 0, 0, 0], [1.0, 0, 0, 0]])
        stats = m.send(fedkmeans.KMEANS_STEP, step(centres)).arrays["stats"]
        reply = m.send(fedkmeans.KMEANS_ASSIGN, {"centres": centres, "stats": stats[0]}, {"start": 0})
        assert reply.answered if run == 0 else reply.refused == "label-releases"


def test_every_reply_of_every_strategy_says_what_a_server_learns_here_and_on_the_privacy_page():
    page = " ".join((ROOT / "docs" / "privacy.md").read_text().split())
    for name, entry in STRATEGIES.items():
        learns = server_learns(name)
        assert set(entry.client.steps()) <= set(learns), (name, set(entry.client.steps()) - set(learns))
        for step, text in learns.items():
            assert f"`{step}` | {text} |" in page, (name, step)


def test_a_runs_result_says_what_a_malicious_server_learns_from_each_of_its_steps(tmp_path):
    from app.client_app import build_client_app
    from app.inprocess import InProcessGrid
    from app.server_app import run_server

    raw = {**RUN, "dataset": "sbm", "partitioner": "node-random", "fedkmeans.filter-order": 4,
           "out-dir": str(tmp_path / "run")}
    result = run_server(InProcessGrid(build_client_app(raw), 3), raw)
    learns = result["privacy"]["malicious_server"]
    # the filter runs over the whole graph: the linking steps, its hops and the seeds after them
    assert set(learns) == {"hello", "boundary_shares", "boundary_tags", "boundary_links", "kmeans_filter",
                           "kmeans_init", "kmeans_step", "kmeans_assign"}
    assert learns["kmeans_assign"] == server_learns("fedkmeans")["kmeans_assign"]
    assert learns["kmeans_filter"] == server_learns("fedkmeans")["kmeans_filter"]
