"""A node's own privacy policy: what its client may send, whatever a run asks.

The policy comes from the node, never from the run: the SuperNode's node
config (``flower-supernode --node-config``, or ``InProcessGrid(node_configs=...)``
in tests) carries it, as inline keys ``privacy.<section>.<rule>=value`` and/or
a TOML file named by ``privacy-policy='/abs/path/policy.toml'`` with one table
per section (inline keys win over the file's)::

    [all]                      # every strategy
    secure-aggregation = true
    min-group = 3
    [fedspectral-plus]
    noise-multiplier = 2.0
    epsilon = 8.0

Sections: ``all`` and each strategy name; a strategy's own section overrides
``all``. The rules (:data:`RULES`) and which strategies can meet them:

* ``secure-aggregation`` (default false): every upload the strategy can mask
  must be requested masked (a request without ``secagg_tag`` is refused).
  fedkmeans, kcagc, kcagc-basic, fedspectral-plus, fedsc, fedavg-dmon.
* ``min-group`` (default 2): a masking group (this client included) smaller
  than this is refused. Same strategies.
* ``noise-multiplier`` (default 0): the least noise std / sensitivity (the
  strategy's own noise multiplier) a noised upload must carry; > 0 also
  refuses un-noised uploads. fedspectral-plus, fedsc, fedavg-dmon.
* ``epsilon`` (default inf) and ``delta`` (default 1e-5): this node's total
  budget for the strategy over every run, composed (Opacus RDP) over the
  releases in its on-disk ledger (:mod:`fedgraphcore.privacy.budget`); a release that
  would exceed it, or an un-noised one under a finite budget, is refused.
  fedspectral-plus, fedsc, fedavg-dmon.
* ``min-rows`` (default 5; 1 for fedsc and fedspectral-plus): the least number
  of this node's rows behind any statistic the server can read, clear or
  after unmasking. fedkmeans: every hello centre is the mean of at least
  this many rows (a smaller local cluster joins its nearest one; a node with
  fewer rows refuses), and a Lloyd assignment's sums go out only when each
  adds up at least this many of its rows and no row of the node follows from
  them with every sum sent before (differencing across rounds included);
  else the node sends its last statistics again. fedsc's C_p and
  fedspectral-plus's blocks hold one row per row of the node's data, which
  determines it noise-free: above 1 they are refused un-noised. Other
  strategies send no sum over a subset of rows the server picks (labels,
  model weights, degrees, LDP embeddings) and meet every value.
* ``label-releases`` (default inf): the most replies that label this node's rows (fedkmeans'
  ``kmeans_assign``, fedavg-dmon's ``dmon_assign``, fedspectral's ``fedspectral_local``, kcagc's
  ``kcagc_local``) per dataset over every run, counted in its release record
  (:mod:`fedgraphcore.privacy.releases`); each is at most ``log2(num-clusters)`` bits of a row. Every
  strategy.
* ``min-block-support`` (default 4): fedspectral-plus refuses a block with a
  column whose effective support ``||y||_1^2 / ||y||_2^2`` (the number of
  nodes it spreads over, 1 for a basis vector) is below this: a column on a
  few nodes reads their adjacency rows directly (an identity block returns
  the whole edge set).

A strategy that cannot meet a rule set for it (e.g. ``noise-multiplier`` for
kcagc, ``secure-aggregation`` for gw-ldp) has every request refused. A refusal
raises :class:`PrivacyRefusal`, which names the rule; the server reports it
naming the client (:class:`fedgraphcore.transport.ProtocolError` subclass
``PrivacyRefused`` in :mod:`fedgraphcore.session`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from fedgraphcore.config import ConfigError, Param
from fedgraphcore.data.memory import is_memory
from fedgraphcore.errors import FedGraphError

POLICY_FILE_KEY = "privacy-policy"
LEDGER_KEY = "privacy-ledger"
INLINE_PREFIX = "privacy."
ALL = "all"

MASKING = ("fedkmeans", "kcagc", "kcagc-basic", "fedspectral-plus", "fedsc", "fedavg-dmon")
NOISED = ("fedspectral-plus", "fedsc", "fedavg-dmon")
#: every strategy of :data:`app.registry.STRATEGIES` (a test keeps the two in step)
EVERY = ("fedkmeans", "gw-ldp", "fedspectral", "fedspectral-plus", "fedavg-dmon", "fedsc", "kcagc", "kcagc-basic")
#: a policy's sections: one per strategy, and ``all``
SECTIONS = (ALL, *EVERY)
#: the strategies that send, noise-free, one row of an upload per row of the node's data (fedsc's
#: coefficients C_p, fedspectral-plus's blocks), from which a server that picks the request reads
#: those rows: they meet ``min-rows`` > 1 only noised, and their built-in ``min-rows`` is 1 so that
#: their papers' noise-free modes run unless a node asks for more (``[all]`` or their own section)
ROW_IMAGES = ("fedsc", "fedspectral-plus")
#: ``min-rows`` unless a node sets it: no sum the server reads is one of fewer of a node's rows
MIN_ROWS = 5


@dataclass(frozen=True)
class Rule:
    """One policy key: its typed parameter and the strategies that can meet it."""

    param: Param
    strategies: tuple[str, ...]

    def demanding(self, value) -> bool:
        """Whether ``value`` asks for more than the default (which every strategy meets)."""
        return value != self.param.default


RULES: dict[str, Rule] = {r.param.key: r for r in (
    Rule(Param("secure-aggregation", bool, False,
               "refuse any upload the strategy can mask unless it is requested masked"), MASKING),
    Rule(Param("min-group", int, 2, "smallest masking group, this client included", low=2, high=1024), MASKING),
    Rule(Param("noise-multiplier", float, 0.0,
               "least noise std / sensitivity of a noised upload; > 0 refuses un-noised ones", low=0.0), NOISED),
    Rule(Param("epsilon", float, math.inf, "total epsilon over every run of the strategy (ledger)",
               low=0.0, infinite=True), NOISED),
    Rule(Param("delta", float, 1e-5, "delta at which the ledger's releases are composed", low=1e-12, high=0.5),
         NOISED),
    Rule(Param("min-rows", int, MIN_ROWS,
               "least number of this node's rows behind any statistic built from its rows (a centre, a "
               "cluster's sum; 1 for fedsc and fedspectral-plus, whose noise-free uploads hold one row of "
               "an image per row: > 1 refuses them un-noised)", low=1, high=1_000_000), EVERY),
    Rule(Param("label-releases", float, math.inf,
               "most replies labelling this node's rows (each a partition of them into at most num-clusters "
               "classes) per dataset over every run, counted in its release record", low=0.0, infinite=True),
         EVERY),
    Rule(Param("min-block-support", float, 4.0,
               "least effective support ||y||_1^2 / ||y||_2^2 of every column of a block", low=1.0),
         ("fedspectral-plus",)),
)}


class PrivacyRefusal(FedGraphError):
    """A request this node's privacy policy forbids (a decision, not a bug).

    ``rule`` names the policy rule (or the protocol rule, e.g. ``masking-group``),
    ``detail`` says what was asked and what the policy allows. A client
    answers the step with a refusal reply naming the rule alone
    (:func:`fedgraphcore.transport.refusal`), which the server reads as a refusal; the
    detail stays in the party's log.
    """

    MARKER = "refused by the node's privacy policy"

    def __init__(self, rule: str, detail: str) -> None:
        self.rule = rule
        self.detail = detail
        super().__init__(f"{self.MARKER}, rule '{rule}': {detail}")

    @property
    def public(self) -> str:
        """What the server hears of the refusal (:mod:`fedgraphcore.disclosure`): the rule, not the detail."""
        return f"{self.MARKER}, rule '{self.rule}'"


@dataclass(frozen=True)
class StrategyPolicy:
    """The node's rules for one strategy (``all`` merged with its own section)."""

    strategy: str
    values: Mapping[str, Any]
    ledger: Path | None = None

    def __getitem__(self, key: str):
        return self.values[key]

    def refuse_unmet(self) -> None:
        """Refuse the whole run if the policy sets a rule this strategy cannot meet."""
        for key, rule in RULES.items():
            if self.strategy not in rule.strategies and rule.demanding(self.values[key]):
                raise PrivacyRefusal(key, f"this node sets {key}={self.values[key]!r} for strategy "
                                          f"'{self.strategy}', which cannot meet it (strategies that can: "
                                          f"{', '.join(rule.strategies)})")

    def require_masking(self, action: str, values: Mapping, needed_by_run: bool) -> None:
        """Refuse an upload of ``action`` requested without masking when this node's
        policy or its own view of the run (``needed_by_run``) requires it."""
        if "secagg_tag" in values:
            return
        if self.values["secure-aggregation"]:
            raise PrivacyRefusal("secure-aggregation", f"'{action}' was requested without secure aggregation "
                                                       "(no secagg_tag); this node only sends it masked")
        if needed_by_run:
            raise PrivacyRefusal("secure-aggregation", f"'{action}' was requested without secure aggregation "
                                                       "(no secagg_tag), but this run's configuration masks it")

    def check_group(self, size: int) -> None:
        if size < int(self.values["min-group"]):
            raise PrivacyRefusal("min-group", f"a masking group of {size} client(s), below this node's "
                                              f"min-group={self.values['min-group']}")

    def check_row_images(self, action: str, multiplier: float | None) -> None:
        """Refuse a noise-free (``multiplier`` None) upload of ``action`` holding one row of an image per
        row of this node's data when ``min-rows`` > 1: each such row is a statistic of one row, which a
        server that picks the request reads (:data:`ROW_IMAGES`); only noise can protect it."""
        floor = int(self.values["min-rows"])
        if multiplier is None and floor > 1:
            raise PrivacyRefusal("min-rows", f"'{action}' was requested without noise; each of its rows comes from "
                                             f"one row of this node's data, below this node's min-rows={floor}")

    def noise_floor(self, run_floor: float = 0.0) -> float:
        """The least noise multiplier an upload must carry: this node's, or its run's if higher."""
        return max(float(self.values.get("noise-multiplier", 0.0)), float(run_floor))

    def check_noise(self, action: str, multiplier: float | None, run_floor: float = 0.0) -> None:
        """Refuse ``multiplier`` (None: no noise) below :meth:`noise_floor`."""
        floor = self.noise_floor(run_floor)
        if floor > 0 and (multiplier is None or multiplier < floor * (1 - 1e-9)):
            got = "no noise" if multiplier is None else f"noise multiplier {multiplier:.6g}"
            raise PrivacyRefusal("noise-multiplier", f"'{action}' was requested with {got}; this client needs "
                                                     f"at least {floor:g} (its node's noise-multiplier "
                                                     f"{self.values['noise-multiplier']:g}, its run's "
                                                     f"{float(run_floor):g})")


