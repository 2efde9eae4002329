"""PODSTrainer (podsrl.integrations.trl) against TRL's GRPOTrainer, on the tiny random model.

Generation is replaced by a seeded fake (``_generate_single_turn``, the lowest TRL generation
method) so that two trainers see the very same completions and the tests do not depend on what a
random model samples. Everything after generation (rewards, selection, old/ref forwards, loss) is
the real code.

Most tests run on conftest.py's ``small_vocab_model_dir``, the tiny model with a 686-token ChatML
tokenizer: what they compare does not depend on the vocabulary, and TRL's log-probabilities over
SmolLM2's 49152 logits a token were most of their time (issue 45: 2-3 s a test, now a few tenths).
A few keep ``tiny_model_dir`` (SmolLM2's tokenizer), each saying why: a tolerance set on its
completions, and TRL's tool calls (test_trl_compat.py), whose episodes did not reach a tool result
on the small tokenizer (not investigated further).
"""

from __future__ import annotations

import copy
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl", reason="the TRL integration needs the trl extra (make test installs it)")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from podsrl.integrations.trl import PODSConfig, PODSTrainer, SUPPORTED_TRL, _check_trl  # noqa: E402
from podsrl.core.downsample import selection_generator  # noqa: E402
from podsrl.core.selection import get_rule  # noqa: E402

from conftest import trl_part_passed, trl_two_process_script  # noqa: E402
from float_bounds import gradient_rtol  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

N_PROMPTS = 2


def length_reward(completions, **columns):
    """TRL-style batched reward: a random model's completions differ in length, so this varies."""
    return [len(c[0]["content"] if isinstance(c, list) else c) / 40.0 for c in completions]


def dataset(count: int = 8) -> Dataset:
    return Dataset.from_dict(
        {
            "prompt": [[{"role": "user", "content": f"What is {i} + 1?"}] for i in range(count)],
            "answer": [str(i + 1) for i in range(count)],
        }
    )


def fake_generation(trainer, seed: int = 0) -> list[list[list[int]]]:
    """Replace generation by seeded random completions (1-8 tokens); returns the list of calls."""
    calls: list[list[list[int]]] = []
    vocab = trainer.model.get_input_embeddings().num_embeddings  # ids 300-4999, fewer with a small vocabulary

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        g = torch.Generator().manual_seed(seed + 1000 * trainer.accelerator.process_index + len(calls))
        out = []
        for _ in prompt_ids:
            length = int(torch.randint(1, 9, (1,), generator=g))
            out.append(torch.randint(300, min(5000, vocab), (length,), generator=g).tolist())
        calls.append(out)
        return out, None

    trainer._generate_single_turn = generate
    return calls


def common_args(tmp_path: Path, n: int, **overrides) -> dict:
    args = dict(
        output_dir=str(tmp_path / "out"),
        num_generations=n,
        per_device_train_batch_size=N_PROMPTS * n,
        max_completion_length=8,
        learning_rate=1e-3,
        report_to="none",
        use_cpu=True,
        bf16=False,  # TRL's default is True: CPU autocast, emulated without native bfloat16 (slow)
        save_strategy="no",
        logging_steps=1,
        seed=7,
    )
    args.update(overrides)
    return args


def generation_batch(n: int) -> list[dict]:
    """TRL's generation batch layout: each prompt's n rows consecutive."""
    ds = dataset()
    return [dict(ds[i]) for i in range(N_PROMPTS) for _ in range(n)]


def loss_and_grads(trainer, inputs):
    """One generation round and one loss/backward as TRL's training step does it (no shuffling)."""
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    trainer.model.zero_grad()
    output = trainer._generate_and_score_completions(copy.deepcopy(inputs))
    loss = trainer.compute_loss(trainer.model, output)
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in trainer.model.named_parameters() if p.grad is not None}
    return output, loss.detach(), grads


@pytest.mark.parametrize("scale_rewards", ["none", "group"])
def test_rule_all_equals_grpo_trainer(request, tmp_path, scale_rewards):
    # "group": TRL divides by std + 1e-4, podsrl by the std, so the tolerance below holds for the
    # rewards' spread on SmolLM2's tokenizer (longer texts a token); "none" is exact on either model.
    tiny_model_dir = request.getfixturevalue("tiny_model_dir" if scale_rewards == "group" else "small_vocab_model_dir")
    # "none" also keeps TRL's default bfloat16 autocast (common_args turns it off elsewhere: emulated
    # on a CPU without native bfloat16, it made the TRL tests 1.4x slower).
    n = 4
    common = common_args(tmp_path, n, beta=0.04, scale_rewards=scale_rewards, loss_type="grpo", bf16=scale_rewards == "none")
    grpo = GRPOTrainer(
        model=str(tiny_model_dir), reward_funcs=[length_reward], args=GRPOConfig(**common), train_dataset=dataset()
    )
    pods = PODSTrainer(
        model=str(tiny_model_dir),
        reward_funcs=[length_reward],
        args=PODSConfig(**common, pods_rule="all"),
        train_dataset=dataset(),
    )
    fake_generation(grpo), fake_generation(pods)
    inputs = generation_batch(n)
    out_g, loss_g, grads_g = loss_and_grads(grpo, inputs)
    out_p, loss_p, grads_p = loss_and_grads(pods, inputs)

    assert torch.equal(out_g["completion_ids"], out_p["completion_ids"])
    assert "ref_per_token_logps" in out_p
    torch.testing.assert_close(out_p["ref_per_token_logps"], out_g["ref_per_token_logps"])
    # TRL divides by std + 1e-4, podsrl by the exact std; centring only ("none") is exactly TRL's.
    tol = {} if scale_rewards == "none" else {"rtol": 1e-3, "atol": 1e-4}
    torch.testing.assert_close(out_p["advantages"], out_g["advantages"], **tol)
    torch.testing.assert_close(loss_p, loss_g, **tol)
    assert grads_g.keys() == grads_p.keys() and grads_g
    for name in grads_g:
        # With "group", each group's advantages differ from TRL's by its own factor 1 + 1e-4 / std, so
        # entries near 0 (cancelling groups) differ relatively more: compare to the tensor's scale.
        scale = {} if not tol else {"rtol": 1e-2, "atol": 1e-2 * float(grads_g[name].abs().max())}
        torch.testing.assert_close(grads_p[name], grads_g[name], **scale)


