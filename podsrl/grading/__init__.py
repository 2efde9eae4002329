"""From a completion to a reward: answer extraction (:mod:`~podsrl.grading.answers`, a leaf),
symbolic equivalence (:mod:`~podsrl.grading.equivalence`), the reward registry and scoring
(:mod:`~podsrl.grading.rewards`) and user reward functions (:mod:`~podsrl.grading.user`)."""
