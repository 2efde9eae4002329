"""Adapters between podsrl and other RL stacks.

- :mod:`podsrl.integrations.trl`: ``PODSConfig`` / ``PODSTrainer``, TRL's ``GRPOTrainer`` with
  PODS and D3S down-sampling (needs the ``trl`` extra: ``pip install 'podsrl[trl]'``).
- :mod:`podsrl.integrations.rewards`: rewards both ways, podsrl's per-completion rewards as TRL
  reward functions and TRL-style batched reward functions inside ``podsrl train``. It does not
  import TRL.

Nothing here is imported by ``import podsrl``; importing this package does not import TRL.
"""
