"""Typed, validated run configuration.

A run is configured by a flat mapping of keys to scalars (Flower's run-config:
``[tool.flwr.app.config]`` in ``pyproject.toml``, overridden by ``flwr run
--run-config`` or ``python -m app.run --set``). Keys shared by every method are
plain (``strategy``, ``dataset``, ...); per-method keys carry the method as a
prefix (``kcagc.local-factor``). Every key is declared once: a key code reads through
a typed view is a field of that :class:`ConfigView` (its type, default, help and range
given by :func:`setting`), from which :meth:`ConfigView.params` builds its :class:`Param`;
the other keys (the data's, the privacy policy's) are plain Params. :meth:`Schema.validate`
turns a raw mapping into a :class:`RunConfig` or raises :class:`ConfigError` with one line
naming the bad value and the valid choices.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterable, Mapping, TypeVar

from fedgraphcore.errors import FedGraphError

Scalar = bool | int | float | str


class ConfigError(FedGraphError, ValueError):
    """A bad configuration value; the message is one line meant for the user.

    ``public``: what a party may tell the server of it (the setting or rule, without the party's
    values, IDs or paths; :mod:`fedgraphcore.disclosure`); None: the message crosses as the type name only."""

    exit_code = 2

    def __init__(self, message: str, *, public: str | None = None) -> None:
        super().__init__(message)
        self.public = public


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are a ConfigError (one line, exit 2 from the caller), not usage lines + error."""

    def error(self, message: str):
        raise ConfigError(message.replace("\n", " "))


def parse_assignments(items: list[str]) -> dict[str, str]:
    """``--set key=value`` items as ``{key: value}`` (stripped strings); a key given twice is
    refused (the later one silently winning would hide a typo)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise ConfigError(f"invalid --set {item!r}; expected key=value")
        if key in out:
            raise ConfigError(f"--set {key} given twice ({out[key]!r}, {value!r}); valid: once")
        out[key] = value
    return out


def exit_code(run, argv: list[str] | None = None) -> int:
    """A command line tool's exit code: ``run(argv)`` gives 0; a ConfigError, its one line on
    stderr and 2 (a user error)."""
    import sys

    try:
        run(argv)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


@dataclass(frozen=True)
class Param:
    """One run-config key.

    ``kind`` is the Python type (bool, int, float, str). Numbers may carry an
    inclusive range ``low``/``high``; strings may carry ``choices``, or a
    ``check`` that raises ConfigError for a bad value (``dataset``: a built-in
    name or a path). Floats must be finite (NaN passes every range check),
    unless ``infinite``: then ``inf`` is a valid value too, with the meaning the
    help text gives it. ``primary`` marks the keys that matter most for a
    method's result (listed first and marked in ``python -m app.run --strategy
    S --help``).
    """

    key: str
    kind: type
    default: Scalar
    help: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] | None = None
    infinite: bool = False
    check: Callable[[Any], None] | None = None
    primary: bool = False

    def valid(self) -> str:
        """The valid values in words: the choices, the inclusive range, or the kind."""
        if self.kind is bool:
            return "true, false"
        if self.choices is not None:
            return ", ".join(self.choices)
        if self.kind is str:
            return "text"
        low = "(-inf" if self.low is None else f"[{_fmt(self.low, '')}"
        high = "inf]" if self.infinite else ("inf)" if self.high is None else f"{_fmt(self.high, '')}]")
        return f"{low}, {high}"

    def coerce(self, value: Any) -> Scalar:
        """Return ``value`` as this parameter's type, or raise ConfigError."""
        value = _parse(value, self.kind, self.key)
        if self.choices is not None and value not in self.choices:
            raise ConfigError(
                f"invalid value {value!r} for '{self.key}'; valid choices: "
                + ", ".join(self.choices)
            )
        if self.check is not None:
            self.check(value)
        if self.kind is float and not (math.isfinite(value) or (self.infinite and value == math.inf)):
            raise ConfigError(
                f"invalid value {value!r} for '{self.key}'; valid: a {'' if self.infinite else 'finite '}number "
                f"in {self.valid()}"
            )
        if self.kind in (int, float):
            if (self.low is not None and value < self.low) or (
                self.high is not None and value > self.high
            ):
                raise ConfigError(
                    f"value {value!r} for '{self.key}' is out of range; "
                    f"valid range: [{_fmt(self.low, '-inf')}, {_fmt(self.high, 'inf')}]"
                )
        return value


