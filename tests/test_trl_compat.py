"""PODSTrainer is a drop-in GRPOTrainer (issue 25): every input and option of TRL 1.16's GRPO.

For each case, on the tiny random model(s) of conftest.py (the small-vocabulary one but for the tool
calls: test_trl.py's docstring) with generation faked as in test_trl.py
(the two trainers see the very same completions, tool calls and tool results):

- with rule ``all`` and m = n, PODSTrainer computes the same advantages, loss and gradients as
  GRPOTrainer;
- with ``max_variance`` and m < n, only the B*m kept rows (episodes, with all their turns) reach
  the forward passes, and each carries what GRPOTrainer gives that row (tool mask, images).

Cases: TRL's own entropy filter (``top_entropy_quantile``) without podsrl token selection; the
caller's batch; ``args`` None or a plain GRPOConfig; tools (a toy tool); ``environment_factory`` (a
toy environment that owns the reward); images (a tiny LLaVA built from a config); reward
aggregation ``normalize_then_sum``; ``scale_rewards="batch"``; completions no reward function
scored (None); podsrl's ``policy_loss`` with a token mask against TRL's ``_compute_loss`` with
its entropy mask (issue 32: one D3S loss); and two processes (``accelerate launch``, gloo) on the
multi-turn path with uneven kept counts.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from unittest.mock import Mock

import pytest
import torch

pytest.importorskip("trl", reason="the TRL integration needs the trl extra (make test installs it)")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from podsrl.integrations.trl import _ROW_MEAN_LOSSES, PODSConfig, PODSTrainer, _normalize_then_sum, _TokenSelection  # noqa: E402
from conftest import trl_part_passed, trl_two_process_script  # noqa: E402
from test_trl import N_PROMPTS, common_args, dataset, fake_generation, generation_batch, length_reward, loss_and_grads  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

TEMPLATES = Path(__import__("trl").__file__).parent / "chat_templates"
EXACT: dict = {}  # centring only (scale_rewards="none") is exactly TRL's
CLOSE = {"rtol": 1e-3, "atol": 1e-4}  # with a std: TRL divides by std + 1e-4, podsrl by the std


# ----------------------------------------------------------------------------- helpers


def pair(tmp_path: Path, n: int, *, model, reward_funcs, config: dict | None = None, make_processor=None, **kwargs):
    """GRPOTrainer and PODSTrainer (rule all, m = n) with the same settings."""
    common = common_args(tmp_path, n, **(config or {}))
    made = []
    for cls, args in ((GRPOTrainer, GRPOConfig(**common)), (PODSTrainer, PODSConfig(**common, pods_rule="all"))):
        extra = dict(kwargs)
        if make_processor is not None:
            extra["processing_class"] = make_processor()  # TRL changes its processor (pad token, response schema)
        made.append(cls(model=model, reward_funcs=reward_funcs, args=args, **extra))
    return made


def assert_same_update(grpo, pods, inputs, tol: dict) -> tuple[dict, dict]:
    """One round and one loss/backward each: the same completions, advantages, loss and gradients."""
    out_g, loss_g, grads_g = loss_and_grads(grpo, inputs)
    out_p, loss_p, grads_p = loss_and_grads(pods, inputs)
    assert torch.equal(out_g["completion_ids"], out_p["completion_ids"])
    for key in ("completion_mask", "tool_mask", "pixel_values"):
        assert (key in out_g) == (key in out_p), key
        if key in out_g:
            torch.testing.assert_close(out_p[key], out_g[key], rtol=0, atol=0)
    torch.testing.assert_close(out_p["advantages"], out_g["advantages"], **tol)
    torch.testing.assert_close(loss_p, loss_g, **tol)
    assert grads_g.keys() == grads_p.keys() and grads_g
    for name in grads_g:
        scale = {"rtol": 1e-2, "atol": 1e-2 * float(grads_g[name].abs().max())} if tol else {}
        torch.testing.assert_close(grads_p[name], grads_g[name], **scale)
    return out_g, out_p


def count_forward_rows(trainer) -> dict[str, list[int]]:
    """Rows of every log-prob forward (policy and reference model), and image rows for a VLM."""
    seen: dict[str, list[int]] = {"rows": [], "images": []}

    def hook(module, args, kwargs):
        if "labels" in kwargs:  # TRL's log-prob forwards (generation is faked away anyway)
            seen["rows"].append(kwargs["input_ids"].shape[0])
            if "pixel_values" in kwargs:
                seen["images"].append(kwargs["pixel_values"].shape[0])

    for model in (trainer.model, trainer.ref_model):
        if model is not None:
            model.register_forward_pre_hook(hook, with_kwargs=True)
    return seen


def trimmed(output: dict, key: str) -> list[list[int]]:
    """Each row of output[key] up to its completion length (rows are padded to the batch's longest)."""
    lengths = output["completion_mask"].sum(1).tolist()
    return [row[:length].tolist() for row, length in zip(output[key], lengths)]


def keep_rows(trainer) -> list[int]:
    return trainer.last_selection.keep.flatten().nonzero().squeeze(1).tolist()


def chatml_tokenizer(model_dir: Path):
    """The tiny model's tokenizer (ChatML tokens) with TRL's Qwen2.5 chat template, which renders
    tools and tool results and which TRL knows how to parse tool calls from."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.chat_template = (TEMPLATES / "qwen2_5.jinja").read_text()
    return tokenizer


# ----------------------------------------------------------------------------- TRL's entropy filter


def stand_in() -> Mock:
    """What TRL's TestGetHighEntropyMask calls the method on: no __init__ ran."""
    trainer = Mock(spec=PODSTrainer)
    trainer.accelerator = Mock(num_processes=1, gather=lambda x: x, pad_across_processes=lambda x, dim, pad_index: x)
    return trainer


def test_entropy_mask_on_a_stand_in_is_trls_and_scales_only_with_podsrl_tokens():
    entropies = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.ones(2, 2, dtype=torch.long)
    trl_mask = GRPOTrainer.get_high_entropy_mask(stand_in(), entropies, mask, 0.5)
    assert trl_mask.tolist() == [[False, False], [True, True]]  # H >= median 2.5
    assert torch.equal(PODSTrainer.get_high_entropy_mask(stand_in(), entropies, mask, 0.5), trl_mask)
    # While podsrl's D3S token selection runs, the score is |A| x H: [[2, 4], [0.3, 0.4]], median 1.2.
    with_state = stand_in()
    with_state._pods_tokens = _TokenSelection("adv_entropy", torch.tensor([2.0, -0.1]))
    assert PODSTrainer.get_high_entropy_mask(with_state, entropies, mask, 0.5).tolist() == [[True, True], [False, False]]


def test_podsrl_token_selection_is_over_the_rows_with_a_signal():
    """Issue 36: rows of advantage 0 are neither selected nor pooled. Row 0 has a signal, rows 1-3
    (A = 0) high entropies. Before, |A| x H pooled their zeros, so the median was 0 and every token
    was kept (the rule did nothing); the entropy-only score kept rows 1-3's tokens instead of row 0's."""
    entropies = torch.tensor([[1.0, 2.0], [5.0, 5.0], [5.0, 5.0], [5.0, 5.0]])
    mask = torch.ones(4, 2, dtype=torch.long)
    for score in ("adv_entropy", "entropy"):
        trainer = stand_in()
        trainer._pods_tokens = _TokenSelection(score, torch.tensor([1.5, 0.0, 0.0, 0.0]))
        kept = PODSTrainer.get_high_entropy_mask(trainer, entropies, mask, 0.5)  # median of row 0's scores
        assert kept.tolist() == [[False, True], [False, False], [False, False], [False, False]], score


def test_trl_entropy_filter_without_podsrl_tokens_is_grpo(small_vocab_model_dir, tmp_path):
    n = 4
    config = {"top_entropy_quantile": 0.5, "scale_rewards": "none", "beta": 0.04}
    grpo, pods = pair(tmp_path, n, model=str(small_vocab_model_dir), reward_funcs=[length_reward], config=config, train_dataset=dataset())
    fake_generation(grpo), fake_generation(pods)
    calls = {"grpo": [], "pods": []}
    for name, trainer in (("grpo", grpo), ("pods", pods)):
        original = trainer.get_high_entropy_mask
        trainer.get_high_entropy_mask = lambda e, m, t, _o=original, _c=calls[name]: _c.append(_o(e, m, t)) or _c[-1]
    assert_same_update(grpo, pods, generation_batch(n), EXACT)
    assert len(calls["pods"]) == 1 and torch.equal(calls["pods"][0], calls["grpo"][0])  # the same token mask


def test_podsrl_quantile_mask_is_trls_entropy_mask():
    """The threshold rule PODSTrainer now takes from podsrl's core is TRL's, ties, padding and bf16 included."""
    from podsrl.core.token_selection import quantile_threshold_mask

    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        entropies = torch.rand(5, 7, generator=g)
        if trial % 3 == 0:
            entropies = (entropies * 4).round() / 4  # many ties
        if trial % 4 == 1:
            entropies = entropies.bfloat16()
        mask = (torch.rand(5, 7, generator=g) < 0.7).long()
        level = float(torch.rand(1, generator=g))
        expected = GRPOTrainer.get_high_entropy_mask(stand_in(), entropies, mask, level)
        assert torch.equal(quantile_threshold_mask(entropies, mask, level), expected)
        assert torch.equal(PODSTrainer.get_high_entropy_mask(stand_in(), entropies, mask, level), expected)
    empty = torch.zeros(2, 3, dtype=torch.long)
    assert not quantile_threshold_mask(torch.rand(2, 3), empty, 0.5).any()
    # The threshold is over the pool given (other processes' tokens, in PODSTrainer): median of [0, 10] = 5.
    scores, valid = torch.tensor([[1.0, 5.0, 9.0]]), torch.tensor([[True, True, False]])
    assert quantile_threshold_mask(scores, valid, 0.5, pool=torch.tensor([0.0, 10.0])).tolist() == [[False, True, False]]
    assert quantile_threshold_mask(scores, valid, 0.5).tolist() == [[False, True, False]]  # median of [1, 5] = 3


# ----------------------------------------------------------------------------- one D3S loss (issue 32)

# TRL's loss_type -> podsrl's aggregation. bnpo and dapo are both "token"; they differ in the count
# they divide by: bnpo this micro-batch's completion tokens, dapo the generation batch's
# (num_items_in_batch), which podsrl passes as BatchCounts.tokens.
TRL_AGGREGATIONS = {"grpo": "sequence", "bnpo": "token", "dapo": "token", "dr_grpo": "constant"}


def trl_loss_harness(loss_type: str, beta: float, top_entropy_quantile: float, max_completion_length: int):
    """A GRPOTrainer that never ran __init__, with the attributes TRL 1.16's ``_compute_loss`` reads
    set as a one-process, train-mode run would set them. Only ``_get_per_token_logps_and_entropies``
    (the model's forward) is replaced, by the log-probs and entropies a test gives; the entropy mask,
    the surrogate, the KL term and the aggregation are TRL's own code."""
    from collections import defaultdict
    from types import SimpleNamespace

    trainer = object.__new__(GRPOTrainer)
    trainer.__dict__.update(
        loss_type=loss_type, beta=beta, top_entropy_quantile=top_entropy_quantile,
        max_completion_length=max_completion_length, epsilon_low=0.2, epsilon_high=0.28,
        importance_sampling_level="token", off_policy_mask_threshold=None, use_vllm=False,
        vllm_importance_sampling_correction=False, aux_loss_enabled=False, _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=2, model=SimpleNamespace(training=True),
        args=SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=2),
        accelerator=SimpleNamespace(num_processes=1, gather=lambda x: x, reduce=lambda x, reduction: x,
                                    pad_across_processes=lambda x, dim, pad_index: x),
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
    )  # fmt: skip
    return trainer


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", sorted(TRL_AGGREGATIONS))
def test_policy_loss_with_a_token_mask_is_trls_entropy_masked_loss(loss_type, beta):
    """podsrl.core.loss.policy_loss(token_mask=...) against TRL's _compute_loss with
    top_entropy_quantile (the 80/20 rule), value and gradient: the mask multiplies only the policy
    gradient term; the normalisers and the KL term stay over every completion token."""
    from podsrl.core.loss import BatchCounts, LossSettings, policy_loss
    from podsrl.core.token_selection import quantile_threshold_mask

    N, T, quantile, accumulation = 6, 9, 0.4, 2
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([9, 1, 4, 7, 0, 5])  # row 4 has no completion token
    mask = torch.arange(T)[None, :] < lengths[:, None]  # [N, T] bool
    logprobs = (-torch.rand(N, T, generator=g) * 3).requires_grad_(True)  # [N, T]
    old = logprobs.detach() + 0.3 * torch.randn(N, T, generator=g)  # ratios far enough from 1 to clip
    ref = logprobs.detach() + 0.5 * torch.randn(N, T, generator=g)
    advantages = torch.randn(N, generator=g)
    entropies = torch.rand(N, T, generator=g)
    generation_tokens = 3 * int(mask.sum())  # dapo: the generation batch's tokens (num_items_in_batch)

    trainer = trl_loss_harness(loss_type, beta, quantile, max_completion_length=T)
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logprobs, entropies, None)
    inputs = {
        "prompt_ids": torch.ones(N, 2, dtype=torch.long), "prompt_mask": torch.ones(N, 2, dtype=torch.long),
        "completion_ids": torch.ones(N, T, dtype=torch.long), "completion_mask": mask.long(),
        "advantages": advantages, "old_per_token_logps": old, "ref_per_token_logps": ref,
        "num_items_in_batch": torch.tensor(float(generation_tokens)),
    }  # fmt: skip
    trl_loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    (trl_grad,) = torch.autograd.grad(trl_loss, logprobs)

    token_mask = quantile_threshold_mask(entropies, mask, 1 - quantile)  # TRL's rule, podsrl's core
    assert 0 < int(token_mask.sum()) < int(mask.sum())
    # TRL divides every micro-batch loss by the accumulation steps (dapo: by its share of
    # num_items_in_batch instead); podsrl's BatchCounts say the same with whole-batch counts.
    counts = {
        "grpo": BatchCounts(sequences=N * accumulation, tokens=int(mask.sum())),
        "bnpo": BatchCounts(sequences=N, tokens=int(mask.sum()) * accumulation),
        "dapo": BatchCounts(sequences=N, tokens=generation_tokens * accumulation // 2),  # x GA / steps_per_generation
        "dr_grpo": BatchCounts(sequences=N * accumulation, tokens=int(mask.sum())),
    }[loss_type]
    settings = LossSettings(eps_low=0.2, eps_high=0.28, aggregation=TRL_AGGREGATIONS[loss_type], beta=beta, max_completion_len=T)
    loss, metrics = policy_loss(logprobs, old, advantages, mask, settings, token_mask=token_mask, ref_logprobs=ref, batch=counts)
    (grad,) = torch.autograd.grad(loss, logprobs)
    assert metrics.tokens == int(token_mask.sum()) and metrics.completion_tokens == int(mask.sum())
    torch.testing.assert_close(loss, trl_loss, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(grad, trl_grad, rtol=1e-6, atol=1e-8)
    assert bool((grad[~token_mask & mask] != 0).any()) == (beta > 0)  # only the KL reaches unselected tokens


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("loss_type", sorted(_ROW_MEAN_LOSSES))
def test_row_mean_losses_scale_with_the_advantages_and_beta(loss_type, beta):
    """What PODSTrainer._compute_loss relies on to rescale only the policy term of the row-mean loss
    types (issue 36): TRL's loss with the advantages and beta scaled by c > 0 is c times its policy
    term (surrogate and KL) plus its entropy bonus unscaled, value and gradient, with an entropy
    bonus on. Checked on TRL's own ``_compute_loss`` (forward replaced by given tensors)."""
    N, T, c = 5, 6, 4 / 3
    g = torch.Generator().manual_seed(2)
    lengths = torch.tensor([6, 2, 0, 4, 5])
    mask = torch.arange(T)[None, :] < lengths[:, None]  # [N, T]
    logprobs = (-torch.rand(N, T, generator=g) * 3).requires_grad_(True)
    entropies = (torch.rand(N, T, generator=g) + 0.5).requires_grad_(True)
    old = logprobs.detach() + 0.3 * torch.randn(N, T, generator=g)
    ref = logprobs.detach() + 0.5 * torch.randn(N, T, generator=g)
    advantages = torch.randn(N, generator=g)

    trainer = trl_loss_harness(loss_type, beta, 1.0, max_completion_length=T)
    trainer.__dict__.update(_entropy_bonus_enabled=True, entropy_coef=0.3, use_adaptive_entropy=False)
    trainer.accelerator.sync_gradients = True
    trainer.args.sapo_temperature_pos, trainer.args.sapo_temperature_neg = 1.0, 1.05
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logprobs, entropies, None)

    def loss(advantage_scale: float, beta_value: float) -> tuple[torch.Tensor, list[torch.Tensor]]:
        trainer.beta = beta_value
        inputs = {
            "prompt_ids": torch.ones(N, 2, dtype=torch.long), "prompt_mask": torch.ones(N, 2, dtype=torch.long),
            "completion_ids": torch.ones(N, T, dtype=torch.long), "completion_mask": mask.long(),
            "advantages": advantages * advantage_scale, "old_per_token_logps": old, "ref_per_token_logps": ref,
        }  # fmt: skip
        value = GRPOTrainer._compute_loss(trainer, None, inputs)
        return value.detach(), list(torch.autograd.grad(value, [logprobs, entropies]))

    bonus, bonus_grads = loss(0.0, 0.0)  # no policy term: the bonus alone
    full, full_grads = loss(1.0, beta)
    scaled, scaled_grads = loss(c, c * beta)
    assert abs(float(full - bonus)) > 1e-3 and abs(float(bonus)) > 1e-3
    torch.testing.assert_close(scaled - bonus, c * (full - bonus), rtol=1e-5, atol=1e-7)
    for got, f, b in zip(scaled_grads, full_grads, bonus_grads):
        torch.testing.assert_close(got - b, c * (f - b), rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- the caller's batch and args


def test_the_callers_batch_is_not_shortened(small_vocab_model_dir, tmp_path):
    n, m = 8, 2
    args = PODSConfig(**common_args(tmp_path, n), pods_rule="max_variance", pods_m=m)
    trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[length_reward], args=args, train_dataset=dataset())
    fake_generation(trainer)
    trainer.model.train()
    batch = generation_batch(n)
    before = copy.deepcopy(batch)
    output = trainer._generate_and_score_completions(batch)
    assert output["completion_ids"].shape[0] == N_PROMPTS * m
    assert batch == before and len(batch) == N_PROMPTS * n  # what training_step received, unchanged


@pytest.fixture
def cpu_defaults(monkeypatch):
    """TRL's default config asks for bf16, which a CPU-only machine refuses: force use_cpu (as TRL's
    own test suite does) so that the configs built without arguments can be made here."""
    from trl.trainer.base_config import _BaseConfig

    original = _BaseConfig.__post_init__

    def on_cpu(self):
        self.use_cpu = True
        original(self)

    monkeypatch.setattr(_BaseConfig, "__post_init__", on_cpu)


def test_no_args_is_the_default_podsconfig_and_a_grpoconfig_is_converted(small_vocab_model_dir, tmp_path, cpu_defaults, monkeypatch):
    monkeypatch.chdir(tmp_path)
    default = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[length_reward], train_dataset=dataset())
    assert type(default.args) is PODSConfig and default.args.pods_rule == "max_variance"
    assert default.args.output_dir.endswith(f"{small_vocab_model_dir.name}-PODS")

    grpo_args = GRPOConfig(**common_args(tmp_path, 4, gradient_accumulation_steps=2, scale_rewards="batch", learning_rate=3e-4))
    with pytest.warns(UserWarning, match="GRPOConfig, which has no PODS settings: training as GRPO"):
        converted = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[length_reward], args=grpo_args, train_dataset=dataset())
    args = converted.args
    assert isinstance(args, PODSConfig) and args.pods_rule == "all" and args.pods_spec().m_start(4) == 4
    for name in ("learning_rate", "num_generations", "steps_per_generation", "generation_batch_size", "scale_rewards", "output_dir"):
        assert getattr(args, name) == getattr(grpo_args, name), name
    assert args.pods_spec().std_over == "batch"
    with pytest.raises(TypeError, match="PODSTrainer needs args=PODSConfig"):
        PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[length_reward], args={"num_generations": 4}, train_dataset=dataset())


