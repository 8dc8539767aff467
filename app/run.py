"""Run one experiment in-process: ``python -m app.run --strategy NAME ...``.

The same ServerApp and ClientApp as ``flwr run`` run under Flower's
simulation engine (``flwr.simulation.run_simulation`` through :func:`app.engine.simulate`,
default: an engine that fails ends the run with exit code 1) or on the
in-process grid (``--engine inprocess``: no Ray start-up, same code path).
The ServerApp logs a summary table and writes ``OUT/result.json``.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

from fedgraphcore import quiet
from app import registry
from fedgraphcore.config import ArgumentParser, ConfigError, RunConfig, SharedConfig, parse_assignments
from fedgraphcore.data import memory
from fedgraphcore.errors import FedGraphError
from fedgraphcore.data.datasets import absolute_dataset, dataset_label, is_builtin
from fedgraphcore.data.params import data_root, dataset_kwargs
from fedgraphcore.data.parties import PARTIES
from fedgraphcore.journal import JOURNAL, MANIFEST
from fedgraphcore.result import REPORT_FILE, RESULT_FILE, check_out_dir, default_out_dir
from fedgraphcore.wire import ProtocolError

ENGINES = ("simulation", "inprocess")
DEFAULT_NUM_CLIENTS = 4


def run_experiment(
    strategy: str,
    dataset: str,
    num_clients: int,
    overrides: Mapping[str, Any] | None = None,
    out_dir: str | Path | None = None,
    engine: str = "inprocess",
    note: Callable[[str], None] | None = None,
    node_configs: list[Mapping[str, Any]] | None = None,
    write: bool = True,
) -> dict:
    """Run one experiment and return its result dict (also in ``out_dir``).

    ``dataset`` is a built-in name or the path of a graph file or directory (made absolute here,
    like ``data.node-table``, so the clients read the same file wherever they run). ``note`` is
    called with each note of the data reader (repairs such as dropped self-loops), before the run;
    result.json lists them too. ``node_configs`` (in-process engine only): each node's node
    config, e.g. a party's own data with ``dataset = 'parties'`` (``data``, ``partition-id``,
    ``out-dir``; :mod:`fedgraphcore.data.parties`); default: partition i of ``num_clients``. ``write=False``
    (in-process engine, no out-dir; :func:`app.api.cluster`): nothing is written, and the result
    dict also holds the labels (``labels``) and no ``path``."""
    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; valid choices: " + ", ".join(ENGINES))
    raw = {**dict(overrides or {}), "strategy": strategy, "dataset": dataset, "num-clients": num_clients}
    config = _validated_with_absolute_paths(raw)  # fail before any engine starts
    given = out_dir or SharedConfig.of(config).out_dir
    if write:
        check_out_dir(Path(given or "results").resolve())  # found now, not when the result is written after the run
    elif engine != "inprocess" or given:
        raise ConfigError(f"a run that writes nothing on engine {engine!r} with out-dir {given!r}; valid: engine "
                          "'inprocess' and no out-dir")
    if node_configs is not None and (engine != "inprocess" or len(node_configs) != num_clients):
        raise ConfigError(f"{len(node_configs)} node configs for {num_clients} clients on engine {engine!r}; valid: "
                          "one per client, engine 'inprocess'")
    if SharedConfig.of(config).dataset == PARTIES:
        notes = _check_parties(config, node_configs)
    else:
        notes = _check_against_data(config, num_clients).meta.get("notes", [])
    for text in notes if note else ():
        note(text)
    if not write:
        return _run(engine, {**raw, "out-dir": ""}, num_clients, node_configs, write=False)
    out = Path(given).resolve() if given else default_out_dir(strategy, dataset_label(dataset)).resolve()
    raw["out-dir"] = str(out)
    try:
        return _run(engine, raw, num_clients, node_configs)
    except BaseException:
        if not given:  # the directory claimed for this run, left empty by a failed run
            with contextlib.suppress(OSError):
                out.rmdir()
        if note and (out / JOURNAL / MANIFEST).exists():
            note(f"the run's journal is in {out}: the same command with --resume {out} continues it")
        raise


def _validated_with_absolute_paths(raw: dict) -> RunConfig:
    """``raw`` validated; a dataset given by path and its ``data.node-table`` made absolute in ``raw``
    and in the config."""
    config = registry.validate(raw)
    dataset = raw["dataset"]
    if is_builtin(dataset) or dataset == PARTIES or memory.is_memory(dataset):
        return config
    raw["dataset"] = absolute_dataset(dataset)
    node_table = config["data.node-table"]
    if node_table:
        raw["data.node-table"] = str(Path(node_table).expanduser().resolve())
    return registry.validate(raw)


def _run(engine: str, raw: dict, num_clients: int, node_configs=None, write: bool = True) -> dict:
    """The checked run ``raw`` on ``engine``; its result dict (``write``: :func:`run_experiment`)."""
    if engine == "inprocess":
        from app.client_app import build_client_app
        from app.inprocess import InProcessGrid
        from app.server_app import run_server

        return run_server(InProcessGrid(build_client_app(raw), num_clients, node_configs), raw, write=write,
                          announce=False)

    from app.client_app import build_client_app
    from app.engine import simulate
    from app.server_app import build_server_app

    path = Path(raw["out-dir"]) / RESULT_FILE  # none before the run (check_out_dir), nor another's after it
    errors: list[Exception] = []
    with quiet.simulation_engine():
        simulate(lambda watch: build_server_app(raw, errors, watch, announce=False), build_client_app(raw), num_clients)
    if errors:
        raise errors[0]
    if not path.exists():
        raise ProtocolError(f"the simulation finished without writing {path}; see the log above")
    result = json.loads(path.read_text())
    result["path"] = str(path)
    report = path.parent / REPORT_FILE
    result["report"] = str(report) if report.exists() else None
    return result


def _check_against_data(config, num_clients: int):
    """Load and split the data once in this process, before any engine starts (the in-process
    clients reuse both), and return it: data without what the strategy uses (a dataset given by
    path is checked here, a built-in already by the config), a split the data does not allow
    (more clients than nodes, columns or graphs, ...), more clusters than items or an eval-file
    of other data is a one-line config error, not client errors or a result scored against the
    wrong labels."""
    from app.client_app import node_shard
    from fedgraphcore.data.datasets import DataProfile
    from fedgraphcore.data.evaluation import check_evaluation
    from fedgraphcore.data.shards import server_data
    from fedgraphcore.data.types import GraphCollection

    shared = SharedConfig.of(config)
    data = server_data(shared.dataset, data_root(config), shared.seed, dataset_kwargs(config.as_dict()))
    registry.get(shared.strategy).strategy.check_data(config, DataProfile.of(data))
    node_shard(config, {"partition-id": 0, "num-partitions": num_clients})
    items, what = ((data.num_graphs, "graphs") if isinstance(data, GraphCollection)
                   else (data.num_nodes, "nodes"))
    if shared.eval_file:
        check_evaluation(shared.eval_file, data)
    if shared.partitioner != "khop" and shared.num_clusters > items:
        classes = f"0 (its {data.num_classes} classes) or 1" if data.num_classes else "1"  # 0: only with labels
        raise ConfigError(f"num-clusters={config['num-clusters']} exceeds the {items} {what} of dataset "
                          f"{memory.shown(config['dataset'])}; valid: {classes} to {items}")
    return data


def _check_parties(config, node_configs) -> list[str]:
    """A run on the parties' own data: every party's data is read, turned into its shard and
    checked against the strategy here first (the in-process clients reuse them), so a piece the
    split or the method cannot use, or an out-dir it cannot write, is a one-line config error
    naming it before the run (a party's client tells the server only which rule failed). Returns the
    readers' notes."""
    from app.client_app import check_party_data, check_party_out_dir
    from fedgraphcore.data.parties import OUT_KEY, party_node_shard

    if node_configs is None:
        raise ConfigError(f"dataset={PARTIES!r} needs parties that bring their own data: deployed SuperNodes with "
                          "node config data=PATH, or app.cluster(strategy, [piece, ...]) in Python; valid here: a "
                          "dataset name or file")
    notes = []
    for i, node_config in enumerate(node_configs):
        party_node_shard(config.as_dict(), node_config, int(node_config.get("partition-id", i)), len(node_configs))
        notes += check_party_data(config, node_config)
        if node_config.get(OUT_KEY):
            check_party_out_dir(str(node_config[OUT_KEY]))
    return notes


def _flag_or_set(flag: str, given, overrides: dict[str, str], key: str, default=None):
    """The value of option ``flag`` or of ``--set key=...``, else ``default`` (an empty value is
    a value: validation refuses it); both given is an error."""
    if given is not None and key in overrides:
        raise ConfigError(f"{flag} {given} and --set {key}={overrides[key]} both given; valid: one of them")
    return given if given is not None else overrides.pop(key, default)


def _simulated_clients(given: int | None) -> int:
    """The clients to simulate: ``given``, :data:`DEFAULT_NUM_CLIENTS` when not given. 0 (the
    run-config's "every connected SuperNode" in a deployment) counts nothing here: an error."""
    if given == 0:
        raise ConfigError(f"num-clients=0 means every connected SuperNode in a deployment; a simulation has none to "
                          f"count; valid: 1 to 1024 (default {DEFAULT_NUM_CLIENTS})")
    return DEFAULT_NUM_CLIENTS if given is None else given


def _resumed_out(resume: str, out: str | None, overrides: dict) -> str:
    """``--resume OUT``: the run's out-dir, ``resume=true`` set in ``overrides``; another --out is an error."""
    if out is not None and Path(out).resolve() != Path(resume).resolve():
        raise ConfigError(f"--resume {resume} and out-dir {out} both given; valid: --resume OUT alone (the result "
                          "goes to OUT)")
    overrides["resume"] = "true"
    return resume


COMMANDS = ("list (strategies and datasets), describe [STRATEGY] (its keys), compare --dataset D (every strategy "
            "that fits D: python -m app.run compare --help); none: run")


def _parser() -> ArgumentParser:
    parser = ArgumentParser(prog="python -m app.run", add_help=False, description=(
        "Run one federated clustering experiment on Flower's simulation engine, beside the centralised method "
        "it approximates, and write OUT/result.json."))
    parser.add_argument("command", nargs="*", help=COMMANDS)
    parser.add_argument("-h", "--help", action="store_true",
                        help="this help; with --strategy S: S's description and every key it reads")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also show what Flower, Ray and torch print (left out by default)")
    parser.add_argument("--strategy", default=None, help="one of: " + ", ".join(registry.STRATEGIES))
    parser.add_argument("--dataset", default=None,
                        help="one of the datasets listed below, or the path of a graph file or directory (docs/data.md)")
    parser.add_argument("--num-clients", type=int, default=None,
                        help=f"simulated clients (default {DEFAULT_NUM_CLIENTS})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="any run-config key, e.g. --set seed=3 (repeatable; describe STRATEGY lists them)")
    parser.add_argument("--out", default=None, help="directory for result.json")
    parser.add_argument("--resume", default=None, metavar="OUT",
                        help="continue the interrupted run in OUT (same strategy, dataset and --set values) from "
                             "its journal: the steps it completed are not sent again")
    parser.add_argument("--engine", default="simulation", help="simulation (Flower, default) or inprocess")
    return parser


def _explain(parser: ArgumentParser, args, overrides: dict[str, str]) -> str:
    """The text of ``--help``, ``list`` or ``describe [STRATEGY]``."""
    from app import describe

    if not args.command and not args.strategy:
        return parser.format_help() + "\n" + describe.overview()
    command, *names = args.command or ["describe"]
    if command == "list" and not names:
        return describe.overview()
    if command == "describe" and len(names) <= 1:
        strategy = names[0] if names else args.strategy
        if strategy is None:
            raise ConfigError("describe needs a strategy; valid choices: " + ", ".join(registry.STRATEGIES))
        registry.get(strategy)  # a one-line error for an unknown name
        return describe.strategy_help(strategy, args.dataset, overrides.get("partitioner", "auto"))
    raise ConfigError(f"unknown command {' '.join(args.command)!r}; valid: {COMMANDS}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["compare"]:
        from app.comparison import main as compare

        return compare(argv[1:], run_experiment)
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        overrides = parse_assignments(args.set)
        if args.help or args.command:
            print(_explain(parser, args, overrides))
            return 0
        quiet.set_verbose(args.verbose)
        schema = registry.schema()
        defaults = schema.defaults()
        strategy = _flag_or_set("--strategy", args.strategy, overrides, "strategy", defaults["strategy"])
        dataset = _flag_or_set("--dataset", args.dataset, overrides, "dataset", defaults["dataset"])
        clients = _flag_or_set("--num-clients", args.num_clients, overrides, "num-clients")
        num_clients = _simulated_clients(schema.params["num-clients"].coerce(clients) if clients is not None else None)
        out = _flag_or_set("--out", args.out, overrides, "out-dir")
        if args.resume is not None:
            out = _resumed_out(args.resume, out, overrides)
        config = registry.validate({**overrides, "strategy": strategy, "dataset": dataset})
        for key in registry.unused_keys(config, overrides):
            print(f"warning: --set {key} has no effect with strategy '{strategy}', dataset '{dataset}' and "
                  f"partitioner '{config['partitioner']}'", file=sys.stderr)
        result = run_experiment(strategy, dataset, num_clients, overrides, out, args.engine,
                                note=lambda text: print(f"note: {text}", file=sys.stderr))
    except FedGraphError as err:  # a setting to fix (2) or a run that stopped without a result (1)
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except ValueError as err:  # a value argparse or a reader refused
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line (the note above names the journal where the run keeps one)
        print("error: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    print(f"result: {result['path']}")
    if result.get("report"):
        print(f"report: {result['report']}")
    elif result["config"].get("report", True):
        print("report: none (see the warning above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
