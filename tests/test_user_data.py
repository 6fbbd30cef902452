"""Where commands write (the user data folder) and where shipped files are read (the package's configs/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from adaptive_spec import files
from adaptive_spec.files import CONFIGS, config_path, installed_models_dir, resolve_config, user_data_dir
from adaptive_spec.planner.acceptance import default_acceptance_paths
from adaptive_spec.selector.runtime import default_selector_paths

PKG = Path(files.__file__).resolve().parent


def test_the_user_data_folder_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path / "home"))
    assert user_data_dir() == tmp_path / "home"
    assert installed_models_dir() == tmp_path / "home" / "default"
    monkeypatch.delenv("ADAPTIVE_SPEC_HOME")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.setattr(files.sys, "platform", "linux")
    assert user_data_dir() == tmp_path / "xdg" / "adaptive-spec"
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert user_data_dir() == tmp_path / ".local" / "share" / "adaptive-spec"


def test_installs_go_to_the_user_folder_and_lookups_try_it_first(monkeypatch, tmp_path):
    monkeypatch.setenv("ADAPTIVE_SPEC_HOME", str(tmp_path / "home"))
    for paths, name in ((default_selector_paths(), "selector.onnx"), (default_acceptance_paths(), "acceptance.onnx")):
        assert paths[0] == tmp_path / "home" / "default" / name  # where --install writes
        assert paths[1] == files.default_pair_path() / name  # then the copy shipped in the package
        assert not paths[0].is_relative_to(PKG)


@pytest.mark.parametrize(
    "rel",
    ["plans/in-draft.yaml", "plans/best-static.yaml", "selector/default.yaml", "selector/ddp.yaml", "zoo/tiny.yaml"],
)
def test_configs_ship_inside_the_package_and_the_working_directory_overrides(rel, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert CONFIGS == PKG / "configs" and (CONFIGS / rel).is_file()
    assert config_path(rel) == CONFIGS / rel
    assert resolve_config(f"configs/{rel}") == CONFIGS / rel  # `--config configs/...` from any folder
    local = tmp_path / "configs" / rel
    local.parent.mkdir(parents=True)
    local.write_text("# a local copy\n")
    assert config_path(rel) == local
    assert resolve_config(f"configs/{rel}") == Path(f"configs/{rel}")  # it exists here: used as given
    assert resolve_config("elsewhere/missing.yaml") == Path("elsewhere/missing.yaml")


def test_the_default_plan_files_fall_back_to_the_package(monkeypatch, tmp_path):
    from adaptive_spec.engine.auto_plan import tuned_plan_files
    from adaptive_spec.planner.presets import in_draft_path, load_best_static

    monkeypatch.chdir(tmp_path)  # no configs/ here
    files = tuned_plan_files()
    own = [CONFIGS / "plans" / name for name in ("adaptive.yaml", "in-draft.yaml", "best-static.yaml")]
    assert files[:3] == own
    # then the source rule and in-draft plans shipped beside a fetched model's drafts, for that pair only
    shipped = files[3:]
    assert all(p.name in ("adaptive.yaml", "in-draft.yaml") and p.parent.parent.name == "zoo" for p in shipped)
    assert all(p.is_file() for p in shipped) and [p.name for p in shipped] == sorted(p.name for p in shipped)
    assert in_draft_path() == CONFIGS / "plans" / "in-draft.yaml"
    load_best_static(0.0)  # read from the shipped file: no FileNotFoundError