def test_max_variance_forwards_only_kept_rows(small_vocab_model_dir, tmp_path):
    n, m = 8, 2
    # num_iterations=2 makes TRL compute old-policy log-probs, beta > 0 reference log-probs.
    args = PODSConfig(**common_args(tmp_path, n, beta=0.04, num_iterations=2), pods_rule="max_variance", pods_m=m)
    trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[length_reward], args=args, train_dataset=dataset())
    calls = fake_generation(trainer)

    rows_seen = {"policy": [], "ref": []}

    def counter(kind):
        def hook(module, args, kwargs):
            if "labels" in kwargs:  # TRL's log-prob forwards (generation is faked away anyway)
                rows_seen[kind].append(kwargs["input_ids"].shape[0])

        return hook

    trainer.model.register_forward_pre_hook(counter("policy"), with_kwargs=True)
    trainer.ref_model.register_forward_pre_hook(counter("ref"), with_kwargs=True)

    output, loss, _ = loss_and_grads(trainer, generation_batch(n))
    assert rows_seen == {"policy": [N_PROMPTS * m, N_PROMPTS * m], "ref": [N_PROMPTS * m]}  # old + loss; ref
    assert output["old_per_token_logps"].shape[0] == N_PROMPTS * m
    assert output["advantages"].shape == (N_PROMPTS * m,)

    selection = trainer.last_selection
    # The rewards selected on are the reward function's on all n completions of the round.
    texts = trainer.processing_class.batch_decode(calls[0], skip_special_tokens=True)
    expected = torch.tensor([len(t) / 40.0 for t in texts], dtype=torch.float32).view(N_PROMPTS, n)
    torch.testing.assert_close(selection.rewards, expected, rtol=1e-6, atol=1e-6)
    # The kept subset is the core's on the same rewards, seed and step (podsrl train's seed rule).
    generator = selection_generator(args.seed, 0)
    assert torch.equal(selection.keep, get_rule("max_variance")(selection.rewards, m, generator=generator))
    assert selection.keep.sum(dim=1).tolist() == [m] * N_PROMPTS
    # The rows that entered the loss are exactly the kept completions, in order.
    kept = selection.keep.flatten().nonzero().squeeze(1).tolist()
    for row, g in enumerate(kept):
        ids = output["completion_ids"][row][: len(calls[0][g])].tolist()
        assert ids == calls[0][g]
    # PODS advantages: normalised over the kept subset (one high, one low per group -> +-1/sqrt(2)).
    torch.testing.assert_close(output["advantages"].abs(), torch.full((N_PROMPTS * m,), 2**-0.5))


def test_train_d3s_with_token_selection_and_dapo_filter(small_vocab_model_dir, tmp_path):
    args = PODSConfig(
        **common_args(tmp_path, 4, max_steps=2, beta=0.0),
        pods_rule="d3s_cross",
        pods_m=2,
        pods_m_final=3,
        pods_m_schedule="linear",
        pods_token_fraction=0.5,
        pods_token_fraction_final=1.0,
        pods_token_schedule="linear",
        pods_filter_zero_variance=True,
    )
    trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[length_reward], args=args, train_dataset=dataset())
    fake_generation(trainer)
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "pods/kept" in entry]
    assert len(logged) == 2
    assert all(0 <= entry["pods/kept"] <= 2 * N_PROMPTS + N_PROMPTS for entry in logged)
    assert {"pods/reward_mean", "pods/reward_kept_mean", "pods/zero_variance_groups", "pods/token_fraction", "pods/kept_adv_var"} <= set(logged[0])
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())


def one_constant_group(completions, answer, **columns):
    """The first prompt's group scores a constant (zero advantage, or dropped by the DAPO filter)."""
    return [0.5 if a == "1" else r for a, r in zip(answer, length_reward(completions))]


LOSS_CONFIG = {"luspo": {"importance_sampling_level": "sequence"}}


