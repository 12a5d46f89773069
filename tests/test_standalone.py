"""The repository stands alone (issue #16, class 7): nothing in it reads the development
checkout's sibling folder of shared notes, which a user's clone does not have; the reference
figures it needs are kept inside it (tests/data, benchmarks/data), with their source."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = "/".join(["..", "shared"])  # the sibling folder, spelled so this file does not name it


def test_nothing_reads_the_development_checkout():
    offenders = []
    for path in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("src/**/*.py"), *ROOT.glob("tests/*.py"),
                 *ROOT.glob("benchmarks/*.py"), ROOT / "Makefile", ROOT / ".ci" / "run"]:
        if not path.exists():
            continue
        if OUTSIDE in path.read_text(errors="replace"):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_reference_figures_are_in_the_repository():
    for name in ("teccl_published_ndv2_2chassis.csv", "teccl_published_dgx2_2chassis_slow.csv"):
        for where in ("tests/data", "benchmarks/data"):
            text = (ROOT / where / name).read_text()
            assert text.count("\n") > 10, (where, name)
