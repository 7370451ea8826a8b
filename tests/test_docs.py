"""Every command and Python example in README.md and docs/*.md runs, in order, as a user would run it.

```bash blocks: each `python -m lcmoe_recipes...` / `python scripts/...` command (setup, pytest and the opt-in TE build
are skipped: CI runs those itself) must exit 0. ```python blocks are run as scripts. They run in a scratch folder
where `recipes/` and `scripts/` point at the repository's, so the docs cannot go stale.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
SKIP = ("scripts/setup.sh", "pytest", "--with-te")


def _blocks(path: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", path.read_text(), flags=re.S)


def _commands(path: Path) -> list[str]:
    out = []
    for block in _blocks(path, "bash"):
        for line in block.splitlines():
            for part in line.split("&&"):
                part = part.strip()
                if part and not part.startswith("#") and not any(s in part for s in SKIP):
                    out.append(part)
    return out


CASES = [(doc.name, kind, i, text) for doc in DOCS
         for kind, items in (("bash", _commands(doc)), ("python", _blocks(doc, "python")))
         for i, text in enumerate(items)]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    folder = tmp_path_factory.mktemp("docs")
    for name in ("recipes", "scripts", "tests"):
        (folder / name).symlink_to(ROOT / name)
    return folder


@pytest.mark.slow
@pytest.mark.parametrize("doc,kind,index,text", CASES, ids=[f"{c[0]}-{c[1]}{c[2]}" for c in CASES])
def test_doc_example_runs(scratch, doc, kind, index, text):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    if kind == "bash":
        argv = shlex.split(text)
        assert argv[0].endswith("python"), f"{doc}: unexpected command {text!r}"
        argv[0] = sys.executable
    else:
        argv = [sys.executable, "-c", text]
    out = subprocess.run(argv, cwd=scratch, capture_output=True, text=True, env=env, timeout=900)
    assert out.returncode == 0, f"{doc} {kind} example {index} failed: {text}\n{out.stdout[-1500:]}\n{out.stderr[-1500:]}"


def test_there_are_examples():
    assert sum(1 for c in CASES if c[1] == "bash") >= 8 and sum(1 for c in CASES if c[1] == "python") >= 4


# The project's working notes live beside the repository and are never shipped: a user cannot open them, so nothing
# the user reads (package, docs, scripts, tests) may cite them; cite the upstream file, paper or model card instead.
PRIVATE = re.compile(r"REFERENCE\.md|DESIGN\.md|INSTALL_NOTES\.md|\.\./shared\b|\bshared/(?:seeds|hooks|REFERENCE)"
                     r"|\bseeds/")


def test_nothing_cites_the_private_notes():
    files = [p for folder in ("src", "docs", "scripts", "tests", "recipes") for p in (ROOT / folder).rglob("*")
             if p.is_file() and p.suffix in (".py", ".md", ".yaml", ".json", ".txt", ".toml")]
    files += [ROOT / "README.md", ROOT / "pyproject.toml"]
    here = Path(__file__).resolve()
    hits = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}" for p in files if p.resolve() != here
            for n, line in enumerate(p.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
            if PRIVATE.search(line)]
    assert not hits, "cite the public source instead of the private notes:\n" + "\n".join(hits)
