"""The plan of a comparison: the base config, the methods (dotted overrides over it) and the seeds;
every method x seed's resolved Config is built and validated, and every method set up as far as it
goes without a model (``check_setup``), before any training.

The budget is the base's ``train.max_steps`` and/or ``train.max_seconds`` (whichever comes first,
as in ``podsrl train``), the same for every method.

Seeds: ``[compare] seeds = K`` gives every method K seeds (indices 0..K-1); ``seeds_per_method =
{ grpo = 5, ... }`` gives the named methods another count, so one file states a mixed plan (5 seeds
where a claim rests, 3 elsewhere). On the command line ``--seeds`` takes ``N`` (every method N
seeds: the file's per-method counts are dropped), ``NAME=K,...`` (only those methods change,
over the file's plan) or both, ``--seeds 3,grpo=5``. Seed index k is the same training seed
(base train.seed + k) in every method, which is what pairs a method's seed k with the baseline's.

Every number of the report reads each run's evaluations at or before the budget
(:func:`podsrl.compare.stats.within_budget`); ``[compare] read_past_budget = true`` reads those after
it too, as reports did before issue 68 (runs then stopped at the first step end past the budget, so
their last evaluation came after it): a comparison of such runs pins it to report as it did.

A screening (``[compare] screening = true``): the methods are tasks, not training methods on one
task. Each method may then set ``task.*`` (its own task, e.g. one reasoning-gym dataset each), which
a comparison refuses; everything else shared stays shared (rewards, evaluation, budget, seed). With
no common task there is no baseline and no target (``baseline``, ``target_fraction`` and ``targets`` are refused):
the report gives each method's own accuracy before and after training and the signal it trained on
(:mod:`podsrl.compare.report`). It exists to choose a task on which a comparison has room to show
something, before the comparison.

A method's table may name its trainer (``trainer = "trl"``: TRL's GRPOTrainer, ``"trl-pods"``:
podsrl's PODSTrainer in TRL; default ``"podsrl"``), which is not a config setting: it is taken out
of the overrides into ``Method.trainer``. Where the comparison's config leaves a setting unset, a
method trains with its trainer's own default (:func:`podsrl.compare.arms.defaults`: a TRL arm's
loss is TRL's default, ``loss_type = "dapo"``, podsrl's ``loss.aggregation = "token"``; a podsrl
arm's is podsrl's): each tool as its users run it. Set ``loss.aggregation`` in the base config to
compare the arms on one loss. A TRL arm's config is checked for settings TRL has no equivalent for
when it is built (:func:`podsrl.compare.arms.check_config`)."""

from __future__ import annotations

import copy
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podsrl import config as config_mod
import podsrl.compare.arms as arms
from podsrl.compare.arms import PODSRL
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
_PER_METHOD_IN_SCREENING = ("task.",)  # what a screening's methods may set (the module docstring)
_COMPARE_KEYS = {"seeds", "seeds_per_method", "baseline", "target_fraction", "targets", "methods", "screening", "read_past_budget"}
_TARGET_KEYS = {"method", "of", "fraction"}
_TARGET_LEVELS = ("peak", "final")


@dataclass(frozen=True)
class Method:
    name: str
    overrides: dict[str, Any]  # dotted setting -> value, applied over the base
    trainer: str = PODSRL  # "podsrl", or a TRL arm: "trl" (GRPOTrainer), "trl-pods" (PODSTrainer): podsrl.compare.arms


@dataclass(frozen=True)
class Target:
    """One more accuracy to time every method to (``compare.targets``), beside the baseline's: ``fraction``
    x ``method``'s seed-mean peak (``of = "peak"``) or its seed-mean accuracy at the budget (``"final"``)."""

    method: str
    of: str = "peak"
    fraction: float = 0.99

    @property
    def label(self) -> str:
        """"99% of grpo_n8's peak", "trl_grpo_n8's final accuracy"."""
        what = "peak" if self.of == "peak" else "final accuracy"
        return f"{self.method}'s {what}" if self.fraction == 1 else f"{100 * self.fraction:g}% of {self.method}'s {what}"


