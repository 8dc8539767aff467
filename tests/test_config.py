"""Run-config validation, the registry, pyproject defaults and CLI errors."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib

import pytest

from app import registry
from fedgraphcore.config import ConfigError, Param, Schema
from fedgraphcore.data import DATASETS
from fedgraphcore.data.formats import FORMAT_HELP
from conftest import HANG_GUARD_S, REPO


def test_defaults_validate_and_resolve_auto_partitioner():
    config = registry.validate({})
    strategy = registry.get(config["strategy"]).strategy
    assert config["partitioner"] == strategy.partitioners[0]
    assert set(config.as_dict()) == set(registry.schema().params)


@pytest.mark.parametrize(
    "raw, fragments",
    [
        ({"strategy": "kmeanz"}, ["'kmeanz'", "valid choices", "fedkmeans"]),
        ({"dataset": "coraa"}, ["'coraa'", "neither a built-in dataset nor an existing file", "valid: a built-in "
                                "dataset (karate, sbm,", "cora", "or the path of an edge list (.csv"]),
        ({"no-such-key": 1}, ["'no-such-key'; no key is close; every key: python -m app.run describe"]),
        ({"fedkmean.secure": 1},
         ["unknown config key 'fedkmean.secure'; closest: fedkmeans.secure, ", "; every key: python -m app.run "
          "describe [STRATEGY]"]),
        ({"num-rounds": 0}, ["0", "'num-rounds'", "out of range", "[1, 1000000]"]),
        ({"num-clients": 5000}, ["5000", "'num-clients'", "valid range", "1024"]),
        ({"gw-ldp.merge-decimals": 12}, ["12", "'gw-ldp.merge-decimals'", "out of range", "[-1, 9]"]),
        ({"seed": "abc"}, ["'abc'", "'seed'", "integer"]),
        ({"seed": 1.5}, ["1.5", "'seed'", "integer"]),
        ({"seed": 2**32}, ["4294967296", "'seed'", "valid range: [0, 4294967295]"]),  # scikit-learn's limit
        ({"reference": "maybe"}, ["'maybe'", "'reference'", "true, false"]),
        ({"timeout": "soon"}, ["'soon'", "'timeout'", "number"]),
        ({"partitioner": "edge"}, ["'edge'", "fedkmeans", "valid choices", "node-random"]),
        # NaN passes every comparison, so it gets past a range check unless refused as such
        ({"gw-ldp.alpha": "nan"}, ["nan", "'gw-ldp.alpha'", "valid: a finite number in [0, 1]"]),
        ({"gw-ldp.lr": float("nan")}, ["nan", "'gw-ldp.lr'", "valid: a finite number in [1e-09, 10]"]),
        ({"gw-ldp.dp-noise": "inf"}, ["inf", "'gw-ldp.dp-noise'", "valid: a finite number in [1e-09, inf)"]),
        ({"timeout": "inf"}, ["inf", "'timeout'", "valid: a finite number in [0.001, inf)"]),
        ({"gw-ldp.epsilon": "nan"}, ["nan", "'gw-ldp.epsilon'", "valid: a number in [0, inf]"]),
        ({"gw-ldp.epsilon": "-inf"}, ["-inf", "'gw-ldp.epsilon'", "valid: a number in [0, inf]"]),
        # Opacus' search for the noise multiplier does not end for a huge epsilon
        ({"strategy": "fedsc", "fedsc.dp-epsilon": 1e30}, ["1e+30", "'fedsc.dp-epsilon'", "[0, 10000]"]),
        ({"strategy": "fedavg-dmon", "fedavg-dmon.dp-epsilon": 1e30}, ["'fedavg-dmon.dp-epsilon'", "[0, 10000]"]),
        ({"strategy": "fedsc", "num-clients": 2, "min-clients": 5}, ["min-clients=5 exceeds num-clients=2",
                                                                     "valid: 1..2"]),
        ({"strategy": "fedkmeans", "num-clients": 2, "fedkmeans.secure": True, "secagg.bound": 1e300},
         ["secagg.bound=1e+300", "does not fit the 64-bit ring of fedkmeans.secure"]),
        ({"num-clusters": 10**20}, ["100000000000000000000", "'num-clusters'", "[0, 100000000]"]),
        # 2 sigma^2 = 0 would make the kernel 0/0 on the diagonal
        ({"strategy": "fedsc", "fedsc.sigma": 1e-200}, ["1e-200", "'fedsc.sigma'", "[1e-150, 1e+150]"]),
        ({"strategy": "fedsc", "fedsc.sigma": 1e200}, ["1e+200", "'fedsc.sigma'", "[0, 1e+150]"]),
    ],
)
def test_bad_values_give_one_line_naming_value_and_choices(raw, fragments):
    with pytest.raises(ConfigError) as err:
        registry.validate(raw)
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


@pytest.mark.parametrize("strategy, key", [("fedkmeans", "fedkmeans.secure"), ("fedsc", "fedsc.secure"),
                                           ("fedavg-dmon", "fedavg-dmon.secure"),
                                           ("fedspectral-plus", "fedspectral-plus.secure")])
def test_secure_aggregation_with_one_client_is_refused_before_the_run(strategy, key):
    with pytest.raises(ConfigError) as err:
        registry.validate({"strategy": strategy, "num-clients": 1, key: True})
    assert str(err.value) == (f"{key}=true with num-clients=1: secure aggregation needs at least 2 clients; "
                              f"valid: num-clients >= 2 or {key}=false")
    registry.validate({"strategy": strategy, "num-clients": 2, key: True})


@pytest.mark.parametrize("raw, message", [
    ({"strategy": "fedkmeans", "dataset": "mutag"},
     "dataset 'mutag' is a graph collection; strategy 'fedkmeans' with partitioner 'node-random' needs one graph "
     "(e.g. karate, sbm, cora, or an edge list)"),
    ({"strategy": "gw-ldp", "dataset": "karate"},
     "dataset 'karate' is one graph; strategy 'gw-ldp' with partitioner 'graph-dirichlet' needs a graph collection: "
     "mutag, proteins, imdb-binary, or a directory of graphs"),
    ({"strategy": "gw-ldp", "dataset": "mutag", "partitioner": "khop"},
     "dataset 'mutag' is a graph collection; strategy 'gw-ldp' with partitioner 'khop' needs one graph "
     "(e.g. karate, sbm, cora, or an edge list)"),
    ({"strategy": "fedspectral", "dataset": "iris"},
     "dataset 'iris' has no edges; strategy 'fedspectral' needs them; valid: a dataset with edges, e.g. karate, "
     "sbm, cora"),
    ({"strategy": "fedavg-dmon", "dataset": "email-eu-core"},
     "dataset 'email-eu-core' has no node features; strategy 'fedavg-dmon' needs them; valid: a dataset with "
     "features, e.g. sbm (sbm.features > 0), cora, citeseer, or a node table with feature columns"),
    ({"strategy": "fedkmeans", "dataset": "sbm", "sbm.features": 0},
     "dataset 'sbm' has no node features; strategy 'fedkmeans' needs them; valid: a dataset with features, "
     "e.g. sbm (sbm.features > 0), cora, citeseer, or a node table with feature columns"),
    ({"strategy": "fedspectral", "dataset": "ego-facebook"},
     "dataset 'ego-facebook' has no labels; valid: num-clusters >= 1 (the number of clusters to find)"),
])
def test_a_dataset_without_what_the_strategy_uses_is_refused_before_the_run(raw, message):
    """Refused before the run starts: on the clients these would stop it with client errors, or
    (fedspectral on a point cloud, fedavg-dmon on identity features) give a meaningless result."""
    with pytest.raises(ConfigError) as err:
        registry.validate(raw)
    assert str(err.value) == message


def test_values_are_coerced_to_declared_types():
    config = registry.validate({"seed": "7", "timeout": 3, "reference": "false", "num-rounds": 5.0})
    assert config["seed"] == 7 and isinstance(config["seed"], int)
    assert config["timeout"] == 3.0 and isinstance(config["timeout"], float)
    assert config["reference"] is False
    assert config["num-rounds"] == 5


def test_inf_is_valid_only_where_declared():
    # gw-ldp.epsilon = inf is documented (no LDP noise); every other float must be finite
    infinite = [p.key for p in registry.schema().params.values() if p.infinite]
    assert infinite == ["gw-ldp.epsilon"] and "inf = no LDP" in registry.schema().params["gw-ldp.epsilon"].help
    assert registry.validate({"gw-ldp.epsilon": "inf"})["gw-ldp.epsilon"] == float("inf")
    assert registry.validate({"gw-ldp.epsilon": 1e5})["gw-ldp.epsilon"] == 1e5
    with pytest.raises(ConfigError, match=r"^invalid value inf for 'x'; valid: a finite number in \(-inf, inf\)$"):
        Param("x", float, 0.0, "").coerce("inf")


def test_schema_rejects_duplicate_keys():
    schema = Schema()
    schema.add([Param("a", int, 1, "")])
    with pytest.raises(ValueError, match="declared twice"):
        schema.add([Param("a", int, 2, "")])


def test_registry_round_trip():
    assert registry.STRATEGIES
    for name, entry in registry.STRATEGIES.items():
        assert registry.get(name) is entry
        assert entry.strategy.name == name
        assert entry.strategy.partitioners
        for action, (method, _) in entry.client.steps().items():
            assert action.isidentifier()
            assert callable(getattr(entry.client, method))
        for param in entry.strategy.params:
            assert param.key.startswith(name + ".")
    with pytest.raises(ConfigError, match="unknown strategy 'x'; valid choices"):
        registry.get("x")


def test_the_dataset_help_names_the_reserved_value_parties_and_the_layers_add_their_choices():
    """fedgraphcore.config cannot import the data layer or the registry: the help spells out
    fedgraphcore.data.parties.PARTIES, and app.registry adds the choices and the check only it knows."""
    from fedgraphcore.data.parties import PARTIES
    from fedgraphcore.data.partition import PARTITIONERS
    from fedgraphcore.transport import POLL_MODES

    params = registry.schema().params
    assert f"{PARTIES!r}: every SuperNode brings its own data" in params["dataset"].help
    assert params["dataset"].check is registry.check_dataset
    assert params["strategy"].choices == tuple(registry.STRATEGIES)
    assert params["partitioner"].choices == ("auto", *PARTITIONERS)
    assert params["transport"].choices == POLL_MODES


@pytest.mark.shipped_defaults
def test_pyproject_run_config_equals_schema_defaults():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    table = pyproject["tool"]["flwr"]["app"]["config"]
    flat = {}

    def walk(prefix, node):
        for key, value in node.items():
            full = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict):
                walk(full, value)
            else:
                flat[full] = value

    walk("", table)
    assert flat == registry.schema().defaults()


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--strategy", "nope"], "invalid value 'nope' for 'strategy'; valid choices: fedkmeans"),
        (["--set", "bogus=1"], "unknown config key 'bogus'"),
        (["--set", "seed=-1"], "value -1 for 'seed' is out of range"),
        (["--engine", "warp"], "unknown engine 'warp'"),
        (["--set", "seed"], "invalid --set 'seed'"),
        # argparse's own errors: one line too, not its usage lines first
        (["--num-clients", "1.5"], "error: argument --num-clients: invalid int value: '1.5'"),
        (["--bogus"], "error: unrecognized arguments: --bogus"),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(args, fragment, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "app.run", "--out", str(tmp_path / "r"), *args],
        cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and fragment in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, message", [
    (["--num-clients", "2", "--set", "num-clients=3"],
     "--num-clients 2 and --set num-clients=3 both given; valid: one of them"),
    (["--strategy", "fedkmeans", "--set", "strategy=fedsc"],
     "--strategy fedkmeans and --set strategy=fedsc both given; valid: one of them"),
    (["--set", "seed=1", "--set", "seed=2"], "--set seed given twice ('1', '2'); valid: once"),
    (["--set", "num-clients=abc"], "invalid value 'abc' for 'num-clients'; expected an integer"),
])
def test_cli_conflicting_or_malformed_options_exit_2(args, message, tmp_path, capsys):
    from app.run import main

    assert main(["--engine", "inprocess", "--dataset", "karate", "--out", str(tmp_path / "r"), *args]) == 2
    assert capsys.readouterr().err == f"error: {message}\n"
    assert not (tmp_path / "r").exists()


def test_cli_refuses_an_out_dir_that_holds_a_result_or_is_a_file(tmp_path, capsys):
    from app.run import main

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "result.json").write_text("{}")
    common = ["--engine", "inprocess", "--dataset", "karate", "--num-clients", "2"]
    assert main([*common, "--out", str(earlier)]) == 2
    assert capsys.readouterr().err == (f"error: out-dir {str(earlier)!r} already holds a result.json; valid: a new "
                                       "or empty directory\n")
    assert (earlier / "result.json").read_text() == "{}"  # nothing lost
    # a file in the way is found before the run, not when the result is written after it
    assert main([*common, "--out", str(earlier / "result.json" / "sub")]) == 2
    assert capsys.readouterr().err.endswith(f"{str(earlier / 'result.json')!r} is a file; valid: a writable "
                                            "directory for result.json\n")


@pytest.mark.parametrize("args, key", [
    (["--strategy", ""], "strategy"), (["--set", "strategy="], "strategy"),
    (["--dataset", ""], "dataset"), (["--set", "dataset="], "dataset"),
    (["--set", "num-clients="], "num-clients"),
])
def test_cli_empty_values_are_refused_not_taken_for_the_default(args, key, tmp_path, capsys, monkeypatch):
    import app.inprocess
    from app.run import main

    monkeypatch.setattr(app.inprocess, "InProcessGrid", None)  # no engine may start
    valid = ("expected an integer" if key == "num-clients"
             else "valid: a built-in dataset (" + ", ".join(DATASETS) + f") or the path of {FORMAT_HELP}"
             if key == "dataset" else "valid choices: " + ", ".join(registry.schema().params[key].choices))
    assert main(["--engine", "inprocess", "--out", str(tmp_path / "r"), *args]) == 2
    assert capsys.readouterr().err == f"error: invalid value '' for '{key}'; {valid}\n"
    assert not (tmp_path / "r").exists()


def test_an_out_dir_that_cannot_be_written_is_refused_before_the_run(tmp_path, capsys, monkeypatch):
    """Refused before the run, not once it is over (when the result would be lost)."""
    import app.inprocess
    from fedgraphcore.files import unwritable
    from app.run import main

    monkeypatch.setattr(app.inprocess, "InProcessGrid", None)  # no engine may start
    assert main(["--engine", "inprocess", "--dataset", "karate", "--out", "/proc/no-such/r"]) == 2
    assert capsys.readouterr().err == ("error: out-dir: '/proc/no-such/r' cannot be created or written (No such file "
                                       "or directory); valid: a writable directory for result.json\n")
    # the check leaves nothing behind
    assert unwritable(tmp_path / "a" / "b") is None and list(tmp_path.iterdir()) == []


def test_write_result_never_replaces_a_result_json(tmp_path):
    """A second run into the same directory never replaces the first one's result and labels."""
    import numpy as np

    from fedgraphcore.result import write_result

    out = tmp_path / "r"
    write_result({"run": 1}, out, np.array([0, 1]))
    with pytest.raises(ConfigError) as err:
        write_result({"run": 2}, out, np.array([1, 0]))
    assert str(err.value) == (f"out-dir {str(out)!r} already holds another run's result.json; this run's result is "
                              f"in {str(tmp_path / 'r-2' / 'result.json')!r} instead; valid: a new or empty out-dir "
                              "for each run")
    assert json.loads((out / "result.json").read_text()) == {"run": 1}
    assert np.load(out / "labels.npy").tolist() == [0, 1]
    assert json.loads((tmp_path / "r-2" / "result.json").read_text()) == {"run": 2}  # not lost either
    assert np.load(tmp_path / "r-2" / "labels.npy").tolist() == [1, 0]
    assert (tmp_path / "r-2" / "labels.csv").read_text() == "node,cluster\n0,1\n1,0\n"
    assert sorted(p.name for p in out.iterdir()) == ["labels.csv", "labels.npy", "result.json"]  # no temporary file


