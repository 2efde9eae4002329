"""PODS in a hand-written PyTorch loop, with podsrl's public API only (docs/integrating.md).

A toy policy answers each of 8 prompts with 6 tokens out of 10; the verifier rewards the fraction of
tokens equal to the prompt's target. Sample n = 16 completions per prompt, train on the m = 4 that
PODS keeps: `podsrl.downsample` sits between scoring and the first forward pass with gradients.
"""

import torch

import podsrl

torch.manual_seed(0)
B, N, T, VOCAB, STEPS = 8, 16, 6, 10, 20
targets = torch.arange(B) % VOCAB  # [B] the token each prompt's verifier wants
policy = torch.nn.Embedding(B, T * VOCAB)  # the logits of each prompt's T tokens
torch.nn.init.zeros_(policy.weight)
optimizer = torch.optim.Adam(policy.parameters(), lr=0.05)
spec = podsrl.DownsampleSpec(rule="max_variance", m=4)  # PODS: the 4 of 16 with max reward variance
settings = podsrl.LossSettings(aggregation="token")

for step in range(STEPS):
    prompts = torch.arange(B)
    with torch.no_grad():  # 1. sample n completions per prompt
        logits = policy(prompts).view(B, 1, T, VOCAB).expand(B, N, T, VOCAB)
        completions = torch.distributions.Categorical(logits=logits).sample()  # [B, N, T]
    rewards = (completions == targets[:, None, None]).float().mean(-1)  # 2. score: [B, N]
    selection = podsrl.downsample(rewards, spec, progress=step / STEPS, step=step, seed=0)  # 3. keep m
    rows = selection.keep.nonzero()  # [K, 2] (prompt, rollout): only these reach a forward pass
    kept = completions[rows[:, 0], rows[:, 1]]  # [K, T]
    logprobs = torch.log_softmax(policy(rows[:, 0]).view(-1, T, VOCAB), -1)
    logprobs = logprobs.gather(-1, kept.unsqueeze(-1)).squeeze(-1)  # [K, T]
    advantages = selection.advantages[selection.keep]  # [K], in the order of rows
    mask = torch.ones_like(kept, dtype=torch.bool)  # every token is a completion token here
    loss, _ = podsrl.policy_loss(logprobs, logprobs.detach(), advantages, mask, settings)  # one iteration: old = current
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()  # 4. the update saw B * m rollouts, not B * n
    m = selection.metrics
    print(f"step {step + 1:2d}  reward {m['reward_mean']:.3f}  kept {m['kept']}  kept_adv_var {m['kept_adv_var']:.3f}")
