"""A deployed run while strangers at eight addresses hold request bodies at the Fleet gateway.

    python benchmarks/gateway_attack.py [--strategy fedkmeans] [--nodes 3] [--addresses 8] [--set KEY=VALUE ...]

The attack holds request bodies: from each address, as many
connections as the gateway lets one address open (16), each a TLS connection announcing the
largest push-object a SuperNode sends and sending all of its body but the last byte at once,
then waiting; when a connection is answered or closed, another takes its place after
``--pause`` seconds (:data:`PAUSE_S`). Addresses are loopback ones (127.0.0.2 ...), distinct source addresses on Linux.

Runs the same experiment twice on a local deployment (``deploy.local``: TLS SuperLink, the
gateway, authenticated SuperNodes with their roster), without and with the attack, which starts
as soon as the gateway serves; prints each run's median and slowest round (after the handshake),
the handshake (waiting for the SuperNodes, hello), the ServerApp's whole run, the ``flwr run``
wall time, the CPU seconds of the federation's processes (the attacker's own apart) and the
ratios, and what the attack got (connections made, answers by status), and writes
benchmarks/results/gateway_attack.json. The target: the attacked run
completes and its median round takes at most twice as long. Timings on a shared machine are
noisy: the attacker's own threads compete with the federation for the same cores.

``python benchmarks/gateway_attack.py --attack OUT`` runs the attacker alone against the gateway
whose log is ``OUT/gateway.log`` until SIGTERM, then writes its counts to ``OUT/attack.json``
(what :class:`Attack` starts).
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import select
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from deploy.gateway import FLEET_ENDPOINTS, MAX_CLIENT_CONNECTIONS, READY  # noqa: E402

PUSH_OBJECT = b"/v1/fleet/push-object"
CHUNK = 256 * 1024
_ZEROS = bytes(CHUNK)
#: an attacker checks no certificate (and makes this context once: loading the system's CA store
#: for every connection cost the attacker tens of milliseconds of CPU each)
_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
_TLS.check_hostname, _TLS.verify_mode = False, ssl.CERT_NONE
#: seconds an attacking connection's place stays empty after it was answered or closed
PAUSE_S = 0.2
RESULT = HERE / "results" / "gateway_attack.json"


def attacker_address(i: int) -> str:
    return f"127.0.0.{2 + i}"


def gateway_address(out: Path, guard_s: float = 600.0) -> tuple[str, int]:
    """The gateway's host and port, from its log once it serves."""
    deadline = time.monotonic() + guard_s
    pattern = re.compile(re.escape(READY) + r".* on https://([0-9.]+):(\d+)")
    while time.monotonic() < deadline:
        log = out / "gateway.log"
        found = pattern.search(log.read_text(errors="replace")) if log.exists() else None
        if found:
            return found.group(1), int(found.group(2))
        time.sleep(0.1)
    raise RuntimeError(f"no gateway served within {guard_s:g} s (log {out / 'gateway.log'})")


def hold_one_body(target: tuple[str, int], source: str) -> str:
    """One attacking connection: announce the largest push-object, send all but its last byte
    (in chunks, stopping early once the gateway has answered or closed: the attacker spares its
    own CPU, which here is the federation's machine's), wait for the answer; how it ended (an HTTP
    status, ``refused`` before TLS, ``closed``)."""
    limit = FLEET_ENDPOINTS[PUSH_OBJECT].request_limit
    try:
        raw = socket.create_connection(target, timeout=300, source_address=(source, 0))
        sock = _TLS.wrap_socket(raw, server_hostname=target[0])
    except (OSError, ssl.SSLError):
        return "refused"
    with sock:
        head = (b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/protobuf\r\nContent-Length: %d\r\n\r\n"
                % (PUSH_OBJECT, target[0].encode(), limit))
        try:
            sock.sendall(head)
            for sent in range(0, limit - 1, CHUNK):
                if select.select([sock], [], [], 0)[0]:  # answered (or closed) before the body is whole
                    break
                sock.sendall(_ZEROS[:min(CHUNK, limit - 1 - sent)])
            status = sock.recv(64)
        except (OSError, ssl.SSLError):
            return "closed"
    found = re.match(rb"HTTP/1.1 (\d+)", status)
    return found.group(1).decode() if found else "closed"


class Attacker:
    """``addresses`` x :data:`~deploy.gateway.MAX_CLIENT_CONNECTIONS` threads, each keeping one
    attacking connection (:func:`hold_one_body`) open until :meth:`stop`."""

    def __init__(self, target: tuple[str, int], addresses: int, pause_s: float = PAUSE_S) -> None:
        self.target, self.pause_s, self.stopped, self.ended = target, pause_s, threading.Event(), Counter()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._keep, args=(attacker_address(a),), daemon=True)
                        for a in range(addresses) for _ in range(MAX_CLIENT_CONNECTIONS)]

    def _keep(self, source: str) -> None:
        while not self.stopped.is_set():
            how = hold_one_body(self.target, source)
            with self.lock:
                self.ended[how] += 1
            self.stopped.wait(self.pause_s)

    def start(self) -> "Attacker":
        for thread in self.threads:
            thread.start()
        return self

    def stop(self) -> dict:
        self.stopped.set()
        return dict(self.ended)