@dataclass(frozen=True)
class Plan:
    base: dict[str, Any]  # config sections (no [compare]), CLI overrides applied
    methods: list[Method]  # the ones to run and report, in order
    all_methods: dict[str, Method]
    seeds: int  # seeds per method, unless seeds_per_method names it
    baseline: str
    target_fraction: float = 0.99
    seeds_per_method: dict[str, int] = field(default_factory=dict)  # method -> its own seed count
    screening: bool = False  # each method its own task, no baseline (the module docstring); baseline: the first method
    # The report reads each run's evaluations after the budget too (compare.read_past_budget; the reading
    # before issue 68, which committed comparisons of runs that stopped past their budget pin): podsrl.compare.stats.within_budget
    read_past_budget: bool = False
    targets: tuple[Target, ...] = ()  # more accuracies every method is timed to (compare.targets), after the baseline's
    configs: dict[tuple[str, int], Config] = field(default_factory=dict, repr=False)

    def n_seeds(self, method: str) -> int:
        """How many seeds (indices 0..n-1) ``method`` trains and reports."""
        return self.seeds_per_method.get(method, self.seeds)

    def config(self, method: str, seed: int) -> Config:
        if (method, seed) not in self.configs:
            self.configs[(method, seed)] = resolve(self.base, self.all_methods[method], seed, screening=self.screening)
        return self.configs[(method, seed)]

    def trainer(self, method: str) -> str:
        """What trains ``method``: "podsrl", "trl" or "trl-pods" (:mod:`podsrl.compare.arms`)."""
        return self.all_methods[method].trainer


def load_plan(
    path: str | Path | None = None,
    overrides: list[str] = (),
    *,
    seeds: int | str | None = None,
    methods: str | list[str] | None = None,
) -> Plan:
    """Read and validate a comparison: every method's config (seed 0) is built here, so a bad
    setting fails before any training. ``seeds``: the command line's ``--seeds`` (a number, or
    ``"3,grpo=5"``: see the module docstring), over the file's. ``methods``: a subset,
    comma-separated or a list."""
    data = copy.deepcopy(DEFAULT_COMPARE) if path is None else _read_file(Path(path))
    table = data.pop("compare", {})
    screening = _check_compare_table(table)
    for key, raw in config_mod.parse_overrides(overrides):
        config_mod.set_dotted(data, key, raw, from_text=True)
    fraction = _target_fraction(table)
    all_methods = _methods(table)
    baseline = next(iter(all_methods)) if screening else table.get("baseline", "grpo")
    if baseline not in all_methods:
        raise ConfigError(f"compare.baseline: {baseline!r} is not a method; methods: {', '.join(all_methods)}")
    targets = _targets(table, all_methods, fraction)
    n_seeds, per_method = _seed_plan(table, seeds, all_methods)
    chosen = _chosen(methods, all_methods)
    _check_base(data)
    plan = Plan(base=data, methods=[all_methods[m] for m in chosen], all_methods=all_methods, seeds=n_seeds,
                baseline=baseline, target_fraction=fraction, seeds_per_method=per_method, screening=screening,
                read_past_budget=_flag(table, "read_past_budget"),
                targets=targets)  # fmt: skip
    for method in all_methods.values():  # every method, chosen or not: a typo fails now
        plan.config(method.name, 0)
    return plan


