"""podsrl: reinforcement learning of language models with verifiable rewards, trained on fewer,
better-chosen rollouts (PODS, D3S) and plain GRPO."""

__version__ = "0.1.0"
