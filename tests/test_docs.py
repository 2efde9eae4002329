"""The docs are tested: every block of README.md, SECURITY.md and docs/*.md that a reader is meant to
run is run here, at tiny sizes, so a page that stops working fails CI (issue 38).

**Blocks.** Every fenced block (```lang) and indented block (four spaces after a blank line) of a
page is taken in page order, in one directory per page (so a page can write a file in one block
and use it in the next), and handled by its kind:

- *commands*: a ```bash / ```sh / ```shell / ```console block, or an indented block with a line that
  starts with a command (:data:`COMMANDS`, or a ``$`` prompt). ``\\`` continues a line; ``#``
  starts a comment; ``> FILE`` writes the output to FILE. Each command runs:
  ``podsrl ...`` and ``python -m podsrl ...`` in this process (``podsrl.cli.main``: no start-up
  time), with :func:`tiny_args` appended (the tiny random model of conftest.py with its 686-token
  tokenizer, ``small_vocab_model_dir``; the transformers engine, one step, 8 new tokens, two
  held-out problems: what a test needs, the command's other settings kept); ``python FILE`` in a subprocess, and so are ``torchrun`` and ``accelerate launch`` of
  ``-m podsrl`` (with the same tiny settings; torchrun ``--standalone``, on a free port);
  ``make TARGET`` as ``make -n TARGET`` (the target exists and expands:
  ``make demo`` would set up a virtual environment and train for 4 minutes, and its last command,
  ``podsrl train``, is run at tiny size in README's tour). A command must exit with 0. After a
  ``$ command`` line, the lines up to the next ``$`` are its output: each must appear in what it
  printed (then it may exit with an error, if the output shows one).
- *python*: executed in this process, in the page's directory, first on sys.path (as for
  ``python`` started there: ``from my_rewards import ...`` finds the page's file). A fragment may use the names of
  :data:`GIVEN` without defining them (``rewards``, ``dataset``, ``step``, ...). Hub model ids of
  :data:`HUB_MODELS` become the tiny model, and ``PODSConfig`` trains one step of 8 tokens
  (:data:`TINY_TRL`).
- *toml*: loaded with ``podsrl.config.load``, which checks every section, name and value.
- any other indented block, with no command in it, is output shown in the text: not run.

**Placeholders.** A run directory a block reads (``runs/<run>``, ``runs/20261123-101500-max_variance``:
any ``runs/NAME`` that is not an ``--out`` / ``output_dir``) is a copy of one tiny run trained once
per session (two steps, checkpoints at both, LoRA off, exported). Missing files of
:data:`PLACEHOLDER_FILES` (``my.toml``, ``math.jsonl``) are written before a block that names them;
``../shared/data/gsm8k`` is a tiny GSM8K. :data:`SUBSTITUTIONS` lists the other rewrites.

**Markers.** An HTML comment on the lines just before a block (blank lines between are fine) says
what the test cannot work out, and shows it in the page's source:

    <!-- doc-test: file NAME -->               the block is the file NAME: written there for later blocks
    <!-- doc-test: excerpt PATH -->            every code line of it is a line of PATH (a file of this repository)
    <!-- doc-test: sketch: REASON -->          Python that cannot run here (glue code for another trainer): compiled only
    <!-- doc-test: output -->                  output shown in the text, not commands
    <!-- doc-test: slow ["TEXT"]: REASON -->   run only in the slow suite (`make test-slow`)
    <!-- doc-test: needs-gpu ["TEXT"]: REASON -->       not run: a skipped test naming the reason
    <!-- doc-test: needs-network ["TEXT"]: REASON -->   (so are needs-cluster and skip)

With ``"TEXT"`` a marker applies only to the block's commands that contain TEXT. A block without a
marker that the test does not know how to run (an unknown language, a command it cannot run, a
line that is neither a command nor a command's output) fails :func:`test_every_block_is_handled`,
so a new page cannot escape. ``python tests/test_docs.py`` prints every block and what is done with it.

**Recipe lengths.** A block that trains (a TOML config with a ``[task]``, a ``PODSConfig``) sets its
completion length; one that trains the embedded model sets a length that cuts off at most a quarter
of that model's completions on the recipe's own prompts (:data:`RECIPE_CUT_OFF`, measured by
``python tests/test_docs.py --lengths``; :func:`test_recipes_set_a_length_their_answers_fit`).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PAGES = sorted(p.relative_to(REPO).as_posix() for p in [*REPO.glob("*.md"), *REPO.glob("docs/*.md")])

SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
# The first word of a line in an indented block that makes it a command.
COMMANDS = {"podsrl", "python", "python3", "torchrun", "accelerate", "make", "pip", "uv", "srun", "sbatch",
            "bash", "sh", "git", "cd", "export", "hf", "huggingface-cli", "vllm", "curl", "wget"}  # fmt: skip
SKIP_KINDS = {"needs-gpu", "needs-network", "needs-cluster", "skip"}
MARKER_KINDS = {"file", "excerpt", "sketch", "output", "slow", *SKIP_KINDS}
MARKER = re.compile(r"^\s*<!--\s*doc-test:\s*(?P<body>.*?)\s*-->\s*$")
MARKER_BODY = re.compile(r'^(?P<kind>[\w-]+)(?:\s+"(?P<text>[^"]+)")?(?:\s+(?P<arg>[^\s:"]+))?\s*(?::\s*(?P<reason>.*))?$')
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")

# Model ids the pages name that would need the Hub: the tiny model stands in for them.
HUB_MODELS = ("Qwen/Qwen2.5-1.5B-Instruct", "HuggingFaceTB/SmolLM2-360M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")
# Rewrites of a command's text: (pattern, replacement, why).
SUBSTITUTIONS = (
    (r"--step \d+", "--step 1", "the tiny run keeps the checkpoints of steps 1 and 2"),
)
# What a PODSConfig in a page gets on top of its own arguments: one optimizer step of 8 tokens.
TINY_TRL = {"max_steps": 1, "max_completion_length": 8, "gradient_accumulation_steps": 1, "report_to": "none",
            "save_strategy": "no", "logging_steps": 1, "use_cpu": True, "bf16": False}  # fmt: skip


# --------------------------------------------------------------------------- reading the pages


@dataclass
class Marker:
    kind: str
    text: str | None = None  # applies to the commands containing this text; None: the whole block
    arg: str | None = None  # file / excerpt: the path
    reason: str = ""
    line: int = 0


@dataclass
class Command:
    text: str  # continuations joined, without the "$ " prompt
    line: int
    expected: list[str] = field(default_factory=list)  # output lines shown after a "$ " command
    mode: str = "run"  # run | slow | skip
    reason: str = ""


@dataclass
class Block:
    page: str
    line: int  # the block's first line, 1-based
    lang: str  # the fence's language; "" for an indented block
    text: str
    markers: list[Marker]
    kind: str = ""  # commands | python | toml | file | excerpt | sketch | output | skip | slow
    commands: list[Command] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # why the test does not know how to run it

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    def marker(self, *kinds: str) -> Marker | None:
        return next((m for m in self.markers if m.kind in kinds and m.text is None), None)


def read_page(page: str, text: str | None = None) -> tuple[list[Block], list[str]]:
    """The blocks of ``page`` (or of ``text``, named ``page``) in order, classified, and the page's
    marker errors."""
    lines = ((REPO / page).read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks, errors, pending = [], [], []
    i = 0
    while i < len(lines):
        line = lines[i]
        if match := MARKER.match(line):
            marker = _parse_marker(match["body"])
            if isinstance(marker, str):
                errors.append(f"{page}:{i + 1}: {marker}")
            else:
                marker.line = i + 1
                pending.append(marker)
            i += 1
        elif fence := FENCE.match(line):
            indent, close = len(fence["indent"]), fence["fence"]
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(close):
                j += 1
            body = "\n".join(x[indent:] if not x[:indent].strip() else x.lstrip() for x in lines[i + 1 : j])
            blocks.append(Block(page, i + 2, fence["lang"].lower(), body, pending))
            pending, i = [], j + 1
        elif line.startswith("    ") and line.strip() and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            while not lines[j - 1].strip():
                j -= 1
            blocks.append(Block(page, i + 1, "", "\n".join(x[4:] for x in lines[i:j]), pending))
            pending, i = [], j
        else:
            if line.strip() and pending:
                errors.append(f"{page}:{pending[-1].line}: a doc-test marker must come just before a block (blank lines only between)")
                pending = []
            i += 1
    for block in blocks:
        _classify(block)
    return blocks, errors


def _parse_marker(body: str) -> Marker | str:
    match = MARKER_BODY.match(body)
    if not match or match["kind"] not in MARKER_KINDS:
        return f"unknown doc-test marker {body!r}; valid kinds: {', '.join(sorted(MARKER_KINDS))}"
    marker = Marker(match["kind"], match["text"], match["arg"], (match["reason"] or "").strip())
    if marker.kind in {"file", "excerpt"} and not marker.arg:
        return f"doc-test: {marker.kind} needs a path, e.g. <!-- doc-test: {marker.kind} my.toml -->"
    if marker.kind in SKIP_KINDS | {"slow", "sketch"} and not marker.reason:
        return f"doc-test: {marker.kind} needs a reason after a colon, e.g. <!-- doc-test: {marker.kind}: why -->"
    return marker


def _classify(block: Block) -> None:
    whole = {m.kind: m for m in block.markers if m.text is None}  # the markers of the whole block
    for kind in ("file", "excerpt", "sketch", "output"):
        if kind in whole:
            block.kind = kind
            return
    if any(kind in whole for kind in SKIP_KINDS):
        block.kind = "skip"
        return
    if block.lang in SHELL_LANGS or (block.lang == "" and _has_command(block.text)):
        block.kind = "commands"
        block.commands = _commands(block)
        if "slow" in whole:
            for command in block.commands:
                if command.mode == "run":
                    command.mode, command.reason = "slow", f"slow: {whole['slow'].reason}"
    elif block.lang in {"python", "py", "toml"}:
        block.kind = "slow" if "slow" in whole else {"python": "python", "py": "python", "toml": "toml"}[block.lang]
    elif block.lang == "":
        block.kind = "output"
    else:
        block.kind = "unknown"
        block.problems.append(f"a ```{block.lang or '(no language)'} block; mark what it is (doc-test: file NAME, output, ...)")


def _has_command(text: str) -> bool:
    return any(_is_command(line) for line in text.splitlines())


def _is_command(line: str) -> bool:
    words = line.split()
    return bool(words) and (words[0] == "$" or words[0] in COMMANDS)


def _commands(block: Block) -> list[Command]:
    commands: list[Command] = []
    lines = block.text.splitlines()
    prompted, i = False, 0  # prompted: the block's last command had a "$ " prompt (output may follow)
    while i < len(lines):
        raw, number = lines[i].strip(), block.line + i
        i += 1
        if not raw or (raw.startswith("#") and not prompted):
            continue
        if raw.startswith("$ ") or block.lang in SHELL_LANGS or _is_command(raw):
            text = raw.removeprefix("$ ")
            while text.endswith("\\") and i < len(lines):
                text, i = text[:-1].rstrip() + " " + lines[i].strip(), i + 1
            commands.append(Command(text, number))
            prompted = raw.startswith("$ ")
        elif prompted:
            commands[-1].expected.append(raw)
        else:
            block.problems.append(f"line {number}: neither a command nor the output of a `$ command` line")
    for command in commands:
        for marker in block.markers:
            if marker.text and marker.text in command.text:
                command.mode = "slow" if marker.kind == "slow" else "skip"
                command.reason = f"{marker.kind}: {marker.reason}"
        if command.mode != "skip":
            try:
                _plan(command)
            except DocTestError as err:
                block.problems.append(f"line {command.line}: {err}")
    for marker in block.markers:
        if marker.text and not any(marker.text in c.text for c in commands):
            block.problems.append(f'the marker {marker.kind} "{marker.text}" matches no command of the block')
    return commands


class DocTestError(Exception):
    """A block the test cannot run, or one that failed."""


# --------------------------------------------------------------------------- running commands


@dataclass
class Plan:
    """How one command runs: in this process (podsrl's CLI) or as a subprocess."""

    argv: list[str]
    in_process: bool
    output_file: str | None = None


def _plan(command: Command) -> Plan:
    text = command.text
    for pattern, replacement, _ in SUBSTITUTIONS:
        text = re.sub(pattern, replacement, text)
    if re.search(r"[|;&`<]|\$\(|\$\{|\$[A-Za-z_]", text.split(" #", 1)[0]):
        raise DocTestError(f"shell syntax the test does not run ({command.text!r}); mark the block")
    try:
        argv = shlex.split(text, comments=True)
    except ValueError as err:
        raise DocTestError(f"cannot split {command.text!r}: {err}") from None
    output_file = None
    if ">" in argv:
        at = argv.index(">")
        if at != len(argv) - 2:
            raise DocTestError(f"only `COMMAND > FILE` is supported ({command.text!r})")
        argv, output_file = argv[:at], argv[at + 1]
    prog = argv[0]
    if prog == "podsrl":
        return Plan(argv[1:], True, output_file)
    if prog in {"python", "python3"} and argv[1:3] == ["-m", "podsrl"]:
        return Plan(argv[3:], True, output_file)
    if prog in {"python", "python3"}:
        return Plan([sys.executable, *argv[1:]], False, output_file)
    if prog in {"torchrun", "accelerate"} and "podsrl" in argv:  # launchers of `-m podsrl`: the venv's own
        return Plan([str(Path(sys.executable).parent / prog), *argv[1:]], False, output_file)
    if prog == "make":
        return Plan(["make", "-n", "-C", str(REPO), *argv[1:]], False, output_file)
    raise DocTestError(f"the test does not know how to run `{prog}`; mark the block (e.g. <!-- doc-test: needs-network: why -->)")


def tiny_args(args: list[str], tiny_model: Path) -> list[str]:
    """What a podsrl command of the docs gets appended: the settings that make it a test's size.
    Later settings win, so these replace the command's own where they overlap."""
    if not args:
        return args
    sub = args[0]

    def has(option: str) -> str | None:
        for k, a in enumerate(args):
            if a == option and k + 1 < len(args):
                return args[k + 1]
            if a.startswith(option + "="):
                return a.split("=", 1)[1]
        return None

    sizes = ["--rollout.max_new_tokens=8", "--eval.max_new_tokens=8", "--eval.max_problems=2"]
    # The transformers engine samples with the policy's own weights: a config's sampler dtype goes with vLLM.
    fresh = [f"--model.name={tiny_model}", "--rollout.engine=transformers", "--rollout.sampler_dtype=auto", "--task.options.num_eval=2", *sizes]
    budget = ["--train.max_steps=1", "--train.prompts_per_step=2", "--train.progress=false"]
    if sub == "train":
        resume = has("--resume")
        if resume and resume != "auto":
            return [*args, "--train.max_steps=3", "--train.progress=false"]  # the tiny run stopped at step 2
        return [*args, *fresh, *budget]
    if sub == "eval":
        if has("--run") or has("--model"):
            return [*args, *sizes]
        return [*args, *fresh]
    if sub == "compare":
        extra = ["--in-process", "--seeds=1"]
        if not has("--methods"):  # the baseline and one other method
            config = args[1] if len(args) > 1 and not args[1].startswith("-") else None
            extra.append(f"--methods={','.join(_compare_methods(config)[:2])}")
        return [*args, *extra, *fresh, *budget]
    return args


def _compare_methods(config: str | None) -> list[str]:
    from podsrl.compare.plan import DEFAULT_COMPARE
    from podsrl.engines.dtype import NOT_NAMED

    table = tomllib.loads(Path(config).read_text()).get("compare", {}) if config else {}
    methods = dict(table.get("methods") or DEFAULT_COMPARE["methods"])
    baseline = table.get("baseline", next(iter(methods)) if table.get("screening") else "grpo")  # a screening has none: its first
    # The test trains on the transformers engine, which refuses a sampler dtype named outright (it
    # samples with the policy itself): the other method is one that names none, when there is one.
    vllm_only = {m for m, over in methods.items() if over.get("rollout.sampler_dtype", "auto") not in NOT_NAMED}
    others = sorted((m for m in methods if m != baseline), key=lambda m: m in vllm_only)  # stable: the file's order otherwise
    return [baseline, *others]


def _run_command(command: Command, plan: Plan, ws: Path, tiny_model: Path) -> tuple[int, str]:
    if plan.in_process:
        from podsrl.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), _last_figure_only():
            try:
                code = main(tiny_args(plan.argv, tiny_model))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
        stdout, stderr = out.getvalue(), err.getvalue()
    else:
        argv = plan.argv
        if "podsrl" in argv:  # a launcher
            at = argv.index("podsrl")
            argv = [*argv[: at + 1], *tiny_args(argv[at + 1 :], tiny_model)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "PET_STANDALONE": "1"}  # torchrun --standalone: a free port, not 29500, which other tests may hold
        proc = subprocess.run(argv, cwd=ws, env=env, capture_output=True, text=True, timeout=600)
        code, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    if plan.output_file:
        (ws / plan.output_file).write_text(stdout)
    return code, stdout + stderr


