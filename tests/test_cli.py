"""What a user sees: the CLI's help from the schema, the keys result.json records, progress lines,
a console without other packages' noise, and a one-line error from the ServerApp."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
import warnings
from logging import ERROR

import pytest
from flwr.app import Context, RecordDict
from flwr.common.logger import FLOWER_LOGGER, log, warn_deprecated_feature

from fedgraphcore import quiet
from app import describe, registry
from fedgraphcore.config import ConfigError
from fedgraphcore.data import DATASETS
from fedgraphcore.progress import Convergence, Progress, expected_rounds, progress_line
from app.run import main, run_experiment
from conftest import HANG_GUARD_S, REPO


def keys_in(text: str) -> set[str]:
    """The keys of ``describe`` lines: the first word after the two-space indent and the ``*`` column."""
    return {line[4:].split()[0] for line in text.splitlines() if line.startswith(("  * ", "    ")) and
            not line.startswith("     ") and line[4:].split()}


@pytest.mark.parametrize("strategy", list(registry.STRATEGIES))
def test_strategy_help_lists_exactly_the_keys_a_run_reads(strategy, capsys):
    assert main(["--strategy", strategy, "--help"]) == 0
    text = capsys.readouterr().out
    dataset = describe._example_dataset(strategy, "auto")
    config = registry.validate({"strategy": strategy, "dataset": dataset})
    assert keys_in(text) == set(registry.keys_read(config))
    cls = registry.get(strategy).strategy
    assert text.startswith(f"{strategy}: {cls.summary}\n")
    assert f"data split: {cls.split}" in " ".join(text.split())
    for p in cls.params:  # each own key with its type, default, valid values and meaning
        assert " ".join(p.help.split()) in " ".join(text.split())
        assert p.valid() in " ".join(text.split())


def test_a_key_line_gives_type_default_range_and_marks_the_keys_that_matter(capsys):
    assert main(["describe", "fedkmeans"]) == 0
    lines = capsys.readouterr().out.splitlines()
    i = next(i for i, line in enumerate(lines) if line.split()[:2] == ["*", "fedkmeans.filter-order"])
    assert lines[i].split() == ["*", "fedkmeans.filter-order", "int", "4", "[0,", "1000]"]
    help_text = " ".join(line.strip() for line in lines[i + 1:i + 3])
    assert help_text == ("AGC low-pass filter order applied first where the data has edges (over the whole graph "
                         "with partition.boundary; 0: features only)")
    tol = next(line for line in lines if "fedkmeans.tol" in line)
    assert tol.split() == ["fedkmeans.tol", "float", "1e-06", "[0,", "inf)"]  # not marked


def test_strategy_help_shows_the_keys_of_the_dataset_and_partitioner_asked_for(capsys):
    assert main(["describe", "fedsc", "--dataset", "circles", "--set", "partitioner=sample-dirichlet"]) == 0
    keys = keys_in(capsys.readouterr().out)
    assert {"circles.noise", "partition.alpha", "partition.min-size", "fedsc.sigma"} <= keys
    assert not keys & {"sbm.nodes", "partition.overlap", "data-root", "fedkmeans.tol"}


def test_plain_help_and_list_name_every_strategy_and_dataset(capsys):
    assert main(["--help"]) == 0
    help_text = capsys.readouterr().out
    assert main(["list"]) == 0
    listing = capsys.readouterr().out
    assert "usage: python -m app.run" in help_text and listing in help_text
    for name in [*registry.STRATEGIES, *DATASETS]:
        assert f"\n  {name} " in listing
    assert "\n  cora              graph: 2,708 nodes, 5,278 edges, 1,433 features, 7 classes\n" in listing
    assert "\n  mutag             graph collection: 188 graphs, 2 classes\n" in listing
    assert "which data each suits, and why" in listing


@pytest.mark.parametrize("argv, message", [
    (["describe"], "error: describe needs a strategy; valid choices: fedkmeans, gw-ldp"),
    (["describe", "nope"], "error: unknown strategy 'nope'; valid choices: fedkmeans"),
    (["frobnicate"], "error: unknown command 'frobnicate'; valid: list (strategies and datasets), describe"),
    (["--num-clients", "0"], "error: num-clients=0 means every connected SuperNode in a deployment; a simulation "
                             "has none to count; valid: 1 to 1024 (default 4)"),
    (["--set", "num-clients=0"], "error: num-clients=0 means every connected SuperNode"),
])
def test_a_bad_command_is_one_line_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(message)


@pytest.mark.parametrize("strategy, dataset, read, not_read", [
    ("fedkmeans", "iris", {"num-rounds", "fedkmeans.filter-order", "partition.overlap", "secagg.bound"},
     {"sbm.nodes", "data-root", "fedsc.sigma", "partition.alpha"}),
    ("kcagc", "sbm", {"kcagc.filter", "sbm.nodes", "partition.split"}, {"num-rounds", "partition.overlap"}),
])
def test_result_config_holds_the_keys_the_run_read(strategy, dataset, read, not_read, tmp_path):
    overrides = {"num-rounds": 2} if strategy == "fedkmeans" else {"kcagc.iterations": 1, "kcagc.restarts": 2,
                                                                  "sbm.nodes": 200}
    result = run_experiment(strategy, dataset, 2, overrides, tmp_path / "r")
    config = result["config"]
    assert list(config) == registry.keys_read(registry.validate({"strategy": strategy, "dataset": dataset}))
    assert read <= set(config) and not not_read & set(config)
    assert config["num-clients"] == 2 and config["num-clusters"] > 0  # as resolved for the run


def test_a_key_the_strategy_does_not_read_is_warned_about(tmp_path, capsys):
    argv = ["--engine", "inprocess", "--strategy", "fedspectral", "--num-clients", "2", "--out", str(tmp_path / "r"),
            "--set", "sbm.nodes=200", "--set", "num-rounds=5"]
    assert main(argv) == 0
    assert ("warning: --set num-rounds has no effect with strategy 'fedspectral', dataset 'sbm' and partitioner "
            "'edge'") in capsys.readouterr().err


# ---------------------------------------------------------------------------------------- progress
class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def on_screen(stream: io.StringIO) -> str:
    """What a terminal shows of ``stream``'s output, without its control codes."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())


