"""A run directory and what goes in it: the directory and its lock (:mod:`~podsrl.run.rundir`),
checkpoints (:mod:`~podsrl.run.checkpoint`), metrics files (:mod:`~podsrl.run.metrics`) and the
plot of a run (:mod:`~podsrl.run.plot`)."""
