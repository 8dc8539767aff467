"""Separate machines emulated on one: a network namespace per host, joined by veth pairs.

:class:`Network` creates one namespace for the SuperLink host (``link``: the
SuperLink, which listens on that namespace's 127.0.0.1 only, the Fleet
gateway and the ServerApp the SuperLink starts) and one per SuperNode
(``node-<i>``). Each node namespace has one interface, ``eth0``, whose peer
sits in the link namespace on a bridge; the addresses come from the private
range :data:`SUBNET` (the link host :data:`LINK_HOST`, node i the (i+2)-th
address), with no route beyond it. So a SuperNode reaches the gateway's
address and nothing of the SuperLink host's loopback, as a party's machine
reaches another organisation's server; its own 127.0.0.1 is its own.

Namespaces are named ``fedgraph-<pid>-<k>-link`` / ``-node-<i>`` (the creating
process's id and a counter: concurrent runs do not collide) and deleted by
:meth:`Network.close` (the context manager's exit, also on errors; while
one is open in the main thread, SIGTERM raises ``SystemExit`` so that the exit
runs). What a killed process left behind, :func:`sweep` deletes before every
new network: the namespaces of this prefix whose process is gone. Creating
namespaces needs root and ``ip`` (iproute2); :func:`unavailable` says why
they cannot be made. A process runs inside one with :func:`exec_prefix`
(``ip netns exec NAME``, which execs the command: its pid stays the one
started).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading

PREFIX = "fedgraph"
SUBNET = ipaddress.IPv4Network("10.213.0.0/16")
#: the SuperLink host's address on the bridge: what SuperNodes dial (the gateway listens there)
LINK_HOST = str(SUBNET[1])
BRIDGE = "fedgraph-br"
#: the most SuperNodes the subnet holds (its first address, the link host and the broadcast left out)
MAX_NODES = SUBNET.num_addresses - 3
#: the largest delay per hop ``--latency-ms`` takes (:class:`deploy.faults.Faults` allows a minute)
MAX_LATENCY_MS = 60_000
_COUNTER = itertools.count()


def unavailable() -> str | None:
    """Why network namespaces cannot be created here (one line), or None when they can."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    if shutil.which("ip") is None:
        return "network namespaces need the `ip` command (iproute2), which is not on PATH"
    if os.geteuid() != 0:
        return f"creating network namespaces needs root (running as uid {os.geteuid()})"
    return None


def check_options(netns: bool, latency_ms: float) -> None:
    """``python -m deploy local --netns --latency-ms MS``: a ValueError naming a bad value, a
    RuntimeError saying why namespaces cannot be made here; before anything is written or started."""
    if not 0 <= latency_ms <= MAX_LATENCY_MS:  # NaN too
        raise ValueError(f"--latency-ms {latency_ms!r}: valid: 0 to {MAX_LATENCY_MS} milliseconds")
    if latency_ms and not netns:
        raise ValueError("--latency-ms needs --netns: the delay sits on each SuperNode's link to the SuperLink host")
    if netns and (reason := unavailable()):
        raise RuntimeError(f"--netns: {reason}")


def separate(nodes: int, netns: bool) -> contextlib.AbstractContextManager:
    """A context giving an open :class:`Network` for ``nodes`` SuperNodes when ``netns``, else None."""
    return Network(nodes) if netns else contextlib.nullcontext()


def _ip(*args: str, stdin: str | None = None) -> str:
    """``ip ARGS``; a RuntimeError with ip's own one-line message when it fails."""
    proc = subprocess.run(["ip", *args], input=stdin, capture_output=True, text=True)
    if proc.returncode != 0:
        message = " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
        raise RuntimeError(f"`ip {' '.join(args[:3])} ...` failed: {message}")
    return proc.stdout


def namespaces() -> list[str]:
    """The names of this machine's named network namespaces."""
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    return True


