"""The training loop (:mod:`~podsrl.train.loop`: sample, score, downsample, update, log), the
update on the kept rollouts (:mod:`~podsrl.train.update`), sequence packing and log-probs
(:mod:`~podsrl.train.sequences`), held-out evaluation and several processes
(:mod:`~podsrl.train.distributed`)."""
