"""The math of down-sampling, tensors in and tensors out: selection rules, advantages, schedules,
D3S token selection, the policy loss, and :func:`downsample`, the one call a trainer makes between
scoring its rollouts and its first forward pass."""
