"""Use what you trained: a run's checkpoint as a standard Hugging Face model directory.

``podsrl export RUN [--step N] --out DIR`` and the trainer's end-of-run hook (``train.export_model``,
``RUN/model``; ``train.export_checkpoints``: ``checkpoints/step-N/model``) write the same directory::

    full fine-tuning, or LoRA merged (the default):
      config.json, generation_config.json   the base model's, with the exported dtype
      model.safetensors                     above max_shard_size: model-0000k-of-0000K.safetensors
                                            and model.safetensors.index.json
      tokenizer.json, tokenizer_config.json, chat_template.jinja   the base model's tokenizer
      README.md                             the model card (podsrl.run.model_card)
      podsrl_config.toml                    the run's resolved config (`podsrl eval --model DIR` reads it)
      adapter/                              LoRA only: adapter_config.json, adapter_model.safetensors (PEFT)
    LoRA, adapter only (--adapter-only, train.export_merged = false):
      adapter_config.json, adapter_model.safetensors, the tokenizer files, README.md, podsrl_config.toml

``AutoModelForCausalLM.from_pretrained(DIR)``, vLLM (``LLM(model=DIR)``, ``vllm serve DIR``) and
``podsrl eval --model DIR`` load the first; ``PeftModel.from_pretrained(base, DIR, subfolder="adapter")``
(or ``DIR`` itself for an adapter-only export) the adapter.

Choices, where neither the issue nor the libraries decide:

- **The checkpoint on disk is the source, never the live model.** Checkpoints are full tensors
  written by rank 0 whatever the parallelism (:mod:`podsrl.run.checkpoint`: FSDP's shards are
  gathered before saving), so exporting is one process's work and gives the same directory for a
  run trained on 1 process, on N with DDP or with FSDP. The trainer's hook (:func:`after_checkpoint`)
  runs on rank 0 right after a checkpoint is saved; the other ranks go on (the next collective waits
  for rank 0, within ``distributed.timeout_minutes``). It takes CPU memory for one more copy of the
  model while it runs.
- **The model is rebuilt as training built it**: :func:`podsrl.models.load_policy` on the CPU (the
  base weights, and for LoRA the same peft wrapping), the checkpoint loaded with the fit checks of
  ``--resume`` (another model or LoRA setting is a ConfigError), then ``save_pretrained``:
  transformers writes tied weights once, the shards and their index, and the config's dtype; PEFT
  writes the adapter's key names and config. The merged model is PEFT's ``merge_and_unload``
  (W + (alpha / r) B A per adapted layer) in the training dtype, then cast.
- **dtype**: "auto" is ``model.dtype``; a chosen one applies to the model's weights. The adapter is
  saved as trained (PEFT loads adapters in float32 anyway), so ``--dtype`` with ``--adapter-only``
  is refused rather than ignored.
- **Nothing half-written.** The directory is built in a hidden staging sibling (``.DIR.tmp-*``, on
  the same file system) and renamed into place; a directory it replaces is first moved aside
  (``.DIR.old-*``) and deleted afterwards. Any failure deletes the staging directory, so DIR is
  either what it was or complete; a process killed mid-export leaves at worst a ``.DIR.tmp-*``
  sibling, never a partial DIR.
- **Refusals**: a non-empty DIR unless ``overwrite``, and even then only an empty directory or a
  model directory (config.json or adapter_config.json) is replaced; never the run directory or a
  directory that contains it.
- **Pushing** (``--push-to-hub REPO``, ``train.push_to_hub``): ``huggingface_hub``'s
  ``create_repo(exist_ok=True)`` then ``upload_folder``, the token from where huggingface_hub looks
  (``HF_TOKEN``, ``hf auth login``'s file). A missing token and ``HF_HUB_OFFLINE`` are refused
  before anything is built. ``podsrl export`` pushes the staged directory before renaming it into
  place, so a failed push (no network) writes nothing locally; the trainer's hook pushes the
  finished ``RUN/model`` and, when that fails, logs how to push it later and leaves the run as it is
  (hours of training are not failed by a network error).
- **Shards**: 5 GB (``MAX_SHARD_SIZE``), what the Hub recommends and transformers 4 defaulted to
  (transformers 5 writes one file up to 50 GB, which the Hub's upload and some loaders handle badly).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from podsrl.errors import ConfigError
from podsrl.run import checkpoint as ckpt

MODEL_DIR = "model"  # RUN/model, checkpoints/step-N/model
ADAPTER_DIR = "adapter"  # DIR/adapter: the LoRA adapter beside the merged model
CONFIG_FILE = "podsrl_config.toml"
MAX_SHARD_SIZE = "5GB"
# --dtype's spellings -> model.dtype's names ("auto": the run's own).
DTYPE_NAMES = {"auto": "auto", "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
DTYPE_NAMES.update({name: name for name in ("float32", "bfloat16", "float16")})


@dataclass(frozen=True)
class ExportResult:
    path: Path | None  # the local directory; None when it was only pushed
    checkpoint: Path  # the checkpoint it came from
    step: int
    lora: bool
    merged: bool  # holds a full model (full fine-tuning, or LoRA merged)
    dtype: str  # of the model weights ("float32" ...)
    seconds: float
    pushed: str | None = None  # the Hub commit URL when pushed


def export_run(
    run_dir: str | Path,
    out: str | Path | None,
    *,
    step: int | None = None,
    dtype: str = "auto",
    adapter_only: bool = False,
    overwrite: bool = False,
    push_to_hub: str | None = None,
    max_shard_size: str = MAX_SHARD_SIZE,
) -> ExportResult:
    """Write checkpoint ``step`` (None: the newest complete one) of ``run_dir`` to the model
    directory ``out`` and/or push it to the Hub repo ``push_to_hub``; see the module docstring.
    Every check that can fail before the work (the run, the step, ``out``, the options, the push's
    token) runs first; a failure later leaves nothing behind."""
    start = time.perf_counter()
    run_dir = Path(run_dir)
    if out is None and push_to_hub is None:
        raise ConfigError("podsrl export: give --out DIR (where to write the model directory) and/or --push-to-hub REPO_ID")
    cfg = run_config(run_dir)
    checkpoint = find_checkpoint(run_dir, step)
    out = Path(out).expanduser() if out is not None else None
    if out is not None:
        check_out(out, run_dir, overwrite=overwrite)
    dtype = _dtype_name(dtype, cfg)
    if adapter_only and not cfg.model.lora:
        raise ConfigError(f"--adapter-only: {run_dir} is a full fine-tune (model.lora = false); it has no adapter, drop --adapter-only")
    if adapter_only and dtype != cfg.model.dtype:
        raise ConfigError("--dtype applies to the model's weights; an adapter is saved as trained (drop --dtype or --adapter-only)")
    _check_shard_size(max_shard_size)
    if push_to_hub is not None:
        check_push(push_to_hub)
    try:
        state = ckpt.read_train_state(checkpoint)  # a damaged state.pt is named here, before any work
    except ckpt.DamagedCheckpoint as err:
        raise _damaged(err, run_dir, checkpoint) from None
    staging = _staging_dir(out)
    try:
        write_model_dir(
            ExportSource(cfg, run_dir, checkpoint, state), staging, dtype=dtype, merged=not adapter_only,
            max_shard_size=max_shard_size, location=push_to_hub or str(out),
        )  # fmt: skip
        pushed = push_folder(staging, push_to_hub, step=state.step) if push_to_hub is not None else None
        if out is not None:
            _install(staging, out)
    except ckpt.DamagedCheckpoint as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise _damaged(err, run_dir, checkpoint) from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out is None:
        shutil.rmtree(staging, ignore_errors=True)
    return ExportResult(
        path=out, checkpoint=checkpoint, step=state.step, lora=cfg.model.lora, merged=not (cfg.model.lora and adapter_only),
        dtype=dtype, seconds=time.perf_counter() - start, pushed=pushed,
    )  # fmt: skip


def after_checkpoint(cfg, run_dir: Path, checkpoint: Path, dist, *, final: bool, log=print) -> None:
    """The trainer's hook, called on every rank right after ``checkpoint`` was saved (``final``: the
    run's last). Rank 0 writes ``RUN/model`` at the end (``train.export_model``) and
    ``checkpoint/model`` at every checkpoint (``train.export_checkpoints``), then pushes ``RUN/model``
    (``train.push_to_hub``). The global RNG states are left as they were."""
    import torch

    t = cfg.train
    if not dist.is_main or not (t.export_checkpoints or (final and t.export_model)):
        return
    start = time.perf_counter()
    run_dir, checkpoint = Path(run_dir), Path(checkpoint)
    targets = ([run_dir / MODEL_DIR] if final and t.export_model else []) + ([checkpoint / MODEL_DIR] if t.export_checkpoints else [])
    dtype = _dtype_name(t.export_dtype, cfg)
    merged = t.export_merged or not cfg.model.lora
    with torch.random.fork_rng(devices=[]):  # building a LoRA model draws its random init
        state = ckpt.read_train_state(checkpoint)
        staged = [_staging_dir(target) for target in targets]
        try:
            location = (t.push_to_hub if final and t.export_model else None) or str(targets[0])
            write_model_dir(ExportSource(cfg, run_dir, checkpoint, state), staged[0], dtype=dtype, merged=merged, location=location)
            for copy in staged[1:]:  # the same directory for the checkpoint: a copy
                shutil.copytree(staged[0], copy, dirs_exist_ok=True)
            for directory, target in zip(staged, targets):
                _install(directory, target)
        except BaseException:
            for directory in staged:
                shutil.rmtree(directory, ignore_errors=True)
            raise
    log(f"podsrl: step {state.step} exported to {', '.join(map(str, targets))} ({time.perf_counter() - start:.1f} s)")
    if final and t.push_to_hub and t.export_model:
        try:
            check_push(t.push_to_hub)
            url = push_folder(run_dir / MODEL_DIR, t.push_to_hub, step=state.step)
        except ConfigError as err:
            log(
                f"podsrl: warning: {err}; the run and {run_dir / MODEL_DIR} are complete: push them later with "
                f"`podsrl export {run_dir} --push-to-hub {t.push_to_hub}`"
            )
        else:
            log(f"podsrl: pushed {run_dir / MODEL_DIR} to {url}")


# ------------------------------------------------------------------------------ the directory


@dataclass(frozen=True)
class ExportSource:
    """A checkpoint to export, with the run it belongs to."""

    cfg: object  # the run's resolved podsrl.config.Config
    run_dir: Path
    checkpoint: Path  # RUN/checkpoints/step-N
    state: ckpt.TrainState  # the checkpoint's (its step, training time, world size)


def write_model_dir(
    source: ExportSource, target: Path, *, dtype: str, merged: bool, location: str, max_shard_size: str = MAX_SHARD_SIZE
) -> None:
    """Build the model directory of ``source``'s checkpoint in ``target`` (an existing, empty directory).
    ``merged``: with LoRA, the merged model plus ``adapter/``; otherwise the adapter alone.
    ``location``: where users will load it from (a Hub repo id or a path), for the model card."""
    from transformers import AutoTokenizer

    from podsrl.config import to_toml
    from podsrl.models import DTYPES, load_policy
    from podsrl.run import model_card

    cfg, run_dir, state = source.cfg, source.run_dir, source.state
    model_cfg = dataclasses.replace(cfg.model, device="cpu", gradient_checkpointing=False)
    target = Path(target)
    with _quiet_progress():
        policy = load_policy(model_cfg)
        ckpt.load_weights(source.checkpoint, policy.model)  # DamagedCheckpoint / ConfigError name the file
        model = policy.model.eval()
        if policy.lora:
            adapter = target / ADAPTER_DIR if merged else target
            model.save_pretrained(adapter)  # PEFT: adapter_config.json, adapter_model.safetensors
            (adapter / "README.md").unlink(missing_ok=True)  # PEFT's stub card; ours is at the top
            if merged:
                model = model.merge_and_unload()
        if merged or not policy.lora:
            model.to(DTYPES[dtype]).save_pretrained(target, max_shard_size=max_shard_size)
        AutoTokenizer.from_pretrained(policy.path, trust_remote_code=False).save_pretrained(target)  # as the base ships it
    (target / CONFIG_FILE).write_text(to_toml(cfg))
    facts = model_card.CardFacts(
        cfg=cfg, run_dir=Path(run_dir), step=state.step, train_seconds=state.train_seconds, world_size=state.world_size,
        dtype=dtype, merged=merged or not policy.lora, location=location, name=_name(location, run_dir),
    )  # fmt: skip
    (target / "README.md").write_text(model_card.render(facts))


def _name(location: str, run_dir: Path) -> str:
    """The model's name on its card: the repo's or the directory's; RUN/model is named after the run."""
    name = Path(location).name
    return Path(run_dir).name if name == MODEL_DIR else name


