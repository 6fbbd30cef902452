"""Packaging: the engine installs without the training stack, and a built wheel runs `generate`.

The extras' modules are blocked the way a missing install looks to Python: ``sys.modules[name] =
None`` makes ``import name`` raise ModuleNotFoundError and ``importlib.util.find_spec(name)``
answer None (so transformers' availability checks see them as absent too).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from adaptive_spec.extras import EXTRA_OF, missing_extra_message

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
# Distribution names of the modules that only the extras install.
EXTRA_DISTRIBUTIONS = (
    "lightning",
    "jsonargparse",
    "onnx",
    "onnxscript",
    "scikit-learn",
    "optuna",
    "optuna-integration",
    "matplotlib",
    "pyarrow",
    "psycopg2-binary",
)
GENERATE = [
    "generate",
    "--prompt",
    "def add(a, b):",
    "--max-new-tokens",
    "6",
    "--temperature",
    "0",
    "--seed",
    "0",
    "--device",
    "cpu",
    "--json",
]


def _name(requirement: str) -> str:
    for sep in "[<>=!~; ":
        requirement = requirement.split(sep)[0]
    return requirement.strip().lower()


def _blocked_run(argv: list[str], cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``adaptive-spec ARGV`` in a fresh interpreter where every extra's module is missing."""
    code = (
        "import sys\n"
        f"for name in {sorted(EXTRA_OF)!r}:\n"
        "    sys.modules[name] = None\n"
        "from adaptive_spec.cli import main\n"
        "import adaptive_spec\n"
        "print('package:', adaptive_spec.__file__, file=sys.stderr)\n"
        f"sys.exit(main({argv!r}))\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=600)


def test_the_core_requirements_leave_out_the_training_stack():
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    assert {"torch", "transformers", "numpy", "onnxruntime", "accelerate"} <= core
    assert not core & set(EXTRA_DISTRIBUTIONS), core & set(EXTRA_DISTRIBUTIONS)
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"train", "tune", "report", "log", "all", "dev"} <= set(extras)
    in_extras = {_name(r) for reqs in extras.values() for r in reqs}
    assert set(EXTRA_DISTRIBUTIONS) <= in_extras
    # every extra a message can name exists, and [all] pulls in each of them but postgres
    assert set(EXTRA_OF.values()) <= set(extras)
    assert extras["all"] == ["adaptive-spec[log,report,train,tune]"]
    assert PYPROJECT["project"]["license"] == "Apache-2.0" and (REPO / "LICENSE").is_file()


def test_generate_runs_without_any_extra(tmp_path):
    res = _blocked_run(GENERATE, cwd=REPO)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(res.stdout)
    assert 1 <= doc["new_tokens"] <= 6 and isinstance(doc["text"], str)


def test_a_verb_that_needs_an_extra_names_it(tmp_path):
    res = _blocked_run(["selector", "train", "--help"], cwd=REPO)
    assert res.returncode == 1
    lines = [line for line in res.stderr.splitlines() if not line.startswith("package:")]
    assert lines == [
        "adaptive-spec selector train needs the [train] extra (lightning is not installed): "
        "pip install 'adaptive-spec[train]'"
    ]
    res = _blocked_run(["selector", "export", "--help"], cwd=REPO)  # help needs no extra: the module imports lazily
    assert res.returncode == 0 and "checkpoint" in res.stdout, res.stderr[-2000:]


def test_the_missing_extra_message_names_the_extra_of_the_top_level_module():
    err = ModuleNotFoundError("No module named 'optuna.trial'", name="optuna.trial")
    assert missing_extra_message(err, "tune plans") == (
        "adaptive-spec tune plans needs the [tune] extra (optuna is not installed): pip install 'adaptive-spec[tune]'"
    )
    assert missing_extra_message(ModuleNotFoundError("x", name="pyarrow.parquet"), "collect").endswith(
        "pip install 'adaptive-spec[log]'"
    )
    assert missing_extra_message(ModuleNotFoundError("x", name="no_such_thing"), "collect") is None


@pytest.mark.slow
def test_a_built_wheel_ships_configs_and_runs_generate_without_extras(tmp_path):
    """Build the wheel, unpack it alone on the path, run `generate` from an unrelated folder."""
    src = tmp_path / "src"
    shutil.copytree(
        REPO,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "data", "build", "*.egg-info", "__pycache__", ".pytest_cache", ".ruff_cache"
        ),
    )
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("adaptive_spec-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(meta_name).decode()
        zf.extractall(tmp_path / "site")
    shipped_files = (
        "configs/plans/in-draft.yaml",
        "configs/selector/default.yaml",
        "configs/zoo/tiny.yaml",
        "zoo/default/build_info.json",
        "zoo/default/target/model.safetensors",
        "planner/default_actions.yaml",
        "zoo/online_prompts.jsonl",
        "zoo/user_prompt_sets/self_instruct.jsonl",
        "zoo/user_prompt_sets/self_instruct.jsonl.licence",
    )
    for shipped in shipped_files:
        assert f"adaptive_spec/{shipped}" in names, shipped
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: Apache-2.0" in metadata
    core = [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    assert core and not {_name(r) for r in core} & set(EXTRA_DISTRIBUTIONS), core

    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    work = tmp_path / "elsewhere"
    work.mkdir()
    res = _blocked_run(GENERATE, cwd=work, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"package: {tmp_path / 'site' / 'adaptive_spec' / '__init__.py'}" in res.stderr  # the wheel's copy ran
    assert 1 <= json.loads(res.stdout)["new_tokens"] <= 6
    # the shipped configs are found from the wheel: the default plan comes from its in-draft.yaml
    code = "from adaptive_spec.files import config_path; print(config_path('plans/in-draft.yaml'))"
    where = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=work, env=env)
    assert where.stdout.strip() == str(tmp_path / "site" / "adaptive_spec" / "configs" / "plans" / "in-draft.yaml")