@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("loss_type", ["grpo", "sapo", "dr_grpo", "luspo", "dapo"])
def test_padding_rows_are_neutral(request, tmp_path, loss_type, skip):
    """Issue 32: K = 3 kept rows over steps_per_generation = 2 micro-batches makes one padding row.
    TRL's grpo/sapo/luspo mean (dr_grpo: divide) over a micro-batch's rows, padding included; the
    gradient of the round, split and accumulated as TRL's training step does, must be that of the K
    real rows alone, which TRL's own loss gives when it sees only them in one micro-batch."""
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    # luspo's sequence-level ratio on the small vocabulary's completions leaves float32 rounding (in
    # Llama's rotary tables) above the tolerance below: it keeps SmolLM2's tokenizer.
    tiny_model_dir = request.getfixturevalue("tiny_model_dir" if loss_type == "luspo" else "small_vocab_model_dir")
    n = 4
    config = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, loss_type=loss_type, **LOSS_CONFIG.get(loss_type, {}))
    args = PODSConfig(**common_args(tmp_path, n, **config), pods_rule="max_variance", pods_m=3,
                      pods_filter_zero_variance=True, pods_skip_zero_advantage=skip)  # fmt: skip
    assert args.steps_per_generation == 2
    trainer = PODSTrainer(model=str(tiny_model_dir), reward_funcs=[one_constant_group], args=args, train_dataset=dataset())
    trainer.model.to(torch.float64)  # the micro-batches' gradients largely cancel (advantages sum to 0): fp64 shows the sum
    fake_generation(trainer)
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(n))
    real = output["completion_mask"].sum(1) > 0  # [4]: the padding row has no completion token
    assert real.tolist().count(False) == 1 and trainer.last_selection.keep.sum() == 3

    def grads_of(batches, accumulation):
        trainer.model.zero_grad()
        trainer.current_gradient_accumulation_steps = accumulation
        for batch in batches:
            trainer.compute_loss(trainer.model, batch).backward()
        return {k: p.grad.detach().clone() for k, p in trainer.model.named_parameters() if p.grad is not None}

    torch.manual_seed(0)
    got = grads_of(split_tensor_dict(shuffle_sequence_dict(output), 2), accumulation=2)  # TRL's _prepare_inputs
    # TRL's loss on the 3 real rows as one micro-batch; dapo divides by num_items_in_batch x GA / spg.
    only_real = {k: (v[real] if isinstance(v, torch.Tensor) and v.dim() else v) for k, v in output.items()}
    only_real.pop("pods_rows_per_micro_batch")
    expected = grads_of([only_real], accumulation=2 if loss_type == "dapo" else 1)
    assert expected.keys() == got.keys() and expected
    # Llama's rotary tables stay float32: the float32 noise of a gradient (gradient_rtol, in norm, so
    # for each entry too) of the magnitude of the terms summed, the two micro-batches' gradients.
    torch.manual_seed(0)
    parts = [grads_of([b], accumulation=2) for b in split_tensor_dict(shuffle_sequence_dict(output), 2)]
    rtol = gradient_rtol(trainer.model.get_input_embeddings().num_embeddings)
    for name in expected:
        # A padding row counted in the mean would scale it by 3/4.
        magnitude = sum(float(p[name].norm()) for p in parts if name in p)
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=rtol * magnitude)


