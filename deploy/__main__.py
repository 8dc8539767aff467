"""``python -m deploy local``: one strategy on a real local deployment.

Creates certificates and SuperNode keys, cuts the dataset into one shard file
per SuperNode (plus the server's labels-only evaluation file), starts a TLS
SuperLink with SuperNode authentication and N authenticated SuperNodes, runs
the strategy with ``flwr run``, then stops every process. Example::

    python -m deploy local --nodes 3 --strategy fedkmeans --dataset karate \\
        --out results/deploy-karate

``result.json`` lands in ``OUT/result``; logs of every process in ``OUT``.

With ``--parties DIR`` (folders ``party-0``, ``party-1``, ... in the user file
format, e.g. from ``python -m app.data.prepare --format files``) nothing is
cut: SuperNode i gets node config ``data='DIR/party-i' partition-id=i
out-dir='OUT/party-i'`` and the run uses ``dataset='parties'``; each party's
``labels.csv`` lands in ``OUT/party-i``::

    python -m deploy local --parties parties/ --strategy kcagc --set num-clusters=4 \
        --out results/deploy-parties
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app import registry
from app.config import ConfigError, parse_assignments
from app.data import prepare
from app.data.parties import PARTIES
from deploy.federation import LocalFederation, toml_value
from deploy.pki import make_all

REPO = Path(__file__).resolve().parents[1]


def run_local(nodes: int, strategy: str, dataset: str, partitioner: str, sets: list[str], out: Path,
              timeout: float = 900.0) -> Path:
    """Run one deployed experiment; return the path of its result.json. ``partitioner``
    ``auto``: the strategy's own. The run-config is checked before anything starts."""
    out = out.resolve()
    shards, result_dir = out / "shards", out / "result"
    run_config = {"strategy": strategy, "dataset": dataset, "partitioner": partitioner,
                  "num-clients": nodes, "eval-file": str(out / "eval.npz"), "reference": False,
                  "out-dir": str(result_dir)}
    for item in sets:
        key, _, value = item.partition("=")
        run_config[key] = value
    partitioner = run_config["partitioner"] = registry.validate(run_config)["partitioner"]
    data_sets = [s for s in sets if s.split("=", 1)[0].startswith(("sbm.", "circles.", "partition.", "khop."))]
    prepare.run(["--dataset", dataset, "--partitioner", partitioner, "--num-clients", str(nodes),
                 "--out", str(shards), "--eval-file", str(out / "eval.npz"), "--eval-graph",
                 *sum((["--set", s] for s in data_sets), [])])
    return _deploy(out, run_config, [f"shard='{shards / f'client-{i}.npz'}'" for i in range(nodes)], timeout)


def party_folders(parties: Path) -> list[Path]:
    """The folders ``party-0`` ... ``party-<n-1>`` of ``parties`` (a one-line ConfigError otherwise)."""
    found = {p.name: p for p in Path(parties).glob("party-*") if p.is_dir()}
    folders = [found.get(f"party-{i}") for i in range(len(found))]
    if not found or None in folders:
        raise ConfigError(f"--parties {str(parties)!r} holds {sorted(found) or 'no party folders'}; valid: folders "
                          "party-0 .. party-<n-1> (python -m app.data.prepare --format files writes them)")
    return [f.resolve() for f in folders]


def run_local_parties(parties: Path, strategy: str, partitioner: str, sets: list[str], out: Path,
                      read: list[str] = (), timeout: float = 900.0) -> Path:
    """Run ``strategy`` on a local deployment whose SuperNode i holds only ``parties/party-i``
    (``dataset='parties'``, partition id i; ``read``: reader options, ``KEY=VALUE``, as node config
    ``read.KEY``); return the path of its result.json. Each party's files are checked as
    ``python -m app.data.check`` does before anything starts; its labels.csv goes to ``OUT/party-i``."""
    from app.data.check import check_party

    out = out.resolve()
    folders = party_folders(parties)
    run_config = {"strategy": strategy, "dataset": PARTIES, "partitioner": partitioner, "num-clients": len(folders),
                  "out-dir": str(out / "result"), **parse_assignments(sets)}
    config = registry.validate(run_config)
    run_config["partitioner"] = config["partitioner"]
    options = {f"read.{k}": v for k, v in parse_assignments(list(read)).items()}
    for folder in folders:
        check_party(str(folder), config.as_dict(), {k[len("read."):]: v for k, v in options.items()})
    node_configs = [" ".join(f"{k}={toml_value(v)}" for k, v in {"data": str(folder), "partition-id": i,
                                                                   "out-dir": str(out / f"party-{i}"),
                                                                   **options}.items())
                    for i, folder in enumerate(folders)]
    return _deploy(out, run_config, node_configs, timeout)


def _deploy(out: Path, run_config: dict, node_configs: list[str], timeout: float) -> Path:
    """Certificates, a TLS SuperLink, one authenticated SuperNode per node config, ``flwr run``;
    the path of the run's result.json."""
    pki, result_dir = out / "pki", Path(run_config["out-dir"])
    make_all(pki, len(node_configs))
    with LocalFederation(out, pki) as federation:
        federation.start_superlink()
        federation.start_configured_nodes(node_configs)
        proc = federation.run_app(REPO, run_config, timeout=timeout)
        (out / "flwr-run.log").write_text(proc.stdout + proc.stderr)
    path = result_dir / "result.json"
    if not path.exists():
        raise RuntimeError(f"the deployed run wrote no result; see {out / 'flwr-run.log'}")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    local = sub.add_parser("local", help="run one strategy on a local TLS deployment")
    local.add_argument("--nodes", type=int, default=3)
    local.add_argument("--strategy", default="fedkmeans")
    local.add_argument("--dataset", default="karate")
    local.add_argument("--partitioner", default="auto", help="auto: the strategy's own")
    local.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    local.add_argument("--out", type=Path, required=True)
    local.add_argument("--parties", type=Path, default=None,
                       help="folders party-0, party-1, ... of the parties' own data (dataset='parties'; "
                            "--nodes and --dataset are not used)")
    local.add_argument("--read", action="append", default=[], metavar="KEY=VALUE",
                       help="with --parties: a reader option for every party (node config read.KEY)")
    args = parser.parse_args(argv)
    try:
        if args.parties is not None:
            path = run_local_parties(args.parties, args.strategy, args.partitioner, args.set, args.out, args.read)
        else:
            path = run_local(args.nodes, args.strategy, args.dataset, args.partitioner, args.set, args.out)
    except (ConfigError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"result: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