# ----------------------------------------------------------------------------- tools and environments


def add_one(x: int) -> int:
    """
    Adds one to a number.

    Args:
        x: The number.
    """
    return x + 1


def tool_generation(trainer, call: str) -> None:
    """Fake generation for multi-turn rollouts: at the first turn, rollout g of the round (global
    index) calls the tool (``call`` formatted with g % 4) when g % 3 != 2, else answers with
    g % 5 + 1 words; after a tool result (TRL asks for one completion per row) it says "Done!"."""
    encode = lambda text: trainer._tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        if num_generations == 1:  # TRL's tool loop: the turn after the tool's result
            return [encode("Done!<|im_end|>") for _ in prompt_ids], None
        base = trainer.accelerator.process_index * len(prompt_ids)
        texts = [call.format(i=g % 4) if g % 3 != 2 else " ".join(["word"] * (g % 5 + 1)) for g in range(base, base + len(prompt_ids))]
        return [encode(text + "<|im_end|>") for text in texts], None

    trainer._generate_single_turn = generate


TOOL_CALL = '<tool_call>\n{{"name": "add_one", "arguments": {{"x": {i}}}}}\n</tool_call>'


def turns_reward(completions, **columns):
    """More turns and a longer last message score higher (varies within every group here)."""
    return [len(c) + len(c[-1].get("content") or "") / 40.0 for c in completions]