def test_progress_is_a_live_bar_on_a_terminal_each_figure_explained_once():
    stream = Terminal()
    progress = Progress(stream)
    progress.step("kmeans_step")
    progress.round(1, 3, 1_500_000, inertia=12.5)
    progress.round(2, 3, 3_000_000, inertia=None, withheld=4)
    progress.close()
    text = on_screen(stream)
    assert text.count("inertia: the k-means objective") == 1 and text.count("withheld: rows whose cluster") == 1
    last = text.rstrip("\n").rsplit("\r", 1)[-1]  # the bar as it stays once the run ends
    assert last.startswith("kmeans_step ") and last.endswith(" round 2/3 0:00:00 withheld 4 3 MB")


def test_progress_line():
    assert progress_line(3, 20, 1.25, 524_288, {"loss": 0.123456789, "objective": None}) == (
        "round 3/20 | 1.2 s | loss 0.123457 | 0.524 MB")
    assert progress_line(3, None, 1.25, 0, {"order": 2}, step="kcagc_exact") == (
        "round 3 | kcagc_exact | 1.2 s | order 2 | 0 MB")


def test_a_capped_run_shows_the_rounds_it_is_expected_to_take_or_at_most():
    def shown(*args, **kwargs) -> str:
        stream = Terminal()
        progress = Progress(stream)
        progress.round(*args, **kwargs)
        progress.close()
        return on_screen(stream)

    residuals = Convergence(tol=1e-6, measures=[1e-1, 1e-2, 1e-3])  # a tenth each round: 3 more to 1e-6
    assert " round 3/~6 (at most 2000) " in shown(3, 2000, 0, converging=residuals)
    rising = Convergence(tol=1e-6, measures=[1e-2, 1e-1, 1.0])
    assert " round 3 (at most 2000) " in shown(3, 2000, 0, converging=rising)
    assert " round 5 (at most 40) " in shown(5, 40, 0, capped=True)
    assert " round 7 " in shown(7, None, 0, order=2)  # no bound worth showing


