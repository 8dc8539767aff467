"""``python -m deploy``: deployment commands.

``local``: one strategy on a real local deployment. Creates certificates,
SuperNode keys and the app signing key, signs the app, cuts the dataset into
one shard file per SuperNode (plus the server's evaluation file), starts a TLS
SuperLink on loopback with SuperNode authentication, the Fleet gateway (the
only port SuperNodes use) and N authenticated SuperNodes that run only the
signed app, runs the strategy with ``flwr run``, then stops every process.
Example::

    python -m deploy local --nodes 3 --strategy fedkmeans --dataset sbm \\
        --out results/deploy-sbm

``result.json`` lands in ``OUT/result``, logs of every process in ``OUT``, the
app's files that are signed and run in ``OUT/app`` (:func:`deploy.bundle.stage_app`); the
summary printed at the end is ``python -m app.run``'s. Certificates and keys exist
only in a private temporary directory while the federation runs. ``--netns``
(root): the SuperLink host and each SuperNode in a network namespace of its own
(:mod:`deploy.netns`), the SuperNodes reaching only the gateway's address;
``--latency-ms MS`` delays every SuperNode's link MS each way (:mod:`deploy.faults`).

``superlink start|status|stop``: your own local SuperLink for ``flwr run .``
(see :mod:`deploy.superlink`).
``keygen --out DIR``: an app signing key pair (``DIR/app-signing``, ``.pub``), the private
key created with mode 0600 in a directory only its owner can write.
``sign [--app DIR] --key KEY --signatures DIR``: sign the app ``flwr run DIR`` submits (default:
the installed app, the bundle ``flwr run .`` builds in a checkout).
``stage --out DIR``: the installed app's files in ``DIR/app`` (what ``sign`` and ``run`` use).
``run [APP] --run-config ...``: submit a run, follow it, and exit non-zero naming why when it
produced no result (see :mod:`deploy.submit` for the exit codes).
``trust --out FILE KEY.pub ... [--min-version V] [--pin SHA256] [--revoke SHA256]``: a SuperNode's
``--trusted-entities`` file, with the member's rules on which signed versions run
(:mod:`deploy.app_versions`).
``roster --out FILE NAME.pub ...``: the members' roster (node config ``roster``) from their identity
keys (``keygen --name NAME``).
``gateway ...``: the Fleet gateway (see :mod:`deploy.gateway`).
``faults --listen HOST:PORT --upstream HOST:PORT ...``: a proxy adding latency, resets and
failed answers (see :mod:`deploy.faults`).

With ``--parties DIR`` (folders ``party-0``, ``party-1``, ... in the user file
format, e.g. from ``python -m app.data.prepare --format files``) nothing is
cut: SuperNode i gets node config ``data='DIR/party-i' partition-id=i
out-dir='OUT/party-i'`` and the run uses ``dataset='parties'``; each party's
``labels.csv`` lands in ``OUT/party-i/run-<run id>``::

    python -m deploy local --parties parties/ --strategy kcagc --set num-clusters=4 \
        --out results/deploy-parties
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from fedgraphcore.config import ConfigError, parse_assignments
from fedgraphcore.errors import FedGraphError
from deploy import faults, submit, superlink
from deploy.app_versions import app_versions
from deploy.bundle import stage_app
from deploy.federation import SUPERLINK_WAIT_S, LocalFederation, toml_value
from deploy.netns import check_options, separate
from deploy.pki import make_all
from deploy.signing import make_signing_key, sign_app, write_roster, write_trusted_entities

#: written next to the run's logs: seconds to start the federation (up to every SuperNode ready)
#: and seconds of ``flwr run`` (submitting the app bundle to the result)
RUN_TIMING = "run-timing.json"


def run_local(nodes: int, strategy: str, dataset: str, partitioner: str, sets: list[str], out: Path,
              timeout: float | None = None, netns: bool = False, latency_ms: float = 0.0) -> Path:
    """Run one deployed experiment; return the path of its result.json. ``partitioner``
    ``auto``: the strategy's own. The run-config is checked before anything starts.

    The certificates and keys live in a private temporary directory (mode 0700) for the
    run and are deleted with it; the CA's private key is never written (it signs this
    run's certificates in memory). ``OUT`` holds the shards, the server's evaluation file
    (the pooled data, so that the server runs the centralised reference, unless
    ``reference=false``), the logs and ``OUT/result``. ``timeout``: seconds after which ``flwr run``
    is stopped (None: no limit; the run bounds each step with its ``timeout`` key and ends by
    itself). ``netns``: every host in a network namespace
    of its own (:mod:`deploy.netns`), ``latency_ms`` added each way on every SuperNode's link."""
    from app import registry  # here, not at the top: ``python -m deploy gateway`` needs none of the app
    from fedgraphcore.data import prepare
    from fedgraphcore.data.datasets import absolute_dataset

    out = out.resolve()
    dataset = absolute_dataset(dataset)  # the ServerApp runs in another folder: a relative path would miss
    shards, result_dir, eval_file = out / "shards", out / "result", out / "eval.npz"
    run_config = {"strategy": strategy, "dataset": dataset, "partitioner": partitioner,
                  "num-clients": nodes, "eval-file": str(eval_file), "reference": True, "out-dir": str(result_dir)}
    for item in sets:
        key, _, value = item.partition("=")
        run_config[key] = value
    if run_config.get("data.node-table"):
        run_config["data.node-table"] = absolute_dataset(str(run_config["data.node-table"]))
    config = registry.validate(run_config)
    partitioner = run_config["partitioner"] = config["partitioner"]
    data_sets = [f"{k}={v}" for k, v in run_config.items() if k.startswith(("sbm.", "circles.", "partition.", "khop.",
                                                                           "data."))]
    prepare.run(["--dataset", dataset, "--partitioner", partitioner, "--num-clients", str(nodes),
                 "--out", str(shards), "--eval-file", str(eval_file), "--eval-graph",
                 "--eval-contents", "full" if config["reference"] else "labels-only",
                 *sum((["--set", s] for s in data_sets), [])])
    return _deploy(out, run_config, [f"shard='{shards / f'client-{i}.npz'}'" for i in range(nodes)], timeout,
                   netns, latency_ms)