def test_tools_rule_all_is_grpo_and_max_variance_forwards_kept_episodes(tiny_model_dir, tmp_path):
    # SmolLM2's tokenizer (test_trl.py's docstring): on the small one TRL's episodes got no tool result.
    n = 4
    config = {"max_completion_length": 64, "scale_rewards": "none", "beta": 0.04}
    grpo, pods = pair(tmp_path, n, model=str(tiny_model_dir), reward_funcs=[turns_reward], config=config,
                      train_dataset=dataset(), tools=[add_one], make_processor=lambda: chatml_tokenizer(tiny_model_dir))  # fmt: skip
    tool_generation(grpo, TOOL_CALL), tool_generation(pods, TOOL_CALL)
    inputs = generation_batch(n)
    out_g, out_p = assert_same_update(grpo, pods, inputs, EXACT)
    assert "tool_mask" in out_p and (out_p["tool_mask"] == 0).any()  # tool results are masked out of the loss
    assert pods._metrics["train"]["tools/call_frequency"][-1] == pytest.approx(grpo._metrics["train"]["tools/call_frequency"][-1])

    # max_variance, m < n: the kept episodes only, each exactly as GRPOTrainer builds that episode.
    m = 2
    args = PODSConfig(**common_args(tmp_path, n, **config), pods_rule="max_variance", pods_m=m)
    trainer = PODSTrainer(model=str(tiny_model_dir), reward_funcs=[turns_reward], args=args, train_dataset=dataset(),
                          tools=[add_one], processing_class=chatml_tokenizer(tiny_model_dir))  # fmt: skip
    tool_generation(trainer, TOOL_CALL)
    seen = count_forward_rows(trainer)
    output, _, _ = loss_and_grads(trainer, inputs)
    assert seen["rows"] == [N_PROMPTS * m, N_PROMPTS * m]  # reference, loss
    kept = keep_rows(trainer)
    assert trimmed(output, "completion_ids") == [trimmed(out_g, "completion_ids")[g] for g in kept]
    assert trimmed(output, "tool_mask") == [trimmed(out_g, "tool_mask")[g] for g in kept]


