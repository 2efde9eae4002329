"""TRL arms of ``podsrl compare``: a method with ``trainer = "trl"`` trains with TRL's
``GRPOTrainer``, one with ``trainer = "trl-pods"`` with podsrl's ``PODSTrainer``
(:mod:`podsrl.integrations.trl`), beside podsrl's own arms (``trainer = "podsrl"``, the default),
from the same config, into a run directory the report reads like any other (docs/trl.md, "TRL arms
in podsrl compare").

    [compare.methods]
    grpo_n8 = { "select.rule" = "all", "rollout.n" = 8, "select.m" = 8 }
    trl_grpo_n8 = { trainer = "trl", "select.rule" = "all", "rollout.n" = 8, "select.m" = 8 }
    trl_pods_n16_m4 = { trainer = "trl-pods", "select.rule" = "max_variance", "rollout.n" = 16, "select.m" = 4 }

One module a job, in the order a run meets them:

- :mod:`~podsrl.compare.trl_arm.mapping`: the podsrl config onto TRL's ``GRPOConfig`` /
  ``PODSConfig``, and the settings TRL cannot honour, refused when the plan loads (pure: no TRL);
- :mod:`~podsrl.compare.trl_arm.run`: one run (``train_trl``) on podsrl's side of it,
  :class:`podsrl.train.external.ExternalRun` (the set-up ``podsrl train`` makes, the run directory,
  the evaluation): the run directory gets podsrl's config.toml, metrics.jsonl and eval.jsonl,
  ``trainer.json`` (which trainer, TRL's version, the GRPOConfig it ran with) and TRL's checkpoints
  in ``trl/``;
- :mod:`~podsrl.compare.trl_arm.clock`: the training clock, the budget and the evaluations at
  podsrl's times, a transformers ``TrainerCallback``;
- :mod:`~podsrl.compare.trl_arm.metrics`: what each step trained on, in metrics.jsonl's names;
- :mod:`~podsrl.compare.trl_arm.checkpoints`: TRL's checkpoints with their training clock, and
  their removal once a run has finished;
- ``python -m podsrl.compare.trl_arm`` (:mod:`~podsrl.compare.trl_arm.__main__`): the child
  process ``podsrl compare`` starts for one run (:func:`podsrl.compare.arms.command`).
"""
