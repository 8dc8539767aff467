"""A party's outputs are kept apart by run (``<out-dir>/run-<run id>/labels.csv``): no later run,
whoever started it, replaces them, and no run id reaches outside the out-dir."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from fedgraphcore.data.parties import PARTIES
from fedgraphcore.party_outputs import run_dir, write_party_labels
from fedgraphcore.data import load_dataset
from fedgraphcore.data.partition import partition
from app.inprocess import InProcessGrid
from fedgraphcore.result import LABELS_CSV
from app.server_app import run_server
from fedgraphcore.wire import LABELS, ProtocolError
from tests.test_parties import forget_registered_pieces, pieces_of, register  # noqa: F401 (autouse fixture)

RUN = {"strategy": "fedkmeans", "dataset": PARTIES, "num-clients": 2, "partitioner": "node-random",
       "num-clusters": 3, "num-rounds": 3}
HOSTILE_RUN_IDS = ["../../escaped", "/tmp/escaped", "1/../../escaped", -1, True, 2.5, "7"]


@pytest.fixture
def pieces():
    return pieces_of(partition(load_dataset("sbm", nodes=60, features=4, seed=0), "node-random", 2))


def files_under(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.shipped_defaults
def test_two_runs_keep_both_label_files_and_the_first_unchanged(pieces, tmp_path):
    configs = register(pieces, tmp_path / "parties")
    first = InProcessGrid(build_client_app(RUN), 2, configs)
    run_server(first, {**RUN, "out-dir": str(tmp_path / "a")})
    party = tmp_path / "parties" / "party-0"
    mine = run_dir(party, first.run_id) / LABELS_CSV
    kept, stamp = mine.read_bytes(), os.stat(mine).st_mtime_ns
    stranger = InProcessGrid(build_client_app({**RUN, "num-clusters": 2}), 2, configs)
    assert stranger.run_id != first.run_id
    run_server(stranger, {**RUN, "num-clusters": 2, "out-dir": str(tmp_path / "b")})
    theirs = run_dir(party, stranger.run_id) / LABELS_CSV
    assert sorted(p.name for p in party.iterdir()) == sorted([f"run-{first.run_id}", f"run-{stranger.run_id}"])
    assert mine.read_bytes() == kept and os.stat(mine).st_mtime_ns == stamp
    assert pd.read_csv(theirs)["cluster"].max() == 1 and pd.read_csv(mine)["cluster"].max() == 2
    assert sorted(p.name for p in mine.parent.iterdir()) == [LABELS_CSV, "report.html"]  # its page; no temporary file


@pytest.mark.parametrize("run_id", HOSTILE_RUN_IDS)
def test_a_hostile_run_id_cannot_write_outside_the_out_dir(tmp_path, run_id):
    out = tmp_path / "deep" / "out"
    with pytest.raises(ConfigError, match=r"^run id .*; valid: Flower's run id, a whole number >= 0$"):
        write_party_labels(out, run_id, np.array(["a", "b"]), np.array([0, 1]))
    assert files_under(tmp_path) == {}


class HostileRunIdGrid(InProcessGrid):
    """Hands every client context the run id ``hostile`` from the step ``at`` on."""

    def __init__(self, *args, hostile, at: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.hostile, self.at = hostile, at

    def push_messages(self, messages):
        messages = list(messages)
        if any(m.metadata.message_type == f"query.{self.at}" for m in messages):
            for context in self.contexts.values():
                context.run_id = self.hostile
        return super().push_messages(messages)


@pytest.mark.parametrize("at", ["hello", LABELS])
@pytest.mark.parametrize("run_id", HOSTILE_RUN_IDS[:3])
def test_a_hostile_run_id_reaches_no_file_through_the_client_app(pieces, tmp_path, run_id, at):
    """The ClientApp under a run id with path characters, from the hello on or at the labels step:
    refused, and nothing written in the parties' out-dirs or beside them."""
    grid = HostileRunIdGrid(build_client_app(RUN), 2, register(pieces, tmp_path / "deep" / "parties"),
                            hostile=run_id, at=at)
    with pytest.raises(ProtocolError, match=rf"^step '{at}'.*nodes 1001, 1002 all: client error: PartyError: run "
                                            r"id, rule 'a whole number >= 0'\)?$"):
        run_server(grid, {**RUN, "out-dir": str(tmp_path / "server")})
    assert files_under(tmp_path / "deep") == {} and not (tmp_path / "escaped").exists()


def test_without_hard_links_the_labels_are_renamed_into_place_and_still_not_over_others(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    keys = np.array(["a", "b"])
    path = write_party_labels(tmp_path, 3, keys, np.array([0, 1]))
    assert path.read_text() == "node,cluster\na,0\nb,1\n" and [p.name for p in path.parent.iterdir()] == [LABELS_CSV]
    with pytest.raises(ConfigError, match="exists and holds other labels"):
        write_party_labels(tmp_path, 3, keys, np.array([1, 1]))
    assert path.read_text() == "node,cluster\na,0\nb,1\n" and [p.name for p in path.parent.iterdir()] == [LABELS_CSV]


def test_the_same_labels_again_are_kept_and_other_labels_are_refused(tmp_path):
    keys, labels = np.array([10, 11, 12]), np.array([0, 1, 1])
    path = write_party_labels(tmp_path, 42, keys, labels)
    before = path.read_bytes()
    assert write_party_labels(tmp_path, 42, keys, labels) == path  # a retried labels step
    with pytest.raises(ConfigError, match=r"run-42/labels.csv' exists and holds other labels; valid: one labels.csv "
                                          r"per run$"):
        write_party_labels(tmp_path, 42, keys, np.array([1, 0, 0]))
    assert path.read_bytes() == before and files_under(tmp_path) == {f"run-42/{LABELS_CSV}": before}


def test_a_run_whose_labels_exist_is_refused_at_hello(pieces, tmp_path):
    configs = register(pieces, tmp_path / "parties")
    grid = InProcessGrid(build_client_app(RUN), 2, configs)
    planted = run_dir(tmp_path / "parties" / "party-1", grid.run_id) / LABELS_CSV
    planted.parent.mkdir(parents=True)
    planted.write_text("node,cluster\n")
    with pytest.raises(ProtocolError, match=r"node 1002: client error: PartyError: node config 'out-dir', rule 'one "
                                            r"labels.csv per run'$"):
        run_server(grid, {**RUN, "out-dir": str(tmp_path / "server")})
    assert planted.read_text() == "node,cluster\n"
