"""The app's files as ``flwr run`` bundles them, from wherever the package is imported.

The app bundle (FAB) holds the files ``fab-include`` in the app's ``pyproject.toml``
names (the ``app``, ``clients``, ``strategies`` and ``deploy`` packages' Python files) and
that ``pyproject.toml``. In a checkout the packages are its folders and
``deploy/app.pyproject.toml`` links to its ``pyproject.toml``; in an installed package
(``pip install``) they are the installed packages and the copy of ``pyproject.toml``
installed with ``deploy``. :func:`stage_app` copies them into one folder, from which
Flower's builder makes the same bundle as ``flwr run .`` in the checkout (its builder walks
every file under the folder it is given, a checkout's ``.venv`` too: seconds per build).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tomllib
from pathlib import Path

#: the app's pyproject.toml as the deploy package carries it
APP_PYPROJECT = Path(__file__).resolve().parent / "app.pyproject.toml"


def app_pyproject() -> bytes:
    """The app's ``pyproject.toml`` (a one-line FileNotFoundError when the package lacks it)."""
    try:
        return APP_PYPROJECT.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{APP_PYPROJECT} is missing: the deploy package was installed without the app's "
                                "pyproject.toml; valid: pip install of the fedgraph-clustering package") from None


def app_packages() -> list[str]:
    """The top-level folders ``fab-include`` names (``app``, ``clients``, ...)."""
    patterns = tomllib.loads(app_pyproject().decode())["tool"]["flwr"]["app"]["fab-include"]
    return sorted({pattern.split("/", 1)[0] for pattern in patterns})


def package_dir(name: str) -> Path:
    """Where the package ``name`` is imported from."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name!r} of the app is not importable; valid: an installed "
                                "fedgraph-clustering package or a checkout on the Python path")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def stage_app(out: Path) -> Path:
    """A copy of the app's files (:func:`app_packages` and ``pyproject.toml``) in ``out/app``,
    which Flower builds into the bundle ``flwr run .`` submits from a checkout. An earlier staging
    there is replaced; anything else there is refused (FileExistsError): ``out`` may be a checkout."""
    stage = Path(out) / "app"
    packages = app_packages()
    if os.path.lexists(stage):
        staged = not stage.is_symlink() and stage.is_dir() and \
            {p.name for p in stage.iterdir()} == {*packages, "pyproject.toml"}
        if not staged:
            raise FileExistsError(f"{stage} exists and is not a staged app (only the folders {', '.join(packages)} "
                                  "and pyproject.toml); valid: a directory without an 'app' entry")
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    for name in packages:
        shutil.copytree(package_dir(name), stage / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", APP_PYPROJECT.name))
    (stage / "pyproject.toml").write_bytes(app_pyproject())
    return stage