@contextlib.contextmanager
def _last_figure_only():
    """``podsrl compare`` draws compare.png as each run finishes, the last time as its final
    report. A tiny run takes about as long as a figure, so a comparison's figures were most of
    its command's time: here only the last report is drawn (after the command), the earlier ones
    are left as empty files. tests/test_compare.py checks that each run's report is drawn."""
    import podsrl.compare.report as report

    draw, last = report.plot_report, []

    def later(data, path):
        last[:] = [(data, path)]
        Path(path).touch()
        return path

    report.plot_report = later
    try:
        yield
    finally:
        report.plot_report = draw
    if last:
        draw(*last[0])


def _check_output(command: Command, code: int, output: str) -> None:
    shown = command.expected
    if code != 0 and not any("error" in line for line in shown):
        raise DocTestError(f"exit code {code}:\n{output[-3000:]}")
    flat = " ".join(output.split())
    for line in shown:
        if " ".join(line.split()) not in flat:
            raise DocTestError(f"the page shows the output line\n  {line}\nwhich the command did not print:\n{output[-3000:]}")


# --------------------------------------------------------------------------- the page's directory


def tiny_task_files(ws: Path) -> None:
    """../shared/data/gsm8k: a GSM8K of 6 + 4 problems in GSM8K's format."""
    gsm8k = ws.parent / "shared" / "data" / "gsm8k"
    gsm8k.mkdir(parents=True, exist_ok=True)
    for name, count in (("train.jsonl", 6), ("test.jsonl", 4)):
        rows = [{"question": f"Sam has {k} apples and buys {k + 2} more. How many apples does he have?",
                 "answer": f"He has {k} + {k + 2} = {2 * k + 2} apples.\n#### {2 * k + 2}"} for k in range(count)]  # fmt: skip
        (gsm8k / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def _tiny_toml(tiny_model: Path) -> str:
    return (f'[model]\nname = "{tiny_model}"\n\n[rollout]\nengine = "transformers"\nn = 4\nmax_new_tokens = 8\n\n'
            '[train]\nprompts_per_step = 2\nmax_steps = 1\nprogress = false\n\n[eval]\nmax_problems = 2\n')  # fmt: skip


def _math_jsonl(_: Path) -> str:
    rows = [{"problem": f"What is $\\frac{{{k}}}{{2}}$ in lowest terms?", "answer": f"\\frac{{{k}}}{{2}}"}
            for k in (1, 3, 5, 7, 9, 11)]
    return "".join(json.dumps(r) + "\n" for r in rows)


# Files a block may name without making them: written (when missing) before the block runs.
PLACEHOLDER_FILES: dict[str, Callable[[Path], str]] = {"my.toml": _tiny_toml, "math.jsonl": _math_jsonl}
RUN_REF = re.compile(r"runs/[^\s\"'`)\]/]+")
RUN_OUTPUT = re.compile(r"(?:--out[ =]|output_dir=[\"'])(runs/[^\s\"'`)\]/]+)")


def prepare(block: Block, ws: Path, tiny_run: Path, tiny_model: Path) -> None:
    """Give ``block`` what it names: copies of the tiny run, placeholder files."""
    outputs = set(RUN_OUTPUT.findall(block.text))
    for ref in set(RUN_REF.findall(block.text)) - outputs:
        if not (ws / ref).exists():
            shutil.copytree(tiny_run, ws / ref)
    for name, make in PLACEHOLDER_FILES.items():
        if re.search(rf"(?<![\w/.]){re.escape(name)}\b", block.text) and not (ws / name).exists():
            (ws / name).write_text(make(tiny_model))


def page_directory(tmp_path_factory, page: str) -> Path:
    ws = tmp_path_factory.mktemp(page.replace("/", "-").removesuffix(".md")) / "ws"
    ws.mkdir()
    for name in ("bench", "configs", "examples"):  # read by commands; nothing writes there
        (ws / name).symlink_to(REPO / name)
    tiny_task_files(ws)
    return ws


# --------------------------------------------------------------------------- running a block


def _binary_rewards():
    import torch

    return (torch.rand(4, 16, generator=torch.Generator().manual_seed(0)) < 0.5).float()  # [B, n]


def _prompt_answer_dataset():
    from datasets import Dataset

    rows = [(a, b) for a in range(1, 4) for b in range(1, 3)]
    return Dataset.from_dict({
        "prompt": [[{"role": "user", "content": f"What is {a} + {b}? Give only the final number."}] for a, b in rows],
        "answer": [str(a + b) for a, b in rows],
    })  # fmt: skip


# Names a Python fragment may use without defining them, and how to make their values: a step's
# rewards [B, n], a dataset with "prompt" and "answer" columns, the step, progress and seed.
GIVEN: dict[str, Callable[[], object]] = {
    "rewards": _binary_rewards, "dataset": _prompt_answer_dataset, "ds": _prompt_answer_dataset,
    "step": lambda: 0, "total": lambda: 10, "s": lambda: 0, "p": lambda: 0.0, "run_seed": lambda: 0, "log": lambda: print,
}  # fmt: skip


def _run_python(block: Block, ws: Path, tiny_model: Path, monkeypatch) -> str:
    source = block.text
    for model in HUB_MODELS:
        source = source.replace(f'"{model}"', repr(str(tiny_model)))
    if "PODSConfig" in source:
        import podsrl.integrations.trl as trl

        base = trl.PODSConfig if not hasattr(trl.PODSConfig, "_doc_test") else trl.PODSConfig.__mro__[1]

        class TinyPODSConfig(base):
            _doc_test = True

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **{**kwargs, **TINY_TRL})

        monkeypatch.setattr(trl, "PODSConfig", TinyPODSConfig)
    monkeypatch.syspath_prepend(str(ws))  # as `python` started in the page's directory
    namespace = {"__name__": "__doc_test__"}
    for name, make in GIVEN.items():
        if re.search(rf"\b{name}\b", source) and not re.search(rf"^\s*{name}\s*=|import .*\b{name}\b", source, re.M):
            namespace[name] = make()
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        exec(compile(source, block.where, "exec"), namespace)  # noqa: S102 - the page's own code
    return out.getvalue()