class Attack:
    """The attacker as a process of its own against the deployment whose files are in ``out``,
    from when its gateway serves until the context ends; :attr:`counts` then holds what its
    connections got."""

    def __init__(self, out: Path, addresses: int = 8, pause_s: float = PAUSE_S) -> None:
        self.out, self.addresses, self.pause_s, self.counts = Path(out), addresses, pause_s, {}

    def __enter__(self) -> "Attack":
        self.out.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, __file__, "--attack", str(self.out),
                                      "--addresses", str(self.addresses), "--pause", str(self.pause_s)])
        return self

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait()
        path = self.out / "attack.json"
        self.counts = json.loads(path.read_text()) if path.exists() else {}


def _attack_until_stopped(out: Path, addresses: int, pause_s: float) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    attacker = Attacker(gateway_address(out), addresses, pause_s).start()
    stop.wait()
    (out / "attack.json").write_text(json.dumps({"ended": attacker.stop(), "cpu_s": time.process_time()}))


def round_seconds(result: dict) -> list[float]:
    """Seconds of every round after the handshake."""
    return [r["seconds"] for r in result["timing"]["per_round"] if r["action"] != "hello"]


def run(strategy: str, nodes: int, sets: list[str], addresses: int, pause_s: float, attacked: bool,
        out: Path) -> dict:
    """One deployed run (with the attack if ``attacked``): its figures."""
    from deploy.__main__ import RUN_TIMING, run_local

    started, cpu = time.monotonic(), _children_cpu_s()
    if attacked:
        with Attack(out, addresses, pause_s) as attack:
            path = run_local(nodes, strategy, "sbm", "auto", sets, out)
        counts = attack.counts
    else:
        path = run_local(nodes, strategy, "sbm", "auto", sets, out)
        counts = {"ended": {}, "cpu_s": 0.0}
    result = json.loads(path.read_text())
    seconds = round_seconds(result)
    timing = result["timing"]
    return {"attacked": attacked, "rounds": len(seconds), "median_round_s": statistics.median(seconds),
            "slowest_round_s": max(seconds), "round_s": seconds, "handshake_s": timing["handshake_s"],
            "server_s": timing["total_s"], "flwr_run_s": json.loads((out / RUN_TIMING).read_text())["flwr_run_s"],
            "wall_s": time.monotonic() - started, "cpu_s": _children_cpu_s() - cpu - counts["cpu_s"],
            "attacker_cpu_s": counts["cpu_s"], "attack": counts["ended"],
            "dropped": result["communication"]["dropped"]}


def _children_cpu_s() -> float:
    """CPU seconds of this process's ended children (the federation's processes, the attacker)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="fedkmeans")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--addresses", type=int, default=8)
    parser.add_argument("--pause", type=float, default=PAUSE_S, help="seconds before a closed attacking connection "
                                                                      "is opened again")
    parser.add_argument("--set", action="append", default=["sbm.nodes=300", "fedkmeans.secure=true",
                                                           "num-rounds=5", "reference=false"])
    parser.add_argument("--attack", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.attack:
        _attack_until_stopped(args.attack, args.addresses, args.pause)
        return 0
    with tempfile.TemporaryDirectory(prefix="gateway-attack-") as tmp:
        runs = [run(args.strategy, args.nodes, args.set, args.addresses, args.pause, attacked,
                    Path(tmp) / str(attacked)) for attacked in (False, True)]
    plain, attacked = runs
    ratios = {k: attacked[k] / plain[k]
              for k in ("median_round_s", "slowest_round_s", "handshake_s", "server_s", "flwr_run_s", "cpu_s")}
    print(f"{args.strategy}, {args.nodes} SuperNodes, {args.addresses} attacking addresses x {MAX_CLIENT_CONNECTIONS} "
          "connections")
    columns = (("median round s", "median_round_s"), ("slowest s", "slowest_round_s"), ("handshake s", "handshake_s"),
               ("server s", "server_s"), ("flwr run s", "flwr_run_s"), ("CPU s", "cpu_s"))
    print(f"{'':>10} {'rounds':>6} " + " ".join(f"{title:>14}" for title, _ in columns))
    for name, r in (("plain", plain), ("attacked", attacked)):
        print(f"{name:>10} {r['rounds']:>6} " + " ".join(f"{r[key]:>14.2f}" for _, key in columns))
    print(f"{'ratio':>10} {'':>6} " + " ".join(f"{ratios[key]:>14.2f}" for _, key in columns))
    print(f"attacking connections ended: {attacked['attack']}; the attacker's own CPU: "
          f"{attacked['attacker_cpu_s']:.1f} s (not in the CPU column)")
    RESULT.parent.mkdir(parents=True, exist_ok=True)
    RESULT.write_text(json.dumps({"strategy": args.strategy, "nodes": args.nodes, "addresses": args.addresses,
                                  "pause_s": args.pause, "sets": args.set, "plain": plain, "attacked": attacked, "ratios": ratios},
                                 indent=1) + "\n")
    print(f"wrote {RESULT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
