"""A researcher's first day, repeated: the frictions a new user met, each tried again.

A 120-node graph of three communities with string IDs, three features and a label column, in a
folder, as the user made it (tests/test_input_corpus.py tries the bad and tricky inputs). Here:
the summary says what its verdict compares; ``cluster(quiet=True)`` prints nothing; errors name
the user's data; Ctrl-C is one line and the resume hint; PyG leaves nothing in the temporary
folder; ``deploy local`` takes a relative path; ``prepare`` keeps the user's column names and
labels; ``app.data.check`` asks for the split in one line; ``list`` gives every dataset's size.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from app import cluster, describe
from fedgraphcore.config import ConfigError
from app.run import main as run_main

pytestmark = pytest.mark.shipped_defaults  # these tests look at the runs' pages


@pytest.fixture(scope="module")
def mygraph(tmp_path_factory) -> Path:
    """The user's folder: ``edges.csv`` and ``nodes.csv`` (id, age, income, score, label)."""
    rng = np.random.default_rng(0)
    folder = tmp_path_factory.mktemp("user") / "mygraph"
    folder.mkdir()
    block = np.arange(120) % 3
    rows = [f"card_{i:03d},{20 + 20 * b + rng.normal(0, 3):.1f},{10 + 10 * b + rng.normal(0, 3):.1f},"
            f"{5 * b + rng.normal(0, 1):.2f},{'abc'[b]}" for i, b in enumerate(block)]
    (folder / "nodes.csv").write_text("id,age,income,score,label\n" + "\n".join(rows) + "\n")
    pairs = [(a, b) for a in range(120) for b in range(a + 1, 120)
             if rng.random() < (0.2 if block[a] == block[b] else 0.01)]
    (folder / "edges.csv").write_text("source,target\n" + "".join(f"card_{a:03d},card_{b:03d}\n" for a, b in pairs))
    return folder


def test_the_summary_says_what_the_verdict_compares_and_puts_quality_beside_it(mygraph, tmp_path, capsys, caplog):
    caplog.set_level("INFO")
    assert run_main(["--engine", "inprocess", "--strategy", "kcagc", "--dataset", str(mygraph), "--num-clients", "2",
                     "--out", str(tmp_path / "r")]) == 0
    out, err = capsys.readouterr()[0], caplog.text
    assert out == f"result: {tmp_path / 'r' / 'result.json'}\nreport: {tmp_path / 'r' / 'report.html'}\n"
    assert "result: " not in err  # the path once
    assert "quality against the ground truth   federated  centralised" in err
    assert "verdict (federated vs centralised clusters, not vs the ground truth): " in err
    labels = (tmp_path / "r" / "labels.csv").read_text().splitlines()
    assert labels[0] == "node,cluster,centralised" and labels[1].startswith("card_000,")


def test_cluster_quiet_shows_nothing(mygraph, capsys, caplog):
    caplog.set_level("INFO")
    result = cluster("fedkmeans", str(mygraph), 2, quiet=True, num_rounds=3)
    out, err = capsys.readouterr()
    assert out == err == "" and not [r for r in caplog.records if r.levelname == "INFO"]
    assert result.metrics["acc"] > 0.9
    cluster("fedkmeans", str(mygraph), 2, num_rounds=3)
    assert "quality against the ground truth" in caplog.text  # not quiet: the summary


def test_errors_name_the_users_data(mygraph):
    from fedgraphcore.data.formats import read_graph

    with pytest.raises(ConfigError, match=rf"exceeds the 120 nodes of dataset '{mygraph}'"):
        cluster("fedkmeans", str(mygraph), 2, quiet=True, num_clusters=500)
    with pytest.raises(ConfigError, match="exceeds the 120 nodes of dataset given in memory"):
        cluster("fedkmeans", read_graph(mygraph), 2, quiet=True, num_clusters=500)