def run_block(block: Block, ws: Path, tiny_run: Path, tiny_model: Path, monkeypatch, *, slow: bool) -> list[str]:
    """Run what ``block`` has of the slow suite (``slow``) or of the fast one; the failures, each
    naming file:line. A file block is written in both."""
    if block.kind in {"output", "skip", "unknown"}:
        return []
    if block.kind not in {"commands", "file"} and (block.kind == "slow") != slow:
        return []
    prepare(block, ws, tiny_run, tiny_model)
    failures = []
    try:
        if block.kind == "commands":
            for command in block.commands:
                if command.mode != ("slow" if slow else "run"):
                    continue
                try:
                    code, output = _run_command(command, _plan(command), ws, tiny_model)
                    _check_output(command, code, output)
                except DocTestError as err:
                    failures.append(f"{block.page}:{command.line}: `{command.text}`: {err}")
        elif block.lang in {"python", "py"} and block.kind in {"python", "slow"}:
            _run_python(block, ws, tiny_model, monkeypatch)
        elif block.kind in {"toml", "slow"}:
            _load_toml(block.text, ws / ".doc-test.toml")
        elif block.kind == "file":
            _write_file(block, ws)
        elif block.kind == "excerpt":
            _check_excerpt(block)
        elif block.kind == "sketch":
            compile(block.text, block.where, "exec")
    except DocTestError as err:
        failures.append(f"{block.where}: {err}")
    except Exception as err:  # noqa: BLE001 - every failure of a block is reported with its place
        import traceback

        failures.append(f"{block.where}: {type(err).__name__}: {err}\n{traceback.format_exc(limit=-4)}")
    return failures


