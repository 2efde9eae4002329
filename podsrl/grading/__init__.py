"""From a completion to a reward: answer extraction (:mod:`~podsrl.grading.answers`, a leaf),
symbolic equivalence (:mod:`~podsrl.grading.equivalence`), the graders a task chooses from
(:mod:`~podsrl.grading.graders`; reasoning-gym's checkers: :mod:`~podsrl.grading.reasoning_gym`), the
reward registry and scoring (:mod:`~podsrl.grading.rewards`) and user reward functions
(:mod:`~podsrl.grading.user`)."""