def party_folders(parties: Path) -> list[Path]:
    """The folders ``party-0`` ... ``party-<n-1>`` of ``parties`` (a one-line ConfigError otherwise)."""
    found = {p.name: p for p in Path(parties).glob("party-*") if p.is_dir()}
    folders = [found.get(f"party-{i}") for i in range(len(found))]
    if not found or None in folders:
        raise ConfigError(f"--parties {str(parties)!r} holds {sorted(found) or 'no party folders'}; valid: folders "
                          "party-0 .. party-<n-1> (python -m app.data.prepare --format files writes them)")
    return [f.resolve() for f in folders]


def run_local_parties(parties: Path, strategy: str, partitioner: str, sets: list[str], out: Path,
                      read: list[str] = (), timeout: float | None = None, netns: bool = False,
                      latency_ms: float = 0.0) -> Path:
    """Run ``strategy`` on a local deployment whose SuperNode i holds only ``parties/party-i``
    (``dataset='parties'``, partition id i; ``read``: reader options, ``KEY=VALUE``, as node config
    ``read.KEY``); return the path of its result.json. Each party's files are checked as
    ``python -m app.data.check`` does before anything starts; its labels.csv goes to ``OUT/party-i/run-<run id>``."""
    from app import registry
    from fedgraphcore.data.check import check_party
    from fedgraphcore.data.parties import PARTIES

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
    return _deploy(out, run_config, node_configs, timeout, netns, latency_ms)


