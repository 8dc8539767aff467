"""A real Flower deployment on this machine: SuperLink + SuperNodes as processes.

:class:`LocalFederation` starts ``flower-superlink`` with TLS (certificates
from :mod:`deploy.pki`) and SuperNode authentication, registers SuperNode
public keys with ``flwr supernode register``, starts ``flower-supernode``
processes, each pointed at its own shard file (``--node-config
"shard='...'"``) or its party's own data (``data='...'``), and runs the app
with ``flwr run`` against that SuperLink. With :meth:`start_gateway` the
SuperNodes connect through the Fleet gateway (:mod:`deploy.gateway`: the Fleet
API only, with the federation's app signatures) and, given
``trusted_entities``, run only signed apps.
Every process runs in its own process group and is killed by :meth:`close`
(also on errors: use it as a context manager). Everything listens on
127.0.0.1; across machines the same commands work with real addresses (see
docs/deployment.md). Given a :class:`deploy.netns.Network`,
each process runs in its host's network namespace (SuperLink, gateway and ``flwr``
CLI on the SuperLink host, SuperNode i on its own) and the gateway listens on
the SuperLink host's address there, the one SuperNodes reach.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import psutil
from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE

from deploy import faults as fault_proxy
from deploy import app_processes, flower_shim, gateway, gates

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[1]
CONNECTION = "fedgraph"
#: How long a SuperNode keeps trying to reach a SuperLink that went away before it exits with
#: Flower's "Giving up reconnection after ... seconds" (``flower-supernode --max-wait-time``); a
#: restarted SuperLink has lost its runs, so waiting longer only hides the failure.
SUPERLINK_WAIT_S = 300.0
#: A SuperNode killed without a goodbye stays online for the SuperLink until its heartbeat expires
#: (Flower: HEARTBEAT_PATIENCE x HEARTBEAT_DEFAULT_INTERVAL after its last heartbeat), and the SuperLink
#: refuses to activate its key again before then (412, the SuperNode exits with code 305).
REJOIN_S = HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL
#: The refusal of an activation (Flower's FLEET_NODE_ACTIVATION_FAILED, code 2004) in the SuperNode's
#: log: its key is still online, or not registered (then the retries end at the timeout).
_STILL_ONLINE = "Failed to activate SuperNode"
#: What a SuperNode logs once the SuperLink has activated it.
_JOINED = "SuperNode ID: "


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc``, its process group and any descendant that left it
    (SuperLink and SuperNode start ServerApp/ClientApp processes)."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for child in family:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait(timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml_value(value: Any) -> str:
    """A run-config value as ``flwr run --run-config`` expects it (TOML)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "") + "'"


