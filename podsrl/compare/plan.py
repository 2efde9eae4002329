"""The plan of a comparison: the base config, the methods (dotted overrides over it) and the seeds;
every method x seed's resolved Config is built and validated before any training.

The budget is the base's ``train.max_steps`` and/or ``train.max_seconds`` (whichever comes first,
as in ``podsrl train``), the same for every method."""

from __future__ import annotations

import copy
import inspect
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podsrl import config as config_mod
from podsrl.config import Config
from podsrl.errors import ConfigError

# The embedded default comparison; configs/compare.toml is the same written as a file (a test
# checks they agree). Sized for the embedded 135M model on a CPU: 10 minutes of training per run
# (the demo's budget), evaluated every minute.
_D3S_SCHEDULE = {
    "select.m_final": 8,
    "select.m_schedule": "linear",
    "select.token_fraction": 0.5,
    "select.token_fraction_final": 1.0,
    "select.token_schedule": "linear",
}
DEFAULT_METHODS: dict[str, dict[str, Any]] = {
    "grpo": {"select.rule": "all", "rollout.n": 4, "select.m": 4},
    "pods_max_variance": {"select.rule": "max_variance", "rollout.n": 16, "select.m": 4},
    "pods_random": {"select.rule": "random", "rollout.n": 16, "select.m": 4},
    "pods_max_reward": {"select.rule": "max_reward", "rollout.n": 16, "select.m": 4},
    "d3s_intra": {"select.rule": "d3s_intra", "rollout.n": 16, "select.m": 4, **_D3S_SCHEDULE},
    "d3s_cross": {"select.rule": "d3s_cross", "rollout.n": 16, "select.m": 4, **_D3S_SCHEDULE},
}
DEFAULT_COMPARE: dict[str, Any] = {
    "train": {"max_steps": None, "max_seconds": 600.0},
    "eval": {"every_seconds": 60.0},
    "compare": {"seeds": 2, "baseline": "grpo", "target_fraction": 0.99, "methods": DEFAULT_METHODS},
}

# What a method may not override: the comparison's shared ground.
_SHARED_PREFIXES = ("task.", "reward.", "eval.", "train.seed", "train.max_seconds", "train.max_steps")
# Settings that may differ between a run directory's config and the plan: the budget (raising it
# extends a comparison) and cosmetics.
_MAY_DIFFER = {"train.max_seconds", "train.max_steps", "train.progress", "train.out_dir"}
_COMPARE_KEYS = {"seeds", "baseline", "target_fraction", "methods"}


@dataclass(frozen=True)
class Method:
    name: str
    overrides: dict[str, Any]  # dotted setting -> value, applied over the base


@dataclass(frozen=True)
class Plan:
    base: dict[str, Any]  # config sections (no [compare]), CLI overrides applied
    methods: list[Method]  # the ones to run and report, in order
    all_methods: dict[str, Method]
    seeds: int
    baseline: str
    target_fraction: float = 0.99
    configs: dict[tuple[str, int], Config] = field(default_factory=dict, repr=False)

    def config(self, method: str, seed: int) -> Config:
        if (method, seed) not in self.configs:
            self.configs[(method, seed)] = resolve(self.base, self.all_methods[method], seed)
        return self.configs[(method, seed)]