def _deploy(out: Path, run_config: dict, node_configs: list[str], timeout: float | None, netns: bool = False,
            latency_ms: float = 0.0) -> Path:
    """Certificates and the app signing key (in a private temporary directory), a TLS SuperLink
    with the Fleet gateway, one authenticated SuperNode per node config running only the signed
    app, ``flwr run``; the path of the run's result.json. ``netns``: SuperLink host and SuperNodes
    in network namespaces of their own (:func:`deploy.netns.separate`); ``latency_ms``: the
    SuperNodes dial the gateway through :mod:`deploy.faults` delaying every chunk that much each way."""
    started = time.monotonic()
    result_dir = Path(run_config["out-dir"])
    app_dir = stage_app(out)
    with tempfile.TemporaryDirectory(prefix="fedgraph-pki-") as pki_dir, separate(len(node_configs), netns) as network:
        pki = Path(pki_dir)
        make_all(pki, len(node_configs), [network.link_host] if network else [], keep_ca_key=False)
        signing_key, signing_public = make_signing_key(pki)
        trusted = write_trusted_entities([signing_public], pki / "trusted-entities.yaml")
        sign_app(app_dir, signing_key, pki / "signatures")
        node_configs = with_members(pki, node_configs)
        with LocalFederation(out, pki, network=network) as federation:
            # latency: a TCP relay on the SuperLink host, every SuperNode's link delayed each way
            federation.start_federation(pki / "signatures", node_configs, trusted,
                                        faults.Faults(latency_s=latency_ms / 1000) if latency_ms else None)
            federation.wait_until_ready([f"supernode-{i}" for i in range(len(node_configs))])
            ready = time.monotonic()
            try:
                proc = federation.run_app(app_dir, run_config, timeout=timeout)
            except subprocess.TimeoutExpired as expired:
                (out / "flwr-run.log").write_text(_text(expired.stdout) + _text(expired.stderr))
                raise RuntimeError(f"the deployed run was stopped after its limit of {timeout:g} s; see "
                                   f"{out / 'flwr-run.log'}") from None
            (out / "flwr-run.log").write_text(proc.stdout + proc.stderr)
            ended = federation.ended()
            (out / RUN_TIMING).write_text(json.dumps({"federation_start_s": ready - started,
                                                      "flwr_run_s": time.monotonic() - ready}))
    path = result_dir / "result.json"
    if not path.exists():
        raise RuntimeError(f"the deployed run wrote no result{_ended_processes(out, ended)}; see "
                           f"{out / 'flwr-run.log'}")
    return path


def with_members(pki: Path, node_configs: list[str]) -> list[str]:
    """The node configs with each node a member of the federation: an identity key of its own
    (``member-<i>`` in the key directory ``pki``) and the roster of every member's public key
    (:mod:`fedgraphcore.privacy.roster`), as each member would hold them on its own machine."""
    keys = [make_signing_key(pki, f"member-{i}") for i in range(len(node_configs))]
    roster = write_roster([public for _, public in keys], pki / "roster.yaml")
    return [f"{config} identity-key={toml_value(str(private))} roster={toml_value(str(roster))}"
            for config, (private, _) in zip(node_configs, keys)]


def _text(output: bytes | str | None) -> str:
    """What a stopped process wrote (bytes when it was stopped mid-line), as text."""
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def _ended_processes(out: Path, ended: dict[str, int]) -> str:
    """What ended during the run, for the error line: the SuperLink (its runs are lost: it keeps them
    in memory; the SuperNodes give up reconnecting after ``SUPERLINK_WAIT_S``) or SuperNodes."""
    if "superlink" in ended:
        return (f": the SuperLink ended mid-run (exit code {ended['superlink']}, log {out / 'superlink.log'}); its "
                f"runs are lost with it, and the SuperNodes stop reconnecting after {SUPERLINK_WAIT_S:g} s; start "
                "the deployment again")
    if ended:
        return ": these processes ended mid-run: " + ", ".join(f"{n} (exit code {c}, log {out / (n + '.log')})"
                                                              for n, c in sorted(ended.items()))
    return ""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m deploy", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_local(sub)
    link = sub.add_parser("superlink", help="start, check or stop your own local SuperLink for flwr run")
    link.add_argument("action", choices=("start", "status", "stop"))
    link.add_argument("--timeout", type=float, default=None,
                      help=f"seconds to wait for it to answer (start, default {superlink.START_TIMEOUT_S:g}) or "
                           f"to end before it is killed (stop, default {superlink.STOP_TIMEOUT_S:g})")
    _add_signing(sub)
    _add_run(sub)
    gateway = sub.add_parser("gateway", help="serve the Fleet API of a loopback SuperLink, nothing else")
    gateway.add_argument("--listen", required=True, metavar="HOST:PORT", help="where SuperNodes connect")
    gateway.add_argument("--superlink", required=True, metavar="HOST:PORT", help="the SuperLink (loopback)")
    gateway.add_argument("--ca", type=Path, required=True, help="ca.crt, to check the SuperLink")
    gateway.add_argument("--cert", type=Path, required=True, help="certificate presented to SuperNodes")
    gateway.add_argument("--key", type=Path, required=True, help="its private key")
    gateway.add_argument("--signatures", type=Path, required=True, help="directory of app signatures")
    gateway.add_argument("--nodes", type=int, default=1, metavar="N",
                         help="the federation's SuperNodes: their bodies are budgeted for N pushing at once "
                              "(default 1: 64 MiB)")
    gateway.add_argument("--shared-address", action="append", default=[], metavar="ADDRESS=N",
                         help="N SuperNodes reach the gateway from ADDRESS (one machine, a NAT): that address, and "
                              "no other, may open N times one's connections (repeatable)")
    faults.add_parser(sub)
    return parser


