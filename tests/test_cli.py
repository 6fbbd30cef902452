from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from adaptive_spec.cli import main


def test_bench_verifiers_writes_the_table_as_json(tmp_path, capsys):
    out = tmp_path / "v.json"
    rc = main(
        ["bench", "verifiers", "--families", "toy", "--shapes", "chain:2,iid:2x2", "--json", str(out), "--no-progress"]
    )
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert {"family", "shape", "verifier", "block_efficiency", "lp_limit", "ratio"} <= set(rows[0])
    by = {(r["shape"], r["verifier"]): r for r in rows}
    assert abs(by[("chain:2", "block")]["block_efficiency"] - 20 / 9) < 1e-9
    assert abs(by[("chain:2", "block")]["ratio"] - 1.0) < 1e-6
    assert abs(by[("iid:2x2", "gbv")]["ratio"] - 1.0) < 1e-6  # GBV reaches the LP limit on the toy
    assert all(r["block_efficiency"] <= r["lp_limit"] + 1e-6 for r in rows if r["lossless"])
    assert "block_efficiency" in capsys.readouterr().out


def test_bench_verifiers_speed_rows(tmp_path):
    out = tmp_path / "s.json"
    rc = main(
        ["bench", "verifiers", "--speed", "--vocabs", "500", "--nodes", "8", "--repeats", "2", "--json", str(out),
         "--no-progress", "--device", "cpu"]
    )  # fmt: skip
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert {r["verifier"] for r in rows} >= {"token", "block", "gbv", "spectr", "traversal"}
    assert all(r["vocab"] == 500 and r["us_per_verify"] > 0 for r in rows)


def test_console_script_help():
    res = subprocess.run([sys.executable, "-m", "adaptive_spec", "--help"], capture_output=True, text=True, check=True)
    assert "bench" in res.stdout


# ----------------------------------------------------------------------------- help, version, errors
def _run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "adaptive_spec", *argv], capture_output=True, text=True, env=env)


def test_top_level_help_and_version_import_neither_torch_nor_transformers():
    code = (
        "import sys, contextlib, io\n"
        "from adaptive_spec.cli import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    assert main(['--help']) == 0 and main(['--version']) == 0 and main(['bench', '--help']) == 0\n"
        "print(sorted(m for m in ('torch', 'transformers', 'numpy', 'lightning') if m in sys.modules))\n"
        "print(out.getvalue())\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, text = res.stdout.split("\n", 1)
    assert loaded == "[]"
    from adaptive_spec.cli import COMMANDS

    for path, (_, help_text) in COMMANDS.items():  # every verb with its one-line help
        assert f"  {' '.join(path)} " in text and help_text in text
    assert "adaptive-spec 0." in text  # --version
    assert "latency-model" in text.split("benchmarks:")[1]  # the group's help lists its verbs


def test_console_version():
    res = _run("--version")
    assert res.returncode == 0 and res.stdout.startswith("adaptive-spec ")


def test_a_user_error_is_one_line_and_debug_shows_the_traceback():
    res = _run("bench", "verifiers", "--families", "toy", "--shapes", "nonsense:3", "--no-progress")
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("adaptive-spec bench verifiers: error: "), res.stderr
    assert "nonsense" in lines[0] and "--debug" in lines[0] and "Traceback" not in res.stderr
    res = _run("--debug", "bench", "verifiers", "--families", "toy", "--shapes", "nonsense:3", "--no-progress")
    assert res.returncode == 1 and "Traceback (most recent call last)" in res.stderr and "ValueError" in res.stderr


def test_unknown_commands_are_one_line_with_the_fix(capsys):
    with pytest.raises(SystemExit, match=r"unknown command 'nosuch'; run `adaptive-spec --help`"):
        main(["nosuch"])
    with pytest.raises(SystemExit, match=r"unknown command `adaptive-spec bench nosuch`; choose one of: e2e, "):
        main(["bench", "nosuch"])
    assert main(["bench"]) == 2  # a group alone: its verbs, on stdout
    assert "verifiers" in capsys.readouterr().out


def test_user_errors_inside_a_verb_become_one_line(tmp_path):
    with pytest.raises(SystemExit, match=r"^adaptive-spec zoo build: error: no ZooConfig file .*missing\.yaml"):
        main(["zoo", "build", "--config", str(tmp_path / "missing.yaml"), "--out", str(tmp_path / "pair")])


def test_old_spellings_still_work_with_a_deprecation_note(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["export-selector", "--help"])
    assert exc.value.code == 0
    captured = capsys.readouterr()
    assert "usage: adaptive-spec selector export" in captured.out
    assert "`adaptive-spec export-selector` is deprecated" in captured.err and "selector export" in captured.err


# ----------------------------------------------------------------------------- commands called from Python
def test_call_command_builds_typed_arguments_from_the_parser():
    from pathlib import Path

    from adaptive_spec.cli.call import command_namespace

    args = command_namespace("adaptive_spec.cli.label", log_dir=Path("log"), every=2)
    assert args.log_dir == Path("log") and args.every == 2 and args.samples == 4  # the parser's default
    with pytest.raises(TypeError, match="has no option evrey"):
        command_namespace("adaptive_spec.cli.label", log_dir=Path("log"), evrey=2)
    with pytest.raises(TypeError, match="needs log_dir"):
        command_namespace("adaptive_spec.cli.label")


def test_shared_options_are_spelled_and_explained_alike():
    from pathlib import Path

    from adaptive_spec.cli import build_parser

    parser = build_parser()
    seen = {"--target": 0, "--no-progress": 0, "--json": 0, "--temperatures": 0}

    def parsers(p):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from (
                        [(name, sub)]
                        if not any(isinstance(a, argparse._SubParsersAction) for a in sub._actions)
                        else parsers(sub)
                    )

    for name, sub in parsers(parser):
        for action in sub._actions:
            opts = set(action.option_strings)
            if "--target" in opts:
                seen["--target"] += 1
                assert action.help.startswith("target model: local directory or hub id"), name
            if "--no-progress" in opts or "--quiet" in opts:
                seen["--no-progress"] += 1
                assert action.dest == "no_progress", name
            if "--json" in opts and name != "generate":  # generate --json prints one JSON document
                seen["--json"] += 1
                assert action.type is Path and action.metavar == "PATH", name
            if "--temperatures" in opts:
                seen["--temperatures"] += 1
                assert action.help.startswith("comma-separated sampling temperatures"), name
    assert min(seen.values()) >= 3, seen


def test_a_bad_option_is_one_line_with_exit_status_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["label", "LOG", "--every", "many"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("adaptive-spec label: error: argument --every: invalid int value")
    assert "see `adaptive-spec label --help`" in err[0]