class Counter:
    """A toy environment: its tool adds to a counter, and it owns the reward (the counter)."""

    def __init__(self):
        self.total = 0

    def reset(self, **kwargs):
        self.total = 0
        return None  # the prompt as it is

    def increment(self, step: int) -> str:
        """
        Adds to the counter.

        Args:
            step: How much to add.
        """
        self.total += step
        return str(self.total)

    def get_reward(self) -> float:
        return float(self.total)


ENV_CALL = '<tool_call>\n{{"name": "increment", "arguments": {{"step": {i}}}}}\n</tool_call>'


def test_environment_rule_all_is_grpo_and_max_variance_forwards_kept_episodes(small_vocab_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    n = 4
    config = {"max_completion_length": 64, "scale_rewards": "none"}
    grpo, pods = pair(tmp_path, n, model=str(small_vocab_model_dir), reward_funcs=None, config=config, train_dataset=dataset(),
                      environment_factory=Counter, make_processor=lambda: chatml_tokenizer(small_vocab_model_dir))  # fmt: skip
    tool_generation(grpo, ENV_CALL), tool_generation(pods, ENV_CALL)
    inputs = generation_batch(n)
    out_g, _ = assert_same_update(grpo, pods, inputs, EXACT)
    assert pods.reward_func_names == ["Counter"]

    m = 2
    args = PODSConfig(**common_args(tmp_path, n, **config), pods_rule="max_variance", pods_m=m)
    trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=None, args=args, train_dataset=dataset(),
                          environment_factory=Counter, processing_class=chatml_tokenizer(small_vocab_model_dir))  # fmt: skip
    tool_generation(trainer, ENV_CALL)
    seen = count_forward_rows(trainer)
    output, _, _ = loss_and_grads(trainer, inputs)
    assert seen["rows"] == [N_PROMPTS * m]
    # The environment's reward was taken on all n episodes (the counter each one reached), before selection.
    assert trainer.last_selection.rewards.flatten().tolist() == [float(i % 4) if i % 3 != 2 else 0.0 for i in range(N_PROMPTS * n)]
    kept = keep_rows(trainer)
    assert trimmed(output, "tool_mask") == [trimmed(out_g, "tool_mask")[g] for g in kept]
    assert len(trainer._batch_environments) == N_PROMPTS * m  # TRL's per-row environment names follow the rows