def _load_toml(text: str, path: Path) -> None:
    """Load a page's TOML as podsrl would; its task options must be the names `podsrl config task`
    prints (docs/your-task.md wrote jsonl's `train_path`, an older name the loader still accepts)."""
    from podsrl import config
    from podsrl.tasks import OPTION_ALIASES

    path.write_text(text)
    cfg = config.load(path)
    task = tomllib.loads(text).get("task", {})
    older = {name: now for name, now in OPTION_ALIASES.get(cfg.task.name, {}).items() if name in task.get("options", {})}
    if older:
        raise DocTestError(f"task option {', '.join(older)}: an older name; write {', '.join(older.values())}, as "
                           f"`podsrl config task --task.name={cfg.task.name}` prints it")  # fmt: skip


def _write_file(block: Block, ws: Path) -> None:
    name = block.marker("file").arg
    path = ws / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(block.text + "\n")
    if name.endswith(".toml"):
        _load_toml(block.text, ws / ".doc-test.toml")
    elif name.endswith(".py"):
        compile(block.text, block.where, "exec")
    elif name.endswith(".jsonl"):
        for line in block.text.splitlines():
            if line.strip():
                json.loads(line)


def _code_lines(text: str) -> list[str]:
    code = (line.split("  #", 1)[0].strip() for line in text.splitlines())
    return [line for line in code if line and not line.startswith("#")]


