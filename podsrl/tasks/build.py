"""A run's task from its config: the task ``cfg.task`` names, with the config's instruction, system
prompt and grader applied, and the held-out problems a run of that config scores. Read by the
training loop (:mod:`podsrl.train.loop`) and by the comparison report (:mod:`podsrl.compare.report`),
which must not depend on the loop."""

from __future__ import annotations

import dataclasses

from podsrl.config import Config
from podsrl.grading.graders import get_grader
from podsrl.tasks import Task, load_task, task_options


def held_out_problems(cfg: Config, task: Task) -> list:
    """The held-out problems a run of ``cfg`` scores: the first ``eval.max_problems`` (all: None)."""
    return task.eval[: cfg.eval.max_problems] if cfg.eval.max_problems else task.eval


def build_task(cfg: Config) -> Task:
    options = dict(cfg.task.options)
    if "seed" in _loader_params(cfg.task.name):
        options.setdefault("seed", cfg.train.seed)
    task = load_task(cfg.task.name, **options)
    if cfg.task.instruction is not None:
        task = dataclasses.replace(task, instruction=cfg.task.instruction)
    if cfg.task.system_prompt is not None:
        task = dataclasses.replace(task, system_prompt=cfg.task.system_prompt)
    if cfg.task.grader is not None:
        task = dataclasses.replace(task, grader=cfg.task.grader)
    get_grader(task.grader)  # a user grader is loaded now: a bad one fails before the model loads
    return task


def _loader_params(name: str) -> set[str]:
    return set(task_options(name))
