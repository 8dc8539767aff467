"""The Fleet gateway's CPU per GB it relays, as deployed (``python -m deploy gateway``, TLS on both
sides) in front of the tests' recording SuperLink stand-in.

A registered SuperNode sends ``--objects`` push-object requests of ``--mb`` MB each (the bytes go
in the request body) on one connection, then as many pull-object requests answered with ``--mb``
MB (the bytes come back in the answer). Only the gateway process's CPU (user + system, from
/proc) is counted: the client and the stand-in run in this process.

    python benchmarks/gateway_relay.py --label L [--objects 40] [--mb 4]

Prints one JSON line and adds it under ``L`` to benchmarks/results/gateway_relay.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from deploy.pki import make_all  # noqa: E402
from deploy.signing import make_signing_key, sign_fab  # noqa: E402
from pages import RESULTS_DIR  # noqa: E402
from test_gateway import (PUSH_OBJECT, SIGNED_FAB, RecordingSuperLink, SuperNode, connect,  # noqa: E402
                          read_answer, start_gateway)

RESULTS = RESULTS_DIR / "gateway_relay.json"
PULL_OBJECT = b"/v1/fleet/pull-object"


def cpu_s(pid: int) -> float:
    """User + system CPU-seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def relay(gateway, upstream: RecordingSuperLink, node: SuperNode, target: bytes, body: bytes,
          objects: int) -> dict:
    """Gateway CPU-s and wall s for ``objects`` requests of ``target`` moving ``body`` each."""
    upstream.body = body if target == PULL_OBJECT else None
    sent = b"\x08\x07" if target == PULL_OBJECT else body
    before, start = cpu_s(gateway.proc.pid), time.perf_counter()
    with connect(gateway) as sock:
        for _ in range(objects):
            sock.sendall(node.request(target, body=sent))
            answer = read_answer(sock)
            assert answer.status == 200, (answer.status, answer.body[:200])
            upstream.received.clear()
    used, gb = cpu_s(gateway.proc.pid) - before, objects * len(body) / 2**30
    return {"cpu_s": round(used, 2), "wall_s": round(time.perf_counter() - start, 2),
            "cpu_s_per_gb": round(used / gb, 2)}


def measure(objects: int, mb: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        make_all(tmp / "pki", 1)
        key, _ = make_signing_key(tmp / "signer")
        sign_fab(SIGNED_FAB, key, tmp / "pki" / "signatures")
        upstream = RecordingSuperLink(tmp / "pki")
        upstream.start()
        gateway = start_gateway(tmp, tmp / "pki", upstream.port)
        try:
            node = SuperNode(tmp / "pki").joined(gateway)
            body = b"\x07" * (mb << 20)
            return {"objects": objects, "mb": mb,
                    "push": relay(gateway, upstream, node, PUSH_OBJECT, body, objects),
                    "pull": relay(gateway, upstream, node, PULL_OBJECT, body, objects),
                    "load": round(os.getloadavg()[0], 1)}
        finally:
            gateway.proc.kill()
            gateway.proc.wait()
            upstream.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--objects", type=int, default=40)
    parser.add_argument("--mb", type=int, default=4)
    args = parser.parse_args()
    row = measure(args.objects, args.mb)
    print(json.dumps({"label": args.label, **row}), flush=True)
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    results.setdefault(args.label, []).append(row)
    RESULTS.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