def _add_local(sub) -> None:
    """The ``local`` command's options."""
    local = sub.add_parser("local", help="run one strategy on a local TLS deployment")
    local.add_argument("--nodes", type=int, default=3)
    local.add_argument("--strategy", default="fedkmeans")
    local.add_argument("--dataset", default="karate")
    local.add_argument("--partitioner", default="auto", help="auto: the strategy's own")
    local.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    local.add_argument("--out", type=Path, default=None, help="the run's folder (required unless --resume)")
    local.add_argument("--resume", type=Path, default=None, metavar="OUT",
                       help="continue the interrupted run in OUT from its journal (same options otherwise)")
    local.add_argument("--parties", type=Path, default=None,
                       help="folders party-0, party-1, ... of the parties' own data (dataset='parties'; "
                            "--nodes and --dataset are not used)")
    local.add_argument("--read", action="append", default=[], metavar="KEY=VALUE",
                       help="with --parties: a reader option for every party (node config read.KEY)")
    local.add_argument("--netns", action="store_true",
                       help="the SuperLink host and each SuperNode in a network namespace of its own (root)")
    local.add_argument("--latency-ms", type=float, default=0.0,
                       help="with --netns: milliseconds added each way on every SuperNode's link")


def _add_signing(sub) -> None:
    """The ``keygen``, ``sign`` and ``trust`` commands' options."""
    keygen = sub.add_parser("keygen", help="create an app signing key pair (Ed25519, OpenSSH format)")
    keygen.add_argument("--out", type=Path, required=True)
    keygen.add_argument("--name", default="app-signing")
    sign = sub.add_parser("sign", help="sign the app that `flwr run APP` submits")
    sign.add_argument("--app", type=Path, default=None, help="the app folder (default: the installed app)")
    sign.add_argument("--key", type=Path, required=True, help="the signer's private key")
    sign.add_argument("--signatures", type=Path, required=True, help="the directory the gateway reads")
    stage = sub.add_parser("stage", help="copy the installed app's files (what sign and run use) to DIR/app")
    stage.add_argument("--out", type=Path, required=True)
    trust = sub.add_parser("trust", help="write a SuperNode's --trusted-entities file")
    trust.add_argument("--out", type=Path, required=True)
    trust.add_argument("public_keys", type=Path, nargs="+", metavar="KEY.pub")
    trust.add_argument("--min-version", help="refuse app bundles of a lower version (their pyproject's)")
    trust.add_argument("--pin", action="append", metavar="SHA256", help="run only these app bundles (repeatable)")
    trust.add_argument("--revoke", action="append", default=[], metavar="SHA256",
                       help="never run this app bundle (repeatable)")
    roster = sub.add_parser("roster", help="write the members' roster (node config 'roster') from their identity keys")
    roster.add_argument("--out", type=Path, required=True)
    roster.add_argument("public_keys", type=Path, nargs="+", metavar="NAME.pub")


