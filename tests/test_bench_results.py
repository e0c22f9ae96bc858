"""What the repository says it measured is what its benchmarks wrote, and what docs/claims.md cites exists.

- every ``bench/results/*.md`` is its benchmark's ``markdown()`` of the ``.json`` beside it, so no figure in a
  result was typed or edited by hand;
- every test (``tests/file.py::name``) and repository file that docs/claims.md names as backing a claim exists,
  so a renamed or deleted test cannot leave a claim pointing at nothing;
- the README's preset table is the presets module's arithmetic.
"""

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

from restartbench.presets import PRESETS

ROOT = Path(__file__).resolve().parent.parent
RESULTS = sorted((ROOT / "bench" / "results").glob("*.json"))
RESULT_NAME = re.compile(r"^\d{4}-\d{2}-\d{2}(\.\d+)?-[^-]+-(?P<benchmark>.+)\.json$")  # .N: a later attempt


def bench_module(benchmark: str):
    """bench/<benchmark>.py (dashes as underscores), imported as a module."""
    benchmark = "gpu-results" if benchmark.startswith("gpu-") else benchmark  # gpu_results.py writes every gpu-<block>
    path = ROOT / "bench" / f"{benchmark.replace('-', '_')}.py"
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(f"bench_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass resolves its annotations through its module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("result", RESULTS, ids=[p.stem for p in RESULTS])
def test_every_result_markdown_is_made_from_its_json(result):
    benchmark = RESULT_NAME.match(result.name)["benchmark"]
    expected = bench_module(benchmark).markdown(json.loads(result.read_text()))
    assert result.with_suffix(".md").read_text() == expected, f"{result.with_suffix('.md')} was edited by hand"


CLAIMS = (ROOT / "docs" / "claims.md").read_text()
CITATION = re.compile(r"(tests/test_\w+\.py)?::(\w+)")


def cited_test_names() -> list[tuple[str, str]]:
    """(test file, test name) for each `tests/x.py::name`, and each bare `::name` after it in the same table cell."""
    cited = set()
    for cell in re.findall(r"[^|\n]+", CLAIMS):
        current = None
        for path, name in CITATION.findall(cell):
            current = path or current
            if current:
                cited.add((current, name))
    return sorted(cited)


def test_every_test_cited_in_claims_exists():
    cited = cited_test_names()
    assert len(cited) > 20  # the parser found the citations
    missing = [f"{path}::{name}" for path, name in cited
               if not (ROOT / path).exists() or f"def {name}(" not in (ROOT / path).read_text()]
    assert not missing, f"docs/claims.md cites tests that do not exist: {missing}"


def test_every_file_cited_in_claims_exists():
    cited = set(re.findall(r"`((?:bench|tests|restartbench|scripts|docs|templates|sweeps)/[\w./-]+\.\w+)", CLAIMS))
    assert len(cited) > 10
    missing = sorted(path for path in cited if not (ROOT / path).exists())
    assert not missing, f"docs/claims.md cites files that do not exist: {missing}"


def test_the_readme_preset_table_is_the_presets_arithmetic():
    readme = (ROOT / "README.md").read_text()
    for name, preset in PRESETS.items():
        row = next(line for line in readme.splitlines() if line.startswith(f"| `{name}` |"))
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        numbers = [preset.vocab_size, preset.hidden, preset.ffn_hidden, preset.layers, preset.heads, preset.kv_heads,
                   preset.seq_len]
        assert cells[2:9] == [str(n) for n in numbers], f"README preset row {name} differs from presets.py"