def test_cli_keeps_a_result_json_written_while_the_run_ran(tmp_path, capsys, monkeypatch):
    """Two runs started a second apart with the same --out both passed the start-up check."""
    from app.run import main
    from strategies.fedkmeans import FedKMeans

    out = tmp_path / "r"
    honest = FedKMeans.run

    def other_run_finishes_first(self, session):
        out.mkdir()
        (out / "result.json").write_text("{}")
        return honest(self, session)

    monkeypatch.setattr(FedKMeans, "run", other_run_finishes_first)
    argv = ["--engine", "inprocess", "--dataset", "karate", "--num-clients", "2", "--set", "reference=false"]
    assert main([*argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"error: out-dir {str(out)!r} already holds another "
                                                               "run's result.json; this run's result is in")
    assert (out / "result.json").read_text() == "{}"
    assert json.loads((tmp_path / "r-2" / "result.json").read_text())["dataset"] == "karate"


def test_default_out_dirs_of_runs_started_in_the_same_second_differ(tmp_path, monkeypatch):
    """They shared results/<strategy>-<dataset>-<time>: the second run replaced the first one's result."""
    import time

    from app.run import run_experiment
    from fedgraphcore.wire import ProtocolError
    from strategies.fedkmeans import FedKMeans

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(time, "strftime", lambda fmt, *when: "20250101-000000")
    base = tmp_path.resolve() / "results" / "fedkmeans-karate-20250101-000000"
    paths = [run_experiment("fedkmeans", "karate", 2, {"reference": False})["path"] for _ in range(2)]
    assert paths == [str(base / "result.json"), str(base.with_name(base.name + "-2") / "result.json")]

    def vanish(self, session):
        raise ProtocolError("client 1 vanished")

    monkeypatch.setattr(FedKMeans, "run", vanish)
    with pytest.raises(ProtocolError):
        run_experiment("fedkmeans", "karate", 2, {"reference": False})
    assert sorted(p.name for p in base.parent.iterdir()) == [base.name, base.name + "-2"]  # no empty one left


@pytest.fixture
def sbm34_eval_file(tmp_path, capsys) -> str:
    """An eval-file as the reviewer made it: SBM labels of 34 nodes, karate's size."""
    from fedgraphcore.data.prepare import main as prepare

    path = str(tmp_path / "sbm34.npz")
    assert prepare(["--dataset", "sbm", "--partitioner", "node-random", "--num-clients", "2", "--set",
                    "sbm.nodes=34", "--out", str(tmp_path / "shards"), "--eval-file", path]) == 0
    capsys.readouterr()
    return path


SAME_DATA = "valid: an eval-file written by python -m app.data.prepare --dataset sbm with the run's seed and dataset " \
            "settings"


@pytest.mark.parametrize("args, message", [
    (["--dataset", "karate"], "was made for dataset 'sbm', not 'karate'; valid: one written by python -m "
                              "app.data.prepare --dataset karate ... --eval-file PATH"),
    (["--dataset", "sbm"], f"holds 34 nodes of 'sbm', the run's 'sbm' has 1000; {SAME_DATA}"),
    (["--dataset", "sbm", "--set", "sbm.nodes=34", "--set", "seed=1"],
     f"was made from other 'sbm' data than the run's (another seed or dataset setting); {SAME_DATA}"),
])
def test_an_eval_file_of_other_data_is_refused_before_the_run(sbm34_eval_file, args, message, tmp_path, capsys,
                                                               monkeypatch):
    """An evaluation file of another dataset is refused before the run, whatever its size."""
    import app.inprocess
    from app.run import main

    monkeypatch.setattr(app.inprocess, "InProcessGrid", None)  # no engine may start
    argv = ["--engine", "inprocess", "--num-clients", "2", "--out", str(tmp_path / "r"),
            "--set", f"eval-file={sbm34_eval_file}", *args]
    assert main(argv) == 2
    assert capsys.readouterr().err == f"error: eval-file {sbm34_eval_file!r} {message}\n"
    assert not (tmp_path / "r").exists()


def test_a_server_refuses_an_eval_file_of_another_dataset_and_takes_its_own(sbm34_eval_file, tmp_path):
    """A deployed ServerApp has no dataset to compare with, but knows the run's dataset name."""
    from fedgraphcore.data.evaluation import load_evaluation
    from app.run import main

    with pytest.raises(ConfigError, match="^eval-file .* was made for dataset 'sbm', not 'karate'; valid: "):
        load_evaluation(sbm34_eval_file, "karate")
    assert main(["--engine", "inprocess", "--dataset", "sbm", "--num-clients", "2", "--set", "sbm.nodes=34",
                 "--set", f"eval-file={sbm34_eval_file}", "--out", str(tmp_path / "r")]) == 0
    assert json.loads((tmp_path / "r" / "result.json").read_text())["metrics"]["nmi"] > 0.5


def test_a_cluster_count_on_unlabelled_data_never_suggests_the_number_of_classes(tmp_path):
    """Without labels, 0 (the number of classes) is refused too: not a valid choice to offer."""
    from app.run import run_experiment

    edges = tmp_path / "edges.csv"
    edges.write_text("".join(f"{i},{i + 1}\n" for i in range(14)))
    with pytest.raises(ConfigError) as err:
        run_experiment("fedspectral", str(edges), 2, {"num-clusters": 50}, tmp_path / "r")
    assert str(err.value) == f"num-clusters=50 exceeds the 15 nodes of dataset '{edges}'; valid: 1 to 15"


@pytest.mark.parametrize("strategy, dataset, clients, overrides, message", [
    ("fedkmeans", "karate", 35, {}, "cannot split 34 nodes of 'karate' over 35 clients; use at most 34 clients"),
    ("kcagc", "iris", 5, {}, "cannot split 4 feature columns of 'iris' over 5 clients"),
    ("fedspectral", "karate", 2, {"num-clusters": 35},
     "num-clusters=35 exceeds the 34 nodes of dataset 'karate'; valid: 0 (its 4 classes) or 1 to 34"),
])
def test_a_split_or_cluster_count_the_data_does_not_allow_stops_before_any_client_runs(
        tmp_path, monkeypatch, strategy, dataset, clients, overrides, message):
    """Refused before the run starts, in one line, not with one error per client once it runs."""
    import app.inprocess

    monkeypatch.setattr(app.inprocess, "InProcessGrid", None)  # no engine may start
    from app.run import run_experiment

    with pytest.raises(ConfigError) as err:
        run_experiment(strategy, dataset, clients, overrides, tmp_path / "r")
    assert str(err.value) == message
    assert not (tmp_path / "r").exists()


def test_cli_warns_about_settings_nothing_reads(tmp_path, capsys):
    from app.run import main

    argv = ["--engine", "inprocess", "--strategy", "fedkmeans", "--dataset", "karate", "--num-clients", "2",
            "--out", str(tmp_path / "r"), "--set", "sbm.nodes=50", "--set", "partition.alpha=0.3",
            "--set", "fedsc.sigma=1", "--set", "partition.overlap=0", "--set", "fedkmeans.tol=1e-4"]
    assert main(argv) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: --set {key} has no effect with strategy 'fedkmeans', dataset 'karate' and "
                        "partitioner 'node-random'" for key in ("sbm.nodes", "partition.alpha", "fedsc.sigma")]