# ----------------------------------------------------------------------------- images


VLM_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def tiny_vlm_dir(small_vocab_model_dir, tmp_path_factory) -> Path:
    """A tiny LLaVA (1-layer CLIP vision tower, the tiny Llama as language model) built from a config,
    with a processor made here: the tiny model's tokenizer plus an <image> token, and a PIL CLIP
    image processor (28 x 28 images, 4 patches)."""
    from transformers import (AutoTokenizer, CLIPImageProcessorPil, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)  # fmt: skip

    tokenizer = AutoTokenizer.from_pretrained(small_vocab_model_dir)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 28}, crop_size={"height": 28, "width": 28})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14, image_token="<image>",
                               vision_feature_select_strategy="default", num_additional_image_tokens=1, chat_template=VLM_TEMPLATE)  # fmt: skip
    vision = CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=512, bos_token_id=tokenizer.bos_token_id,
                       eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
                         vision_feature_select_strategy="default", vision_feature_layer=-1)  # fmt: skip
    torch.manual_seed(1234)
    path = tmp_path_factory.mktemp("tiny-llava")
    LlavaForConditionalGeneration(config).save_pretrained(path)
    processor.save_pretrained(path)
    return path


def image_dataset(count: int = 8) -> Dataset:
    from PIL import Image

    g = torch.Generator().manual_seed(0)
    images = [Image.fromarray(torch.randint(0, 255, (20 + 3 * i, 30, 3), generator=g, dtype=torch.uint8).numpy()) for i in range(count)]
    return Dataset.from_dict({"prompt": [[{"role": "user", "content": f"What is in picture {i}?"}] for i in range(count)], "image": images})


