"""``pip install`` gives a member the deployment commands, no checkout needed.

The package is installed with pip into a directory of its own (``--target``, no dependencies:
they come from this environment) and every command runs from a directory outside the checkout,
importing ``deploy`` and ``app`` from the installed files only. The app bundle a pip-installed
operator signs and submits must be byte for byte the one ``flwr run .`` builds in the checkout.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk

from conftest import REPO

#: seconds a command may take before the test gives up on it (a hang guard, not a speed target)
GUARD_S = 600


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> tuple[Path, dict]:
    """The package installed by pip into ``site``; the environment that imports only it."""
    site = tmp_path_factory.mktemp("install") / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--target", str(site), str(REPO)], capture_output=True, text=True, timeout=GUARD_S,
                          cwd=tmp_path_factory.getbasetemp())
    assert done.returncode == 0, done.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": str(site), "PATH": f"{site / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return site, env


def command(args: list[str], env: dict, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd, timeout=GUARD_S)


def test_the_installed_package_imports_from_its_own_files(installed, tmp_path):
    site, env = installed
    done = command([sys.executable, "-c", "import app, deploy, clients, strategies; "
                    "print(deploy.__file__, app.__file__, clients.__file__, strategies.__file__)"], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert all(Path(f).is_relative_to(site) for f in done.stdout.split()), done.stdout


@pytest.mark.parametrize("script", ["fedgraph-deploy", "fedgraph-pki", "fedgraph-run", "fedgraph-prepare",
                                    "fedgraph-check"])
def test_every_console_script_answers_help(installed, tmp_path, script):
    site, env = installed
    done = command([str(site / "bin" / script), "--help"], env, tmp_path)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


def test_a_member_makes_keys_and_a_trust_file_outside_the_checkout(installed, tmp_path):
    _, env = installed
    for args in (["fedgraph-deploy", "keygen", "--out", "signer"],
                 ["fedgraph-deploy", "trust", "--out", "trusted.yaml", "signer/app-signing.pub"],
                 [sys.executable, "-m", "deploy.pki", "--out", "pki", "--nodes", "1"],
                 [sys.executable, "-m", "deploy", "--help"]):
        done = command(args, env, tmp_path)
        assert done.returncode == 0, f"{args}: {done.stderr[-2000:]}"
    assert (tmp_path / "signer" / "app-signing").stat().st_mode & 0o777 == 0o600
    assert "ssh-ed25519" in (tmp_path / "trusted.yaml").read_text()
    assert (tmp_path / "pki" / "supernode-0").exists()


def test_the_installed_package_signs_the_bundle_flwr_run_builds_in_the_checkout(installed, tmp_path):
    """``sign`` without ``--app`` signs the installed app: the very FAB ``flwr run .`` submits
    from a checkout (same files, same pyproject.toml), so one signature serves both."""
    _, env = installed
    checkout_fab = hashlib.sha256(build_fab_from_disk(REPO)).hexdigest()
    keygen = command(["fedgraph-deploy", "keygen", "--out", "signer"], env, tmp_path)
    assert keygen.returncode == 0, keygen.stderr
    done = command(["fedgraph-deploy", "sign", "--key", "signer/app-signing", "--signatures", "sigs"], env, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().endswith(f"FAB sha256 {checkout_fab}"), done.stdout
    assert (tmp_path / "sigs" / f"{checkout_fab}.json").exists()