def run_config(run_dir: Path):
    """The run's resolved config, from its config.toml."""
    from podsrl.run.rundir import check_is_run, check_trained_by_podsrl, run_config as read_config

    check_is_run(run_dir, "podsrl export")
    check_trained_by_podsrl(run_dir, "podsrl export")
    return read_config(Path(run_dir))


def find_checkpoint(run_dir: Path, step: int | None = None) -> Path:
    """Checkpoint ``step`` of the run (None: the newest complete one); a ConfigError lists the kept ones."""
    run_dir = Path(run_dir)
    found = ckpt.candidates(run_dir)
    if not found:
        from podsrl.run import rundir

        raise ConfigError(
            f"{run_dir}: no checkpoint under {run_dir / 'checkpoints'} (the run stopped before its first one), so "
            f"nothing to export or resume; {rundir.restart_advice(run_dir)}"
        )
    if step is None:
        return found[0]
    wanted = run_dir / "checkpoints" / f"step-{step:06d}"
    if wanted in found:
        return wanted
    kept = ", ".join(str(int(p.name.removeprefix("step-"))) for p in sorted(found))
    raise ConfigError(
        f"--step {step}: {run_dir} has no complete checkpoint at step {step}; kept: {kept} "
        "(train.keep_checkpoints keeps more); give one of those, or leave --step out for the newest"
    )