def test_images_rule_all_is_grpo_and_max_variance_forwards_kept_rows_with_their_images(tiny_vlm_dir, tmp_path):
    n = 4
    config = {"scale_rewards": "none", "beta": 0.04}
    grpo, pods = pair(tmp_path, n, model=str(tiny_vlm_dir), reward_funcs=[length_reward], config=config, train_dataset=image_dataset())
    fake_generation(grpo), fake_generation(pods)
    ds = image_dataset()
    inputs = [dict(ds[i]) for i in range(N_PROMPTS) for _ in range(n)]
    out_g, out_p = assert_same_update(grpo, pods, inputs, EXACT)
    assert out_p["pixel_values"].shape[0] == N_PROMPTS * n  # one image per row

    m = 2
    args = PODSConfig(**common_args(tmp_path, n, **config), pods_rule="max_variance", pods_m=m)
    trainer = PODSTrainer(model=str(tiny_vlm_dir), reward_funcs=[length_reward], args=args, train_dataset=image_dataset())
    fake_generation(trainer)
    seen = count_forward_rows(trainer)
    output, _, _ = loss_and_grads(trainer, inputs)
    assert seen == {"rows": [N_PROMPTS * m, N_PROMPTS * m], "images": [N_PROMPTS * m, N_PROMPTS * m]}  # reference, loss
    kept = keep_rows(trainer)
    torch.testing.assert_close(output["pixel_values"], out_g["pixel_values"][kept], rtol=0, atol=0)  # each row's own image
    assert output["num_images"] == [1] * (N_PROMPTS * m)


# ----------------------------------------------------------------------------- reward aggregation and scale


def short_reward(completions, **columns):
    """A second objective, against length: normalize_then_sum then weighs the two per group."""
    return [1.0 / (1 + len(c[0]["content"] if isinstance(c, list) else c)) for c in completions]


def completion_texts(trainer, calls) -> list[str]:
    return trainer.processing_class.batch_decode(calls[0], skip_special_tokens=True)


