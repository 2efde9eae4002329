"""User reward functions: ``"module:function"`` or ``"path/to/file.py:function"``, podsrl-style
``fn(completion: str, example: Example) -> float`` or TRL-style batched
``fn(prompts, completions, **columns) -> list[float | None]``.

A TRL-style function (one with a parameter named ``completions``, :func:`is_batched`) is adapted by
:func:`from_batched`: it is called with ``prompts=[question]``, ``completions=[completion]`` (plain
strings, TRL's "standard" format), ``answer=[answer]``, ``id=[id]`` and ``question=[question]``,
only the names the function accepts unless it takes ``**kwargs``; it must return one number. One
call per completion: correct, not batched.

A ``"module:function"`` whose module is on no entry of sys.path is looked for in the current
directory, as ``python -m`` would find it: the directory is appended to sys.path (after the installed
packages, so it shadows none of them), for the rest of the process. That imports only the module the
config names, as a file path would (SECURITY.md: a config, a resumed run's too, names code to run).

Every failure to load (module not found, import error, missing attribute, not callable, wrong
arguments) is a ConfigError naming the spec and the fix.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from podsrl.errors import ConfigError
from podsrl.tasks.types import Example

__all__ = ["RewardFn", "from_batched", "is_batched", "load_user_reward", "user_rewards"]

RewardFn = Callable[[str, Example], float]


def load_user_reward(spec: str) -> RewardFn:
    """The function a ``"module:function"`` or ``"file.py:function"`` spec names, checked to be callable
    as ``fn(completion, example)`` (a TRL-style batched function is adapted, :func:`from_batched`)."""
    module_name, _, attribute = spec.rpartition(":")
    usage = (
        "give a user reward as 'module:function' (importable from sys.path or the current directory) or "
        "'path/to/file.py:function', where the function is "
        "def fn(completion: str, example: Example) -> float"
    )
    if not module_name or not attribute:
        raise ConfigError(f"reward {spec!r} is malformed; {usage}")
    is_file = module_name.endswith(".py") or "/" in module_name or "\\" in module_name
    module = _import_file(spec, Path(module_name)) if is_file else _import_module(spec, module_name)
    if not hasattr(module, attribute):
        available = sorted(
            n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
        )
        raise ConfigError(
            f"reward {spec!r}: {module_name} has no attribute {attribute!r} "
            f"(its callables: {', '.join(available) or 'none'}); "
            f"define def {attribute}(completion: str, example: Example) -> float there"
        )
    fn = getattr(module, attribute)
    if not callable(fn):
        raise ConfigError(
            f"reward {spec!r}: {module_name}.{attribute} is a {type(fn).__name__}, not a "
            "function; it must be def fn(completion: str, example: Example) -> float"
        )
    # A TRL-style batched reward, fn(prompts, completions, **columns) -> list[float], is adapted.
    if is_batched(fn):
        return from_batched(fn, spec)
    try:
        inspect.signature(fn).bind("", Example("", "", ""))
    except TypeError as exc:
        raise ConfigError(
            f"reward {spec!r}: {attribute} cannot be called as fn(completion, example) ({exc}); "
            "give it exactly those two parameters"
        ) from None
    except ValueError:
        pass  # no introspectable signature (some builtins): trust it, _score still guards calls
    return fn


def user_rewards(names) -> list[str]:
    """The user specs among the rewards ``names`` (``reward.names``), each once, in order: the code
    that loading them imports (the "module" or "file.py" part) and calls (the function)."""
    return list(dict.fromkeys(name for name in names if ":" in name))


def _import_module(spec: str, module_name: str) -> object:
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            cwd = os.getcwd()
            if cwd not in sys.path and "" not in sys.path:  # as `python -m` would (the module docstring)
                sys.path.append(cwd)
                importlib.invalidate_caches()
                return _import_module(spec, module_name)
            raise ConfigError(
                f"reward {spec!r}: no module named {module_name!r} on sys.path or in the current directory "
                f"({cwd}); check the spelling, install it, or pass a file path like 'path/to/file.py:function'"
            ) from None
        raise ConfigError(f"reward {spec!r}: importing {module_name} failed: {exc}") from exc
    except Exception as exc:
        raise ConfigError(
            f"reward {spec!r}: importing {module_name} failed ({type(exc).__name__}: {exc})"
        ) from exc


def _import_file(spec: str, path: Path) -> object:
    path = path.expanduser().resolve()
    if not path.is_file():
        raise ConfigError(
            f"reward {spec!r}: file {str(path)!r} does not exist; give a path to a .py file "
            "as 'path/to/file.py:function'"
        )
    # A unique module name per file, registered in sys.modules so the user's code can use
    # dataclasses, pickling and relative lookups as in any imported module.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
    name = f"podsrl_user_reward_{path.stem}_{digest}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise ConfigError(f"reward {spec!r}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ConfigError(
            f"reward {spec!r}: running {path} failed ({type(exc).__name__}: {exc})"
        ) from exc
    return module


def is_batched(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` looks like a TRL-style batched reward: it has a parameter named ``completions``."""
    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def from_batched(fn: Callable[..., Sequence[float | None]], spec: str = "") -> Callable[[str, Example], float]:
    """A podsrl reward ``fn(completion, example) -> float`` calling a TRL-style batched reward on one completion.

    Raises ConfigError at once if ``fn`` needs an argument podsrl cannot give (e.g. ``completion_ids``
    without a default, or a dataset column other than answer/id/question).
    """
    label = spec or getattr(fn, "__name__", "reward")
    params = inspect.signature(fn).parameters
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())

    def arguments(completion: str, example: Example) -> dict[str, list[str]]:
        offered = {
            "prompts": [example.question],
            "completions": [completion],
            "answer": [example.answer],
            "id": [example.id],
            "question": [example.question],
        }
        return offered if takes_kwargs else {k: v for k, v in offered.items() if k in params}

    try:
        inspect.signature(fn).bind(**arguments("", Example("", "", "")))
    except TypeError as exc:
        raise ConfigError(
            f"reward {label!r} is a TRL-style batched function but cannot be called with the columns podsrl "
            f"has (prompts, completions, answer, id, question): {exc}; give its other parameters defaults"
        ) from None

    def reward(completion: str, example: Example) -> float:
        values = fn(**arguments(completion, example))
        if not isinstance(values, Sequence) or isinstance(values, str) or len(values) != 1:
            raise TypeError(f"a batched reward must return a list with one value per completion, got {values!r}")
        return values[0]  # podsrl checks it is a finite number (RewardError otherwise)

    reward.__name__ = getattr(fn, "__name__", "reward")
    if hasattr(fn, "reward_values"):  # its declared values (rollout.early_stop), kept through the wrapper
        reward.reward_values = fn.reward_values
    return reward