@pytest.mark.parametrize("loss_type, beta", [("grpo", 0.0), ("grpo", 0.04), ("sapo", 0.0), ("dr_grpo", 0.0), ("luspo", 0.0), ("dapo", 0.0)])
def test_padding_rescales_only_the_policy_term(small_vocab_model_dir, tmp_path, loss_type, beta):
    """Issue 36: with a padding row, PODSTrainer multiplied TRL's whole loss by rows / (K / spg) =
    2 / 1.5, TRL's entropy bonus (``entropy_coef``, a token mean, not a row mean) included, so the
    bonus was trained x4/3. Each micro-batch's loss must be the rescaled policy term (surrogate and
    KL, TRL's loss there without the bonus) plus the bonus exactly as TRL computes it (TRL's loss
    there with advantage 0 and beta 0), and the round's gradient that of the K real rows' policy
    term alone plus the micro-batches' bonuses. dapo (divided by the generation batch's tokens,
    never rescaled) is the control."""
    from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

    # A bonus that dominates the gradient: its gradient through TRL's fused float32 LM head differs
    # by up to ~2e-3 of the norm between one backward with the policy term and one without.
    n, coef = 4, 1e4
    config = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, loss_type=loss_type, beta=beta, entropy_coef=coef,
                  **LOSS_CONFIG.get(loss_type, {}))  # fmt: skip
    args = PODSConfig(**common_args(tmp_path, n, **config), pods_rule="max_variance", pods_m=3, pods_filter_zero_variance=True)
    trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[one_constant_group], args=args, train_dataset=dataset())
    assert trainer._entropy_bonus_enabled and not trainer._pods_skip
    trainer.model.to(torch.float64)
    fake_generation(trainer)
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(n))
    real = output["completion_mask"].sum(1) > 0  # [4]: one padding row
    assert real.tolist().count(False) == 1 and trainer.last_selection.keep.sum() == 3
    micro_batches = split_tensor_dict(shuffle_sequence_dict(output), 2)  # TRL's _prepare_inputs: 2 rows each
    scale = 2 / 1.5 if loss_type != "dapo" else 1.0

    def trl_loss(batch, bonus: bool, policy: bool):  # GRPOTrainer's own, without PODSTrainer's marker
        batch = {k: v for k, v in batch.items() if k != "pods_rows_per_micro_batch"}
        if not policy:
            batch["advantages"] = torch.zeros_like(batch["advantages"])
        trainer._entropy_bonus_enabled, trainer.beta = bonus, beta if policy else 0.0
        try:
            return GRPOTrainer._compute_loss(trainer, trainer.model, batch)
        finally:
            trainer._entropy_bonus_enabled, trainer.beta = True, beta

    def grads_of(loss, batches, accumulation):
        trainer.model.zero_grad()
        trainer.current_gradient_accumulation_steps = accumulation
        for batch in batches:
            loss(batch).backward()
        return {k: p.grad.detach().clone() for k, p in trainer.model.named_parameters() if p.grad is not None}

    trainer.current_gradient_accumulation_steps = 2
    with torch.no_grad():
        for batch in micro_batches:
            got = trainer.compute_loss(trainer.model, batch)
            policy, bonus = trl_loss(batch, bonus=False, policy=True), trl_loss(batch, bonus=True, policy=False)
            assert abs(float(bonus)) > 10 * abs(float(policy))
            torch.testing.assert_close(got, scale * policy + bonus, rtol=1e-6, atol=0.0)  # before: scale * (policy + bonus)
    got = grads_of(lambda batch: trainer.compute_loss(trainer.model, batch), micro_batches, accumulation=2)
    only_real = {k: (v[real] if isinstance(v, torch.Tensor) and v.dim() else v) for k, v in output.items()}
    policy = grads_of(lambda batch: trl_loss(batch, bonus=False, policy=True), [only_real], accumulation=2 if loss_type == "dapo" else 1)
    bonus = grads_of(lambda batch: trl_loss(batch, bonus=True, policy=False), micro_batches, accumulation=2)
    assert got.keys() == policy.keys() and bonus.keys() <= got.keys() and got
    for name in got:
        expected = policy[name] + bonus.get(name, 0.0)
        error = float((got[name] - expected).norm() / expected.norm())
        assert error < 1e-2, f"{name}: relative difference {error:.1e} (a bonus scaled x4/3 gives ~0.3)"


@pytest.mark.parametrize(
    "loss_type, token_fraction",
    [("grpo", 1.0), ("dr_grpo", 1.0), ("dapo", 1.0), ("sapo", 1.0), ("bnpo", 1.0), ("grpo", 0.5), ("dapo", 0.5)],
)
def test_skipping_zero_advantage_rows_keeps_the_update(small_vocab_model_dir, tmp_path, loss_type, token_fraction):
    """Issue 31: with beta = 0 a row of advantage 0 adds nothing to the gradient; skipping it (on by
    default) leaves the weights after an optimizer step as they are without skipping (plain SGD, so
    that a wrong scale would show), with rule all (GRPO) and over 2 accumulated micro-batches. Also
    with podsrl's token selection (issue 36: its budget and pool leave out the rows of advantage 0)."""
    n = 4
    config = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, loss_type=loss_type, max_steps=1,
                  optim="sgd", learning_rate=0.1, beta=0.0, scale_rewards="none")  # fmt: skip
    weights, logs = {}, {}
    for skip in (True, False):
        args = PODSConfig(**common_args(tmp_path / str(skip), n, **config), pods_rule="all", pods_skip_zero_advantage=skip,
                          pods_token_fraction=token_fraction)  # fmt: skip
        trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[one_constant_group], args=args, train_dataset=dataset())
        fake_generation(trainer)
        before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
        trainer.train()
        weights[skip] = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
        logs[skip] = next(entry for entry in trainer.state.log_history if "pods/loss_rows" in entry)
    # The first prompt's 4 rows have advantage 0: skipped, except where bnpo's normaliser forbids it.
    skipped = loss_type != "bnpo"
    assert logs[True]["pods/loss_rows_fraction"] == (0.5 if skipped else 1.0) and logs[False]["pods/loss_rows_fraction"] == 1.0
    assert logs[True]["pods/loss_rows"] == (2.0 if skipped else 4.0)  # per micro-batch, mean over the 2
    for name, value in weights[False].items():
        # Rounding of the sums behind an element's update scales with the tensor's terms, not with the
        # element: an element near 0 differed by 1.5e-9 (1.9e-5 of itself) on an AVX-512/AMX CPU, where
        # the kernels block the sums differently for other row counts; a skipped row that counted would
        # move its elements by about lr x its gradient, orders of magnitude above this.
        torch.testing.assert_close(weights[True][name], value, rtol=1e-6, atol=1e-6 * float(value.abs().max()))
        update = value - before[name]
        if update.abs().max() > 0:
            torch.testing.assert_close(weights[True][name] - before[name], update, rtol=1e-4, atol=1e-4 * float(update.abs().max()))
    assert any(bool((weights[False][k] != before[k]).any()) for k in before)


