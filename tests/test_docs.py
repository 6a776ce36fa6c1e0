"""What the user's guide lists must match the code it describes: the zoo's models, the graph
format's node kinds, the solvers' heuristics, `run`'s synopsis, and the Hugging Face example's
config, which must build."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from edge_remat_agent.formats import KINDS
from edge_remat_agent.zoo import MODELS

REPO = Path(__file__).resolve().parents[1]
GUIDES = [REPO / "README.md", REPO / "docs" / "capture.md"]


def bullet(text: str, start: str) -> str:
    """The markdown bullet that begins with `start`, its continuation lines joined."""
    match = re.search(rf"^- {re.escape(start)}.*?(?=^- |^$)", text, re.M | re.S)
    assert match, f"no bullet starting {start!r}"
    return " ".join(match.group(0).split())


def zoo_names(text: str) -> set:
    """The names a **Zoo** bullet gives; `(and `-imagenet` stems)` adds resnet*-imagenet."""
    names = set(re.findall(r"`([a-z][\w.-]*)`", bullet(text, "**Zoo**").split("; ")[0]))
    return names | {f"{name}-imagenet" for name in names if name.startswith("resnet")}


@pytest.mark.parametrize("guide", GUIDES, ids=lambda path: path.name)
def test_the_zoo_list_names_every_model(guide):
    assert zoo_names(guide.read_text()) == set(MODELS)


def test_the_graph_format_names_every_node_kind():
    text = bullet((REPO / "docs" / "capture.md").read_text(), "**graph**")
    listed = re.search(r"`kind` \(`([a-z|]+)`", text).group(1).split("|")
    assert listed == list(KINDS)


def test_the_hf_example_config_builds_a_model():
    pytest.importorskip("transformers", reason="pip install -e '.[hf]'")
    from edge_remat_agent.capture.hf import load_hf

    pattern = r"^echo '(\{.*\})' > small\.json$"
    configs = [re.search(pattern, guide.read_text(), re.M) for guide in GUIDES]
    assert all(configs), "each guide shows the small.json its hf:gpt2 example reads"
    text = configs[0].group(1)
    assert configs[1].group(1) == text
    module, args = load_hf(f"hf:gpt2?config={text}", batch=1, seq=8)
    assert module(*args).ndim == 0 and json.loads(text)["n_embd"] == module.model.config.n_embd


def test_the_hf_llama_example_makes_the_files_it_names_and_they_build():
    """`run --model 'hf:llama?config=llama.json&adapter=lora.json'` named two files nothing in
    the guide made: a reader typing it got an error."""
    pytest.importorskip("peft", reason="pip install -e '.[hf]'")
    from edge_remat_agent.capture.hf import load_hf

    shown = []
    for guide in GUIDES:
        text = guide.read_text()
        assert "hf:llama?config=llama.json&adapter=lora.json" in text
        shown.append([re.search(rf"^echo '(\{{.*\}})' > {name}\.json$", text, re.M)
                      for name in ("llama", "lora")])
    assert all(all(pair) for pair in shown), "each guide makes llama.json and lora.json"
    config, adapter = (match.group(1) for match in shown[0])
    assert [match.group(1) for match in shown[1]] == [config, adapter]
    module, args = load_hf(f"hf:llama?config={config}&adapter={adapter}", batch=1, seq=8)
    trained = [name for name, p in module.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in name for name in trained)
    assert module(*args).ndim == 0


def test_the_solvers_bullet_names_every_heuristic():
    """The README's list of baselines left out heuristic:peak-search."""
    from edge_remat.planner.baselines import BASELINES
    text = bullet((REPO / "README.md").read_text(), "**Solvers**")
    assert set(re.findall(r"`heuristic:([a-z-]+)`", text)) == set(BASELINES)


@pytest.mark.parametrize("guide", [REPO / "README.md", REPO / "docs" / "running.md"],
                         ids=lambda path: path.name)
def test_the_run_synopsis_lists_every_data_spec_and_requires_a_budget(guide):
    """It showed `[--budget ...]` as optional (it is required without a memory limit) and left
    `text` out of --data."""
    from edge_remat_agent.data import DATA_SPECS
    synopsis = re.search(r"^edge-remat run --device DEVICE .*?```", guide.read_text(),
                         re.M | re.S).group(0)
    assert re.search(r"--data ([\w|:]+)", synopsis).group(1).split("|") == list(DATA_SPECS)
    assert "--model MODEL --budget" in synopsis