def test_ctrl_c_is_one_line_and_names_the_resume_command(tmp_path, monkeypatch, capsys):
    from strategies.fedspectral import FedSpectralPlus

    steps = []
    honest = FedSpectralPlus.run

    def interrupted(self, session):
        original = session.exchange

        def exchange(action, *args, **kwargs):
            steps.append(action)
            if len(steps) == 4:
                raise KeyboardInterrupt
            return original(action, *args, **kwargs)

        session.exchange = exchange
        return honest(self, session)

    monkeypatch.setattr(FedSpectralPlus, "run", interrupted)
    out = tmp_path / "r"
    code = run_main(["--engine", "inprocess", "--strategy", "fedspectral-plus", "--dataset", "karate",
                     "--num-clients", "2", "--out", str(out)])
    err = capsys.readouterr().err.splitlines()
    assert code == 130 and err[-1] == "error: interrupted (Ctrl-C)"
    assert err[-2] == f"note: the run's journal is in {out}: the same command with --resume {out} continues it"
    assert not any(line.startswith(("Traceback", "  File")) for line in err)


def test_building_the_gnns_leaves_no_generated_module_in_the_temporary_folder(monkeypatch):
    """PyG generates a layer class's module once per process: whichever test built it first, its file is gone."""
    from fedgraphcore.models import GCN, GIN, GENERATED, DMoNModel

    for name in [n for n in sys.modules if n.endswith(GENERATED)]:  # where PyG would generate them again
        monkeypatch.delitem(sys.modules, name)
    GCN(3, 2), GIN(3, 2), DMoNModel(3, 2)
    generated = [m.__file__ for n, m in sys.modules.items() if n.endswith(GENERATED)]
    assert generated and not any(Path(f).exists() for f in generated)  # loaded, their files removed


def test_deploy_local_takes_a_relative_path(mygraph, tmp_path, monkeypatch):
    import deploy.__main__ as deploy

    seen = {}
    monkeypatch.setattr(deploy, "_deploy", lambda out, run_config, *args: seen.update(run_config) or out)
    monkeypatch.chdir(mygraph.parent)
    deploy.run_local(2, "fedkmeans", "mygraph", "auto", ["num-rounds=2"], tmp_path / "d")
    assert seen["dataset"] == str(mygraph) and (tmp_path / "d" / "shards" / "client-1.npz").is_file()


def test_prepare_keeps_the_users_column_names_and_labels(mygraph, tmp_path):
    from fedgraphcore.data.prepare import main as prepare

    for partitioner, header in (("node-random", "id,age,income,score,label"), ("vertical", "id,age,income,label")):
        out = tmp_path / partitioner
        assert prepare(["--dataset", str(mygraph), "--partitioner", partitioner, "--num-clients", "2",
                        "--format", "files", "--out", str(out)]) == 0
        lines = (out / "party-0" / "nodes.csv").read_text().splitlines()
        assert lines[0] == header and lines[1].endswith((",a", ",b", ",c"))


def test_check_asks_for_the_split_in_one_line(mygraph, capsys):
    from fedgraphcore.data.check import main as check

    assert check([str(mygraph)]) == 2
    assert capsys.readouterr().err == (f"error: {mygraph}: which split is this party's data part of? valid: "
                                       "--partitioner with one of node-random, node-community, node-dirichlet, "
                                       "sample, sample-dirichlet, khop, edge, vertical, graph-dirichlet (the run's "
                                       "partitioner)\n")


@pytest.mark.parametrize("name", ["karate", "sbm", "iris", "digits", "circles"])
def test_list_gives_each_embedded_datasets_size_as_it_loads(name):
    from fedgraphcore.data import load_dataset

    data = load_dataset(name, seed=0)
    items, edges, features, classes = describe.SIZES[name]
    assert (data.num_nodes, data.num_edges, data.num_features, data.num_classes) == (items, edges, features, classes)


def test_describe_says_whether_fedkmeans_uses_the_edges_by_its_default(capsys):
    from app import registry

    assert run_main(["describe", "fedkmeans"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    order = registry.schema().params["fedkmeans.filter-order"].default
    said = "by default it ignores the edges" if order == 0 else "by default it smooths the features over the edges"
    assert f"suits: rows whose features separate the clusters" in text and said in text


def test_a_result_json_names_the_users_data_for_the_page(mygraph, tmp_path):
    result = cluster("fedkmeans", str(mygraph), 2, out_dir=tmp_path / "r", quiet=True, num_rounds=3)
    assert json.loads(result.path.read_text())["dataset_name"] == str(mygraph)
    assert f"<h1>fedkmeans on {mygraph}</h1>" in result.report.read_text()
