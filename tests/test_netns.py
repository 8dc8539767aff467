"""Separate machines emulated: the SuperLink host and every SuperNode in a network namespace of its own.

From a SuperNode's namespace, as an attacker at another organisation would try: the SuperLink's
port on 127.0.0.1 (its own loopback, not the SuperLink host's) and on the SuperLink host's address
are refused, an address outside the federation's subnet has no route, and the gateway's address
answers with a certificate valid for that address. Namespaces are deleted on exit, on an error
while they are made, on SIGTERM, and those a killed run left are swept. The slow test runs a
strategy deployed across the namespaces behind a delay on every SuperNode's link and gets the
in-process run's labels.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import HANG_GUARD_S
from deploy import netns
from deploy.__main__ import RUN_TIMING, main
from deploy.federation import LocalFederation
from deploy.pki import make_all

pytestmark = pytest.mark.skipif(bool(netns.unavailable()), reason=f"{netns.unavailable()}")

#: connects to HOST PORT (with CAFILE: a TLS handshake checking the certificate against HOST) and
#: prints what happened: "open", or the error's errno name / "certificate"
PROBE = """
import errno, socket, ssl, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    conn = socket.create_connection((host, port), timeout=600)
    if len(sys.argv) > 3:
        ssl.create_default_context(cafile=sys.argv[3]).wrap_socket(conn, server_hostname=host)
    print("open")
except ssl.SSLCertVerificationError:
    print("certificate")
except OSError as err:
    print(errno.errorcode.get(err.errno, str(err)))
"""


def probe(namespace: str, host: str, port: int, cafile: Path | None = None) -> str:
    """What a connection from ``namespace`` to ``host:port`` meets (:data:`PROBE`)."""
    cmd = [*netns.exec_prefix(namespace), sys.executable, "-c", PROBE, host, str(port), *([str(cafile)] if cafile else [])]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD_S, check=True).stdout.strip()


def listening(namespace: str) -> set[str]:
    """The TCP addresses ``host:port`` listening in ``namespace``."""
    out = subprocess.run([*netns.exec_prefix(namespace), "ss", "-ltnH"], capture_output=True, text=True,
                         check=True).stdout
    return {line.split()[3] for line in out.splitlines()}


@pytest.fixture
def network():
    with netns.Network(2) as net:
        yield net
    assert not set(net.nodes + [net.link]) & set(netns.namespaces())


@pytest.fixture
def link_host(network, tmp_path):
    """A real TLS SuperLink and Fleet gateway in the link namespace, the certificate also valid for
    the address SuperNodes dial."""
    pki = tmp_path / "pki"
    make_all(pki, 2, [network.link_host])
    (tmp_path / "signatures").mkdir()
    with LocalFederation(tmp_path / "fed", pki, network=network) as federation:
        federation.start_superlink()
        federation.start_gateway(tmp_path / "signatures")
        yield federation


@pytest.mark.deployment
def test_a_supernode_reaches_the_gateway_and_nothing_of_the_superlink_host(network, link_host, tmp_path):
    node, gateway_port = network.nodes[0], int(link_host.fleet_address.rsplit(":", 1)[1])
    assert link_host.fleet_address == f"{network.link_host}:{gateway_port}"
    assert listening(network.link) == {link_host.address, link_host.fleet_address}
    assert probe(node, "127.0.0.1", link_host.port) == "ECONNREFUSED"  # the node's own loopback
    assert probe(node, network.link_host, link_host.port) == "ECONNREFUSED"  # the SuperLink is on loopback only
    assert probe(node, "192.0.2.1", gateway_port) == "ENETUNREACH"  # no route out of the federation's subnet
    assert probe(node, network.link_host, gateway_port, tmp_path / "pki" / "ca.crt") == "open"
    other_ca = tmp_path / "other"
    make_all(other_ca, 0)
    assert probe(node, network.link_host, gateway_port, other_ca / "ca.crt") == "certificate"


@pytest.mark.integration
def test_a_certificate_without_the_link_hosts_address_is_refused_for_it(network, tmp_path):
    """What the SAN is for: a gateway whose certificate names only loopback fails the node's check."""
    pki = tmp_path / "pki"
    make_all(pki, 0)
    (tmp_path / "signatures").mkdir()
    with LocalFederation(tmp_path / "fed", pki, network=network) as federation:
        federation.start_superlink()
        federation.start_gateway(tmp_path / "signatures")
        port = int(federation.fleet_address.rsplit(":", 1)[1])
        assert probe(network.nodes[1], network.link_host, port, pki / "ca.crt") == "certificate"


def test_each_process_runs_in_its_hosts_namespace(network):
    assert [network.namespace_of(f"supernode-{i}") for i in range(2)] == network.nodes
    assert {network.namespace_of(p) for p in ("superlink", "gateway", "flwr", "supernode-2")} == {network.link}
    assert network.command("supernode-1", ["x"]) == ["ip", "netns", "exec", network.nodes[1], "x"]
    addresses = subprocess.run(network.command("supernode-1", ["ip", "-4", "-o", "address"]), capture_output=True,
                               text=True, check=True).stdout
    assert [line.split()[3] for line in addresses.splitlines()] == ["127.0.0.1/8", f"{network.node_hosts[1]}/16"]


