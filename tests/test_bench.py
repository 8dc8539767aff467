"""benchmarks/harness.py (with a fake run function), benchmarks/plots.py figures, and the
benchmark scripts' argument checks."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import harness
import plots
from harness import Experiment, Suite, list_arg
from conftest import HANG_GUARD_S

REPO = Path(__file__).resolve().parents[1]


def fake_run_factory(calls: list, fail_on: tuple = ()):
    def fake_run(strategy, dataset, num_clients, overrides, out_dir=None, engine="inprocess"):
        calls.append((strategy, dataset, num_clients, dict(overrides), out_dir, engine))
        if (num_clients, overrides["seed"]) in fail_on:
            raise RuntimeError("boom")
        seed = overrides["seed"]
        acc = 0.5 + 0.1 * num_clients + 0.01 * seed
        return {
            "strategy": strategy,
            "dataset": dataset,
            "num_clients": num_clients,
            "config": dict(overrides),
            "metrics": {"acc": acc, "nmi": 0.4, "cluster_similarity": 0.9},
            "reference": {"acc": 0.8, "nmi": 0.5, "agreement": {"ari": 0.7, "nmi": 0.6, "cluster_similarity": 0.95}},
            "timing": {"total_s": 1.5, "protocol_s": 1.0, "rounds": 3},
            "communication": {"bytes_up": 1000, "bytes_down": 500, "messages": 6, "secure_aggregations": 0},
            "privacy": {},
            "history": [{"round": r, "acc": acc * r / 3} for r in (1, 2, 3)],
            "isolated": {"acc": 0.3},
        }

    return fake_run


@pytest.fixture
def suite():
    return Suite(
        name="unit-suite",
        title="Unit suite",
        source="test",
        experiments=(
            Experiment("s", "d", 2, {"x": 1}, row="method", col="d L=2", paper={"acc": 70.0}),
            Experiment("s", "d", 4, row="method", col="d L=4", paper={"acc": 95.0}, quick=False),
        ),
        metrics=("acc",),
        seeds=(0, 1),
        quick_seeds=(5,),
        quick_overrides={"num-rounds": 1},
    )


def test_run_suite_writes_json_and_figures_and_renders_tables(tmp_path, suite):
    calls = []
    summary = harness.run_suite(suite, run_fn=fake_run_factory(calls), results_dir=tmp_path / "results",
                                image_dir=tmp_path / "img", progress=False)
    assert len(calls) == 4
    assert calls[0][:4] == ("s", "d", 2, {"x": 1, "seed": 0}) and calls[0][5] == "inprocess"
    assert Path(calls[0][4]) == tmp_path / "results" / "unit-suite" / Experiment("s", "d", 2, {"x": 1}).slug / "seed0"
    data = json.loads((tmp_path / "results" / "unit-suite.json").read_text())
    e0 = data["experiments"][0]
    assert e0["summary"]["metrics"]["acc"]["mean"] == pytest.approx(0.705)
    assert e0["summary"]["metrics"]["acc"]["std"] == pytest.approx(0.005)
    assert e0["summary"]["agreement"]["ari"]["mean"] == pytest.approx(0.7)
    assert e0["summary"]["reference"]["acc"]["mean"] == pytest.approx(0.8)
    assert len(e0["runs"]) == 2 and e0["runs"][1]["seed"] == 1
    md = harness.render_markdown(suite, data)
    # paper 70.00, ours 70.50 +- 0.50, diff +0.50
    assert "| method, d L=2 | acc | 70.00 | 70.50 ± 0.50 | +0.50 |" in md
    assert "| method, d L=4 | acc | 95.00 | 90.50 ± 0.50 | -4.50 |" in md
    assert "| method, d L=2 | 70.50 | 80.00 | 30.00 | 70.00 | 60.00 | 1.50 | 1,500 |" in md
    assert sorted(p.name for p in tmp_path.rglob("*.md")) == []
    assert sorted(Path(p).name for p in summary["plots"]) == ["unit-suite_bars.png", "unit-suite_rounds.png"]
    for p in summary["plots"]:
        assert Path(p).parent == tmp_path / "img" and Path(p).stat().st_size > 1000


def test_report_mode_redraws_from_the_json_without_running(tmp_path, suite, monkeypatch, capsys):
    monkeypatch.setitem(harness.SUITES, suite.name, suite)
    dirs = {"results_dir": tmp_path / "results", "image_dir": tmp_path / "img"}
    assert harness.main([suite.name, "--no-plots"], run_fn=fake_run_factory([]), **dirs) == 0
    first = capsys.readouterr().out
    calls = []
    assert harness.main([suite.name, "--report"], run_fn=fake_run_factory(calls), **dirs) == 0
    again = capsys.readouterr().out
    assert calls == [] and (tmp_path / "img" / "unit-suite_bars.png").is_file()
    assert again.split("\nwrote ")[0] == first.split("\nwrote ")[0]
    assert harness.main(["smoke", "--report"], results_dir=tmp_path / "none") == 2
    assert "no results for suite 'smoke'" in capsys.readouterr().err


def test_quick_mode_uses_quick_seeds_experiments_and_overrides(tmp_path, suite):
    calls = []
    harness.run_suite(suite, quick=True, run_fn=fake_run_factory(calls), results_dir=tmp_path, progress=False,
                      plots=False)
    assert [(c[2], c[3]) for c in calls] == [(2, {"x": 1, "num-rounds": 1, "seed": 5})]
    calls.clear()
    harness.run_suite(suite, seeds=range(3), run_fn=fake_run_factory(calls), results_dir=tmp_path, progress=False,
                      plots=False)
    assert [c[3]["seed"] for c in calls] == [0, 1, 2, 0, 1, 2]


def test_failed_run_is_recorded_and_suite_continues(tmp_path, suite, monkeypatch, capsys):
    monkeypatch.setitem(harness.SUITES, suite.name, suite)
    calls = []
    code = harness.main([suite.name, "--no-plots"], run_fn=fake_run_factory(calls, fail_on=((4, 1),)),
                        results_dir=tmp_path / "results")
    assert code == 1 and len(calls) == 4
    data = json.loads((tmp_path / "results" / f"{suite.name}.json").read_text())
    runs = data["experiments"][1]["runs"]
    assert "RuntimeError: boom" in runs[1]["error"] and "error" not in runs[0]
    assert data["experiments"][1]["summary"]["runs_failed"] == 1
    assert "(1 failed)" in capsys.readouterr().out


def test_unknown_suite_exits_2_with_one_line_listing_suites(tmp_path, capsys):
    assert harness.main(["no-such-suite"], results_dir=tmp_path / "results") == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no-such-suite" in err and "smoke" in err
    assert harness.main(["smoke", "--seeds", "0"], results_dir=tmp_path / "results") == 2
    assert not (tmp_path / "results").exists()


def test_cli_drives_app_run_run_experiment(tmp_path, monkeypatch):
    """Without an injected run function the harness calls app.run.run_experiment."""
    import app.run

    calls = []
    monkeypatch.setattr(app.run, "run_experiment", fake_run_factory(calls))
    assert harness.main(["smoke", "--quick", "--no-plots"], results_dir=tmp_path / "results") == 0
    assert [(c[0], c[1], c[2]) for c in calls] == [("fedkmeans", "sbm", 2), ("fedkmeans", "sbm", 4)]


def test_smoke_suite_end_to_end(tmp_path, capsys):
    """The real smoke suite (fedkmeans on sbm, 2 and 4 clients) through app.run: every
    recorded run is the run a user gets from app.run with the same settings, and the
    table shows its numbers."""
    from app.run import run_experiment

    code = harness.main(["smoke", "--quick", "--no-plots"], results_dir=tmp_path / "results")
    table = capsys.readouterr().out
    data = json.loads((tmp_path / "results" / "smoke.json").read_text())
    runs = [(e, r) for e in data["experiments"] for r in e["runs"]]
    assert code == 0, [r.get("error") for _, r in runs]
    assert [(e["num_clients"], r["seed"]) for e, r in runs] == [(2, 0), (4, 0)]
    for e, r in runs:
        direct = run_experiment(e["strategy"], e["dataset"], e["num_clients"], {**e["overrides"], "seed": r["seed"]},
                                out_dir=tmp_path / f"direct{e['num_clients']}")
        assert r["metrics"] == pytest.approx(direct["metrics"])
        assert r["reference"]["agreement"] == pytest.approx(direct["reference"]["agreement"])
        assert f"{100 * r['metrics']['acc']:.1f}" in table


def test_suite_validation():
    with pytest.raises(ValueError, match="unknown metric"):
        Suite("x", "x", (Experiment("s", "d", 2),), metrics=("accuracy",))
    with pytest.raises(ValueError, match="no experiments"):
        Suite("x", "x", ())
    with pytest.raises(ValueError, match="registered twice"):
        harness.register_suite(harness.SUITES["smoke"])


# ---------------------------------------------------------------------------
# the benchmark scripts' arguments
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("argv, value, valid", [
    ("gw_ldp.py --parts nonsense", "'nonsense'", "valid choices: table1, cluster, timing"),
    ("gw_ldp.py --parts timing,table1,nonsnse", "'nonsnse'", "valid choices: table1, cluster, timing"),
    ("gw_ldp.py --sweep abc", "'abc'", "valid: floats >= 0"),
    ("gw_ldp.py --datasets mutag,cora", "'cora'", "valid choices: mutag, proteins, imdb-binary"),
    ("gw_ldp.py --dp-settings sgd:1,foo:2", "'foo:2'", "mode one of client, sgd"),
    ("gw_ldp.py --parts table1,lr --rounds 50", "--rounds 50", "trained with --rounds 40 --epochs 2"),
    ("kcagc.py --clients abc", "'abc'", "valid choices: 2, 4, 8, 16"),
    ("kcagc.py --datasets cora,nonsense", "'nonsense'", "valid choices: karate, sbm, iris, digits, circles, cora"),
    ("kcagc.py --compare svd,svd+foo", "'svd+foo'", "flag one of prune, adaptive"),
    ("kcagc.py --datasets cora,karate", "'karate'", "--datasets within cora,citeseer,pubmed,wiki"),
    ("fedavg_dmon.py --clients abc", "'abc'", "valid: ints >= 1"),
    ("fedavg_dmon.py --overlaps 0,2", "'2'", "valid: floats in [0, 1]"),
    ("fedsc.py --skip table,nope", "'nope'", "valid choices: table, grid, dp, errors, attack"),
    ("fedsc.py --seeds 0", "'0'", "valid: ints >= 1"),
    ("fedspectral.py table --seeds 0", "'0'", "valid: ints >= 1"),
    ("fedavg_dmon_selection.py --cells cora:2:0:0,cora:x:0:0", "'cora:x:0:0'", "dataset:clients:overlap:seed"),
    ("defaults.py --strategies fedsc,fedmeans", "'fedmeans'", "valid choices: fedkmeans, fedsc, kcagc"),
    ("defaults.py --clients 0", "'0'", "valid: ints in [1, 1024]"),
    ("fedkmeans.py --seeds 0", "'0'", "valid: ints >= 1"),
])
@pytest.mark.integration
def test_benchmark_bad_argument_is_one_line_exit_2(argv, value, valid):
    """Every list is read whole at parse time: a bad item, even the last, stops the script with one
    line naming it and the valid values (no traceback, no usage block) before anything runs."""
    script, *args = argv.split()
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith(f"{script}: error: ")
    assert value in done.stderr and valid in done.stderr


@pytest.mark.skipif(not (REPO.parent / "shared" / "datasets").is_dir(), reason="shared datasets not found")
def test_benchmark_stops_on_inconsistent_dataset_files_with_one_line(tmp_path):
    """The reviewer's case: MUTAG with its graph labels cut to 100 lines. gw_ldp.py stops when it loads
    the dataset, naming the file, instead of failing at the end on a label-length mismatch."""
    import shutil

    raw = tmp_path / "root" / "tudataset" / "MUTAG" / "raw"
    shutil.copytree(REPO.parent / "shared" / "datasets" / "tudataset" / "MUTAG" / "raw", raw)
    labels = raw / "MUTAG_graph_labels.txt"
    labels.write_text("".join(labels.read_text().splitlines(keepends=True)[:100]))
    env = {**os.environ, "FEDGRAPH_DATA_ROOT": str(tmp_path / "root")}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gw_ldp.py"), "--parts", "table1",
                           "--datasets", "mutag", "--json", str(tmp_path / "gw.json")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 2
    assert done.stderr == (f"gw_ldp.py: error: dataset 'mutag': {labels} has 100 lines but "
                           "MUTAG_graph_indicator.txt numbers 188 graphs; valid: one line per graph\n")


def test_list_arg_checks_every_item():
    floats = list_arg(float, low=0)
    assert floats("1, inf,") == [1.0, math.inf]
    for bad in ("1,nan", "1,-2", "", ","):
        with pytest.raises(argparse.ArgumentTypeError, match="valid: floats >= 0"):
            floats(bad)
    assert list_arg(int, choices=(2, 4), empty_ok=True)("") == []
    with pytest.raises(argparse.ArgumentTypeError, match="invalid value '3'; valid choices: 2, 4"):
        list_arg(int, choices=(2, 4))("2,3")


# ---------------------------------------------------------------------------
# plots
# ---------------------------------------------------------------------------
def test_plots_write_files(tmp_path):
    p1 = plots.plot_metric_vs_rounds({"fed": [0.1, 0.5, 0.7]}, tmp_path / "a" / "rounds.png",
                                     metric="acc", reference={"centralised": 0.8})
    p2 = plots.plot_grouped_bars(["L=2", "L=4"], {"federated": [0.6, 0.5], "centralised": [0.7, 0.7],
                                                 "isolated": [0.4, float("nan")]}, tmp_path / "bars.png")
    rng = np.random.default_rng(0)
    x = np.vstack([rng.normal(0, 0.2, (30, 5)), rng.normal(3, 0.2, (30, 5))])
    y = np.repeat([0, 1], 30)
    for method in ("tsne", "pca"):
        coords = plots.embedding_2d(x=x, method=method, seed=0)
        assert coords.shape == (60, 2)
    import scipy.sparse as sp

    A = sp.csr_matrix(np.kron(np.eye(2), np.ones((30, 30))) - np.eye(60))
    coords = plots.embedding_2d(adj=A, method="spectral")
    assert coords.shape == (60, 2) and np.all(np.isfinite(coords))
    p3 = plots.plot_embedding(coords, {"truth": y, "pred": 1 - y}, tmp_path / "emb.png", title="t")
    for p in (p1, p2, p3):
        assert Path(p).stat().st_size > 1000
    with pytest.raises(ValueError, match="length mismatch"):
        plots.plot_embedding(coords, {"bad": y[:10]}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="unknown embedding method"):
        plots.embedding_2d(x=x, method="umap")


# ---------------------------------------------------------------------------
# matplotlib is loaded when a page is drawn, not when a module loads
# ---------------------------------------------------------------------------
def test_app_strategies_clients_and_deploy_load_matplotlib_only_to_draw():
    """Every module a user or a SuperNode loads imports without loading matplotlib (a run's page imports it
    when it draws; a SuperNode's ClientApp process per message never pays for it): importing them all in a
    fresh interpreter leaves no matplotlib module behind. matplotlib is a dependency of the app."""
    import tomllib

    code = (
        "import importlib, pkgutil, sys\n"
        "names = []\n"
        "for pkg in ('fedgraphcore', 'app', 'strategies', 'clients', 'deploy'):\n"
        "    names.append(importlib.import_module(pkg).__name__)\n"
        "    for info in pkgutil.walk_packages(sys.modules[pkg].__path__, pkg + '.'):\n"
        "        names.append(importlib.import_module(info.name).__name__)\n"
        "print(len(names), sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr[-2000:]
    count, leaked = done.stdout.split(" ", 1)
    assert int(count) > 50 and leaked.strip() == "[]"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert any(d.startswith("matplotlib") for d in project["dependencies"])


def test_simulation_steps_splits_a_message_into_its_hops_and_pairs_the_engines_runs():
    """benchmarks/simulation_steps.py: each message's events (ServerApp's store, the runtime's
    submit, the actor, the reply's store) give its hops; the first messages are left out; the
    simulated-to-in-process ratio is taken run by run."""
    import simulation_steps as steps

    def events(mid: str, t: float, th: str) -> list[dict]:
        return [{"k": "store_ins", "mid": mid, "reply_to": "", "t0": t, "t": t + 0.001, "th": "server", "cpu": 0},
                {"k": "process", "mid": mid, "reply_to": "", "t0": t + 0.002, "t": t + 0.030, "th": th, "cpu": 0},
                {"k": "submit", "mid": mid, "reply_to": "", "t0": t + 0.002, "t": t + 0.005, "th": th, "cpu": 0.001},
                {"k": "actor", "mid": mid, "reply_to": "", "t0": t + 0.006, "t": t + 0.020, "th": "a", "cpu": 0},
                {"k": "clientapp", "mid": mid, "reply_to": "", "t0": t + 0.008, "t": t + 0.018, "th": "a",
                 "cpu": 0.004},
                {"k": "fetch", "t0": t + 0.005, "t": t + 0.025, "th": th, "cpu": 0},
                {"k": "store_res", "mid": "r" + mid, "reply_to": mid, "t0": t + 0.031, "t": t + 0.032,
                 "th": "injector", "cpu": 0}]

    hops = steps.hops([e for i in range(3) for e in events(str(i), float(i), f"w{i % 2}")], first_step_messages=1)
    assert hops["messages"] == 2
    expected = {"push": 1, "pick_up": 1, "submit": 3, "submit_cpu": 1, "to_actor": 3, "clientapp": 10,
                "clientapp_cpu": 4, "back": 7, "store": 7, "total": 32}
    assert {k: round(v, 6) for k, v in hops.items() if k != "messages"} == expected
    run = {"label": "x", "protocol_s": 1.0, "load": 1.0}
    lines = [{**run, "engine": "simulation", "steps_s": [0.5, 0.02, 0.04, 0.03]},
             {**run, "engine": "inprocess", "steps_s": [3.0, 0.01, 0.01, 0.01]},
             {**run, "engine": "simulation", "steps_s": [0.5, 0.05, 0.05, 0.05]},
             {**run, "engine": "inprocess", "steps_s": [3.0, 0.02, 0.02, 0.02]}]
    collected = steps.collect(lines)["x"]
    assert collected["pairs"] == 2 and collected["step_ratio"] == pytest.approx(2.75)  # median of 3.0 and 2.5
    assert collected["median"]["simulation"]["later_step_ms"] == pytest.approx(40.0) and collected["trace"] is None


def test_gw_solver_page_names_the_accuracy_rows_it_did_not_measure():
    import gw_solver

    result = {"accuracy": {"imdb-binary/GW_A": {"measured_by": gw_solver.MEASURED_BY},
                           "proteins/GW_A": {}, "proteins/GW_H(GIN)": {"timing": {"pairs": 2}}}}
    text = gw_solver.provenance(result)
    measured, entered = text.split(" Entered from separate runs, not measured by this script: ")
    assert measured.endswith(": imdb-binary GW_A.")
    assert entered == "proteins GW_A, proteins GW_H(GIN) (and the time table's proteins GW_H(GIN) row)."
    result["accuracy"] = {"imdb-binary/GW_A": {"measured_by": gw_solver.MEASURED_BY}}
    assert "Entered" not in gw_solver.provenance(result)


def test_defaults_rerun_of_some_strategies_keeps_the_other_strategies_rows():
    import defaults

    def row(strategy, dataset, acc):
        return {"strategy": strategy, "dataset": dataset, "federated": acc}

    kept = {"runs": [row("fedkmeans", "wine", 0.1), row("fedsc", "wine", 0.2), row("gw-ldp", "two-families", 0.3)],
            "alternatives": [row("fedsc", "iris", 0.4), row("gw-ldp", "two-families", 0.5)]}
    merged = defaults.merge(kept, [row("gw-ldp", "cora-khop", 0.6), row("fedkmeans", "wine", 0.7)],
                            [row("gw-ldp", "two-families", 0.8)], ["fedkmeans", "gw-ldp"])
    assert [(r["strategy"], r["federated"]) for r in merged["runs"]] == [
        ("fedkmeans", 0.7), ("fedsc", 0.2), ("gw-ldp", 0.6)]
    assert [(r["strategy"], r["federated"]) for r in merged["alternatives"]] == [("fedsc", 0.4), ("gw-ldp", 0.8)]