def _check_excerpt(block: Block) -> None:
    source = REPO / block.marker("excerpt").arg
    have = set(_code_lines(source.read_text()))
    missing = [line for line in _code_lines(block.text) if line not in have]
    if missing:
        raise DocTestError(f"not in {source.relative_to(REPO)}: " + "; ".join(missing))


# --------------------------------------------------------------------------- the tests


ALL = {page: read_page(page) for page in PAGES}


def _skipped() -> list[tuple[str, str]]:
    """(place, reason) of every block and command that is not run."""
    out = []
    for blocks, _ in ALL.values():
        for block in blocks:
            if block.kind == "skip":
                marker = block.marker(*SKIP_KINDS)
                out.append((f"{block.where}", f"{marker.kind}: {marker.reason}"))
            for command in block.commands:
                if command.mode == "skip":
                    out.append((f"{block.page}:{command.line} {command.text.split(' #')[0].strip()}", command.reason))
    return out


def _has_slow(page: str) -> bool:
    return any(b.kind == "slow" or any(c.mode == "slow" for c in b.commands) for b in ALL[page][0])


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, small_vocab_model_dir) -> Path:
    """One tiny run every block that reads a run directory gets a copy of: two steps, a checkpoint
    at each (both kept), the exported model/."""
    from podsrl.cli import main

    out = tmp_path_factory.mktemp("doc-run") / "run"
    args = ["train", "--out", str(out), "--no-plot", f"--model.name={small_vocab_model_dir}", "--rollout.engine=transformers",
            "--rollout.n=4", "--rollout.max_new_tokens=8", "--train.prompts_per_step=2", "--train.max_steps=2",
            "--train.checkpoint_every=1", "--train.keep_checkpoints=2", "--train.progress=false", "--eval.max_problems=2",
            "--eval.samples=1", "--task.options.num_eval=2"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    return out


@pytest.fixture
def doc_env(monkeypatch, one_thread):
    # A name that reached the Hub would wait for the network (31 s for a model id) or download: fail
    # at once instead. The library reads the variable when imported, hence its constant too.
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    return monkeypatch


def _run_page(page: str, tmp_path_factory, tiny_run, tiny_model, monkeypatch, *, slow: bool) -> None:
    ws = page_directory(tmp_path_factory, page)
    monkeypatch.chdir(ws)
    monkeypatch.setattr(sys, "path", list(sys.path))  # a reward "module:function" adds the directory
    modules = set(sys.modules)
    failures = []
    try:
        for block in ALL[page][0]:
            start = time.perf_counter()
            failures += run_block(block, ws, tiny_run, tiny_model, monkeypatch, slow=slow)
            print(f"{time.perf_counter() - start:6.1f} s  {block.where} {block.kind}")  # shown with -s
    finally:
        for name in set(sys.modules) - modules:  # the page's own modules (my_rewards), not another page's
            if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(ws.parent)):
                del sys.modules[name]
    assert not failures, "\n\n".join(failures)


