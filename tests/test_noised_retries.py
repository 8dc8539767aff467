"""A noised reply is one release: re-sent after a timeout, the request gets the first draw back.

The late reply still reaches the SuperLink, i.e. the server. A second, fresh draw for the
re-sent request would hand the server two noisings of the same update to average, while
the accountant counts one release.
"""

from __future__ import annotations

import numpy as np
import pytest

from app.client_app import build_client_app
from app.inprocess import FIRST_CLIENT_NODE_ID
from app.server_app import run_server
from fedgraphcore.transport import unpack
from conftest import LateReplyGrid, shared_datasets_or_skip

DMON = {"strategy": "fedavg-dmon", "dataset": "karate", "num-clusters": 2, "partitioner": "node-random",
        "num-rounds": 2, "fedavg-dmon.local-epochs": 1, "fedavg-dmon.hidden": 4, "fedavg-dmon.select": "last",
        "fedavg-dmon.dp-clip": 1.0, "fedavg-dmon.dp-noise": 1.0,
        "partition.boundary": False}  # client-level DP covers the paper's split, without cut edges
FEDSC_DP = {"strategy": "fedsc", "dataset": "iris", "num-clusters": 3, "num-rounds": 2, "fedsc.sigma": 1.0,
            "fedsc.landmarks": 8, "fedsc.dp-epsilon": 5.0}
FEDSC_RATIOS = {"strategy": "fedsc", "dataset": "iris", "num-clusters": 3, "num-rounds": 2, "fedsc.noise-z": 0.3,
                "fedsc.noise-c": 0.3}
GW_DP = {"strategy": "gw-ldp", "dataset": "mutag", "gw-ldp.model": "gcn", "num-rounds": 2, "gw-ldp.epsilon": "inf",
         "gw-ldp.svc": False, "gw-ldp.dp": "client", "gw-ldp.dp-clip": 1.0, "gw-ldp.dp-noise": 0.5}


@pytest.mark.parametrize("raw, category, action, accounted", [
    (DMON, "train", "dmon_train", ("dp-fedavg", "steps", 2)),
    (FEDSC_DP, "query", "fedsc_round", ("fedsc:gaussian-z", "steps", 2)),
    (FEDSC_RATIOS, "query", "fedsc_round", None),
    (FEDSC_RATIOS, "query", "fedsc_final", None),
    (GW_DP, "train", "fit", ("dp-fedavg:weights", "steps", 2)),
], ids=["fedavg-dmon-dp", "fedsc-dp-z", "fedsc-noise-z", "fedsc-noise-c", "gw-ldp-client-dp"])
@pytest.mark.integration
def test_a_noised_reply_re_sent_after_a_timeout_is_the_first_draw(out_dir, raw, category, action, accounted):
    if raw["strategy"] == "gw-ldp":
        shared_datasets_or_skip()
    raw = {**raw, "num-clients": 2, "retries": 1, "timeout": 0.5, "reference": False, "out-dir": str(out_dir)}
    node = FIRST_CLIENT_NODE_ID + 1
    grid = LateReplyGrid(build_client_app(raw), 2, record=True, node=node, action=action, category=category)
    result = run_server(grid, raw)
    message_type = f"{category}.{action}"
    asked = [m.metadata.dst_node_id for m in grid.pushed if m.metadata.message_type == message_type]
    assert len(grid.late) == 1 and asked.count(node) == asked.count(node - 1) + 1  # asked once more
    late = unpack(grid.late[0].content)[0]
    answered = next(unpack(r.content)[0] for r in grid.pulled
                    if r.metadata.message_type == message_type and r.metadata.src_node_id == node)
    assert late.keys() == answered.keys() and all(np.array_equal(late[k], answered[k]) for k in late)
    if accounted:
        name, key, releases = accounted
        mech = {m["name"]: m for m in result["privacy"]["mechanisms"]}[name]
        assert mech["params"][key] == releases