@pytest.mark.parametrize("score", ["adv_entropy", "entropy"])
def test_token_selection_is_over_the_rows_with_a_signal(small_vocab_model_dir, tmp_path, score):
    """Issue 36: the token budget is over the rows whose advantage is not 0, as in ``podsrl train``.
    Rule all, the first prompt's 4 rows score a constant (A = 0, not skipped here): the mask keeps
    about half the tokens of the other 4 rows and none of the first 4. Before, |A| x H pooled the
    zero scores, so the threshold fell towards 0 and kept most or all signal tokens, and the
    entropy-only score (TRL's mask) kept tokens of the rows without a signal."""
    n = 4
    args = PODSConfig(**common_args(tmp_path, n, beta=0.0, scale_rewards="none"), pods_rule="all", pods_token_fraction=0.5,
                      pods_token_score=score, pods_skip_zero_advantage=False)  # fmt: skip
    trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[one_constant_group], args=args, train_dataset=dataset())
    fake_generation(trainer)
    masks = []
    original = trainer.get_high_entropy_mask
    trainer.get_high_entropy_mask = lambda e, m, t: masks.append(original(e, m, t)) or masks[-1]
    output, _, _ = loss_and_grads(trainer, generation_batch(n))
    (mask,) = masks  # [8, T]: the one micro-batch's
    signal, tokens = output["advantages"] != 0, output["completion_mask"].bool()
    assert int(signal.sum()) == 4 and not mask[~signal].any()
    assert abs(int(mask[signal].sum()) - 0.5 * int(tokens[signal].sum())) <= 1


def fake_vllm_generation(trainer, seed: int = 0) -> list[tuple[list[list[int]], list[list[float]]]]:
    """:func:`fake_generation` with vLLM's sampling log-prob of every completion token (a random
    gap to the tiny model's, about -log(vocabulary)); returns the calls' (completions, log-probs)."""
    calls = fake_generation(trainer, seed)
    generate, out = trainer._generate_single_turn, []

    def with_logprobs(*args, **kwargs):
        completions, _ = generate(*args, **kwargs)
        g = torch.Generator().manual_seed(seed + len(out))
        base = -math.log(len(trainer.processing_class))
        logprobs = [(base + 0.3 * torch.randn(len(c), generator=g)).tolist() for c in completions]
        out.append((completions, logprobs))
        return completions, logprobs

    trainer._generate_single_turn = with_logprobs
    trainer.use_vllm = True  # TRL's vLLM paths after generation (its importance correction); generation is faked
    assert calls is not None
    return out


@pytest.mark.parametrize("mode", ["token_truncate", "token_mask", "sequence_truncate", "sequence_mask"])
def test_trl_importance_correction_follows_the_kept_rows(small_vocab_model_dir, tmp_path, mode):
    """Issue 46: vLLM gives a sampling log-prob for every one of the n rollouts, PODS keeps m. TRL's
    correction (``vllm_importance_sampling_correction``, on by default) must see the kept rows' own
    log-probs, and its weights must be those of podsrl's core
    (:func:`podsrl.core.importance.importance_weights`, the function ``podsrl train`` calls) on them;
    skipping the rows of advantage 0 takes their weights out with them, and the loss changes nothing."""
    from podsrl.core.importance import ImportanceSettings, importance_weights

    n, m = 8, 2
    bounds = dict(vllm_importance_sampling_clip_max=1.5, vllm_importance_sampling_clip_min=0.6)
    args = PODSConfig(**common_args(tmp_path, n, beta=0.0), pods_rule="max_variance", pods_m=m, vllm_importance_sampling_mode=mode, **bounds)
    assert args.vllm_importance_sampling_correction  # TRL's default
    trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[one_constant_group], args=args, train_dataset=dataset())
    calls = fake_vllm_generation(trainer)
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(n))
    ((completions, logprobs),) = calls
    kept = trainer.last_selection.keep.flatten().nonzero().squeeze(1).tolist()
    assert len(kept) == N_PROMPTS * m and output["completion_ids"].shape[0] == len(kept)
    mask = output["completion_mask"].bool()
    for row, g in enumerate(kept):  # the kept rows' own sampling log-probs, in order
        assert output["completion_ids"][row][: len(completions[g])].tolist() == completions[g]
        assert output["sampling_per_token_logps"][row][: len(logprobs[g])].tolist() == torch.tensor(logprobs[g]).tolist()
    settings = ImportanceSettings(mode=mode, clip_max=1.5, clip_min=0.6)
    ours, _ = importance_weights(output["old_per_token_logps"], output["sampling_per_token_logps"], mask, settings)
    theirs = output["importance_sampling_ratio"].expand_as(ours)  # [K, T] (sequence level: [K, 1])
    torch.testing.assert_close(theirs[mask], ours[mask], rtol=1e-6, atol=1e-7)
    assert ((ours[mask] - 1).abs() > 1e-3).any()  # a real correction
    # The loss's micro-batch without the rows of advantage 0 keeps the other rows' weights.
    signal = output["advantages"] != 0
    assert 0 < int(signal.sum()) < len(kept)
    subset = trainer._pods_loss_rows(dict(output), skip=True)
    torch.testing.assert_close(subset["importance_sampling_ratio"], output["importance_sampling_ratio"][signal], rtol=0, atol=0)
    torch.testing.assert_close(subset["sampling_per_token_logps"], output["sampling_per_token_logps"][signal], rtol=0, atol=0)

    def loss_of(skip: bool, correction: bool = True) -> torch.Tensor:
        trainer._pods_skip, trainer.vllm_importance_sampling_correction = skip, correction
        try:
            return trainer.compute_loss(trainer.model, output).detach()
        finally:
            trainer._pods_skip, trainer.vllm_importance_sampling_correction = True, True

    trainer.current_gradient_accumulation_steps = 1
    torch.testing.assert_close(loss_of(skip=True), loss_of(skip=False), rtol=1e-6, atol=1e-7)
    assert not torch.allclose(loss_of(skip=True), loss_of(skip=True, correction=False))  # TRL weighted the loss


