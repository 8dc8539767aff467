"""A deployed federation whose SuperNodes each hold only their own files gives exactly the
labels of the pre-split pieces run through ``cluster()`` in-process.

Each deployed run takes about a minute: one split family runs in the default suite, the
others are marked ``slow`` (deselected by default; ``pytest -m slow`` runs them)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from app import cluster
from fedgraphcore.data.formats import read_graph
from fedgraphcore.data.prepare import run as prepare
from deploy.__main__ import run_local_parties
from tests.conftest import RUN_GUARD_S, run_labels, shared_datasets_or_skip

pytestmark = pytest.mark.deployment

SBM = ["--dataset", "sbm", "--set", "sbm.nodes=150", "--set", "sbm.features=6"]
FAMILIES = {
    "node": ("fedkmeans", "node-random", SBM, {"num-clusters": "4", "num-rounds": "5",
                                               "fedkmeans.filter-order": "0"}),  # the parties' files, not the filter
    "node-boundary": ("fedspectral-plus", "node-random", SBM, {"num-clusters": "4"}),
    "vertical": ("kcagc", "vertical", SBM, {"num-clusters": "4", "kcagc.iterations": "2", "kcagc.restarts": "1",
                                            "kcagc.local-restarts": "1", "kcagc.filter-order": "2"}),
    "edge": ("fedspectral-plus", "edge", SBM, {"num-clusters": "4", "fedspectral-plus.mode": "paper",
                                               "fedspectral-plus.rounds": "3", "fedspectral-plus.iters": "2"}),
    "graphs": ("gw-ldp", "graph-dirichlet", ["--dataset", "mutag", "--set", "partition.alpha=100"],
               {"num-clusters": "2", "num-rounds": "2", "gw-ldp.model": "gcn", "gw-ldp.workers": "1",
                "gw-ldp.epsilon": "inf"}),
}


def deployed_equals_presplit(family: str, tmp_path) -> None:
    strategy, partitioner, data, sets = FAMILIES[family]
    if "mutag" in data:
        data = [*data, "--data-root", str(shared_datasets_or_skip())]
    parties = tmp_path / "parties"
    prepare([*data, "--partitioner", partitioner, "--num-clients", "3", "--out", str(parties), "--format", "files"])
    pieces = [read_graph(parties / f"party-{i}", boundary=True) for i in range(3)]
    local = cluster(strategy, pieces, config={"partitioner": partitioner, **sets}, out_dir=tmp_path / "inprocess")
    path = run_local_parties(parties, strategy, partitioner, [f"{k}={v}" for k, v in sets.items()],
                             tmp_path / "deployed", timeout=RUN_GUARD_S)
    deployed = json.loads(path.read_text())
    assert np.array_equal(np.load(path.parent / "labels.npy"), local.labels)
    assert deployed["dataset"] == "parties" and deployed["timing"]["rounds"] == local.timing["rounds"]
    frame = local.labels_frame()
    for i in range(3):
        written = pd.read_csv(run_labels(tmp_path / "deployed" / f"party-{i}"))
        assert written.equals(pd.read_csv(run_labels(tmp_path / "inprocess" / f"party-{i}")))
        if local.parties is not None:
            own = frame[frame["party"] == i]
            assert written[local.item].tolist() == own[local.item].tolist()
            assert written["cluster"].tolist() == own["cluster"].tolist()
        else:  # every party holds every node and gets every label
            assert written["cluster"].tolist() == local.labels.tolist()


def test_deployed_parties_with_their_own_files_equal_the_presplit_run(tmp_path):
    deployed_equals_presplit("node", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["node-boundary", "vertical", "edge", "graphs"])
def test_deployed_parties_equal_the_presplit_run_in_every_split_family(family, tmp_path):
    deployed_equals_presplit(family, tmp_path)