@dataclass(frozen=True)
class NodePolicy:
    """Every section of a node's policy, validated (see module docstring)."""

    sections: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    ledger: Path | None = None

    def for_strategy(self, strategy: str) -> StrategyPolicy:
        values = {key: rule.param.default for key, rule in RULES.items()}
        if strategy in ROW_IMAGES:
            values["min-rows"] = 1
        values.update(self.sections.get(ALL, {}))
        values.update(self.sections.get(strategy, {}))
        return StrategyPolicy(strategy, values, self.ledger)


def _add(sections: dict, section: str, key: str, value, where: str) -> None:
    if section not in SECTIONS:
        raise ConfigError(f"{where}: unknown privacy policy section '{section}'; valid: {', '.join(SECTIONS)}")
    rule = RULES.get(key)
    if rule is None:
        raise ConfigError(f"{where}: unknown privacy policy rule '{key}' in section '{section}'; valid: "
                          f"{', '.join(RULES)}")
    if section != ALL and section not in rule.strategies:
        raise ConfigError(f"{where}: rule '{key}' does not apply to strategy '{section}'; it applies to "
                          f"{', '.join(rule.strategies)}")
    try:
        sections.setdefault(section, {})[key] = rule.param.coerce(value)
    except ConfigError as err:
        raise ConfigError(f"{where}: section '{section}': {err}") from None