def test_expected_rounds_follow_the_rate_of_decrease_within_the_cap():
    assert expected_rounds(4, [1.0, 0.5, 0.25, 0.125], 0.001, 2000) == 11  # 0.125 * 2^-7 < 0.001
    assert expected_rounds(4, [1.0, 0.1, 0.01, 0.001], 1e-300, 20) == 20  # never beyond the cap
    assert expected_rounds(3, [1.0, 0.5, 1e-9], 1e-9, 100) == 3  # reached: this round is the last
    assert expected_rounds(2, [1.0, 0.5], 0.0, 100) is None  # a tolerance of 0 is reached only by chance
    assert expected_rounds(1, [0.5], 0.1, 100) is None  # one value gives no rate


def test_a_run_without_a_terminal_logs_progress_lines(tmp_path):
    """The first round and the last one at least, whatever the machine's speed."""
    done = subprocess.run([sys.executable, "-m", "app.run", "--engine", "inprocess", "--strategy", "fedkmeans",
                           "--dataset", "iris", "--num-clients", "2", "--set", "num-rounds=50", "--set",
                           "fedkmeans.tol=0", "--out", str(tmp_path / "r")],
                          cwd=REPO, capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert done.returncode == 0, done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "round " in line and " MB" in line]
    rounds = len(json.loads((tmp_path / "r" / "result.json").read_text())["history"])  # fewer once converged
    assert lines[0].split("round ", 1)[1].startswith("1 (at most 50) | ") and " | inertia " in lines[0]
    # the last round's centres moved by 0 = fedkmeans.tol: that round was the last expected
    assert lines[-1].split("round ", 1)[1].startswith(f"{rounds}/~{rounds} (at most 50) | ")
    assert "\r" not in done.stdout + done.stderr


# ---------------------------------------------------------------------------------------- quiet
def test_other_packages_notices_are_left_out_unless_verbose():
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    FLOWER_LOGGER.addHandler(handler)
    try:
        for verbose in (False, True):
            quiet.set_verbose(verbose)
            records.clear()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with quiet.simulation_engine():
                    warn_deprecated_feature("The `run_simulation` function is deprecated and will be removed")
                    warnings.warn(quiet.RAY_WARNINGS[0] + " ...", FutureWarning)
                    log(ERROR, "our own line")
            assert [r.getMessage() for r in records][-1] == "our own line"
            assert len(records) == (2 if verbose else 1) and len(caught) == (1 if verbose else 0)
            assert quiet.ray_init_args() == ({} if verbose else {"log_to_driver": False})
    finally:
        quiet.set_verbose(False)
        FLOWER_LOGGER.removeHandler(handler)



# ---------------------------------------------------------------------------------------- ServerApp errors
def test_the_server_app_logs_a_config_error_as_app_runs_one_line_and_flower_no_traceback():
    """Under `flwr run` the error still propagates (Flower marks the run failed with its message),
    but Flower's report of it (the traceback and the exit-code notice) is left out of the log."""
    from app.server_app import build_server_app

    records = []
    handler = logging.Handler()
    handler.emit = records.append
    FLOWER_LOGGER.addHandler(handler)
    before = list(FLOWER_LOGGER.filters)
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config={})
    try:
        with pytest.raises(ConfigError) as info:
            build_server_app({"seed": -1})(None, context)
        # what Flower 1.41/1.42's flwr-serverapp / flwr-simulation then log (run_serverapp.py, simulation/app.py)
        log(ERROR, "%s raised an exception", "ServerApp", exc_info=info.value)
        log(ERROR, "Exit Code: 201\nServerApp raised an exception\n\nFor more information, visit: <...>")
        log(ERROR, "another error, with its traceback", exc_info=ValueError("not this one"))
    finally:
        FLOWER_LOGGER.removeHandler(handler)
        FLOWER_LOGGER.filters[:] = before
    assert [r.getMessage() for r in records] == [
        f"error: {info.value}", "another error, with its traceback"]
    assert str(info.value) == "value -1 for 'seed' is out of range; valid range: [0, 4294967295]"