def run_config_arg(values: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={toml_value(v)}" for k, v in values.items())


def flower_command(role: str, env: Mapping[str, str]) -> list[str]:
    """``flower-<role>`` (``supernode``, ``superlink``), through :mod:`deploy.flower_shim` unless
    ``env`` switches it off."""
    return flower_shim.command(role) if flower_shim.enabled(env) else [str(BIN / f"flower-{role}")]


class LocalFederation:
    """SuperLink and SuperNodes on loopback (see module docstring)."""

    def __init__(self, workdir: Path, pki: Path | None, *, auth: bool = True,
                 superlink_wait_s: float = SUPERLINK_WAIT_S, state_file: bool = False, network=None) -> None:
        self.workdir = Path(workdir)
        # a deploy.netns.Network: each process in its host's namespace, SuperNodes dial the gateway's address there
        self.network = network
        # the SuperLink's state in a file: a SuperLink restarted after a crash knows the registered nodes
        # again, and the SuperNodes, which keep retrying through the gateway, reconnect by themselves;
        # in memory (the default) every message costs no disk write
        self.state_file = state_file
        self.superlink_wait_s = superlink_wait_s  # each SuperNode's --max-wait-time
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.pki = Path(pki) if pki else None
        self.auth = auth and self.pki is not None
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.home = self.workdir / "flwr-home"
        self.home.mkdir(exist_ok=True)
        self.processes: dict[str, subprocess.Popen] = {}
        self.commands: dict[str, list[str]] = {}  # each SuperNode's command, for restart_supernode
        self.fleet_address = self.address  # where SuperNodes connect: the gateway once started
        self.env = {
            **os.environ,
            "FLWR_HOME": str(self.home),
            # use this environment instead of a fresh `uv sync` per run
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            # SuperExec checks for new tasks every second by default; every 0.1 s costs each message
            # 50 ms on average, and polling more often costs the 2-core machine CPU the run needs
            # (a SuperNode started through deploy.flower_shim wakes its SuperExec per task instead)
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.1",
            # every Flower process (one ClientApp per message) would report its start and exit to
            # telemetry.flower.ai, waiting up to 4 s at exit
            "FLWR_TELEMETRY_ENABLED": "0",
            "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "OMP_NUM_THREADS": "1",
            # deploy.flower_shim and the SuperExec it starts run from this checkout
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        self._write_cli_config()

    def _write_cli_config(self) -> None:
        lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]",
                 f'address = "{self.address}"']
        if self.pki:
            lines.append(f'root-certificates = "{(self.pki / "ca.crt").resolve()}"')
        else:
            lines.append("insecure = true")
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")

    # -- processes --------------------------------------------------------------
    def spawn(self, name: str, cmd: list[str], env: Mapping[str, str] | None = None,
               append: bool = False, pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
        log = open(self.workdir / f"{name}.log", "a" if append else "w")
        proc = subprocess.Popen(self.inside(name, cmd), stdout=log, stderr=subprocess.STDOUT, env=env or self.env,
                                cwd=self.workdir, start_new_session=True, pass_fds=pass_fds)
        self.processes[name] = proc
        return proc

    def inside(self, name: str, cmd: list[str]) -> list[str]:
        """``cmd`` as process ``name`` runs it: inside its namespace, with a :class:`deploy.netns.Network`."""
        return self.network.command(name, cmd) if self.network else cmd

    def log(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start_superlink(self, timeout: float = 120.0) -> None:
        """Start the SuperLink and return once it serves."""
        self.launch_superlink()
        self.await_line("superlink", "Uvicorn running", "SuperLink", timeout)

    def launch_superlink(self) -> None:
        """Start the SuperLink (:meth:`await_line` ``"Uvicorn running"``: it serves)."""
        cmd = [*flower_command("superlink", self.env), "--port", str(self.port),
               "--disable-runtime-dependency-installation"]
        if self.state_file:
            cmd += ["--database", str(self.workdir / "superlink-state.db")]
        if self.pki:
            cmd += ["--ssl-ca-certfile", str(self.pki / "ca.crt"),
                    "--ssl-certfile", str(self.pki / "superlink.crt"),
                    "--ssl-keyfile", str(self.pki / "superlink.key")]
        else:
            cmd += ["--insecure"]
        if self.auth:
            cmd += ["--enable-supernode-auth"]
        self.spawn("superlink", cmd)

    def start_gateway(self, signatures: Path, timeout: float = 120.0, nodes: int = 1) -> None:
        """Start the Fleet gateway on its own port and return once it serves; SuperNodes started
        afterwards connect to it (``nodes``: :meth:`launch_gateway`)."""
        self.launch_gateway(signatures, nodes)
        self.await_line("gateway", gateway.READY, "the Fleet gateway", timeout)

    def launch_gateway(self, signatures: Path, nodes: int = 1) -> None:
        """Start the Fleet gateway on its own port (it needs no SuperLink to start); SuperNodes
        started afterwards connect to it. ``nodes``: the SuperNodes to come (``--nodes``), which
        may reach it from its own address (loopback, or a relay in front of it): the gateway gives
        that address, and only it, the connections of that many (``--shared-address``, at most 8)."""
        port, host = free_port(), self.network.link_host if self.network else "127.0.0.1"
        cmd = [sys.executable, "-m", "deploy", "gateway", "--listen", f"{host}:{port}",
               "--superlink", self.address, "--ca", str(self.pki / "ca.crt"),
               "--cert", str(self.pki / "superlink.crt"), "--key", str(self.pki / "superlink.key"),
               "--signatures", str(Path(signatures).resolve()),
               "--nodes", str(max(1, min(nodes, gateway.MOST_NODES))),
               "--shared-address", f"{host}={max(1, min(nodes, 8))}"]
        self.spawn("gateway", cmd)
        self.fleet_address = f"{host}:{port}"

    def start_fault_proxy(self, faults: fault_proxy.Faults, timeout: float = 120.0, http: bool = True) -> None:
        """:meth:`launch_fault_proxy` and return once it serves."""
        self.launch_fault_proxy(faults, http)
        self.await_line("faults", fault_proxy.READY, "the fault proxy", timeout)

    def launch_fault_proxy(self, faults: fault_proxy.Faults, http: bool = True) -> None:
        """Put the fault proxy (:mod:`deploy.faults`, HTTP mode, presenting the SuperLink's certificate
        as the gateway does; ``http=False``: a TCP relay, TLS end to end between SuperNode and gateway)
        in front of the Fleet address; SuperNodes started afterwards connect through it. Its fault
        lines go to ``faults.log``."""
        host, port = self.fleet_address.rpartition(":")[0], free_port()
        tls = (fault_proxy.ProxyTLS(self.pki / "superlink.crt", self.pki / "superlink.key", self.pki / "ca.crt")
               if http else None)
        self.spawn("faults", fault_proxy.command(f"{host}:{port}", self.fleet_address, faults, tls))
        self.fleet_address = f"{host}:{port}"

    def await_line(self, name: str, ready: str, what: str, timeout: float = 120.0) -> None:
        """Return once started process ``name``'s log says ``ready`` (a one-line error naming ``what``
        if it ends first or ``timeout`` seconds pass)."""
        proc, deadline = self.processes[name], time.monotonic() + timeout
        while ready not in self.log(name):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start:\n{self.log(name)[-2000:]}")
            time.sleep(0.2)

    def register(self, *public_keys: Path) -> None:
        """Register SuperNode public keys (only registered SuperNodes may join) with Flower's ``flwr
        supernode register``, all in one process (:mod:`deploy.registration`)."""
        self.registered(self.launch_registration(list(public_keys)), len(public_keys))

    def launch_registration(self, public_keys: list[Path], gate: gates.Gate | None = None) -> subprocess.Popen:
        """Start :meth:`register`'s process (``gate``: it registers once the gate is opened)."""
        cmd = self.inside("flwr", [sys.executable, "-m", "deploy.registration", CONNECTION,
                                   *(str(key) for key in public_keys)])
        env, fds = ({**self.env, **gate.environ()}, (gate.read_end,)) if gate else (self.env, ())
        proc = subprocess.Popen(cmd, env=env, pass_fds=fds, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if gate:
            gate.handed_over()
        return proc

    def registered(self, proc: subprocess.Popen, count: int, timeout: float = 300.0) -> None:
        """Return once the registration ``proc`` registered ``count`` keys (a RuntimeError otherwise)."""
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        if proc.returncode != 0 or out.count("registered successfully") != count:
            raise RuntimeError(f"registering {count} SuperNode keys failed:\n{out}\n{err}")

    def start_supernode(self, name: str, shard: Path | None, *, private_key: Path | None = None,
                        root_certificates: Path | None = None, node_config: str | None = None,
                        trusted_entities: Path | None = None,
                        gate: gates.Gate | None = None) -> subprocess.Popen:
        """Start Flower's SuperNode (through :mod:`deploy.flower_shim` unless it is switched off); it
        stops reconnecting ``superlink_wait_s`` seconds after losing the SuperLink (Flower logs
        "Giving up reconnection after ... seconds"). ``gate`` (the shim on): it joins once the gate
        is opened (:func:`deploy.flower_shim.join_after_gate`)."""
        cmd = [*flower_command("supernode", self.env), "--superlink", self.fleet_address, "--port", str(free_port()),
               "--max-wait-time", repr(float(self.superlink_wait_s))]
        cmd += ["--root-certificates", str(root_certificates)] if root_certificates else ["--insecure"]
        if private_key:
            cmd += ["--auth-supernode-private-key", str(private_key)]
        if trusted_entities:
            cmd += ["--trusted-entities", str(trusted_entities)]
        config = node_config if node_config is not None else f"shard='{Path(shard).resolve()}'"
        cmd += ["--node-config", config]
        self.commands[name] = cmd
        if gate is None:
            return self.spawn(name, cmd)
        proc = self.spawn(name, cmd, env={**self.env, **gate.environ()}, pass_fds=(gate.read_end,))
        gate.handed_over()
        return proc

    def restart_supernode(self, name: str, timeout: float = REJOIN_S + 60.0, first_wait_s: float = 2.0) -> int:
        """Start SuperNode ``name`` again with its command and key (after it was killed) and return once it
        has joined; returns the attempts it took. While the SuperLink still counts the killed instance
        online (:data:`REJOIN_S` after its last heartbeat) it refuses the key; each refused attempt is
        logged in ``NAME.log`` (appended to) and retried after a back-off doubling from ``first_wait_s``
        (at most 16 s), up to ``timeout`` seconds in all."""
        cmd, deadline, wait_s = self.commands[name], time.monotonic() + timeout, first_wait_s
        for attempt in itertools.count(1):
            start = len(self.log(name))
            proc = self.spawn(name, cmd, append=True)

            def since() -> str:
                return self.log(name)[start:]

            while proc.poll() is None and _STILL_ONLINE not in since() and _JOINED not in since():
                time.sleep(0.2)
            if _JOINED in since():
                return attempt
            if _STILL_ONLINE not in since() or time.monotonic() + wait_s > deadline:
                raise RuntimeError(f"{name} did not rejoin within {timeout:g} s:\n{since()[-2000:]}")
            _kill_tree(proc)
            with open(self.workdir / f"{name}.log", "a") as log:
                log.write(f"restart: the SuperLink still counts {name}'s previous instance online (a killed node "
                          f"goes offline {REJOIN_S:g} s after its last heartbeat); attempt {attempt + 1} in "
                          f"{wait_s:g} s\n")
            time.sleep(wait_s)
            wait_s = min(2 * wait_s, 16.0)
        raise AssertionError("unreachable")

    def start_nodes(self, shards: list[Path], trusted_entities: Path | None = None) -> None:
        """Register and start one authenticated TLS SuperNode per shard (running only apps
        signed by a key in ``trusted_entities``, when given)."""
        self.start_configured_nodes([f"shard='{Path(shard).resolve()}'" for shard in shards], trusted_entities)

    def start_configured_nodes(self, node_configs: list[str], trusted_entities: Path | None = None) -> None:
        """Register and start one authenticated TLS SuperNode per node config (``--node-config``
        text, e.g. ``data='/abs/party-0' out-dir='/abs/out-0'``), running only apps signed by a
        key in ``trusted_entities``, when given."""
        if self.auth:
            self.register(*self._node_keys(len(node_configs)))
        self._launch_nodes(node_configs, trusted_entities, gated=False)

    def _node_keys(self, count: int) -> list[Path]:
        return [self.pki / f"supernode-{i}.pub" for i in range(count)]

    def _launch_nodes(self, node_configs: list[str], trusted_entities: Path | None,
                      gated: bool) -> list[gates.Gate]:
        """Start SuperNode i with node config i (``gated``: each behind a gate of its own, returned)."""
        node_gates = [gates.Gate() if gated else None for _ in node_configs]
        for i, (node_config, gate) in enumerate(zip(node_configs, node_gates)):
            key = self.pki / f"supernode-{i}" if self.auth else None
            root = self.pki / "ca.crt" if self.pki else None
            self.start_supernode(f"supernode-{i}", None, private_key=key, root_certificates=root,
                                 node_config=node_config, trusted_entities=trusted_entities, gate=gate)
        return [gate for gate in node_gates if gate is not None]

    def start_federation(self, signatures: Path, node_configs: list[str], trusted_entities: Path | None = None,
                         relay: fault_proxy.Faults | None = None, timeout: float = 120.0) -> None:
        """The SuperLink, the Fleet gateway (with ``relay``, a TCP relay adding its faults in front of
        it), the registration of the SuperNodes' keys and one SuperNode per node config (as
        :meth:`start_configured_nodes`), all started at once: each imports its code while the others
        start, then waits at its gate (:mod:`deploy.gates`): the registration until the SuperLink
        serves, each SuperNode (having started its SuperExec) until its key is registered and the
        gateway serves. Plain Flower (the shim off) cannot wait so: then one after the other."""
        if not flower_shim.enabled(self.env):
            self.start_superlink(timeout)
            self.start_gateway(signatures, timeout, nodes=len(node_configs))
            if relay is not None:
                self.start_fault_proxy(relay, timeout, http=False)
            self.start_configured_nodes(node_configs, trusted_entities)
            return
        self.launch_superlink()
        self.launch_gateway(signatures, nodes=len(node_configs))
        if relay is not None:
            self.launch_fault_proxy(relay, http=False)
        keys, registration_gate = self._node_keys(len(node_configs)) if self.auth else [], gates.Gate()
        registration = self.launch_registration(keys, registration_gate) if keys else None
        node_gates = [registration_gate, *self._launch_nodes(node_configs, trusted_entities, gated=True)]
        try:
            self.await_line("superlink", "Uvicorn running", "SuperLink", timeout)
            registration_gate.open()
            if registration is not None:
                self.registered(registration, len(keys))
            else:
                registration_gate.handed_over()  # nothing to register: nobody holds its read end
            self.await_line("gateway", gateway.READY, "the Fleet gateway", timeout)
            if relay is not None:
                self.await_line("faults", fault_proxy.READY, "the fault proxy", timeout)
        except BaseException:  # the SuperNodes are killed with the federation, the registration here
            if registration is not None and registration.poll() is None:
                registration.kill()
                registration.wait()
            raise
        finally:  # no gate stays shut on a process that waits
            for gate in node_gates:
                gate.open()

    def wait_until_ready(self, names: list[str], timeout: float = 300.0) -> None:
        """Return once every SuperNode of ``names`` has joined the federation and, with the shim
        on, its SuperExec's ClientApp runtime is preloaded (:data:`deploy.app_processes.PRELOADED`):
        a long-lived SuperNode is in that state when a run comes."""
        wanted = [_JOINED] + ([app_processes.PRELOADED] if flower_shim.enabled(self.env) else [])
        deadline = time.monotonic() + timeout
        for name in names:
            while not all(line in self.log(name) for line in wanted):
                ended = self.ended()
                if name in ended or time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not get ready (exit code {ended.get(name)}):\n{self.log(name)[-2000:]}")
                time.sleep(0.1)

    def run_app(self, app_dir: Path, run_config: Mapping[str, Any],
                timeout: float | None = None) -> subprocess.CompletedProcess:
        """``flwr run APP <connection> --stream --run-config ...``; returns the finished process
        (``timeout``: seconds after which it is stopped, raising ``subprocess.TimeoutExpired``;
        None: no limit)."""
        cmd = self.inside("flwr", [str(BIN / "flwr"), "run", str(app_dir), CONNECTION, "--stream",
                                    "--run-config", run_config_arg(run_config)])
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)

    def ended(self) -> dict[str, int]:
        """The started processes that have exited, with their exit codes (e.g. a SuperLink that died)."""
        return {name: proc.returncode for name, proc in self.processes.items() if proc.poll() is not None}

    def kill(self, name: str) -> None:
        """Kill one started process and everything it started (SIGKILL: a crash, not a shutdown)."""
        proc = self.processes.pop(name, None)
        if proc is not None:
            _kill_tree(proc)

    def close(self) -> None:
        """Stop every process this federation started, children included."""
        for name in list(self.processes):
            self.kill(name)

    def __enter__(self) -> "LocalFederation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