def _fmt(bound: float | None, unbounded: str) -> str:
    if bound is None:
        return unbounded
    return str(bound) if isinstance(bound, int) else f"{bound:g}"  # integer bounds exactly (seed: 2**32 - 1)


def _parse(value: Any, kind: type, key: str) -> Scalar:
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ConfigError(f"invalid value {value!r} for '{key}'; valid choices: true, false")
    if kind is int:
        if isinstance(value, bool):
            raise ConfigError(f"invalid value {value!r} for '{key}'; expected an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(f"invalid value {value!r} for '{key}'; expected an integer")
    if kind is float:
        if isinstance(value, bool):
            raise ConfigError(f"invalid value {value!r} for '{key}'; expected a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"invalid value {value!r} for '{key}'; expected a number")
    if kind is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"invalid value {value!r} for '{key}'; expected a string")
    raise TypeError(f"unsupported parameter type {kind!r} for '{key}'")


@dataclass(frozen=True)
class RunConfig:
    """A validated configuration: every declared key present, typed and in range."""

    values: Mapping[str, Scalar]

    def __getitem__(self, key: str) -> Scalar:
        return self.values[key]

    def get(self, key: str, default: Scalar | None = None) -> Scalar | None:
        return self.values.get(key, default)

    def section(self, prefix: str) -> dict[str, Scalar]:
        """Keys under ``prefix.`` as Python keyword names (``p-in`` -> ``p_in``)."""
        start = prefix + "."
        return {
            k[len(start):].replace("-", "_"): v
            for k, v in self.values.items()
            if k.startswith(start)
        }

    def as_dict(self) -> dict[str, Scalar]:
        return dict(self.values)


ViewT = TypeVar("ViewT", bound="ConfigView")

#: the metadata key of a view field's declaration (:func:`setting`)
_SETTING = "setting"


def setting(default: Scalar, help: str, *, low: float | None = None, high: float | None = None,
            choices: tuple[str, ...] | None = None, infinite: bool = False,
            check: Callable[[Any], None] | None = None, primary: bool = False) -> Any:
    """The declaration of one run-config key as a field of a :class:`ConfigView`: its default and
    the rest of its :class:`Param` (the key comes from the field's name, the kind from its type)."""
    declared = dict(help=help, low=low, high=high, choices=choices, infinite=infinite, check=check,
                    primary=primary)
    return field(default=default, metadata={_SETTING: declared})


@dataclass(frozen=True)
class ConfigView:
    """A typed, read-only view of some keys of a :class:`RunConfig`, and their declaration.

    A subclass is a frozen dataclass whose fields are keys under its ``prefix``,
    ``-`` written ``_``: a field ``filter_order`` of a view with prefix
    ``"fedkmeans"`` reads ``fedkmeans.filter-order``; prefix ``""`` reads shared
    keys (``num_clusters`` reads ``num-clusters``). Each field is declared with
    :func:`setting`; :meth:`params` are the keys' Params, in field order. The schema
    has typed and range-checked every value, so a view only names them for code and tools.
    """

    prefix: ClassVar[str] = ""

    @classmethod
    def key(cls, name: str) -> str:
        """The run-config key of field ``name``."""
        key = name.replace("_", "-")
        return f"{cls.prefix}.{key}" if cls.prefix else key

    @classmethod
    def params(cls) -> tuple[Param, ...]:
        """The Param of every field, in declaration order."""
        out = []
        for f in dataclasses.fields(cls):
            if _SETTING not in f.metadata:
                raise TypeError(f"{cls.__name__}.{f.name} is not declared with fedgraphcore.config.setting()")
            kind = _TYPES[f.type] if isinstance(f.type, str) else f.type
            out.append(Param(cls.key(f.name), kind, f.default, **f.metadata[_SETTING]))
        return tuple(out)

    @classmethod
    def keys(cls) -> dict[str, type]:
        """Run-config key -> Python type of every field."""
        return {p.key: p.kind for p in cls.params()}

    @classmethod
    def of(cls: type[ViewT], config: RunConfig) -> ViewT:
        """This view of ``config``."""
        return cls(**{f.name: config[cls.key(f.name)] for f in dataclasses.fields(cls)})


_TYPES = {"bool": bool, "int": int, "float": float, "str": str}


@dataclass(frozen=True)
class SharedConfig(ConfigView):
    """The keys every method shares, less secure aggregation's (:class:`SecAggConfig`). The
    choices of ``strategy``, ``partitioner`` and ``transport`` and the check of ``dataset`` come
    from the layers that define them (:func:`app.registry.core_params` adds them)."""

    strategy: str = setting("fedkmeans", "clustering method")
    dataset: str = setting("sbm", "a built-in dataset's name, or the path of a graph file or directory; "
                                  "'parties': every SuperNode brings its own data (node config data=PATH)")
    # 'parties' is fedgraphcore.data.parties.PARTIES (tests/test_config.py holds the two together)
    num_clusters: int = setting(0, "clusters to find; 0 = number of classes in the dataset", low=0,
                                high=100_000_000, primary=True)
    partitioner: str = setting("auto", "how the data is split over clients; auto = the method's own")
    seed: int = setting(0, "seed of data generation, partitioning and the protocol", low=0,
                        high=2**32 - 1)  # scikit-learn's largest random_state
    num_rounds: int = setting(20, "protocol rounds (each method says what a round is)", low=1, high=1_000_000,
                              primary=True)
    num_clients: int = setting(0, "clients taking part; 0 = every connected SuperNode", low=0, high=1024)
    retries: int = setting(0, "ask a client that did not answer within timeout again, this many times", low=0,
                           high=100)
    min_clients: int = setting(1, "strategies that tolerate dropouts stop when fewer clients remain", low=1,
                               high=1024)
    timeout: float = setting(600.0, "seconds to wait for the clients' replies in one step", low=0.001)
    transport: str = setting("backoff", "reply polling: backoff (2-50 ms, default) or flower "
                                        "(Grid.send_and_receive)")
    reference: bool = setting(True, "also run the centralised reference on the pooled data")
    eval_file: str = setting("", "server-side evaluation file (deployment); empty = load the dataset "
                                 "(simulation)")
    out_dir: str = setting("", "where result.json goes; empty = results/<strategy>-<dataset>-<time>")
    resume: bool = setting(False, "continue the interrupted run in out-dir from its journal (fedgraphcore.journal)")
    report: bool = setting(True, "write the run's page, report.html, beside result.json (and what it draws of the "
                                 "data, report-data.npz); false: result.json and the labels only, e.g. in a sweep "
                                 "of many runs")


@dataclass(frozen=True)
class SecAggConfig(ConfigView):
    """Secure aggregation's fixed-point ``scale`` and the declared ``bound`` of a summed value."""

    prefix: ClassVar[str] = "secagg"
    scale: float = setting(float(2**20), "secure aggregation: fixed-point scale (resolution 1/scale)", low=1.0,
                           high=float(2**40))
    bound: float = setting(1e6, "secure aggregation: largest |value| one client may contribute (fedkmeans: "
                                "one row's, its sums may reach its rows x this)", low=1e-9)


@dataclass(frozen=True)
class NoiseConfig(ConfigView):
    """``privacy.noise-seed``: repeatable privacy noise, for research runs in simulation or in process."""

    prefix: ClassVar[str] = "privacy"
    noise_seed: int = setting(-1, "seed of every client's privacy noise (LDP codes, DP noise, noise ratios), so that "
                                  "a noised run repeats byte for byte: simulation and in-process runs only (a node "
                                  "with its own data, i.e. deployed, refuses a run that sets it); -1: unset, fresh OS "
                                  "entropy at every release", low=-1, high=2**32 - 1)


@dataclass(frozen=True)
class NoConfig(ConfigView):
    """The view of a method without keys of its own."""


#: the command that lists every run-config key with its type, default and meaning
KEYS_COMMAND = "python -m app.run describe [STRATEGY]"


@dataclass
class Schema:
    """The set of declared parameters."""

    params: dict[str, Param] = field(default_factory=dict)

    def add(self, params: Iterable[Param]) -> None:
        for p in params:
            if p.key in self.params:
                raise ValueError(f"run-config key '{p.key}' declared twice")
            self.params[p.key] = p

    def defaults(self) -> dict[str, Scalar]:
        return {k: p.default for k, p in self.params.items()}

    def validate(self, raw: Mapping[str, Any]) -> RunConfig:
        unknown = sorted(set(raw) - set(self.params))
        if unknown:
            close = difflib.get_close_matches(unknown[0], list(self.params), n=3)
            hint = f"closest: {', '.join(close)}" if close else "no key is close"
            raise ConfigError(f"unknown config key '{unknown[0]}'; {hint}; every key: {KEYS_COMMAND}")
        values = self.defaults()
        for key, value in raw.items():
            values[key] = self.params[key].coerce(value)
        return RunConfig(values)