def test_every_block_is_handled():
    """Every block is run, or marked; every marker is well-formed and before a block."""
    problems = [error for _, errors in ALL.values() for error in errors]
    problems += [f"{b.where}: {p}" for blocks, _ in ALL.values() for b in blocks for p in b.problems]
    assert not problems, "blocks the test does not know how to run (see tests/test_docs.py):\n" + "\n".join(problems)


CASE = """
```yaml
a: 1
```

    pip install something

```bash
x=$(date)
```

<!-- doc-test: needs-network "nothing": why -->

    podsrl config

<!-- doc-test: skip: why -->
Some text.

    $ podsrl train --select.m=32
    podsrl: error: select.m = 32 exceeds rollout.n = 16

Output shown:

    held-out accuracy: 17%

<!-- doc-test: needs-gpu "nproc-per-node=8": 8 GPUs -->

    podsrl train  # the demo
    torchrun --nproc-per-node=8 -m podsrl train \\
             my.toml
"""


def test_the_reader_flags_what_it_cannot_run():
    """What makes test_every_block_is_handled fail, so that no new block escapes: a language it does
    not know, a command it cannot run, shell syntax, a marker matching nothing or before text."""
    blocks, errors = read_page("case.md", CASE)
    assert [b.kind for b in blocks] == ["unknown", "commands", "commands", "commands", "commands", "output", "commands"]
    assert "```yaml" in blocks[0].problems[0]
    assert "does not know how to run `pip`" in blocks[1].problems[0]
    assert "shell syntax" in blocks[2].problems[0]
    assert 'needs-network "nothing" matches no command' in blocks[3].problems[0]
    assert errors == ["case.md:16: a doc-test marker must come just before a block (blank lines only between)"]
    shown = blocks[4].commands[0]
    assert (shown.text, shown.expected) == ("podsrl train --select.m=32", ["podsrl: error: select.m = 32 exceeds rollout.n = 16"])
    demo, eight = blocks[6].commands
    assert (demo.mode, eight.mode, eight.reason) == ("run", "skip", "needs-gpu: 8 GPUs")
    assert eight.text == "torchrun --nproc-per-node=8 -m podsrl train my.toml" and not blocks[6].problems
    with pytest.raises(DocTestError, match="did not print"):
        _check_output(shown, 2, "podsrl: error: select.m = 32 exceeds rollout.n = 8")


# A command that trains or evaluates on a task whose answers are reasoned out needs room for them:
# the default rollout.max_new_tokens (16) truncated every GSM8K answer of README's eval command.
REASONING_TASK = re.compile(r"task\.name=(gsm8k|math)\b|^name = \"(gsm8k|math)\"", re.M)


def test_reasoning_task_commands_set_a_length():
    short = [f"{block.page}:{c.line}" for blocks, _ in ALL.values() for block in blocks
             for c in (block.commands or [Command(block.text, block.line)]) if block.kind in {"commands", "toml"}
             and REASONING_TASK.search(c.text) and "max_new_tokens" not in c.text]  # fmt: skip
    assert not short, f"set max_new_tokens (the default, 16, truncates a worked answer): {short}"


# Words that claim one method is ahead of (or level with) another: a paragraph that says one must not
# show a 95% interval that straddles zero (README said "learned at least as well" beside [-5.1, +7.0]).
CLAIMS = re.compile(r"at least as well|\bbeats?\b|\bis best\b|clear loser|\blearns faster\b|\boutperforms?\b", re.I)
INTERVAL = re.compile(r"\[(?:paired 95% CI )?([+-]?\d+(?:\.\d+)?), ([+-]?\d+(?:\.\d+)?)\]")


def claims_beyond_their_intervals(text: str) -> list[str]:
    """The sentences of ``text`` that claim an ordering beside an interval that contains zero ("no
    resolved difference" is what such an interval says); a paragraph's bold lead ("**X beats Y.**")
    claims for its whole paragraph (or list item)."""

    def straddling(part: str) -> list[str]:
        return [m[0] for m in INTERVAL.finditer(part) if float(m[1]) < 0 < float(m[2])]

    out = []
    for para in re.split(r"\n\s*\n|\n(?=- )", text):
        flat = " ".join(para.split())
        lead = re.match(r"(?:- )?\*\*(.+?)\*\*", flat)
        parts = [flat] if lead and CLAIMS.search(lead[1]) else re.split(r"(?<=\.)\s+(?=[A-Z*])", flat)
        for part in parts:
            if (claim := CLAIMS.search(part)) and (bad := straddling(part)):
                out.append(f"{claim[0]!r} beside {', '.join(bad)}: {part[:120]}...")
    return out


def test_no_claim_beyond_its_interval():
    assert claims_beyond_their_intervals("It learned at least as well: +1.0 [paired 95% CI -5.1, +7.0].")
    assert claims_beyond_their_intervals("- **It learns at least as well.** Means +1.0 and +3.7 (+1.6 [-5.0, +8.3]).")
    assert not claims_beyond_their_intervals("A beats B (+5.9 [+1.8, +10.0]). C and A are level (-0.3 [-2.5, +1.9]).")
    assert not claims_beyond_their_intervals("No resolved difference (+1.0 [paired 95% CI -5.1, +7.0]).\n\nA beats B (+2.7 [+0.8, +4.6]).")
    found = [f"{page}: {c}" for page in PAGES for c in claims_beyond_their_intervals((REPO / page).read_text())]
    assert not found, "a claim stronger than its interval (say what the interval says):\n" + "\n".join(found)