def _damaged(err: ConfigError, run_dir: Path, checkpoint: Path) -> ConfigError:
    others = [str(int(p.name.removeprefix("step-"))) for p in sorted(ckpt.candidates(run_dir)) if p != checkpoint]
    advice = f"export another kept checkpoint with --step ({', '.join(others)})" if others else "no other checkpoint is kept"
    return ConfigError(f"{err}; {advice}")


def check_out(out: Path, run_dir: Path, *, overwrite: bool) -> None:
    """Refuse an ``out`` that would lose something: see the module docstring."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: is a file; give a directory")
    resolved, run = out.resolve(), Path(run_dir).resolve()
    if resolved == run or resolved in run.parents:
        raise ConfigError(f"--out {out}: it holds the run {run_dir}; give a new directory, e.g. {Path(run_dir) / MODEL_DIR}-export")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not overwrite:
        raise ConfigError(f"--out {out}: is not empty; give a new directory, or --overwrite to replace the model directory in it")
    if not ((out / "config.json").is_file() or (out / "adapter_config.json").is_file()):
        raise ConfigError(
            f"--out {out}: holds files but no model (no config.json or adapter_config.json); --overwrite replaces only "
            "a model directory: give a new directory"
        )


def _dtype_name(dtype: str, cfg) -> str:
    if dtype not in DTYPE_NAMES:
        raise ConfigError(f"--dtype {dtype}: unknown; valid values: auto, bf16, fp16, fp32 (or bfloat16, float16, float32)")
    name = DTYPE_NAMES[dtype]
    return cfg.model.dtype if name == "auto" else name


def _check_shard_size(size: str) -> None:
    from transformers.utils.hub import convert_file_size_to_int

    try:
        if convert_file_size_to_int(size) <= 0:
            raise ValueError(size)
    except (ValueError, TypeError):
        raise ConfigError(f"--max-shard-size {size}: not a size; write it like 5GB, 500MB or 100KB") from None


def _staging_dir(out: Path | None) -> Path:
    """An empty hidden directory on ``out``'s file system (its nearest existing ancestor), or a
    temporary one when nothing is written locally."""
    if out is None:
        return Path(tempfile.mkdtemp(prefix="podsrl-export-"))
    parent = Path(out).parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{Path(out).name}.tmp-", dir=parent))
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot write in {parent} ({err.strerror or err})") from None
    staging.chmod(0o777 & ~_umask())  # mkdtemp's 0700 would hide the model from a server run as another user
    return staging


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _install(staging: Path, out: Path) -> None:
    """Rename the finished ``staging`` directory to ``out``; an existing ``out`` is moved aside
    first and deleted once the new one is in place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    old = None
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(out, old)
    mode = 0o666 & ~_umask()
    for path in staging.rglob("*"):  # some writers (transformers' safetensors files) make them 0600
        if path.is_file():
            path.chmod(mode)
    os.replace(staging, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _quiet_progress():
    """No "Writing model shards" bars in the run's log."""
    from transformers.utils import logging as hf_logging

    enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()


# ------------------------------------------------------------------------------ the Hub


def check_push(repo_id: str) -> None:
    """What can be known without the network: a token, and that offline mode is off."""
    from huggingface_hub import constants, get_token

    if constants.HF_HUB_OFFLINE:
        raise ConfigError(f"--push-to-hub {repo_id}: HF_HUB_OFFLINE is set, and pushing needs the network; unset it")
    if not get_token():
        raise ConfigError(
            f"--push-to-hub {repo_id}: no Hugging Face token; log in with `hf auth login` or set HF_TOKEN (a token with write access)"
        )


def push_folder(folder: Path, repo_id: str, *, step: int) -> str:
    """``create_repo`` (kept if it exists) and ``upload_folder``; returns the commit's URL. Any
    failure of either (network, permissions, a bad id) is one ConfigError line."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        repo = api.create_repo(repo_id, repo_type="model", exist_ok=True)
        info = api.upload_folder(
            repo_id=getattr(repo, "repo_id", repo_id), folder_path=str(folder), repo_type="model",
            commit_message=f"podsrl: policy at step {step}",
        )  # fmt: skip
    except Exception as err:  # requests/httpx errors, HfHubHTTPError, OfflineModeIsEnabled, ValueError ...
        detail = " ".join(str(err).split())[:300] or type(err).__name__
        raise ConfigError(
            f"--push-to-hub {repo_id}: the push failed ({type(err).__name__}: {detail}); check the network, the repo id "
            "and that your token may write to it"
        ) from None
    return str(getattr(info, "commit_url", None) or f"https://huggingface.co/{repo_id}")


# ------------------------------------------------------------------------------ `podsrl eval --model DIR`


def eval_config(model: str, config_path: str | Path | None, overrides: list[str]):
    """The config ``podsrl eval --model MODEL`` evaluates with: ``config_path``, else MODEL's
    ``podsrl_config.toml`` (an exported directory: the run's task, prompts and evaluation settings,
    so the numbers are comparable with ``podsrl eval --run``), else the defaults; then the
    overrides; then ``model.name`` = MODEL without LoRA, in the directory's dtype."""
    from podsrl import config as config_mod
    from podsrl.models import DTYPES

    if any(o.startswith("model.name=") for o in overrides):
        raise ConfigError("--model and --model.name both name the model to evaluate; give one of them")
    path = Path(model).expanduser()
    if path.is_dir() and (path / "adapter_config.json").is_file() and not (path / "config.json").is_file():
        raise ConfigError(
            f"--model {model}: holds a LoRA adapter alone; evaluate the merged export (`podsrl export RUN --out DIR`, "
            "without --adapter-only) or the run itself (`podsrl eval --run RUN`)"
        )
    if config_path is None and (path / CONFIG_FILE).is_file():
        config_path = path / CONFIG_FILE
    cfg = config_mod.load(config_path, overrides)
    dtype = cfg.model.dtype
    if not any(o.startswith("model.dtype=") for o in overrides) and (path / "config.json").is_file():
        try:
            saved = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"--model {model}: config.json does not read ({err})") from None
        saved_dtype = saved.get("dtype") or saved.get("torch_dtype")
        dtype = saved_dtype if saved_dtype in DTYPES else dtype
    model_cfg = dataclasses.replace(cfg.model, name=str(path) if path.is_dir() else model, lora=False, dtype=dtype)
    return dataclasses.replace(cfg, model=model_cfg)