def test_trl_importance_metrics_leave_out_padding_rows(small_vocab_model_dir, tmp_path):
    """K = 3 kept rows over steps_per_generation = 2 make one padding row, a copy of a kept row: TRL
    logged the means of its correction with the copy counted twice; they are over the kept rows."""
    n = 4
    args = PODSConfig(**common_args(tmp_path, n, per_device_train_batch_size=4, gradient_accumulation_steps=2, beta=0.0),
                      pods_rule="max_variance", pods_m=3, pods_filter_zero_variance=True,
                      vllm_importance_sampling_mode="token_truncate")  # fmt: skip
    trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[one_constant_group], args=args, train_dataset=dataset())
    fake_vllm_generation(trainer)
    trainer.model.train()
    output = trainer._generate_and_score_completions(generation_batch(n))
    mask = output["completion_mask"].bool()
    real = mask.any(dim=1)
    assert real.tolist().count(False) == 1 and trainer.last_selection.keep.sum() == 3
    metrics = trainer._metrics["train"]
    ratio = output["importance_sampling_ratio"]
    delta = (output["old_per_token_logps"] - output["sampling_per_token_logps"]).abs()
    assert metrics["sampling/importance_sampling_ratio/mean"][-1] == pytest.approx(float(ratio[mask].mean()), rel=1e-6)
    assert metrics["sampling/sampling_logp_difference/mean"][-1] == pytest.approx(float(delta[mask].mean()), rel=1e-6)
    assert metrics["sampling/importance_sampling_ratio/max"][-1] == pytest.approx(float(ratio[mask].max()), rel=1e-6)


@pytest.mark.parametrize("native", [False, True])
def test_bf16_on_a_cpu_without_native_bfloat16_warns_once_at_the_config(tmp_path, monkeypatch, native):
    """TRL's default bf16=True runs emulated bfloat16 autocast on such a CPU: PODSConfig says so, with
    the evidence, where the config is built; bf16=False, or a CPU that computes bfloat16, is silent."""
    import warnings

    from podsrl.engines import dtype

    monkeypatch.setattr(dtype, "cpu_bf16", lambda: (native, "the flags of a made-up CPU"))
    base = dict(output_dir=str(tmp_path), num_generations=4, per_device_train_batch_size=4, use_cpu=True, report_to="none")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        PODSConfig(**base)  # bf16 left at TRL's default
        PODSConfig(**base, bf16=False)
    ours = [w for w in caught if "bfloat16 autocast" in str(w.message)]
    if native:
        assert not ours
    else:
        assert len(ours) == 1 and ours[0].filename == __file__
        assert "the flags of a made-up CPU" in str(ours[0].message) and "Pass bf16=False" in str(ours[0].message)


def test_config_validation(tmp_path):
    base = dict(output_dir=str(tmp_path), num_generations=8, per_device_train_batch_size=8, use_cpu=True, bf16=False, report_to="none")
    assert PODSConfig(**base, pods_rule="max_variance").pods_spec().m_start(8) == 2  # n // 4, as podsrl train
    with pytest.raises(ValueError, match=r"pods_m = 16 exceeds num_generations = 8"):
        PODSConfig(**base, pods_m=16)
    with pytest.raises(ValueError, match="pods_rule: unknown value 'maxvar'"):
        PODSConfig(**base, pods_rule="maxvar", pods_m=2)
    with pytest.raises(ValueError, match="pods_m_schedule: is 'constant', so pods_m_final = 4 would never be reached"):
        PODSConfig(**base, pods_m=2, pods_m_final=4)
    with pytest.raises(ValueError, match="keeps every rollout"):
        PODSConfig(**base, pods_rule="all", pods_m=4)
    # Settings that can never learn are refused, as by podsrl train (issue 38): one kept rollout
    # with advantages over the kept subset; a group of one (TRL refuses it first).
    with pytest.raises(ValueError, match=r"pods_m = 1 keeps one rollout per prompt.*pods_advantage_over"):
        PODSConfig(**base, pods_rule="max_reward", pods_m=1)
    assert PODSConfig(**base, pods_rule="max_reward", pods_m=1, pods_advantage_over="group").pods_m == 1
    with pytest.raises(ValueError, match=r"at least 2 generations"):  # TRL's own refusal, before podsrl's
        PODSConfig(**{**base, "num_generations": 1, "per_device_train_batch_size": 1, "generation_batch_size": 1})
    # TRL's advantage convention becomes the spec's: scale_rewards, and normalize_then_sum's batch std.
    conventions = {
        ("group", "sum_then_normalize"): (True, "group"),
        ("none", "sum_then_normalize"): (False, "group"),
        ("batch", "sum_then_normalize"): (True, "batch"),
        ("group", "normalize_then_sum"): (True, "batch"),
        ("none", "normalize_then_sum"): (True, "batch"),  # TRL divides by the batch std whatever scale_rewards says
    }
    for (scale, aggregation), expected in conventions.items():
        spec = PODSConfig(**base, pods_m=2, scale_rewards=scale, multi_objective_aggregation=aggregation).pods_spec()
        assert (spec.scale_std, spec.std_over) == expected, (scale, aggregation)
    with pytest.raises(ValueError, match="top_entropy_quantile and pods_token_fraction"):
        PODSConfig(**base, pods_m=2, pods_token_fraction=0.5, top_entropy_quantile=0.2)
    assert PODSConfig(**base, pods_rule="all").pods_spec().m_start(8) == 8
    assert PODSConfig(**base, pods_rule="d3s_intra", pods_m=2).pods_spec().advantages_over_group
    assert not PODSConfig(**base, pods_m=2).pods_spec().advantages_over_group