def test_readme_is_one_page():
    """README.md is the product page (issue 57): at most 300 lines, one results table and one figure;
    every table row it shows is also in docs/results.md, where the evidence lives."""
    readme = (REPO / "README.md").read_text()
    results = (REPO / "docs" / "results.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("|") and not line.startswith("|---")]
    tables = len(re.findall(r"^\|---", readme, re.M))
    figures = re.findall(r"^!\[", readme, re.M)
    assert len(readme.splitlines()) <= 300, f"README.md has {len(readme.splitlines())} lines; keep it under 300 (results: docs/results.md)"
    assert (tables, len(figures)) == (1, 1), f"README.md shows {tables} tables and {len(figures)} figures: one each, the rest in docs/results.md"
    assert all(row in results for row in rows), "a README table row that docs/results.md lacks"


# --------------------------------------------------------------------------- recipe lengths (issue 57)

# A recipe is a block that trains: a TOML config with a [task], or a PODSConfig. Each sets its
# completion length (rollout.max_new_tokens, max_completion_length): docs/your-task.md's
# reasoning-gym recipe inherited the default 16 and 74-80% of its completions were cut off.
# Where a recipe trains the embedded model, the length must leave at most MAX_CUT_OFF of that
# model's completions on the recipe's own prompts cut off, as its training samples them (before any
# training: a cut-off completion scores what the grader makes of half a sentence). The shares are
# RECIPE_CUT_OFF, measured by `python tests/test_docs.py --lengths` (no GPU: a minute or a few per
# recipe on 2 CPU cores); test_recipe_lengths_measured (slow) measures them again.
MAX_CUT_OFF = 0.25
LENGTHS = (16, 32, 64, 96, 128, 192, 256)
LENGTH = re.compile(r"\b(?:max_new_tokens|max_completion_length)\s*=\s*(\d+)")
# recipe -> {length: share of the embedded model's completions cut off at that length}: 64
# completions (16 prompts x 4, or 8 x 8), seed 0, measured 2026-11-28 on this project's 2-core CPU by `python tests/test_docs.py --lengths`.
RECIPE_CUT_OFF: dict[str, dict[int, float]] = {
    "docs/trl.md runs/trl-embedded": {16: 0.641, 32: 0.516, 64: 0.266, 96: 0.172, 128: 0.156, 192: 0.094, 256: 0.078},  # 432 s
    "docs/your-task.md mytask.toml": {16: 0.922, 32: 0.797, 64: 0.547, 96: 0.406, 128: 0.266, 192: 0.203, 256: 0.156},  # 927 s
    "docs/your-task.md legs.toml": {16: 0.891, 32: 0.719, 64: 0.453, 96: 0.344, 128: 0.266, 192: 0.141, 256: 0.125},  # 583 s
}


def recipes() -> list[Block]:
    return [b for blocks, _ in ALL.values() for b in blocks
            if (b.lang == "toml" and re.search(r"^\[task\]", b.text, re.M)) or "PODSConfig(" in b.text]  # fmt: skip


def recipe_name(block: Block) -> str:
    """The page and the file the block writes (``docs/your-task.md legs.toml``), or its trainer's
    output_dir (``docs/trl.md runs/trl-embedded``), else its line."""
    out = re.search(r"output_dir=\"([^\"]+)\"", block.text)
    return f"{block.page} {block.marker('file').arg if block.marker('file') else out[1] if out else block.line}"


def trains_the_embedded_model(block: Block) -> bool:
    if "PODSConfig(" in block.text:
        return 'model="smollm2-135m-instruct"' in block.text
    name = tomllib.loads(block.text).get("model", {}).get("name", "smollm2-135m-instruct")
    return name == "smollm2-135m-instruct"


def test_recipes_set_a_length_their_answers_fit():
    short = []
    for block in recipes():
        lengths = [int(n) for n in LENGTH.findall(block.text)]
        if not lengths:
            short.append(f"{block.where}: sets no completion length (rollout.max_new_tokens / max_completion_length)")
        elif trains_the_embedded_model(block):
            measured = RECIPE_CUT_OFF.get(recipe_name(block))
            if measured is None:
                short.append(f"{block.where}: not measured; add `python tests/test_docs.py --lengths`'s line to RECIPE_CUT_OFF")
                continue
            fits = max((n for n in measured if n <= lengths[0]), default=None)
            if fits is None or measured[fits] > MAX_CUT_OFF:
                share = "?" if fits is None else f"{measured[fits]:.0%}"
                enough = min((n for n, cut in measured.items() if cut <= MAX_CUT_OFF), default=None)
                short.append(f"{block.where}: {lengths[0]} tokens cut off {share} of the embedded model's completions "
                             f"(at most {MAX_CUT_OFF:.0%}: {enough or 'more than ' + str(max(measured))} tokens)")  # fmt: skip
    assert len(recipes()) >= 3 and not short, "\n".join(short)


def recipe_prompts(block: Block, ws: Path, tokenizer) -> tuple[list[list[int]], dict]:
    """The prompts (token ids) a recipe trains on, at most 16, and its sampling settings, built as
    its trainer builds them: podsrl's task and chat template, or TRL's chat template of the dataset."""
    if "PODSConfig(" in block.text:
        import podsrl.integrations.trl as trl

        seen = {}

        class Recorder:  # the trainer the page builds, recorded instead of trained
            def __init__(self, *, args, train_dataset, **_):
                seen.update(args=args, dataset=train_dataset)

            def train(self):
                pass

        real, cwd = trl.PODSTrainer, os.getcwd()
        trl.PODSTrainer = Recorder
        os.chdir(ws)
        try:
            exec(compile(block.text, block.where, "exec"), {"__name__": "__recipe__"})  # noqa: S102 - the page's own code
        finally:
            trl.PODSTrainer = real
            os.chdir(cwd)
        args = seen["args"]
        prompts = [tokenizer.apply_chat_template(row, add_generation_prompt=True, tokenize=False) for row in seen["dataset"]["prompt"][:16]]
        ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in prompts]
        return ids, {"temperature": args.temperature, "top_p": args.top_p, "top_k": args.top_k or 0}
    from podsrl import config
    from podsrl.tasks.build import build_task
    from podsrl.train.loop import prompt_ids

    for earlier in ALL[block.page][0]:  # the page's files before it (mytask.jsonl, my_rewards.py)
        if earlier.kind == "file" and earlier.line < block.line:
            _write_file(earlier, ws)
    (ws / "recipe.toml").write_text(block.text)
    cwd = os.getcwd()
    os.chdir(ws)
    try:
        cfg = config.load(ws / "recipe.toml")
        task = build_task(cfg)
    finally:
        os.chdir(cwd)
    return prompt_ids(tokenizer, task, task.train[:16]), {"temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p, "top_k": 0}


def cut_off_shares(block: Block, ws: Path, lengths=LENGTHS, completions: int = 64, seed: int = 0) -> dict[int, float]:
    """{length: share of the embedded model's completions (about ``completions``, spread evenly
    over the recipe's prompts, sampled as the recipe samples them) that have not ended within it}."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from podsrl.models import resolve_model_path

    path = resolve_model_path("smollm2-135m-instruct")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    prompts, sampling = recipe_prompts(block, ws, tokenizer)
    rows = [p for p in prompts for _ in range(-(-completions // len(prompts)))]
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # left-padded
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, do_sample=True, max_new_tokens=max(lengths), pad_token_id=pad,
                             eos_token_id=tokenizer.eos_token_id, **sampling)[:, width:]  # fmt: skip
    ended = (out == tokenizer.eos_token_id).int()
    first_end = torch.where(ended.any(1), ended.argmax(1) + 1, max(lengths) + 1)  # tokens up to and with the end
    return {n: round(float((first_end > n).float().mean()), 3) for n in lengths}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RECIPE_CUT_OFF))
def test_recipe_lengths_measured(name, tmp_path, one_thread):
    """RECIPE_CUT_OFF measured again at the recipe's own length: within 3 standard errors of 64
    completions (sampling differs across CPUs' kernels: the share, not the samples, must hold)."""
    block = next(b for b in recipes() if recipe_name(b) == name)
    length = int(LENGTH.findall(block.text)[0])
    got = cut_off_shares(block, tmp_path, lengths=(length,))[length]
    want = RECIPE_CUT_OFF[name][max(n for n in RECIPE_CUT_OFF[name] if n <= length)]
    assert got <= MAX_CUT_OFF + 3 * (MAX_CUT_OFF * (1 - MAX_CUT_OFF) / 64) ** 0.5, (name, length, got, want)


def test_toml_blocks_use_the_option_names_podsrl_config_prints(tmp_path):
    """Every page's TOML, a file it writes or a config shown, loads, with today's option names."""
    tomls = [b for blocks, _ in ALL.values() for b in blocks if b.kind == "toml" or (b.kind == "file" and b.marker("file").arg.endswith(".toml"))]
    assert any(b.page == "docs/your-task.md" for b in tomls)
    failed = []
    for block in tomls:
        try:
            _load_toml(block.text, tmp_path / "page.toml")
        except DocTestError as err:
            failed.append(f"{block.where}: {err}")
    assert not failed, "\n".join(failed)


@pytest.mark.parametrize("page", PAGES)
def test_page(page, tmp_path_factory, tiny_run, small_vocab_model_dir, doc_env):
    """The page's blocks, in order, in one directory of their own. The tiny model is conftest.py's
    with a 686-token tokenizer: the pages' commands do not depend on the vocabulary, and a step over
    SmolLM2's 49152 logits took ten times as long (issue 45)."""
    _run_page(page, tmp_path_factory, tiny_run, small_vocab_model_dir, doc_env, slow=False)


@pytest.mark.slow
@pytest.mark.parametrize("page", [p for p in PAGES if _has_slow(p)])
def test_page_slow(page, tmp_path_factory, tiny_run, small_vocab_model_dir, doc_env):
    """The blocks and commands marked slow (several processes), on test_page's tiny model."""
    _run_page(page, tmp_path_factory, tiny_run, small_vocab_model_dir, doc_env, slow=True)


@pytest.mark.parametrize("place, reason", _skipped(), ids=[p for p, _ in _skipped()])
def test_not_run_here(place, reason):
    """A skipped test per block (or command) marked as needing what this machine lacks, so that
    every one shows in pytest's summary (`-rs`) with its reason."""
    pytest.skip(f"{place}: {reason}")


def inventory() -> list[str]:
    """One line per block: where, kind, what is done with it."""
    rows = []
    for page in PAGES:
        blocks, _ = ALL[page]
        for block in blocks:
            if block.kind == "commands":
                for c in block.commands:
                    how = {"run": _how(c), "slow": f"slow ({c.reason}): {_how(c)}", "skip": f"not run ({c.reason})"}[c.mode]
                    rows.append(f"{block.page}:{c.line}\tcommand\t{c.text.split(' #')[0].strip()[:90]}\t{how}")
            else:
                marker = block.markers[0] if block.markers else None
                how = {"python": "executed", "toml": "loaded by podsrl.config.load", "output": "output shown, not run",
                       "file": f"written as {marker.arg if marker else ''}", "excerpt": f"checked against {marker.arg if marker else ''}",
                       "sketch": "compiled only", "skip": f"not run ({marker.kind}: {marker.reason})" if marker else "",
                       "slow": "slow", "unknown": "UNKNOWN"}[block.kind]  # fmt: skip
                rows.append(f"{block.where}\t{block.lang or 'indented'}\t{block.text.splitlines()[0][:60] if block.text else ''}\t{how}")
    return rows


def _how(command: Command) -> str:
    try:
        plan = _plan(command)
    except DocTestError as err:
        return f"UNKNOWN: {err}"
    how = "in-process, tiny" if plan.in_process else "make -n" if plan.argv[0] == "make" else "subprocess"
    return how + (", its output checked" if command.expected else "")


if __name__ == "__main__":
    if sys.argv[1:] == ["--lengths"]:  # RECIPE_CUT_OFF's lines: every recipe that trains the embedded model
        import tempfile

        for block in recipes():
            if trains_the_embedded_model(block):
                with tempfile.TemporaryDirectory() as ws:
                    start = time.perf_counter()
                    shares = cut_off_shares(block, Path(ws))
                print(f"    {recipe_name(block)!r}: {shares},  # {time.perf_counter() - start:.0f} s", flush=True)
    else:
        print("\n".join(inventory()))
