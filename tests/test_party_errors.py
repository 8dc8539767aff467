"""What a party's failed step tells the server: which rule or file kind failed, never the party's
values, node IDs or paths (those go to the party's own log); a local user still reads them."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest

from app.client_app import build_client_app
from fedgraphcore.config import ConfigError
from fedgraphcore.data.check import main as check_main
from fedgraphcore.data.parties import PARTIES
from fedgraphcore.disclosure import LOGGER, PartyError, disclosed
from app.inprocess import InProcessGrid
from fedgraphcore.privacy.policy import PrivacyRefusal
from app.run import run_experiment
from app.server_app import run_server
from fedgraphcore.session import PrivacyRefused
from fedgraphcore.wire import ProtocolError
from clients.fedkmeans import FedKMeansClient

SECRET_DIR = "ward7-oncology-cohort"  # a directory name that says more than it should
SECRET_CELL = "TOPSECRET-4242"
SECRET_ID = "patient-31337"
RUN = {"strategy": "fedkmeans", "dataset": PARTIES, "num-clients": 2, "partitioner": "node-random",
       "num-clusters": 2, "num-rounds": 3}


def write_party(folder, first: int, *, cell=None, stranger=None) -> str:
    """A party's folder: nodes.csv (id, x0, x1) of 12 nodes in a ring and edges.csv; ``cell``
    replaces one feature value, ``stranger`` adds an edge to a node ID the table does not list."""
    folder.mkdir(parents=True)
    ids = [f"n{first + i}" for i in range(12)]
    rng = np.random.default_rng(first)
    nodes = pd.DataFrame({"id": ids, "x0": rng.normal(size=12), "x1": rng.normal(size=12)}).astype({"x0": object})
    if cell is not None:
        nodes.loc[5, "x0"] = cell
    nodes.to_csv(folder / "nodes.csv", index=False)
    edges = pd.DataFrame({"source": ids, "target": ids[1:] + ids[:1]})
    if stranger is not None:
        edges.loc[len(edges)] = [ids[3], stranger]
    edges.to_csv(folder / "edges.csv", index=False)
    return str(folder)


def server_sees(tmp_path, second: str, caplog, run: dict = RUN) -> tuple[str, list[str]]:
    """Run the federation with party 1 holding ``second``: the server's error and every error reply's text."""
    first = write_party(tmp_path / "p0", 0)
    configs = [{"data": first, "partition-id": 0}, {"data": second, "partition-id": 1}]
    grid = InProcessGrid(build_client_app(run), 2, configs, record=True)
    with caplog.at_level(logging.ERROR, logger=LOGGER.name), pytest.raises(ProtocolError) as err:
        run_server(grid, {**run, "out-dir": str(tmp_path / "server")})
    return str(err.value), [m.error.reason for m in grid.pulled if m.has_error()]


#: Cut edges dropped: every edge of a party's file joins two nodes of its node table.
WITHOUT_BOUNDARY = {**RUN, "partition.boundary": False}
#: A method that joins the parties' boundary edges: an edge may name another party's node.
LINKED = {**RUN, "strategy": "fedspectral-plus"}


@pytest.mark.parametrize("make, run, public, private", [
    (lambda d: write_party(d, 100, cell=SECRET_CELL), RUN, "data check failed: nodes.csv, rule 'numeric feature "
     "columns", [SECRET_CELL, "line 7, column 'x0'"]),
    (lambda d: write_party(d, 100, stranger=SECRET_ID), WITHOUT_BOUNDARY, "data check failed: edges.csv, rule 'node "
     "IDs of the node table'", [SECRET_ID, "line 14"]),
    (lambda d: write_party(d, 100, stranger=SECRET_ID), LINKED, "data check failed: the party's boundary edges, rule "
     "'boundary edges to nodes some party holds'", ["1 boundary edge(s) reach a node ID no party holds"]),
])
def test_a_bad_party_file_tells_the_server_the_file_kind_and_rule_only(tmp_path, caplog, make, run, public, private):
    second = make(tmp_path / SECRET_DIR / "party")
    error, replies = server_sees(tmp_path, second, caplog, run)
    assert replies and all(public in r for r in replies)
    assert f"node 1002{'' if run is LINKED else ':'}" in error and f"client error: PartyError: {public}" in error
    for text in [error, *replies]:
        assert SECRET_DIR not in text and str(tmp_path) not in text
        assert not any(value in text for value in private)
    party_log = caplog.text  # the party's own log holds what it kept from the server
    assert SECRET_DIR in party_log and all(value in party_log for value in private)


def test_the_local_user_reads_the_bad_value_and_the_path(tmp_path, capsys):
    second = write_party(tmp_path / SECRET_DIR / "party", 100, cell=SECRET_CELL)
    assert check_main([second, "--partitioner", "node-random"]) == 2
    line = capsys.readouterr().err.strip()
    assert len(line.splitlines()) == 1 and SECRET_CELL in line and SECRET_DIR in line and "valid: numeric" in line
    first = write_party(tmp_path / "p0", 0)
    with pytest.raises(ConfigError, match=rf"{SECRET_DIR}/party/nodes.csv: line 7, column 'x0': '{SECRET_CELL}' is "
                                          r"not a finite number; valid: numeric feature columns"):
        run_experiment("fedkmeans", PARTIES, 2, {k: v for k, v in RUN.items() if k not in ("strategy", "dataset",
                                                                                          "num-clients")},
                       tmp_path / "out", node_configs=[{"data": first}, {"data": second}])


def test_a_missing_data_path_and_a_strategy_misfit_name_no_path(tmp_path, caplog):
    missing = str(tmp_path / SECRET_DIR / "nowhere.csv")
    error, replies = server_sees(tmp_path, missing, caplog)
    assert "PartyError: node config 'data', rule 'an existing file or directory'" in error
    assert not any(SECRET_DIR in t for t in [error, *replies]) and SECRET_DIR in caplog.text
    caplog.clear()
    folder = tmp_path / "noedges" / SECRET_DIR
    folder.mkdir(parents=True)
    pd.DataFrame({"id": [f"n{i}" for i in range(12)]}).to_csv(folder / "nodes.csv", index=False)  # no features
    error, replies = server_sees(tmp_path / "b", str(folder), caplog)
    assert "PartyError: data check failed: the party's data has no node features; strategy 'fedkmeans' needs" in error
    assert not any(SECRET_DIR in t for t in [error, *replies]) and SECRET_DIR in caplog.text


def test_a_bug_on_the_party_crosses_as_its_type_and_step(tmp_path, caplog, monkeypatch):
    def leaky(self, arrays, values):
        raise ValueError(f"row {SECRET_ID} of {tmp_path / SECRET_DIR} broke")

    monkeypatch.setattr(FedKMeansClient, "on_kmeans_step", leaky)
    first, second = (write_party(tmp_path / f"p{i}", 100 * i) for i in range(2))
    grid = InProcessGrid(build_client_app(RUN), 2, [{"data": first}, {"data": second}], record=True)
    with caplog.at_level(logging.ERROR, logger=LOGGER.name), pytest.raises(ProtocolError) as err:
        run_server(grid, {**RUN, "out-dir": str(tmp_path / "server")})
    assert ("client error: PartyError: ValueError in step 'kmeans_step' (the party's log has the details)"
            in str(err.value))
    assert SECRET_ID not in str(err.value) and SECRET_DIR not in str(err.value)
    assert SECRET_ID in caplog.text and "Traceback" in caplog.text  # a bug keeps its traceback, on the party


def test_a_refusal_crosses_as_its_rule_and_the_server_still_stops_on_it():
    refusal = PrivacyRefusal("epsilon", f"would spend 3.1 (ledger /srv/{SECRET_DIR}/ledger.jsonl)")
    text = disclosed(refusal, "fedsc_round")
    assert text == f"{PrivacyRefusal.MARKER}, rule 'epsilon'"
    assert disclosed(KeyError(SECRET_ID), "hello") == "KeyError in step 'hello' (the party's log has the details)"
    assert str(PartyError(text)) == text


def test_a_policy_refusal_stops_the_run_naming_the_rule_not_the_detail(tmp_path, caplog):
    first, second = (write_party(tmp_path / f"p{i}", 100 * i) for i in range(2))
    configs = [{"data": first}, {"data": second, "privacy.all.min-group": 3}]
    run = {**RUN, "fedkmeans.secure": True}
    grid = InProcessGrid(build_client_app(run), 2, configs, record=True)
    with caplog.at_level(logging.ERROR, logger=LOGGER.name), pytest.raises(PrivacyRefused) as err:
        run_server(grid, {**run, "out-dir": str(tmp_path / "server")})
    assert list(err.value.refusals.values()) == [("min-group", "")]  # at hello: before partition ids
    assert str(err.value).endswith("rule 'min-group'")
    assert "a masking group of 2 client(s), below this node's min-group=3" in caplog.text