def sweep(prefix: str = PREFIX) -> list[str]:
    """Delete the namespaces ``<prefix>-<pid>-...`` whose process ``pid`` has ended (a run that was
    killed without its exit); returns their names."""
    pattern = re.compile(rf"{re.escape(prefix)}-(\d+)-\d+-(link|node-\d+)$")
    stale = [name for name in namespaces() if (m := pattern.match(name)) and not _alive(int(m.group(1)))]
    for name in stale:
        try:
            _ip("netns", "delete", name)
        except RuntimeError:
            if name in namespaces():  # else a concurrent sweep deleted it first
                raise
    return stale


def exec_prefix(namespace: str) -> list[str]:
    """The command prefix that runs a command inside ``namespace``."""
    return ["ip", "netns", "exec", namespace]


def _raise_exit(signum, frame) -> None:
    raise SystemExit(128 + signum)


class Network:
    """The namespaces of one federation: ``link`` and ``nodes[i]`` (see the module docstring)."""

    def __init__(self, nodes: int, prefix: str = PREFIX) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"a namespace network holds 1 to {MAX_NODES} SuperNodes, got {nodes}")
        self.name = f"{prefix}-{os.getpid()}-{next(_COUNTER)}"
        self.prefix = prefix
        self.link = f"{self.name}-link"
        self.nodes = [f"{self.name}-node-{i}" for i in range(nodes)]
        self.link_host = LINK_HOST
        self.node_hosts = [str(SUBNET[i + 2]) for i in range(nodes)]
        self.created: list[str] = []
        self._previous_sigterm = None

    def open(self) -> "Network":
        """Create the namespaces and their links (everything created is deleted again on an error)."""
        sweep(self.prefix)
        try:
            for name in (self.link, *self.nodes):
                _ip("netns", "add", name)
                self.created.append(name)
            for namespace, lines in self._links().items():
                _ip("-n", namespace, "-batch", "-", stdin="\n".join(lines) + "\n")
        except BaseException:
            self.close()
            raise
        return self

    def _links(self) -> dict[str, list[str]]:
        """``ip -batch`` lines per namespace, in order: in ``link`` the bridge with the link host's
        address and one veth pair per node (its peer on the bridge, ``eth0`` in the node's namespace),
        in each node's namespace ``eth0``'s address; every ``lo`` and interface up."""
        bits = SUBNET.prefixlen
        links = {self.link: ["link set lo up", f"link add {BRIDGE} type bridge",
                             f"address add {self.link_host}/{bits} dev {BRIDGE}", f"link set {BRIDGE} up"]}
        for i, (node, host) in enumerate(zip(self.nodes, self.node_hosts)):
            links[self.link] += [f"link add vn{i} type veth peer name eth0 netns {node}",
                                 f"link set vn{i} master {BRIDGE} up"]
            links[node] = ["link set lo up", f"address add {host}/{bits} dev eth0", "link set eth0 up"]
        return links

    def namespace_of(self, process: str) -> str:
        """Where the federation's process ``process`` runs: ``supernode-<i>`` in node namespace i,
        everything else (SuperLink, gateway, ``flwr`` CLI) on the SuperLink host."""
        if (m := re.fullmatch(r"supernode-(\d+)", process)) and int(m.group(1)) < len(self.nodes):
            return self.nodes[int(m.group(1))]
        return self.link

    def command(self, process: str, cmd: list[str]) -> list[str]:
        """``cmd`` run inside the namespace of ``process`` (:meth:`namespace_of`)."""
        return [*exec_prefix(self.namespace_of(process)), *cmd]

    def close(self) -> None:
        """Delete every namespace this network created (their interfaces go with them)."""
        failed = []
        while self.created:
            name = self.created.pop()
            try:
                _ip("netns", "delete", name)
            except RuntimeError as err:
                failed.append(str(err))
        if failed:
            raise RuntimeError("; ".join(failed))

    def __enter__(self) -> "Network":
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, _raise_exit)
        try:
            return self.open()
        except BaseException:
            self._restore_sigterm()
            raise

    def _restore_sigterm(self) -> None:
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None

    def __exit__(self, *exc) -> None:
        try:
            self.close()
        finally:
            self._restore_sigterm()