def load_plan(
    path: str | Path | None = None,
    overrides: list[str] = (),
    *,
    seeds: int | None = None,
    methods: str | list[str] | None = None,
) -> Plan:
    """Read and validate a comparison: every method's config (seed 0) is built here, so a bad
    setting fails before any training. ``methods``: a subset, comma-separated or a list."""
    if path is None:
        data = copy.deepcopy(DEFAULT_COMPARE)
    else:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"comparison file {path} does not exist")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as err:
            raise ConfigError(f"comparison file {path}: not UTF-8 text (byte {err.object[err.start]:#04x}); save it as UTF-8") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"comparison file {path}: invalid TOML: {err}") from err
    table = data.pop("compare", {})
    if not isinstance(table, dict):
        raise ConfigError("[compare] must be a table with seeds, baseline, target_fraction and methods")
    unknown = set(table) - _COMPARE_KEYS
    if unknown:
        raise ConfigError(f"unknown setting compare.{sorted(unknown)[0]}; valid settings in [compare]: {', '.join(sorted(_COMPARE_KEYS))}")
    for key, raw in config_mod.parse_overrides(overrides):
        config_mod.set_dotted(data, key, raw, from_text=True)

    n_seeds = seeds if seeds is not None else table.get("seeds", DEFAULT_COMPARE["compare"]["seeds"])
    if isinstance(n_seeds, bool) or not isinstance(n_seeds, int) or n_seeds < 1:
        raise ConfigError(f"compare.seeds: must be a whole number >= 1, got {n_seeds!r}")
    fraction = table.get("target_fraction", 0.99)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ConfigError(f"compare.target_fraction: must be in (0, 1], got {fraction!r}")
    raw_methods = table.get("methods", DEFAULT_METHODS)
    if not isinstance(raw_methods, dict) or not raw_methods:
        raise ConfigError('compare.methods: give a table of named methods, e.g. grpo = { "select.rule" = "all" }')
    all_methods = {}
    for name, over in raw_methods.items():
        if not isinstance(over, dict):
            raise ConfigError(f"compare.methods.{name}: must be a table of dotted settings, got {over!r}")
        all_methods[name] = Method(name, dict(over))
    baseline = table.get("baseline", "grpo")
    if baseline not in all_methods:
        raise ConfigError(f"compare.baseline: {baseline!r} is not a method; methods: {', '.join(all_methods)}")

    if methods is None:
        chosen = list(all_methods)
    else:
        chosen = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
        bad = [m for m in chosen if m not in all_methods]
        if bad or not chosen:
            raise ConfigError(f"--methods: unknown method {bad[0] if bad else '(none)'!r}; methods: {', '.join(all_methods)}")

    base_cfg = _from_dict(data, "the base config")
    if not (base_cfg.eval.every_seconds or base_cfg.eval.every_steps):
        raise ConfigError("eval.every_seconds: a comparison needs held-out evaluations during training; set eval.every_seconds (or eval.every_steps)")
    plan = Plan(base=data, methods=[all_methods[m] for m in chosen], all_methods=all_methods, seeds=n_seeds,
                baseline=baseline, target_fraction=float(fraction))  # fmt: skip
    for method in all_methods.values():  # every method, chosen or not: a typo fails now
        plan.config(method.name, 0)
    return plan


def resolve(base: dict[str, Any], method: Method, seed: int) -> Config:
    """The Config of ``method`` for seed index ``seed`` (train.seed = base seed + seed)."""
    data = copy.deepcopy(base)
    where = f"compare.methods.{method.name}"
    for dotted, value in method.overrides.items():
        if any(dotted == p or dotted.startswith(p) for p in _SHARED_PREFIXES):
            raise ConfigError(
                f"{where}: {dotted!r} must be the same for every method (task, rewards, evaluation, budget and seed "
                "are the comparison's shared ground); set it in the base config instead"
            )
        config_mod.set_dotted(data, dotted, value, from_text=False, where=where)
    base_cfg = _from_dict(base, "the base config")
    data.setdefault("train", {})["seed"] = base_cfg.train.seed + seed
    from podsrl.tasks import TASKS

    if "seed" in inspect.signature(TASKS[base_cfg.task.name]).parameters:
        # The held-out set is drawn with the task's seed (the trainer defaults it to train.seed):
        # pin it to the base's, so every seed is scored on the same problems.
        data.setdefault("task", {})["options"] = {"seed": base_cfg.train.seed, **base_cfg.task.options}
    return _from_dict(data, where)


def _from_dict(data: dict[str, Any], where: str) -> Config:
    try:
        return config_mod.from_dict(copy.deepcopy(data))
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