def _add_run(sub) -> None:
    """The ``run`` command's options (:mod:`deploy.submit`)."""
    run = sub.add_parser("run", help="submit a run, follow it, exit non-zero naming why it produced no result",
                         description=submit.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("app", nargs="?", type=Path, default=None, help="the app folder (default: the installed app)")
    run.add_argument("--connection", default=None,
                     help="the SuperLink connection in $FLWR_HOME/config.toml (default: its default)")
    run.add_argument("--run-config", action="append", default=[], metavar="'KEY=VALUE ...'",
                     help="as flwr run --run-config; out-dir='/abs/path' is required")
    run.add_argument("--federation", default=None, help="as flwr run --federation")
    run.add_argument("--timeout", type=float, default=None,
                     help="stop following after this many seconds (the run goes on; exit code 11)")


def _sign(args) -> None:
    """``sign``: the app folder given, or the installed app staged in a temporary folder."""
    if args.app is not None:
        digest = sign_app(args.app, args.key, args.signatures)
        print(f"signed the app in {args.app.resolve()}: FAB sha256 {digest}")
        return
    with tempfile.TemporaryDirectory(prefix="fedgraph-app-") as tmp:
        digest = sign_app(stage_app(Path(tmp)), args.key, args.signatures)
    print(f"signed the installed app: FAB sha256 {digest}")


def _run_command(args) -> None:
    """Run the command ``args`` name (every one but ``superlink``)."""
    if args.command == "keygen":
        private, public = make_signing_key(args.out, args.name)
        print(f"signing key: {private} (keep it with the signer); public key: {public}")
    elif args.command == "sign":
        _sign(args)
    elif args.command == "stage":
        print(f"the app's files: {stage_app(args.out)}")
    elif args.command == "trust":
        versions = (app_versions(args.min_version, args.pin, args.revoke)
                    if args.min_version or args.pin or args.revoke else None)
        print(f"trusted entities: {write_trusted_entities(args.public_keys, args.out, versions)}")
    elif args.command == "roster":
        print(f"roster: {write_roster(args.public_keys, args.out)}")
    elif args.command == "gateway":
        from deploy.gateway import serve

        serve(args.listen, args.superlink, args.ca, args.cert, args.key, args.signatures, args.nodes,
              args.shared_address)
    elif args.command == "faults":
        faults.run(args)
    else:
        from fedgraphcore.result import REPORT_FILE, summary_table

        check_options(args.netns, args.latency_ms)
        hosts = {"netns": args.netns, "latency_ms": args.latency_ms}
        out, sets = _local_out(args)
        if args.parties is not None:
            path = run_local_parties(args.parties, args.strategy, args.partitioner, sets, out, args.read, **hosts)
        else:
            path = run_local(args.nodes, args.strategy, args.dataset, args.partitioner, sets, out, **hosts)
        print(summary_table(json.loads(path.read_text())))
        print(f"result: {path}")
        page = path.parent / REPORT_FILE
        print(f"report: {page}" if page.exists() else "report: none (the server's log says why)")


def _local_out(args) -> tuple[Path, list[str]]:
    """``local``'s folder and ``--set`` items: ``--resume OUT`` resumes the run in OUT (``resume=true``)."""
    if args.resume is None:
        if args.out is None:
            raise ConfigError("local needs --out OUT (a new run) or --resume OUT (an interrupted one)")
        return args.out, args.set
    if args.out is not None and args.out.resolve() != args.resume.resolve():
        raise ConfigError(f"--resume {args.resume} and --out {args.out} both given; valid: --resume OUT alone")
    return args.resume, [*args.set, "resume=true"]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "superlink":
        return superlink.main(args.action, args.timeout)
    if args.command == "run":
        return submit.run(args.app, args.connection, args.run_config, args.federation, args.timeout)
    try:
        _run_command(args)
    except (FedGraphError, RuntimeError, OSError, ValueError) as err:  # RuntimeError, OSError: Flower's, the system's
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: the federation's processes are stopped on the way out
        resume = f"; python -m deploy local --resume {args.out or args.resume} continues a run that keeps a journal" \
            if args.command == "local" else ""
        print(f"error: interrupted (Ctrl-C){resume}", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