def _read_file(path: Path, sections: dict) -> None:
    try:
        tables = tomllib.loads(path.read_text())
    except OSError as err:
        raise ConfigError(f"cannot read the privacy policy {path}: {err.strerror}") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"privacy policy {path}: {err}") from None
    for section, table in tables.items():
        if not isinstance(table, dict):
            raise ConfigError(f"privacy policy {path}: '{section}' must be a table ([{section}]), "
                              f"got {table!r}")
        for key, value in table.items():
            _add(sections, section, key, value, f"privacy policy {path}")


def ledger_path(node_config: Mapping[str, Any]) -> Path | None:
    """Where this node's privacy ledger lives: node-config ``privacy-ledger``, else
    beside its data (``<data file>.privacy-ledger.jsonl``, or ``privacy-ledger.jsonl``
    in a data directory), else nowhere (simulation and in-memory data: the run context
    keeps it)."""
    if node_config.get(LEDGER_KEY):
        return Path(str(node_config[LEDGER_KEY])).expanduser()
    for key in ("shard", "data"):
        if node_config.get(key) and not is_memory(str(node_config[key])):
            data = Path(str(node_config[key])).expanduser()
            return data / "privacy-ledger.jsonl" if data.is_dir() else data.with_name(
                data.name + ".privacy-ledger.jsonl")
    return None


def node_policy(node_config: Mapping[str, Any]) -> NodePolicy:
    """The policy a node config sets (all defaults without any ``privacy`` key);
    a bad file, section, rule or value raises one-line :class:`ConfigError`."""
    sections: dict[str, dict[str, Any]] = {}
    if node_config.get(POLICY_FILE_KEY):
        _read_file(Path(str(node_config[POLICY_FILE_KEY])).expanduser(), sections)
    for name, value in node_config.items():
        if name.startswith(INLINE_PREFIX):
            section, _, key = name[len(INLINE_PREFIX):].partition(".")
            _add(sections, section, key, value, f"node config '{name}'")
    return NodePolicy(sections, ledger_path(node_config))
