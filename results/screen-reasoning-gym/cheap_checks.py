"""Cheap checks before the reasoning-gym screening (issue 47): the untrained embedded model's
held-out accuracy on a few problems of each candidate dataset, with each answer format, and how
often its answers have the answer's form at all. No training.

The numbers are `podsrl eval`'s: the same task, prompts, sampling seeds (train.seed 0, per call
seed + 1e6 x call), engine calls of at least 64 completions and grader (podsrl.train.evaluate.evaluate,
called as podsrl.train.loop.run_eval calls it), with one engine for every check (the model is the
same) so that vLLM starts once; the engine's generate is wrapped to keep the completions.

"parseable": the answer the dataset's checker scores (podsrl.grading.reasoning_gym.extract: the last
<answer> tag's content, else the final number for a numeric reference, else the last line's answer;
before commit 9a392f1, the last tag's content, else the whole completion) has the form of
the dataset's answers (SHAPES: a bare number, a single word, a comma-separated list of words, a
JSON-style list of quoted numbers), whether right or wrong; "alone": the whole completion, stripped of
surrounding whitespace, quotes and punctuation, has that form (the model wrote the answer alone, as
the plain instruction asks); "tagged": the completion holds an <answer>...</answer> pair; "contains": the
reference answer appears in the completion (a number not inside a longer one; other answers as a
case-insensitive substring): the model knows it but does not write it alone; "reward": the mean of
the dataset's own score_answer with partial credit (task option partial_credit = true).

Formats: "plain" and "tags", the task's answer_format; "number" (numeric answers only): "plain" with
the arithmetic task's own prompts instead (task.system_prompt "Answer with only the final number.",
task.instruction "Give only the final number.").

    OMP_NUM_THREADS=2 nice -n 10 .venv/bin/python results/screen-reasoning-gym/cheap_checks.py [NAME ...] --out FILE.json
        [--formats plain,tags,number] [--max-new-tokens 32] [--temperature 1 --samples 4] [--problems 30]
        [--formats custom --system TEXT --instruction TEXT]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time

NUMBER = re.compile(r"^[+-]?\d+(\.\d+)?$")
WORD = re.compile(r"^[A-Za-z]+$")
WORD_LIST = re.compile(r"^[A-Za-z]+(\s*,\s*[A-Za-z]+)*$")
QUOTED_LIST = re.compile(r"^\[\s*(['\"][+-]?\d+(\.\d+)?['\"]\s*(,\s*['\"][+-]?\d+(\.\d+)?['\"]\s*)*)?\]$")
SHAPES = {"number": NUMBER, "word": WORD, "word_list": WORD_LIST, "quoted_list": QUOTED_LIST}

# name -> (dataset, its config, num_train, num_eval, answer shape): the easiest settings worth a look.
CANDIDATES = {
    "chain_sum_1d": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}, 100, 100, "number"),
    "chain_sum_2d": ("chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}, 1000, 200, "number"),
    "basic_arithmetic": ("basic_arithmetic", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                         "operators": ["+", "-", "*"], "allow_parentheses": False, "allow_negation": False}, 150, 100, "number"),
    "decimal_chain_sum": ("decimal_chain_sum", {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1,
                          "min_decimal_places": 1, "max_decimal_places": 1}, 1000, 200, "number"),
    "simple_equations": ("simple_equations", {"min_terms": 2, "max_terms": 2, "min_value": 1, "max_value": 9,
                         "operators": ["+", "-"], "operators_weights": [0.5, 0.5]}, 1000, 200, "number"),
    "leg_counting": ("leg_counting", {"min_animals": 1, "max_animals": 2, "min_instances": 1, "max_instances": 3}, 1000, 200, "number"),
    "letter_counting": ("letter_counting", {"min_words": 1, "max_words": 2}, 1000, 200, "number"),
    "gcd": ("gcd", {"min_value": 1, "max_value": 50}, 1000, 200, "number"),
    "lcm": ("lcm", {"min_value": 1, "max_value": 20}, 150, 100, "number"),
    "count_bits": ("count_bits", {"min_n": 1, "max_n": 255}, 100, 100, "number"),
    "number_format": ("number_format", {"min_num_candidates": 2, "max_num_candidates": 2, "min_n": 1, "max_n": 100}, 1000, 200, "number"),
    "number_sorting": ("number_sorting", {"min_numbers": 2, "max_numbers": 3, "min_decimals": 0, "max_decimals": 0,
                       "min_value": 0, "max_value": 99}, 1000, 200, "quoted_list"),
    "number_filtering": ("number_filtering", {"min_numbers": 3, "max_numbers": 3, "min_decimals": 0, "max_decimals": 0,
                         "min_value": 0, "max_value": 50}, 1000, 200, "quoted_list"),
    "word_sorting": ("word_sorting", {"min_words": 2, "max_words": 3, "min_word_length": 3, "max_word_length": 5}, 1000, 200, "word_list"),
    "spell_backward": ("spell_backward", {"min_word_len": 3, "max_word_len": 4}, 1000, 200, "word"),
}  # fmt: skip


def _contains(text: str, answer: str, shape: str) -> bool:
    if shape == "number":
        return re.search(rf"(?<![\d.]){re.escape(answer)}(?![\d]|\.\d)", text) is not None
    return answer.lower() in text.lower()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("names", nargs="*", help="candidates (default: all)")
    ap.add_argument("--formats", default="plain,tags,number")
    ap.add_argument("--problems", type=int, default=30)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", required=True, help="JSON file: a row per check, rewritten after each")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--keep", type=int, default=8, help="completions kept in the output per check (the first problems')")
    ap.add_argument("--system", default="none", help='format "custom": the system prompt ("none": no system prompt)')
    ap.add_argument("--instruction", default="none", help='format "custom": the instruction after the question')
    args = ap.parse_args()

    from podsrl import config as config_mod
    from podsrl.grading.graders import _SURROUNDING
    from podsrl.grading.reasoning_gym import extract, score
    from podsrl.train.evaluate import evaluate
    from podsrl.train.loop import _min_call, build_task, prompt_ids, setup

    def cfg_for(name: str, fmt: str):
        dataset, config, num_train, num_eval, _ = CANDIDATES[name]
        prompts = {"system_prompt": "Answer with only the final number.", "instruction": "Give only the final number."} if fmt == "number" else {}
        if fmt == "custom":
            # "" is no system prompt: podsrl's config reads "none" as the task's own (the first cheap
            # checks' "--system none" kept the task's "Answer with only the final answer.": README).
            prompts = {"system_prompt": "" if args.system == "none" else args.system, "instruction": args.instruction}
        return config_mod.from_dict({
            "task": {"name": "reasoning_gym", "options": {"dataset": dataset, "config": config, "num_train": num_train,
                                                           "num_eval": num_eval, "answer_format": "tags" if fmt == "tags" else "plain",
                                                           "partial_credit": False}, **prompts},
            "eval": {"max_problems": args.problems, "samples": args.samples, "temperature": args.temperature},
            "rollout": {"max_new_tokens": args.max_new_tokens},
            "train": {"progress": False},
        })  # fmt: skip

    names = args.names or list(CANDIDATES)
    formats = args.formats.split(",")
    s = setup(cfg_for(names[0], formats[0]))  # one engine for all: the model is the same
    captured = []
    generate = s.engine.generate

    def keep(prompts, sampling):
        out = generate(prompts, sampling)
        captured.extend(out.texts)
        return out

    s.engine.generate = keep
    results = []
    for name in names:
        for fmt in formats:
            if fmt == "number" and CANDIDATES[name][4] != "number":
                continue
            cfg = cfg_for(name, fmt)
            task = build_task(cfg)
            examples = task.eval[: cfg.eval.max_problems]
            captured.clear()
            start = time.perf_counter()
            r = evaluate(s.engine, prompt_ids(s.policy.tokenizer, task, examples), examples, temperature=cfg.eval.temperature,
                         samples=cfg.eval.samples, max_new_tokens=cfg.rollout.max_new_tokens, seed=cfg.train.seed,
                         min_call=_min_call(s))  # fmt: skip
            shape = SHAPES[CANDIDATES[name][4]]
            refs = [examples[i // cfg.eval.samples] for i in range(len(captured))]
            answers = [extract(t, ex.answer or None) or "" for t, ex in zip(captured, refs)]
            parseable = sum(bool(shape.match(a)) for a in answers) / len(answers)
            alone = sum(bool(shape.match(t.strip(_SURROUNDING))) for t in captured) / len(captured)
            tagged = sum("<answer>" in t and "</answer>" in t for t in captured) / len(captured)
            contains = sum(_contains(t, ex.answer, CANDIDATES[name][4]) for t, ex in zip(captured, refs)) / len(captured)
            reward = sum(score(t, ex) for t, ex in zip(captured, refs)) / len(captured)
            row = {"name": name, "dataset": CANDIDATES[name][0], "config": CANDIDATES[name][1], "format": fmt,
                   "accuracy": r.accuracy, "ci95": [r.ci_low, r.ci_high], "pass_at_k": r.pass_at_k, "parseable": parseable,
                   "alone": alone, "tagged": tagged, "contains": contains, "reward": reward, "mean_length": r.mean_length, "truncated": r.truncated, "problems": r.problems,
                   "seconds": time.perf_counter() - start, "temperature": cfg.eval.temperature, "samples": cfg.eval.samples,
                   "max_new_tokens": cfg.rollout.max_new_tokens,
                   "examples": [{"question": examples[i // cfg.eval.samples].question[-120:], "answer": examples[i // cfg.eval.samples].answer,
                                 "completion": captured[i]} for i in range(min(len(captured), args.keep))]}  # fmt: skip
            results.append(row)
            print(f"{name:18s} {fmt:5s} acc {100 * r.accuracy:5.1f}%  pass@{args.samples} {100 * r.pass_at_k[f'pass@{args.samples}']:5.1f}%  "
                  f"parseable {100 * parseable:5.1f}%  alone {100 * alone:5.1f}%  tagged {100 * tagged:5.1f}%  contains {100 * contains:5.1f}%  reward {reward:.3f}  len {r.mean_length:4.1f}  trunc {100 * r.truncated:4.1f}%  "
                  f"{row['seconds']:.0f} s", flush=True)  # fmt: skip
            with open(args.out, "w") as f:
                json.dump(results, f, indent=1)
    s.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
