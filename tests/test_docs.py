"""Every command and Python example in README.md and docs/*.md runs, in order, as a user would run it.

```bash blocks: each `python -m lcmoe_recipes...` / `python scripts/...` command (setup, pytest and the opt-in TE build
are skipped: CI runs those itself) must exit 0. ```python blocks are run as scripts. They run in a scratch folder
where `recipes/` and `scripts/` point at the repository's, so the docs cannot go stale.
"""

import functools
import os
import re
import shlex
import sys
from pathlib import Path

import pytest
from scripts_loader import load_script

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
def test_doc_example_runs(scratch, zygote, doc, kind, index, text):
    """Each example is its own process with the user's argv, cwd and env: forked from the session's server, which
    imported megatron-bridge once (tests/zygote.py; a fresh interpreter for anything a fork cannot reproduce)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    if kind == "bash":
        argv = shlex.split(text)
        assert argv[0].endswith("python"), f"{doc}: unexpected command {text!r}"
        argv[0] = sys.executable
    else:
        argv = [sys.executable, "-c", text]
    out = zygote.run(argv, cwd=scratch, capture_output=True, text=True, env=env, timeout=900)
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


# Paths a reason, doc or docstring cites must exist: in this repository or in an installed dependency (megatron-core,
# megatron-bridge, torch, NeMo-Run), by their trailing path. Files of dependencies the light environment does not
# install are named by their package; placeholders in examples are not citations.
NOT_INSTALLED_HERE = ("transformer_engine/", "pytorch/", "attention/dot_product_attention/", "deep_ep/",
                      "docs/releases/",  # Transformer Engine, DeepEP (full environment); the NeMo Framework docs site
                      # files of the public Megatron-Bridge and Megatron-LM repositories, cited by repository path
                      # (tests/published.py names the commit): skills cards, verification cards, the performance
                      # summary; Megatron-LM's MoE guide
                      "skills/", "examples/model_verification_cards/", "docs/performance-summary",
                      "megatron/core/transformer/moe/README.md",
                      # Megatron-Bridge's performance scripts and its repository paths (known-issue sources)
                      "scripts/performance/", "src/megatron/bridge/",
                      # SimuMax v1.2's public system configs (the peer comparison, scripts/simumax_compare.py)
                      "configs/system/")
PLACEHOLDERS = ("out/", "my/", "x/", "folder/", "hf_dir/", "iter_NNNNNNN/")
CITED = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md|yaml|json|sh|txt|toml))\b")


@functools.lru_cache(maxsize=1)
def _known_files() -> frozenset[str]:
    """Paths of the repository's files and of the installed dependencies' sources (relative to site-packages)."""
    import sysconfig

    site = Path(sysconfig.get_paths()["purelib"])
    known = {str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and not {".venv", ".git"} & set(p.parts)}
    for package in ("megatron", "torch", "nemo_run"):
        known |= {str(p.relative_to(site)) for p in (site / package).rglob("*.py")}
    return frozenset(known)


def _missing(cited: str) -> bool:
    cited = cited.lstrip("./")
    if cited.startswith(NOT_INSTALLED_HERE + PLACEHOLDERS):
        return False
    return not any(k == cited or k.endswith("/" + cited) for k in _known_files())


def _cited_paths_missing() -> list[str]:
    texts = list((ROOT / "src").rglob("*.py")) + list((ROOT / "src").rglob("*.yaml")) + [ROOT / "README.md"]
    texts += sorted((ROOT / "docs").glob("*.md"))
    return [f"{path.relative_to(ROOT)}:{n}: {cited}" for path in texts
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
            for cited in CITED.findall(line) if _missing(cited)]


def test_every_cited_file_exists():
    missing = _cited_paths_missing()
    assert not missing, "cited but not in the repository or its dependencies:\n" + "\n".join(missing)


DOTTED = re.compile(r"(?<![\w./-])lcmoe_recipes(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def _resolves(dotted: str) -> bool:
    """``lcmoe_recipes.a.b.name`` names a module, or an attribute (a dataclass field counts) of the longest module
    prefix that imports."""
    import dataclasses
    import importlib

    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:n]))
        except ImportError:
            continue
        for attr in parts[n:]:
            fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
            if not hasattr(obj, attr) and attr not in fields:
                return False
            obj = getattr(obj, attr, None)
        return True
    return False


def test_every_dotted_name_in_the_package_and_docs_resolves():
    """Docstrings, messages, reasons and docs that name ``lcmoe_recipes.x.y`` name a module or object that exists:
    none still describes an old home."""
    files = sorted(p for root in ("src", "docs") for p in (ROOT / root).rglob("*") if p.suffix in (".py", ".md"))
    stale = sorted({f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files + [ROOT / "README.md"]
                    for m in DOTTED.finditer(p.read_text(encoding="utf-8")) if not _resolves(m.group(0).rstrip("."))})
    assert stale == []
    assert _resolves("lcmoe_recipes.planner.resolve.Resolution.plan") and not _resolves("lcmoe_recipes.resolve.search")


def test_every_reason_cites_what_a_user_can_open():
    """The reasons `--explain` prints, of every named recipe and of planned ones: no private note, and every file
    they name exists (as in the docs)."""
    from lcmoe_recipes.planner.recipes import NAMED_RECIPES, recipe_plan
    from lcmoe_recipes.core.request import TrainingRequest
    from lcmoe_recipes.planner.search import search_layouts

    plans = [recipe_plan(name) for name in NAMED_RECIPES]
    plans += [search_layouts(TrainingRequest(model=m, seq_length=s, hardware=h, num_gpus=n)).best.plan
              for m, s, h, n in (("kimi_k2", 131072, "h100", 512), ("gpt_oss_120b", 65536, "gb200", 16),
                                 ("glm45_air", 32768, "h100", 32))]
    text = "\n".join(f"{r.why} [{r.source}]" for p in plans for r in p.reasons.values())
    assert not PRIVATE.search(text)
    assert "REFERENCE" not in text and "seeds" not in text
    cited = {c.lstrip("./") for c in CITED.findall(text)}
    assert cited, "the reasons cite upstream files"
    missing = [c for c in cited if _missing(c)]
    assert not missing, missing




def test_recipes_table_is_generated_from_the_yaml():
    """docs/recipes.md's table is what recipes/*.yaml say (scripts/recipes_doc.py): the effective values, current."""
    module = load_script("recipes_doc")
    assert module.generate() == module.TARGET.read_text(), "run python scripts/recipes_doc.py"
    row = next(line for line in module.table().splitlines() if line.startswith("| `qwen3_235b_128k_gb200`"))
    # TP4 CP8 EP32 ETP1 PP4 VPP12, DP1 EDP1; FP32 gradients; the recompute megatron runs
    assert row.split(" | ")[2:10] == ["4", "8", "32", "1", "4", "12", "1", "1"]
    assert " | FP32 | moe_act | attn, moe_router, moe_preprocess | no | - |" in row
    dsv3 = next(line for line in module.table().splitlines() if line.startswith("| `dsv3_128k_h100`"))
    assert dsv3.endswith(" | FP32 | mla_up_proj, layernorm, moe, mlp | none | 1 | 0 |")