def test_trl_version_errors(monkeypatch):
    import trl

    monkeypatch.setattr(trl, "__version__", "1.15.2")
    with pytest.raises(ImportError, match=r"supports TRL >=1.16,<1.17, found trl 1.15.2"):
        _check_trl()
    monkeypatch.setitem(sys.modules, "trl", None)
    with pytest.raises(ImportError, match=r"needs TRL >=1.16,<1.17.*pip install 'podsrl\[trl\]'"):
        _check_trl()
    assert SUPPORTED_TRL == ">=1.16,<1.17"


def test_rewards_both_ways(tmp_path):
    from podsrl.integrations.rewards import as_trl_reward
    from podsrl.grading.rewards import compute_rewards, get_reward
    from podsrl.tasks import Example

    correctness = as_trl_reward("correctness")
    assert correctness.__name__ == "correctness"
    prompts = [[{"role": "user", "content": "What is 2 + 2?"}]] * 2
    completions = [[{"role": "assistant", "content": "It is 4."}], [{"role": "assistant", "content": "5"}]]
    assert correctness(prompts=prompts, completions=completions, answer=["4", "4"]) == [1.0, 0.0]
    assert correctness(prompts=["2+2?"], completions=["#### 4"], answer=["4"]) == [1.0]
    with pytest.raises(ValueError, match="column 'answer'"):
        correctness(prompts=["q"], completions=["4"], solution=["4"])

    source = tmp_path / "trl_style.py"
    source.write_text(
        textwrap.dedent(
            """
            def batched(prompts, completions, answer, **kwargs):
                return [float(c.strip() == a) for c, a in zip(completions, answer)]

            def needs_ids(completions, completion_ids):
                return [0.0]
            """
        )
    )
    reward = get_reward(f"{source}:batched")
    assert reward("4", Example("1", "2+2?", "4")) == 1.0
    result = compute_rewards(["4", "5"], [Example("1", "q", "4")] * 2, [(f"{source}:batched", 1.0)])
    assert result.total == [1.0, 0.0]
    from podsrl.errors import ConfigError

    with pytest.raises(ConfigError, match="completion_ids"):
        get_reward(f"{source}:needs_ids")