def test_normalize_then_sum_selects_on_trls_aggregate(small_vocab_model_dir, tmp_path):
    n = 4
    config = {"multi_objective_aggregation": "normalize_then_sum", "reward_weights": [1.0, 0.5]}
    grpo, pods = pair(tmp_path, n, model=str(small_vocab_model_dir), reward_funcs=[length_reward, short_reward], config=config, train_dataset=dataset())
    fake_generation(grpo), fake_generation(pods)
    inputs = generation_batch(n)
    assert_same_update(grpo, pods, inputs, CLOSE)

    n, m = 8, 3
    args = PODSConfig(**common_args(tmp_path, n, **config), pods_rule="max_variance", pods_m=m)
    trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[length_reward, short_reward], args=args, train_dataset=dataset())
    calls = fake_generation(trainer)
    output, _, _ = loss_and_grads(trainer, generation_batch(n))
    texts = completion_texts(trainer, calls)
    # TRL's aggregate, by hand: each function standardised within its group (sample std + 1e-4), weighted sum.
    per_function = torch.tensor([length_reward(texts), short_reward(texts)]).T.view(N_PROMPTS, n, 2)  # [B, n, F]
    z = (per_function - per_function.mean(1, keepdim=True)) / (per_function.std(1, keepdim=True) + 1e-4)
    aggregate = (z * torch.tensor([1.0, 0.5])).sum(-1)  # [B, n]
    torch.testing.assert_close(trainer.last_selection.rewards, aggregate, rtol=1e-5, atol=1e-5)
    # Advantages: centred on the kept subset of each group, divided by one std of every group's kept pooled.
    keep = trainer.last_selection.keep
    kept = aggregate[keep].view(N_PROMPTS, m)
    expected = (kept - kept.mean(1, keepdim=True)) / kept.flatten().std()
    torch.testing.assert_close(output["advantages"], expected.flatten(), rtol=1e-5, atol=1e-5)


def test_normalize_then_sum_matches_trls_formula_with_missing_values():
    rewards_per_func = torch.tensor([[1.0, 2.0], [3.0, float("nan")], [5.0, 4.0], [0.0, 1.0], [0.0, 1.0], [2.0, 3.0]])  # [B*n, F], n=3
    weights = torch.tensor([1.0, 2.0])
    got = _normalize_then_sum(rewards_per_func, weights, 3)
    # Group 0, function 0: mean 3, std 2 -> [-1, 0, 1]; function 1 (one None): mean 3, std sqrt(2) -> [-1/sqrt2, -, 1/sqrt2].
    s2 = 2**0.5 + 1e-4
    g0 = torch.tensor([-2 / 2.0001 - 2 * 1 / s2, 0.0, 2 / 2.0001 + 2 * 1 / s2])
    torch.testing.assert_close(got[:3], g0, rtol=1e-5, atol=1e-6)
    # Group 1, function 0: [0, 0, 2] mean 2/3, std 2/sqrt(3); function 1: [1, 1, 3] the same shape, doubled.
    z = torch.tensor([-2 / 3, -2 / 3, 4 / 3]) / (2 / 3**0.5 + 1e-4)
    torch.testing.assert_close(got[3:], 3 * z, rtol=1e-5, atol=1e-6)


