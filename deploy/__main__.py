"""``python -m deploy local``: one strategy on a real local deployment.

Creates certificates and SuperNode keys, cuts the dataset into one shard file
per SuperNode (plus the server's labels-only evaluation file), starts a TLS
SuperLink with SuperNode authentication and N authenticated SuperNodes, runs
the strategy with ``flwr run``, then stops every process. Example::

    python -m deploy local --nodes 3 --strategy fedkmeans --dataset karate \\
        --out results/deploy-karate

``result.json`` lands in ``OUT/result``; logs of every process in ``OUT``.

``python -m deploy superlink start|status|stop``: your own local SuperLink for
``flwr run .`` (see :mod:`deploy.superlink`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from app import registry
from app.config import ConfigError
from app.data import prepare
from deploy import superlink
from deploy.federation import LocalFederation
from deploy.pki import make_all

REPO = Path(__file__).resolve().parents[1]


def run_local(nodes: int, strategy: str, dataset: str, partitioner: str, sets: list[str], out: Path,
              timeout: float = 900.0) -> Path:
    """Run one deployed experiment; return the path of its result.json. ``partitioner``
    ``auto``: the strategy's own. The run-config is checked before anything starts."""
    out = out.resolve()
    pki, shards, result_dir = out / "pki", out / "shards", out / "result"
    run_config = {"strategy": strategy, "dataset": dataset, "partitioner": partitioner,
                  "num-clients": nodes, "eval-file": str(out / "eval.npz"), "reference": False,
                  "out-dir": str(result_dir)}
    for item in sets:
        key, _, value = item.partition("=")
        run_config[key] = value
    partitioner = run_config["partitioner"] = registry.validate(run_config)["partitioner"]
    make_all(pki, nodes)
    data_sets = [s for s in sets if s.split("=", 1)[0].startswith(("sbm.", "circles.", "partition.", "khop."))]
    prepare.run(["--dataset", dataset, "--partitioner", partitioner, "--num-clients", str(nodes),
                 "--out", str(shards), "--eval-file", str(out / "eval.npz"), "--eval-graph",
                 *sum((["--set", s] for s in data_sets), [])])
    with LocalFederation(out, pki) as federation:
        federation.start_superlink()
        federation.start_nodes([shards / f"client-{i}.npz" for i in range(nodes)])
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
    link = sub.add_parser("superlink", help="start, check or stop your own local SuperLink for flwr run")
    link.add_argument("action", choices=("start", "status", "stop"))
    link.add_argument("--timeout", type=float, default=None,
                      help=f"seconds to wait for it to answer (start, default {superlink.START_TIMEOUT_S:g}) or "
                           f"to end before it is killed (stop, default {superlink.STOP_TIMEOUT_S:g})")
    args = parser.parse_args(argv)
    if args.command == "superlink":
        return superlink.main(args.action, args.timeout)
    try:
        path = run_local(args.nodes, args.strategy, args.dataset, args.partitioner, args.set, args.out)
    except (ConfigError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"result: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