def test_an_error_while_the_namespaces_are_made_deletes_those_made(monkeypatch):
    real_ip = netns._ip
    net = netns.Network(3)

    def failing(*args, **kwargs):
        if args[:2] == ("-n", net.nodes[1]):
            raise RuntimeError("injected")
        return real_ip(*args, **kwargs)

    monkeypatch.setattr(netns, "_ip", failing)
    with pytest.raises(RuntimeError, match="injected"):
        net.open()
    assert not net.created and not {net.link, *net.nodes} & set(netns.namespaces())


def test_sigterm_deletes_the_namespaces(tmp_path):
    script = ("import signal, sys\nfrom deploy import netns\nwith netns.Network(2) as net:\n"
              "    print(' '.join([net.link, *net.nodes]), flush=True)\n    signal.pause()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                            cwd=Path(netns.__file__).parents[1])
    names = proc.stdout.readline().split()
    assert len(names) == 3 and set(names) <= set(netns.namespaces())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=HANG_GUARD_S) == 128 + signal.SIGTERM
    assert not set(names) & set(netns.namespaces())


def test_the_sweep_deletes_namespaces_of_ended_processes_only():
    ended = subprocess.Popen(["true"])
    ended.wait()
    stale, live = f"{netns.PREFIX}-{ended.pid}-0-link", f"{netns.PREFIX}-{netns.os.getpid()}-9999-node-0"
    unrelated = f"{netns.PREFIX}-{ended.pid}-x"
    for name in (stale, live, unrelated):
        netns._ip("netns", "add", name)
    try:
        swept = netns.sweep()
        assert stale in swept and live not in swept and unrelated not in swept
        assert {live, unrelated} <= set(netns.namespaces()) and stale not in netns.namespaces()
    finally:
        for name in (stale, live, unrelated):
            if name in netns.namespaces():
                netns._ip("netns", "delete", name)


@pytest.mark.parametrize("nodes", [0, netns.MAX_NODES + 1])
def test_a_network_holds_one_to_max_nodes(nodes):
    with pytest.raises(ValueError, match=rf"^a namespace network holds 1 to {netns.MAX_NODES} SuperNodes, got {nodes}$"):
        netns.Network(nodes)


@pytest.mark.parametrize("argv, error", [
    (["--latency-ms", "50"], "--latency-ms needs --netns"),
    (["--netns", "--latency-ms", "-1"], "--latency-ms -1.0: valid: 0 to 60000 milliseconds"),
    (["--netns", "--latency-ms", "nan"], "--latency-ms nan: valid: 0 to 60000 milliseconds"),
    (["--netns", "--latency-ms", "60001"], "--latency-ms 60001.0: valid: 0 to 60000 milliseconds"),
])
def test_bad_latency_options_stop_before_anything_is_written(argv, error, tmp_path, capsys):
    assert main(["local", "--out", str(tmp_path / "out"), *argv]) == 2
    assert capsys.readouterr().err.startswith(f"error: {error}")
    assert not (tmp_path / "out").exists()


def test_without_root_netns_says_why_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert main(["local", "--netns", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == "error: --netns: creating network namespaces needs root (running as uid 1000)\n"
    monkeypatch.setattr(netns.shutil, "which", lambda name: None)
    assert netns.unavailable() == "network namespaces need the `ip` command (iproute2), which is not on PATH"
    assert not (tmp_path / "out").exists()


SETTINGS = ["sbm.nodes=300", "sbm.features=8", "fedspectral-plus.mode=paper", "fedspectral-plus.rounds=3",
            "fedspectral-plus.iters=2"]
LATENCY_MS = 50


@pytest.mark.deployment
@pytest.mark.slow
def test_a_run_across_namespaces_behind_latency_gives_the_in_process_labels(tmp_path, capsys):
    from app.run import run_experiment

    out = tmp_path / "deployed"
    argv = ["local", "--netns", "--latency-ms", str(LATENCY_MS), "--nodes", "3", "--strategy", "fedspectral-plus",
            "--dataset", "sbm", "--partitioner", "edge", "--out", str(out)]
    assert main([*argv, *sum((["--set", s] for s in SETTINGS), [])]) == 0
    deployed = json.loads((out / "result" / "result.json").read_text())
    local = run_experiment("fedspectral-plus", "sbm", 3, {"partitioner": "edge", **dict(s.split("=", 1) for s in SETTINGS)},
                           tmp_path / "inprocess")
    assert np.array_equal(np.load(out / "result" / "labels.npy"), np.load(tmp_path / "inprocess" / "labels.npy"))
    assert deployed["timing"]["rounds"] == local["timing"]["rounds"]
    # in every round each SuperNode's pull answer comes back over its link and its reply goes over it
    assert min(r["seconds"] for r in deployed["timing"]["per_round"]) >= 2 * LATENCY_MS / 1000
    timing = json.loads((out / RUN_TIMING).read_text())
    with capsys.disabled():
        print(f"\n{LATENCY_MS} ms per hop: {deployed['timing']['rounds']} rounds, flwr run {timing['flwr_run_s']:.1f} s, "
              f"protocol {deployed['timing']['protocol_s']:.1f} s, federation start {timing['federation_start_s']:.1f} s")