def test_batch_scale_rule_all_is_grpo_and_pods_divides_by_the_batch_std(small_vocab_model_dir, tmp_path):
    n = 4
    grpo, pods = pair(tmp_path, n, model=str(small_vocab_model_dir), reward_funcs=[length_reward], config={"scale_rewards": "batch"},
                      train_dataset=dataset())  # fmt: skip
    fake_generation(grpo), fake_generation(pods)
    assert_same_update(grpo, pods, generation_batch(n), CLOSE)

    n, m = 8, 3
    args = PODSConfig(**common_args(tmp_path, n, scale_rewards="batch"), pods_rule="max_variance", pods_m=m)
    trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[length_reward], args=args, train_dataset=dataset())
    fake_generation(trainer)
    output, _, _ = loss_and_grads(trainer, generation_batch(n))
    selection = trainer.last_selection
    kept = selection.rewards[selection.keep].view(N_PROMPTS, m)
    expected = (kept - kept.mean(1, keepdim=True)) / kept.flatten().std()  # per group centred, one pooled std
    torch.testing.assert_close(output["advantages"], expected.flatten(), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- completions without a reward


def length_generation(trainer, lengths: list[int]) -> None:
    """Fake generation: rollout i of each group gets lengths[i] tokens (deterministic per position)."""

    def generate(prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return [list(range(400, 400 + lengths[i % len(lengths)])) for i in range(len(prompt_ids))], None

    trainer._generate_single_turn = generate


def none_for_two_tokens(completion_ids, **columns):
    """None (no reward) for a two-token completion, else the length."""
    return [None if len(ids) == 2 else float(len(ids)) for ids in completion_ids]


def test_completions_without_a_reward(small_vocab_model_dir, tmp_path, caplog):
    n = 4
    lengths = [1, 2, 5, 3]  # position 1 of every group has no reward
    grpo, pods = pair(tmp_path, n, model=str(small_vocab_model_dir), reward_funcs=[none_for_two_tokens], config={"scale_rewards": "none", "beta": 0.04},
                      train_dataset=dataset())  # fmt: skip
    length_generation(grpo, lengths), length_generation(pods, lengths)
    with pytest.warns(UserWarning, match="every reward function scored None has no reward; it is never kept"):
        with caplog.at_level("WARNING", logger="trl.trainer.grpo_trainer"):
            out_g, out_p = assert_same_update(grpo, pods, generation_batch(n), EXACT)
    assert "All reward functions returned None" in caplog.text  # TRL's own warning, from TRL's scoring
    assert out_p["advantages"].view(N_PROMPTS, n)[:, 1].abs().sum() == 0  # rule all trains on it with advantage 0
    assert pods._metrics["train"]["pods/unscored"][-1] == N_PROMPTS

    # max_variance, m = 2 of n = 4: never keep the unscored; the rule picks among the three scored.
    args = PODSConfig(**common_args(tmp_path, n), pods_rule="max_variance", pods_m=2)
    trainer = PODSTrainer(model=str(small_vocab_model_dir), reward_funcs=[none_for_two_tokens], args=args, train_dataset=dataset())
    length_generation(trainer, lengths)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        output, _, _ = loss_and_grads(trainer, generation_batch(n))
    assert trainer.last_selection.keep.tolist() == [[True, False, True, False]] * N_PROMPTS  # {1, 5}: the widest pair
    torch.testing.assert_close(output["advantages"].abs(), torch.full((N_PROMPTS * 2,), 2**-0.5))
    assert trainer.last_selection.selection.metrics["reward_mean"] == pytest.approx(3.0)  # over the scored 1, 5, 3


# ----------------------------------------------------------------------------- two processes, multi-turn


DDP_SCRIPT = '''
import sys, torch
from accelerate.utils import gather_object
sys.path.insert(0, sys.argv[2])
from test_trl import dataset
from test_trl_compat import TOOL_CALL, add_one, chatml_tokenizer, tool_generation
from podsrl.integrations.trl import PODSConfig, PODSTrainer

torch.set_num_threads(1)

def tool_result_reward(completions, **columns):
    # The tool's result for an episode that called it, minus its word count for one that did not.
    tools = [[m for m in c if m["role"] == "tool"] for c in completions]
    return [float(t[0]["content"]) if t else -float(len(c[0]["content"].split())) for t, c in zip(tools, completions)]

# 3 prompts x n=4 over 2 processes (rows 0-5 on process 0, 6-11 on process 1; the second group straddles them),
# tool-calling episodes (tool_generation: rollout g calls add_one(g % 4) unless g % 3 == 2). max_reward with m=1
# keeps rows 3, 7 and 10: one generated by process 0, two by process 1; K = 3 dealt out as 2 + 2, one padding slot.
args = PODSConfig(output_dir=sys.argv[3], num_generations=4, per_device_train_batch_size=6, max_completion_length=64,
                  max_steps=2, report_to="none", use_cpu=True, bf16=False, save_strategy="no", logging_steps=1, beta=0.04,
                  pods_rule="max_reward", pods_m=1, pods_advantage_over="group", seed=3)
trainer = PODSTrainer(model=sys.argv[1], reward_funcs=[tool_result_reward], args=args, train_dataset=dataset(12),
                      tools=[add_one], processing_class=chatml_tokenizer(sys.argv[1]))
tool_generation(trainer, TOOL_CALL)
rounds = []
original = trainer._pods_finish
def finish(output, state):
    out = original(output, state)
    kept = trainer.last_selection.keep.flatten().nonzero().squeeze(1).tolist()
    tool_rows = int((out["tool_mask"] == 0).any(1).sum()) if "tool_mask" in out else -1
    rounds.append((kept, int(out["completion_ids"].shape[0]), state.num_kept, state.num_slots, tool_rows))
    return out
trainer._pods_finish = finish
trainer.train()
everyone = gather_object([rounds])
if trainer.accelerator.is_main_process:
    assert len(everyone[0]) == 2 and everyone[0] == [(r[0], 2, 3, 4, r[4]) for r in everyone[0]], everyone
    assert all(r[0] == [3, 7, 10] for r in everyone[0] + everyone[1]), everyone  # the same selection everywhere
    assert [r[1:4] for r in everyone[0]] == [r[1:4] for r in everyone[1]], everyone  # 2 rows each, K=3, 4 slots
    # Process 0 trains on rows 3 and 7 (7 came from process 1), process 1 on row 10 and a zero-weight copy of
    # row 3: every kept episode called the tool, so each row carries a tool mask with a masked tool result.
    assert [r[4] for r in everyone[0] + everyone[1]] == [2, 2, 2, 2], everyone
    print("DDP-OK", everyone)
'''
# Run in conftest.py's one accelerate launch a session (trl_two_processes), with test_trl.py's.
# On SmolLM2's tokenizer, as test_tools_rule_all_is_grpo_and_max_variance_forwards_kept_episodes.
MULTI_TURN = trl_two_process_script("trl_multi_turn_uneven_kept_counts", DDP_SCRIPT, model="tiny_model_dir")


def test_two_processes_multi_turn_uneven_kept_counts(trl_two_processes):
    trl_part_passed(trl_two_processes, MULTI_TURN)