DDP_SCRIPT = '''
import sys, torch
from datasets import Dataset
from accelerate.utils import gather_object
sys.path.insert(0, sys.argv[2])
from test_trl import dataset, fake_generation, length_reward
from podsrl.integrations.trl import PODSConfig, PODSTrainer

torch.set_num_threads(1)

def uneven_reward(completions, answer, trainer_state, **columns):
    """Step 0: prompts with an even answer score a constant (the DAPO filter drops their group);
    step 1: every completion scores the same, so nothing at all is kept."""
    lengths = length_reward(completions)
    if trainer_state.global_step >= 1:
        return [0.5] * len(completions)
    return [0.5 if int(a) % 2 == 0 else r for a, r in zip(answer, lengths)]

# 3 prompts x n=4 over 2 processes: the second group straddles them. d3s_cross keeps unequal numbers per
# group and the DAPO filter drops groups, so the kept count differs between steps and between origins.
args = PODSConfig(output_dir=sys.argv[3], num_generations=4, per_device_train_batch_size=6, max_completion_length=8,
                  max_steps=2, report_to="none", use_cpu=True, bf16=False, save_strategy="no", logging_steps=1, beta=0.04,
                  pods_rule="d3s_cross", pods_m=3, pods_filter_zero_variance=True, seed=3)
trainer = PODSTrainer(model=sys.argv[1], reward_funcs=[uneven_reward], args=args, train_dataset=dataset(12))
fake_generation(trainer)
local_rows = []
original = trainer._pods_finish
def finish(output, state):
    out = original(output, state)
    local_rows.append((int(out["completion_ids"].shape[0]), state.num_kept, state.num_slots))
    return out
trainer._pods_finish = finish
trainer.train()
keeps = gather_object([trainer.last_selection.keep.tolist()])
rows = gather_object([local_rows])
if trainer.accelerator.is_main_process:
    assert keeps[0] == keeps[1], "the processes selected differently"
    assert rows[0] == rows[1], rows
    assert rows[0][-1] == (1, 0, 2), rows  # nothing kept: one zero-weight row per process, no hang
    assert any(slots > kept for _, kept, slots in rows[0]), rows
    print("DDP-OK", rows[0])
'''


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_two_processes(args: list, *, timeout: int) -> str:
    """``accelerate launch ARGS`` (a script and its arguments) on 2 gloo processes; it must exit 0.
    Its output."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "ACCELERATE_USE_CPU": "1"}
    command = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()), *map(str, args),
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return result.stdout


# Run in conftest.py's one accelerate launch a session (trl_two_processes), with test_trl_compat.py's.
UNEVEN = trl_two_process_script("trl_uneven_kept_counts", DDP_SCRIPT)


def test_two_processes_uneven_kept_counts(trl_two_processes):
    trl_part_passed(trl_two_processes, UNEVEN)


DDP_SKIP_SCRIPT = '''
import sys, torch
from accelerate.utils import gather_object
sys.path.insert(0, sys.argv[2])
from test_trl import dataset, fake_generation, length_reward
from podsrl.integrations.trl import PODSConfig, PODSTrainer

torch.set_num_threads(1)

def even_constant(completions, answer, **columns):
    return [0.5 if int(a) % 2 == 0 else r for a, r in zip(answer, length_reward(completions))]

# 3 prompts x n=4 over 2 processes, 2 micro-batches each; m=3 keeps K=9 rows (zero-advantage ones in
# groups that score a constant): 12 slots, 3 of them padding, then zero-advantage rows skipped.
weights, rows = {}, {}
for skip in (True, False):
    args = PODSConfig(output_dir=sys.argv[3], num_generations=4, per_device_train_batch_size=3,
                      gradient_accumulation_steps=2, max_completion_length=8, max_steps=1, report_to="none",
                      use_cpu=True, bf16=False, save_strategy="no", logging_steps=1, beta=0.0, loss_type="grpo", optim="sgd",
                      learning_rate=0.1, pods_rule="max_variance", pods_m=3, pods_skip_zero_advantage=skip, seed=3)
    trainer = PODSTrainer(model=sys.argv[1], reward_funcs=[even_constant], args=args, train_dataset=dataset(12))
    fake_generation(trainer)
    trainer.train()
    weights[skip] = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    rows[skip] = next(e["pods/loss_rows_fraction"] for e in trainer.state.log_history if "pods/loss_rows" in e)
if trainer.accelerator.is_main_process:
    assert rows[True] < 1.0 and rows[False] == 1.0, rows
    for name, value in weights[False].items():
        # Rounding of the sums behind an element's update scales with the tensor's terms, not with the
        # element: an element near 0 differed by 1.5e-9 (1.9e-5 of itself) on an AVX-512/AMX CPU, where
        # the kernels block the sums differently for other row counts; a skipped row that counted would
        # move its elements by about lr x its gradient, orders of magnitude above this.
        torch.testing.assert_close(weights[True][name], value, rtol=1e-6, atol=1e-6 * float(value.abs().max()))
    print("DDP-OK", rows)
'''


SKIPPING = trl_two_process_script("trl_skipping_keeps_the_update", DDP_SKIP_SCRIPT)


def test_two_processes_skipping_keeps_the_update(trl_two_processes):
    """Skipping zero-advantage rows and padding over 2 processes (uneven rows per process after the
    skip): the weights after the step are those without skipping."""
    trl_part_passed(trl_two_processes, SKIPPING)


@pytest.mark.slow
@pytest.mark.vllm
def test_vllm_colocate_on_cpu_syncs_weights(tmp_path):
    """TRL's colocated vLLM (vllm-cpu) samples for PODSTrainer, and the policy's weights reach it.

    With lr 1e-3 one update moves the policy far: were vLLM still sampling from the initial
    weights, TRL's logged sampler/trainer log-prob difference would be ~5 nats at step 2 (measured
    with the weight sync disabled); with the sync it was 0.07 (vLLM's dtype, see docs/trl.md).
    """
    pytest.importorskip("vllm")
    # TRL's colocate mode writes RANK/WORLD_SIZE/MASTER_* into os.environ: restore them afterwards.
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "VLLM_CPU_KVCACHE_SPACE")
    saved = {key: os.environ.get(key) for key in keys}
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        _colocate_run(tmp_path)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _colocate_run(tmp_path):
    from podsrl.integrations.rewards import as_trl_reward
    from podsrl.models import resolve_model_path

    ds = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": f"What is {a} + {b}? Give only the final number."}], "answer": str(a + b)}
            for a in range(4)
            for b in range(4)
        ]
    )
    args = PODSConfig(
        **common_args(tmp_path, 8, per_device_train_batch_size=16, max_steps=2, learning_rate=1e-3),
        pods_m=2,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_max_model_length=256,
    )
    trainer = PODSTrainer(
        model=resolve_model_path("smollm2-135m-instruct"),
        reward_funcs=[as_trl_reward("correctness")],
        args=args,
        train_dataset=ds,
    )
    trainer.train()
    logged = [e for e in trainer.state.log_history if "pods/kept" in e]
    assert [e["pods/kept"] for e in logged] == [4.0, 4.0]
    assert logged[1]["sampling/sampling_logp_difference/mean"] < 0.5
