"""podsrl: reinforcement learning of language models with verifiable rewards, trained on fewer,
better-chosen rollouts (PODS, D3S) and plain GRPO.

The public API (imported on first use, so ``import podsrl`` and the CLI's ``--help`` stay light):

- :func:`downsample`, :class:`DownsampleSpec`, :class:`Selection`: the one call any trainer makes
  between scoring its rollouts and its first forward pass (:mod:`podsrl.core.downsample`);
- :func:`group_advantages`, :data:`RULES`, :func:`policy_loss`, :class:`LossSettings`: the math it is
  made of and the loss to train with (:mod:`podsrl.core`).
"""

__version__ = "0.1.0"

_PUBLIC = {
    "downsample": "podsrl.core.downsample",
    "DownsampleSpec": "podsrl.core.downsample",
    "Selection": "podsrl.core.downsample",
    "group_advantages": "podsrl.core.advantages",
    "RULES": "podsrl.core.selection",
    "policy_loss": "podsrl.core.loss",
    "LossSettings": "podsrl.core.loss",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str):
    if name in _PUBLIC:
        import importlib

        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'podsrl' has no attribute {name!r}")
