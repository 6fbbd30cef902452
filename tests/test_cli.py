from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

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
        [
            "bench",
            "verifiers",
            "--speed",
            "--vocabs",
            "500",
            "--nodes",
            "8",
            "--repeats",
            "2",
            "--json",
            str(out),
            "--no-progress",
            "--device",
            "cpu",
        ]
    )
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


def test_old_spellings_are_gone(capsys):
    with pytest.raises(SystemExit, match=r"unknown command 'export-selector'; run `adaptive-spec --help`"):
        main(["export-selector", "--help"])


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
                assert action.help.startswith("target model: local directory, hub id or short name"), name
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


def test_every_limit_option_takes_a_whole_number_of_at_least_one(capsys):
    import argparse as ap
    import importlib

    from adaptive_spec.cli import COMMANDS

    verbs = []
    for path, (module, _) in COMMANDS.items():
        parser = ap.ArgumentParser()
        importlib.import_module(module).add_arguments(parser)
        if any("--limit" in a.option_strings for a in parser._actions):
            verbs.append(path)
    assert {("bench", "e2e"), ("bench", "overhead"), ("demo",), ("tune", "sources")} <= set(verbs)
    for path in verbs:
        for bad in ("0", "-2", "x"):
            with pytest.raises(SystemExit) as exc:
                main([*path, "--limit", bad])
            assert exc.value.code == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith(f"adaptive-spec {' '.join(path)}: error: argument --limit: "), (
                err
            )
            assert "takes a whole number >= 1" in err[0], err
    from adaptive_spec.files import default_prompts

    assert default_prompts(2) == default_prompts()[:2] and len(default_prompts(2)) == 2


# ----------------------------------------------------------------------------- --out is a folder
def test_out_file_is_a_file_in_the_folder_and_a_file_suffix_is_refused(tmp_path, capsys):
    from adaptive_spec.options import out_file

    assert out_file(tmp_path / "new" / "dir", "labels.parquet") == tmp_path / "new" / "dir" / "labels.parquet"
    assert (tmp_path / "new" / "dir").is_dir() and capsys.readouterr().err == ""
    old = tmp_path / "old" / "mine.parquet"
    with pytest.raises(ValueError, match=rf"--out is a folder, not a .parquet file: pass --out {old.parent} to"):
        out_file(old, "labels.parquet")
    assert not old.parent.exists()  # nothing created
    assert out_file(tmp_path / "v1.0", "selector.onnx") == tmp_path / "v1.0" / "selector.onnx"


def test_zoo_prompts_out_is_a_folder_of_split_files(tmp_path, monkeypatch, capsys):
    import adaptive_spec.cli.zoo_prompts as verb

    monkeypatch.setattr(verb, "prompt_set", lambda split, count, seed: [f"def {split}_{i}():" for i in range(count)])
    assert main(["zoo", "prompts", "train", "--count", "3", "--out", str(tmp_path / "sets")]) == 0
    lines = (tmp_path / "sets" / "train.jsonl").read_text().splitlines()
    assert [json.loads(line)["prompt"] for line in lines] == ["def train_0():", "def train_1():", "def train_2():"]
    assert main(["zoo", "prompts", "heldout2", "--count", "1", "--out", str(tmp_path / "sets")]) == 0
    assert sorted(p.name for p in (tmp_path / "sets").iterdir()) == ["heldout2.jsonl", "train.jsonl"]
    assert "warning" not in capsys.readouterr().err
    old = tmp_path / "old.jsonl"  # the old file form: one line saying what to pass
    with pytest.raises(SystemExit, match=r"^adaptive-spec zoo prompts: error: --out is a folder, not a .jsonl file"):
        main(["zoo", "prompts", "train", "--count", "2", "--out", str(old)])
    assert not old.exists() and not (tmp_path / "train.jsonl").exists()


