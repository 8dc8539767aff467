"""``python -m deploy local``: one strategy on a real local deployment.

Creates certificates and SuperNode keys, cuts the dataset into one shard file
per SuperNode (plus the server's evaluation file), starts a TLS SuperLink with
SuperNode authentication and N authenticated SuperNodes, runs the strategy with
``flwr run``, then stops every process. Example::

    python -m deploy local --nodes 3 --strategy fedkmeans --dataset sbm \\
        --out results/deploy-sbm

``result.json`` lands in ``OUT/result``, logs of every process in ``OUT``; the
summary printed at the end is ``python -m app.run``'s. Certificates and keys exist
only in a private temporary directory while the federation runs.

``python -m deploy superlink start|status|stop``: your own local SuperLink for
``flwr run .`` (see :mod:`deploy.superlink`).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from app import registry
from app.config import ConfigError
from app.data import prepare
from app.result import summary_table
from deploy import superlink
from deploy.federation import LocalFederation
from deploy.pki import make_all

REPO = Path(__file__).resolve().parents[1]


def run_local(nodes: int, strategy: str, dataset: str, partitioner: str, sets: list[str], out: Path,
              timeout: float = 900.0) -> Path:
    """Run one deployed experiment; return the path of its result.json. ``partitioner``
    ``auto``: the strategy's own. The run-config is checked before anything starts.

    The certificates and keys live in a private temporary directory (mode 0700) for the
    run and are deleted with it; the CA's private key is never written (it signs this
    run's certificates in memory). ``OUT`` holds the shards, the server's evaluation file
    (the pooled data, so that the server runs the centralised reference, unless
    ``reference=false``), the logs and ``OUT/result``."""
    out = out.resolve()
    shards, result_dir, eval_file = out / "shards", out / "result", out / "eval.npz"
    run_config = {"strategy": strategy, "dataset": dataset, "partitioner": partitioner,
                  "num-clients": nodes, "eval-file": str(eval_file), "reference": True, "out-dir": str(result_dir)}
    for item in sets:
        key, _, value = item.partition("=")
        run_config[key] = value
    config = registry.validate(run_config)
    partitioner = run_config["partitioner"] = config["partitioner"]
    data_sets = [s for s in sets if s.split("=", 1)[0].startswith(("sbm.", "circles.", "partition.", "khop."))]
    prepare.run(["--dataset", dataset, "--partitioner", partitioner, "--num-clients", str(nodes),
                 "--out", str(shards), "--eval-file", str(eval_file), "--eval-graph",
                 "--eval-contents", "full" if config["reference"] else "labels-only",
                 *sum((["--set", s] for s in data_sets), [])])
    with tempfile.TemporaryDirectory(prefix="fedgraph-pki-") as pki:
        make_all(Path(pki), nodes, keep_ca_key=False)
        with LocalFederation(out, Path(pki)) as federation:
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
    print(summary_table(json.loads(path.read_text())))
    print(f"result: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