def _read_file(path: Path) -> dict[str, Any]:
    """A comparison file's TOML, as a dict; a ConfigError naming the file when it cannot be read."""
    if not path.is_file():
        raise ConfigError(f"comparison file {path} does not exist")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ConfigError(f"comparison file {path}: not UTF-8 text (byte {err.object[err.start]:#04x}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"comparison file {path}: invalid TOML: {err}") from err


def _check_compare_table(table: Any) -> bool:
    """Check [compare]'s keys and a screening's; returns whether it is a screening."""
    if not isinstance(table, dict):
        raise ConfigError("[compare] must be a table with seeds, seeds_per_method, baseline, target_fraction, targets and methods")
    unknown = set(table) - _COMPARE_KEYS
    if unknown:
        raise ConfigError(f"unknown setting compare.{sorted(unknown)[0]}; valid settings in [compare]: {', '.join(sorted(_COMPARE_KEYS))}")
    screening = table.get("screening", False)
    if not isinstance(screening, bool):
        raise ConfigError(f"compare.screening: must be true or false, got {screening!r}")
    for key in ("baseline", "target_fraction", "targets") if screening else ():
        if key in table:
            raise ConfigError(f"compare.{key}: a screening (compare.screening = true) trains each method on its own task, so "
                              f"no method is a baseline and there is no target; drop compare.{key}")  # fmt: skip
    return screening


def _flag(table: dict[str, Any], key: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise ConfigError(f"compare.{key}: must be true or false, got {value!r}")
    return value


def _target_fraction(table: dict[str, Any]) -> float:
    fraction = table.get("target_fraction", 0.99)
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
        raise ConfigError(f"compare.target_fraction: must be in (0, 1], got {fraction!r}")
    return float(fraction)


def _targets(table: dict[str, Any], all_methods: dict[str, Any], fraction: float) -> tuple[Target, ...]:
    """compare.targets: a list of tables ``{ method = "grpo_n8" }``, ``{ method = "trl_grpo_n8", of = "final" }``;
    ``fraction`` defaults to compare.target_fraction for a peak and to 1 for a final accuracy."""
    raw = table.get("targets", [])
    example = 'e.g. targets = [{ method = "grpo_n8" }, { method = "trl_grpo_n8", of = "final" }]'
    if not isinstance(raw, list):
        raise ConfigError(f"compare.targets: must be a list of tables, {example}")
    targets = []
    for i, item in enumerate(raw):
        where = f"compare.targets[{i}]"
        if not isinstance(item, dict) or "method" not in item:
            raise ConfigError(f"{where}: must be a table with a method, {example}")
        unknown = set(item) - _TARGET_KEYS
        if unknown:
            raise ConfigError(f"{where}.{sorted(unknown)[0]}: unknown; a target has {', '.join(sorted(_TARGET_KEYS))}")
        if item["method"] not in all_methods:
            raise ConfigError(f"{where}.method: {item['method']!r} is not a method; methods: {', '.join(all_methods)}")
        of = item.get("of", "peak")
        if of not in _TARGET_LEVELS:
            raise ConfigError(f"{where}.of: {of!r}; valid: 'peak' (the method's peak) or 'final' (its accuracy at the budget)")
        value = item.get("fraction", fraction if of == "peak" else 1.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            raise ConfigError(f"{where}.fraction: must be in (0, 1], got {value!r}")
        targets.append(Target(item["method"], of, float(value)))
    return tuple(targets)


def _methods(table: dict[str, Any]) -> dict[str, Method]:
    """[compare.methods] (default: DEFAULT_METHODS), each a named Method."""
    raw_methods = table.get("methods", DEFAULT_METHODS)
    if not isinstance(raw_methods, dict) or not raw_methods:
        raise ConfigError('compare.methods: give a table of named methods, e.g. grpo = { "select.rule" = "all" }')
    all_methods = {}
    for name, over in raw_methods.items():
        if not isinstance(over, dict):
            raise ConfigError(f"compare.methods.{name}: must be a table of dotted settings, got {over!r}")
        over = dict(over)
        trainer = arms.check_trainer_name(over.pop("trainer", PODSRL), f"compare.methods.{name}.trainer")
        all_methods[name] = Method(name, over, trainer)
    return all_methods


def _chosen(methods: str | list[str] | None, all_methods: dict[str, Method]) -> list[str]:
    """The methods to run and report: ``--methods`` (comma-separated or a list), else every one."""
    if methods is None:
        return list(all_methods)
    chosen = [m.strip() for m in (methods.split(",") if isinstance(methods, str) else methods) if m.strip()]
    bad = [m for m in chosen if m not in all_methods]
    if bad or not chosen:
        raise ConfigError(f"--methods: unknown method {bad[0] if bad else '(none)'!r}; methods: {', '.join(all_methods)}")
    return chosen


def _check_base(data: dict[str, Any]) -> None:
    """The base config builds, and it evaluates during training (what a comparison reads)."""
    base_cfg = _from_dict(data, "the base config")
    if not (base_cfg.eval.every_seconds or base_cfg.eval.every_steps):
        raise ConfigError("eval.every_seconds: a comparison needs held-out evaluations during training; set eval.every_seconds (or eval.every_steps)")


def check_setup(plan: Plan) -> None:
    """Every method to run, set up as far as it goes without a model (:func:`podsrl.compare.arms.check_setup`:
    the training dtype, settings under which nothing could be learned, the reward functions loaded,
    early stopping against their declared values; its trainer installed), so that one refused method
    stops the comparison before the first run trains rather than after the others. ``load_plan``
    checked the configs already; this needs the reward functions (user code), which
    ``--report-only`` does not."""
    for method in plan.methods:
        try:
            arms.check_setup(plan.config(method.name, 0))
            arms.check_trainer(method.trainer)
        except (ConfigError, ImportError) as err:
            raise ConfigError(f"compare.methods.{method.name}: {err}") from None


def _seed_plan(table: dict[str, Any], cli: int | str | None, methods: dict[str, Method]) -> tuple[int, dict[str, int]]:
    """(default seed count, {method: its own count}) from [compare] and --seeds."""
    default = _seed_count(table.get("seeds", DEFAULT_COMPARE["compare"]["seeds"]), "compare.seeds")
    raw = table.get("seeds_per_method", {})
    if not isinstance(raw, dict):
        raise ConfigError(f"compare.seeds_per_method: give a table of method = number of seeds, e.g. {{ grpo = 5 }}; got {raw!r}")
    per_method = {name: _seed_count(k, f"compare.seeds_per_method.{name}") for name, k in raw.items()}
    where = "compare.seeds_per_method"
    if cli is not None:
        where = "--seeds"
        cli_default, cli_named = _parse_seeds_option(cli)
        if cli_default is not None:  # a number on the command line is every method's count
            default, per_method = cli_default, {}
        per_method.update(cli_named)
    for name in per_method:
        if name not in methods:
            raise ConfigError(f"{where}: {name!r} is not a method; methods: {', '.join(methods)}")
    return default, {name: k for name, k in per_method.items() if k != default}


def _parse_seeds_option(value: int | str) -> tuple[int | None, dict[str, int]]:
    """``--seeds``: 5 -> (5, {}); "3,grpo=5" -> (3, {"grpo": 5}); "grpo=5" -> (None, {"grpo": 5})."""
    if isinstance(value, int) and not isinstance(value, bool):
        return _seed_count(value, "--seeds"), {}
    usage = "give a number of seeds for every method and/or METHOD=K for some, e.g. --seeds 3 or --seeds 3,grpo=5"
    default, named = None, {}
    for part in (p.strip() for p in str(value).split(",")):
        name, eq, count = (s.strip() for s in part.partition("="))
        text = count if eq else name
        if not text.isdigit() or (eq and not name) or (not eq and default is not None) or name in named:
            raise ConfigError(f"--seeds: {usage}; got {value!r}")
        if eq:
            named[name] = _seed_count(int(text), f"--seeds {name}")
        else:
            default = _seed_count(int(text), "--seeds")
    return default, named


def _seed_count(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where}: must be a whole number >= 1, got {value!r}")
    return value


def resolve(base: dict[str, Any], method: Method, seed: int, *, screening: bool = False) -> Config:
    """The Config of ``method`` for seed index ``seed`` (train.seed = base seed + seed); in a
    screening the method may set its own task (the module docstring)."""
    data = copy.deepcopy(base)
    where = f"compare.methods.{method.name}"
    for dotted, value in method.overrides.items():
        own = screening and any(dotted.startswith(p) for p in _PER_METHOD_IN_SCREENING)
        if not own and any(dotted == p or dotted.startswith(p) for p in _SHARED_PREFIXES):
            shared = "rewards, evaluation, budget and seed" if screening else "task, rewards, evaluation, budget and seed"
            raise ConfigError(
                f"{where}: {dotted!r} must be the same for every method ({shared} are the comparison's shared ground); "
                "set it in the base config instead"
            )
        config_mod.set_dotted(data, dotted, value, from_text=False, where=where)
    for dotted, value in arms.defaults(method.trainer).items():  # the trainer's own, where the comparison sets none
        section, _, key = dotted.partition(".")
        if key not in data.get(section, {}):
            config_mod.set_dotted(data, dotted, value, from_text=False, where=where)
    base_cfg = _from_dict(base, "the base config")
    data.setdefault("train", {})["seed"] = base_cfg.train.seed + seed
    # A comparison measures; it does not ship models: no RUN/model (about 0.5 GB for the embedded
    # 135M model, and a few seconds) for each method x seed unless the base asks for them.
    data["train"].setdefault("export_model", False)
    from podsrl.tasks import task_options

    task = _from_dict(data, where).task  # the base's, or in a screening the method's own
    if "seed" in task_options(task.name):
        # The held-out set is drawn with the task's seed (the trainer defaults it to train.seed):
        # pin it to the base's, so every seed is scored on the same problems.
        data.setdefault("task", {})["options"] = {"seed": base_cfg.train.seed, **task.options}
    cfg = _from_dict(data, where)
    try:
        arms.check_config(cfg, method.trainer)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
    return cfg


def _from_dict(data: dict[str, Any], where: str) -> Config:
    try:
        return config_mod.from_dict(copy.deepcopy(data))
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None