def test_selector_export_out_is_a_folder(tmp_path, monkeypatch, capsys):
    import adaptive_spec.cli.selector_export as verb

    written = []

    def export(ckpt, out, *, check_batch, report):
        Path(out).write_bytes(b"onnx")
        written.append(Path(out))
        return {"path": str(out)}

    monkeypatch.setattr(verb, "export_checkpoint", export)
    ckpt = tmp_path / "best.ckpt"
    assert main(["selector", "export", str(ckpt), "--out", str(tmp_path / "sel"), "--latency-decisions", "0"]) == 0
    assert written == [tmp_path / "sel" / "selector.onnx"] and written[0].read_bytes() == b"onnx"
    assert json.loads(capsys.readouterr().out)["path"] == str(tmp_path / "sel" / "selector.onnx")
    with pytest.raises(SystemExit, match=r"--out is a folder, not a \.onnx file"):
        main(["selector", "export", str(ckpt), "--out", str(tmp_path / "old.onnx"), "--latency-decisions", "0"])
    assert len(written) == 1 and not (tmp_path / "old.onnx").exists()
    monkeypatch.chdir(tmp_path)  # the default folder: data/selector, where the demo and generate look
    assert main(["selector", "export", str(ckpt), "--latency-decisions", "0"]) == 0
    assert written[-1] == Path("data/selector/selector.onnx") and (tmp_path / "data/selector/selector.onnx").exists()


def test_profile_out_is_a_folder_with_profile_json_and_its_plot(tmp_path, monkeypatch, capsys):
    import adaptive_spec.cli.profile as verb
    import adaptive_spec.engine.load
    from tests.helpers.profiles import synthetic_profile

    profile = {**synthetic_profile(), "device": {"type": "cpu", "name": "test", "torch_threads": 1}, "dtype": "float32"}
    profile["overhead"] = None  # print_summary leaves the bookkeeping line out
    monkeypatch.setattr(adaptive_spec.engine.load, "load_engine", lambda *a: None)
    monkeypatch.setattr(verb, "measure_profile", lambda *a, **k: profile)
    monkeypatch.chdir(tmp_path)
    assert main(["profile", "--no-progress", "--no-plot"]) == 0  # default: data/profile/profile.json
    assert json.loads((tmp_path / "data/profile/profile.json").read_text())["contexts"] == profile["contexts"]
    assert main(["profile", "--no-progress", "--out", "p"]) == 0
    assert json.loads((tmp_path / "p/profile.json").read_text()) == json.loads(json.dumps(profile))
    assert (tmp_path / "p/profile.png").read_bytes()[:4] == b"\x89PNG"
    assert "warning" not in capsys.readouterr().err
    monkeypatch.setattr(verb, "measure_profile", lambda *a, **k: pytest.fail("measured before checking --out"))
    with pytest.raises(SystemExit, match=r"--out is a folder, not a \.json file: pass --out \. to write profile\.json"):
        main(["profile", "--no-progress", "--no-plot", "--out", "mine.json"])
    assert not (tmp_path / "mine.json").exists()


def test_label_out_is_a_folder_with_the_labels_and_the_report(tmp_path, monkeypatch, capsys):
    import adaptive_spec.records.label as label
    from adaptive_spec.formats.label_table import read_labels, write_labels
    from tests.helpers.tuning_labels import synthetic_labels

    table = synthetic_labels()
    calls = []

    def fake_label_log(log_dir, config, *, out, **kw):
        calls.append((Path(log_dir), Path(out)))
        return table, write_labels(table, out)

    monkeypatch.setattr(label, "label_log", fake_label_log)
    log = tmp_path / "log"
    log.mkdir()
    assert main(["label", str(log), "--no-progress"]) == 0  # default: the log directory
    assert len(read_labels(log / "labels.parquet")) == len(table) and (log / "label_report" / "report.md").is_file()
    assert main(["label", str(log), "--no-progress", "--out", str(tmp_path / "labelled")]) == 0
    assert calls[-1] == (log, tmp_path / "labelled" / "labels.parquet")
    assert (tmp_path / "labelled" / "labels.parquet").is_file()
    assert (tmp_path / "labelled" / "label_report" / "report.md").is_file()
    assert "warning" not in capsys.readouterr().err
    with pytest.raises(SystemExit, match=r"--out is a folder, not a \.parquet file"):
        main(["label", str(log), "--no-progress", "--out", str(tmp_path / "old.parquet")])
    assert len(calls) == 2 and not (tmp_path / "old.parquet").exists()  # refused before labelling
