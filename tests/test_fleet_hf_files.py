"""A fleet manifest's hf: model is checked with the manifest, as a MODULE:FACTORY's file is:
the spec parses, its config and adapter read as JSON objects, a checkpoint folder has its
config.json (capture/hf_spec.check_spec, no torch). QA: `model = "hf:gpt2?config=nope.json"`
was a 'capture failed' row and exit 1 after the manifest was accepted, where a missing
`missing.py:make` was a manifest error (exit 2); docs/fleet.md says every mistake is
reported before any work starts."""

from __future__ import annotations

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, env


def test_an_hf_models_missing_files_are_manifest_errors(tmp_path):
    (tmp_path / "broken.json").write_text("{\"n_layer\": 2,")
    (tmp_path / "list.json").write_text("[2]")
    (tmp_path / "fleet.toml").write_text("""
budgets = ["80%"]
[[models]]
model = "hf:gpt2?config=nope.json"
[[models]]
model = "hf:gpt2?config={\\"n_layer\\": 1}&adapter=lora.json"
[[models]]
model = "hf:./no-checkpoint"
name = "ckpt"
[[models]]
model = "hf:gpt2?config=broken.json"
name = "broken"
[[models]]
model = "hf:gpt2?config=list.json"
name = "list"
[[models]]
model = "hf:gpt2?colour=blue"
name = "colour"
[[models]]
model = "missing.py:make"
[[boards]]
device = "jetson-orin-nano"
""")
    proc = cli("fleet", "plan", tmp_path / "fleet.toml", "--out", tmp_path / "out", "--no-ray",
               environ=env(), timeout=120)
    assert proc.returncode == BAD_INPUT, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = proc.stderr.strip().splitlines()
    assert all(line.startswith(f"error: {tmp_path / 'fleet.toml'}: ") for line in errors), errors
    expected = [("models[0].model", f"cannot read the config file {tmp_path / 'nope.json'}"),
                ("models[1].model", f"cannot read the adapter file {tmp_path / 'lora.json'}"),
                ("models[2].model", f"{tmp_path / 'no-checkpoint'} is not a checkpoint "
                                    "directory (no config.json in it)"),
                ("models[3].model", "the config is not valid JSON"),
                ("models[4].model", "the config must be a JSON object of fields"),
                ("models[5].model", "unknown option colour"),
                ("models[6].model", f"no such file {tmp_path / 'missing.py'}")]
    assert len(errors) == len(expected), errors
    for (where, words), line in zip(expected, errors):
        assert f": {where}: " in line and words in line, (where, words, line)
    assert not (tmp_path / "out").exists()  # nothing captured, nothing planned


def test_an_hf_model_whose_files_read_is_accepted(tmp_path, monkeypatch):
    """Paths relative to the manifest (not the current folder), made absolute in the spec;
    inline JSON and an adapter folder alike."""
    from edge_remat.fleet.manifest import load_manifest
    (tmp_path / "small.json").write_text("{\"n_layer\": 1, \"n_embd\": 32, \"n_head\": 2}")
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "adapter_config.json").write_text("{\"peft_type\": \"LORA\"}")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{\"model_type\": \"gpt2\"}")
    (tmp_path / "fleet.toml").write_text("""
budgets = ["80%"]
[[models]]
model = "hf:gpt2?config=small.json&adapter=adapter"
[[models]]
model = "hf:gpt2?config={\\"n_layer\\": 1}"
name = "inline"
[[models]]
model = "hf:./ckpt"
name = "ckpt"
[[boards]]
device = "jetson-orin-nano"
""")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    manifest = load_manifest(tmp_path / "fleet.toml")
    assert [m.spec for m in manifest.models] == [
        f"hf:gpt2?config={tmp_path / 'small.json'}&adapter={tmp_path / 'adapter'}",
        "hf:gpt2?config={\"n_layer\": 1}", f"hf:{tmp_path / 'ckpt'}"]


@pytest.mark.parametrize("spec", ["hf:gpt2", "hf:gpt2?task=causal-lm"])
def test_a_spec_with_no_files_needs_none(spec):
    from edge_remat_agent.capture.hf_spec import check_spec
    check_spec(spec)
