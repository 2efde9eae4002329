"""The tables of ``../tables.py`` for the runs in this directory: configs/compare-demo-mixed.toml at
commit d42f60c, before the update's attention computed in float32 under bfloat16 autocast on a CPU
(commit 38625e8); ``python -m podsrl.docs_render`` renders docs/results.md's copies from here:

    .venv/bin/python results/compare-demo-mixed/tables.py --dir results/compare-demo-mixed/before-float32-attention
"""

from __future__ import annotations

from pathlib import Path

from podsrl.figures import load_script

FIGURES = load_script(Path(__file__).resolve().parent.parent / "tables.py", "podsrl_tables_compare_demo_mixed").FIGURES
