"""Property-based fuzzing of the command lines (hypothesis): whatever a user types -- flags, override values, a
mangled copy of a named recipe's YAML -- the answer is an exit code as documented (docs/guide.md "Exit codes": 0
success, 1 valid but cannot run here, 2 bad input; argparse's own usage errors exit 2 too), one message, never a
traceback, and nothing written when the answer is an error.

Bounded: a fixed number of examples per property and no shrinking deadline, so CI time stays in seconds per test.
"""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings, strategies as st

ROOT = Path(__file__).resolve().parent.parent
# derandomized (the same examples every run, no example database written), no shrinking (a failure is reported as
# generated: bounded time)
FUZZ = settings(max_examples=int(os.environ.get("LCMOE_FUZZ_EXAMPLES", "25")), deadline=None, derandomize=True,
                database=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

MODELS = st.sampled_from(["dsv3", "qwen3_235b", "qwen3_next", "qwen3_30b", "gpt_oss_20b", "dsv3_128k_h100",
                          "dsv4", "../x"])
SEQ = st.sampled_from(["131072", "32768", "65536", "262144", "8192", "131071", "0", "-4096", "7", "x"])
GPUS = st.sampled_from([None, 256, 128, 64, 32, 8, 0, 3, 100000])
HARDWARE = st.sampled_from([None, "h100", "gb200", "h200", "H100", "a100"])
FIELDS = ["model.tensor_model_parallel_size", "model.context_parallel_size", "model.pipeline_model_parallel_size",
          "model.expert_model_parallel_size", "train.global_batch_size", "train.micro_batch_size",
          "model.seq_length", "model.recompute_granularity", "model.context_paralel_size", "optimizer.lr",
          "model.moe_token_dispatcher_type", "checkpoint.load", "nonsense", "model.", "train.train_iters",
          "optimizer.weight_decay", "model.sequence_parallel"]
VALUES = st.one_of(st.integers(-2, 300).map(str), st.sampled_from(["null", "full", "selective", "alltoall", "x",
                                                                     "", "[1,2]", "{a: 1}", "1e-5", "true", "'"]))
OVERRIDES = st.lists(st.builds(lambda k, v: f"{k}={v}", st.sampled_from(FIELDS), VALUES)
                     | st.sampled_from(["=", "model", "+model.foo=1", "~model.seq_length", "a=b=c"]), max_size=2)
# whole flags (name and value), valid and not
LAUNCH_FLAGS = st.lists(st.sampled_from([["--rope", "yarn"], ["--rope", "abf"], ["--rope", "bogus"], ["--tp", "3"],
                                         ["--cp", "48"], ["--cp", "16"], ["--tokens-per-step", "0"],
                                         ["--tokens-per-step", "8388608"], ["--phases", "32768,131072"],
                                         ["--phases", "0,1"], ["--variable-length"], ["--lr", "-1"], ["--json"],
                                         ["--train-iters", "10"], ["--from-hf", "/nonexistent"],
                                         ["--executor", "slurm"], ["--time", "4"], ["--lr", "-1e-5"],
                                         ["--gbs", "0"], ["--fs-gbps", "0"]]), max_size=3).map(
    lambda flags: [x for flag in flags for x in flag])
PLAN_FLAGS = st.lists(st.sampled_from([["--top", "0"], ["--top", "2"], ["--tp", "5"], ["--memory-margin", "2"],
                                       ["--memory-margin", "0.2"], ["--mbs", "0"], ["--json"], ["--gbs", "-1"],
                                       ["--gbs", "64"], ["--rope", "keep"], ["--no-offload"]]), max_size=3).map(
    lambda flags: [x for flag in flags for x in flag])


def _run(main, argv: list[str]) -> tuple[int, str]:
    """Exit code and output (stderr, then stdout: --json errors are JSON on stdout) of ``main(argv)``; argparse's
    SystemExit is an exit code; any other exception fails the test."""
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: usage errors exit 2, --help exits 0
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue() + out.getvalue()


def _assert_clean(code: int, err: str, written: list[Path]) -> None:
    assert code in (0, 1, 2), code
    assert "Traceback (most recent call last)" not in err, err
    if code == 2:
        assert not [p for p in written if p.exists()], written
        assert err.strip(), "an error says what was wrong"


def _assert_a_fix(code: int, err: str) -> None:
    """A refused value is answered with a fix for it: "see --help" only where the command line itself is malformed
    (an unknown flag, a value of the wrong type), never for a value the request's checks refuse."""
    if code == 2 and "fix: see " in err:
        assert "error: argument " in err or "unrecognized arguments" in err or "the following arguments" in err, err


@pytest.fixture
def scratch(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@FUZZ
@given(model=MODELS, seq=SEQ, gpus=GPUS, hardware=HARDWARE, overrides=OVERRIDES, extra=LAUNCH_FLAGS)
def test_launch_never_tracebacks(scratch, model, seq, gpus, hardware, overrides, extra):
    from lcmoe_recipes.cli.launch import main

    out = scratch / "fuzz.yaml"
    if out.exists():
        out.unlink()
    argv = [model, "--seq", seq, "--dry-run", "--output", str(out)]
    argv += ["--gpus", str(gpus)] if gpus is not None else []
    argv += ["--hardware", hardware] if hardware is not None else []
    code, err = _run(main, argv + extra + overrides)
    _assert_clean(code, err, [out])
    _assert_a_fix(code, err)


@FUZZ
@given(model=MODELS, seq=SEQ, gpus=GPUS.filter(lambda n: n is not None), hardware=HARDWARE.map(lambda h: h or "x"),
       extra=PLAN_FLAGS)
def test_plan_never_tracebacks(scratch, model, seq, gpus, hardware, extra):
    from lcmoe_recipes.cli.plan import main

    csv = scratch / "fuzz.csv"
    if csv.exists():
        csv.unlink()
    code, err = _run(main, [model, "--seq", seq, "--gpus", str(gpus), "--hardware", hardware, "--csv",
                            str(csv)] + extra)
    _assert_clean(code, err, [csv])
    _assert_a_fix(code, err)


def _mutations() -> st.SearchStrategy:
    """(recipe file, mutation, path into the YAML tree, new value)."""
    recipes = sorted(p.name for p in (ROOT / "recipes").glob("*.yaml"))
    return st.tuples(st.sampled_from(recipes),
                     st.sampled_from(["delete", "set", "rename", "truncate", "bytes", "target", "empty"]),
                     st.integers(0, 10_000), VALUES)


def _mutate(text: str, kind: str, where: int, value: str) -> bytes:
    if kind == "truncate":
        return text[: where % max(1, len(text))].encode()
    if kind == "bytes":
        return text.encode()[: where % 500] + b"\xff\xfe\x00" + text.encode()[where % 500:]
    if kind == "empty":
        return b"a: 1\n" if where % 2 else b""
    header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
    tree = yaml.safe_load(text)
    leaves = [(section, key) for section, body in tree.items() if isinstance(body, dict) and "_target_" in body
              for key in body]  # config objects (env_vars is a plain dict: any key is a variable)
    section, key = leaves[where % len(leaves)]
    if kind == "delete":
        del tree[section][key]
    elif kind == "set":
        tree[section][key] = yaml.safe_load(value) if value not in ("'",) else value
    elif kind == "rename":
        tree[section][key[:-1] + "x"] = tree[section].pop(key)
    elif kind == "target":
        tree[section].pop("_target_", None)
    return (header + yaml.safe_dump(tree, sort_keys=False)).encode()


@FUZZ
@given(mutation=_mutations())
def test_check_on_mangled_yaml_never_tracebacks(scratch, mutation):
    from lcmoe_recipes.cli.check import main

    name, kind, where, value = mutation
    path = scratch / "mangled.yaml"
    path.write_bytes(_mutate((ROOT / "recipes" / name).read_text(encoding="utf-8"), kind, where, value))
    code, err = _run(main, [str(path)])
    assert code in (0, 1, 2), code
    assert "Traceback (most recent call last)" not in err, err
    if kind in ("bytes", "empty", "target", "rename"):
        assert code == 2, (kind, err)  # not UTF-8, not a ConfigContainer, no _target_, an unknown key: refused


# Messages a new user met (issue 20, part 4): each names its fix.
@pytest.mark.parametrize("command,argv,expected", [
    ("plan", ["dsv3", "--seq", "-4096", "--gpus", "256", "--hardware", "h100"],
     ("seq_length -4096 must be greater than 0", "fix: use e.g. 131072 (128K)")),
    ("plan", ["dsv3", "--seq", "131072", "--gpus", "256", "--hardware", "h100", "--tokens-per-step", "0"],
     ("tokens_per_step 0 must be greater than 0", "fix: use e.g. 8388608 (8M)")),
    ("plan", ["dsv3", "--seq", "131072", "--gpus", "256", "--hardware", "h100", "--lr", "-1e-5"],
     ("lr -1e-05 must be greater than 0", "fix: use e.g. 1e-05")),
    ("check", ["dsv3_128k_h100", "--gpus", "60"],
     ("60 GPUs do not fill whole h100 nodes of 8 (nor divide one)", "fix: use 56 or 64")),
])
def test_messages_name_their_fix(command, argv, expected):
    from lcmoe_recipes.cli.check import main as check
    from lcmoe_recipes.cli.plan import main as plan

    code, err = _run({"plan": plan, "check": check}[command], argv)
    assert code == 2 and all(text in err for text in expected), err


def test_a_recompute_fix_offers_only_modules_the_model_has():
    from lcmoe_recipes import recipe_plan
    from lcmoe_recipes.checks import check_plan

    plan = recipe_plan("qwen3_235b_128k_gb200")
    found = {f.rule: f for f in check_plan(plan.with_changes(recompute_modules=("core_attn",)))}
    fix = found["recompute/core-attn-long-context"].fix
    assert fix == "recompute layernorm / moe_act / moe instead" and "mla_up_proj" not in fix
    dsv3 = recipe_plan("dsv3_128k_h100")
    found = {f.rule: f for f in check_plan(dsv3.with_changes(recompute_modules=("core_attn",)))}
    assert found["recompute/core-attn-long-context"].fix == "recompute layernorm / moe_act / mla_up_proj / moe instead"


@pytest.mark.slow
def test_upstream_notices_print_at_most_once(scratch):
    """megatron-bridge's gradient_accumulation_fusion notice describes this machine, not the target: it does not
    print on every build (it printed twice per launch), nor do megatron-core's UserWarnings."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "lcmoe_recipes.launch", "qwen3_next", "--seq", "8192", "--dry-run"],
                         capture_output=True, text=True, cwd=scratch, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("gradient_accumulation_fusion") <= 1 and "UserWarning" not in out.stderr, out.stderr

