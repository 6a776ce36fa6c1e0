"""A model's frozen weights come back from its weight file, not from pages: the capture marks
their param nodes, the profiler times that file's reads on the flash, and the plan charges those
reads off that curve (a page read, its header and CRC32 included, took twice as long here)."""

from __future__ import annotations

import os

import pytest

from edge_remat_agent.capture import capture_model
from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import FormatError, Profile, Tier, graph_from_dict, profile_from_dict
from edge_remat_agent.formats.graph_details import WEIGHT_FILE
from edge_remat_agent.formats.profile import TransferCurve
from edge_remat_agent.profiler import measure_flash

KiB, MiB = 2**10, 2**20
PAGE_READS = TransferCurve(((64 * KiB, 1e-3), (MiB, 4e-3), (8 * MiB, 20e-3)))
FILE_READS = TransferCurve(((64 * KiB, 2e-4), (MiB, 2e-3), (8 * MiB, 10e-3)))


def flash(weights_curve: TransferCurve | None) -> Profile:
    tier = Tier(read_bytes_per_s=4e8, write_bytes_per_s=2e8, latency_s=1e-4,
                read_curve=PAGE_READS, weights_read_curve=weights_curve)
    return Profile("measured", {}, idle_w=0.0, active_w=1.0, tiers={"flash": tier})


def sources(graph) -> dict[str, str | None]:
    """Each param node's first parameter -> the source its reads are costed as."""
    return {node.attrs["params"][0]: node.attrs["io"].get("source")
            for node in graph.nodes if node.kind == "param"}


def test_the_frozen_groups_of_a_model_built_on_meta_come_from_its_weight_file():
    captured = capture_model("llama-tiny-lora", optimizer="adamw", params_home="flash",
                             refined=False)
    trainable = {name for name, p in captured.module.named_parameters() if p.requires_grad}
    marked = sources(captured.graph)
    assert WEIGHT_FILE in marked.values() and None in marked.values()
    for first, source in marked.items():  # a group is all frozen or all trainable
        assert (source == WEIGHT_FILE) == (first not in trainable)
    # built in RAM, its frozen groups are pages of the parameter home like any other
    built = capture_model("mlp", batch=2, image=8, params_home="flash")
    assert set(sources(built.graph).values()) == {None}


def test_a_read_from_the_weight_file_costs_what_its_curve_says():
    graph = capture_model("llama-tiny-lora", optimizer="adamw", params_home="flash",
                          refined=False).graph
    measured, unmeasured = build_costs(graph, flash(FILE_READS)), build_costs(graph, flash(None))
    for index, node in enumerate(graph.nodes):
        if node.kind != "param":
            continue
        nbytes = node.attrs["io"]["read_bytes"]
        page = PAGE_READS.seconds(nbytes, 1e-4)
        assert unmeasured.home_io_s[index] == pytest.approx(page)  # a profile made before
        if node.attrs["io"].get("source") == WEIGHT_FILE:
            assert measured.home_io_s[index] == pytest.approx(FILE_READS.seconds(nbytes, 1e-4))
            assert measured.home_io_s[index] < page
        else:
            assert measured.home_io_s[index] == pytest.approx(page)


def test_the_profile_keeps_the_weight_file_curve_and_names_a_bad_one():
    profile = flash(FILE_READS)
    again = profile_from_dict(profile.to_dict())
    assert again.tiers["flash"].weights_read_curve == FILE_READS
    assert "weights_read_curve" not in flash(None).tiers["flash"].to_dict()
    bad = profile.to_dict()
    bad["tiers"]["flash"]["weights_read_curve"] = [[MiB, 2e-3], [KiB, 1e-3]]
    with pytest.raises(FormatError, match="weights_read_curve"):
        profile_from_dict(bad)


def test_a_graph_names_only_the_weight_file_as_a_source():
    graph = capture_model("llama-tiny-lora", optimizer="adamw", params_home="flash",
                          refined=False).graph.to_dict()
    param = next(node for node in graph["nodes"] if node["kind"] == "param")
    param["attrs"]["io"]["source"] = "the cloud"
    with pytest.raises(FormatError, match="source"):
        graph_from_dict(graph)


def test_the_flash_measurement_times_reads_of_a_weight_file(tmp_path):
    sizes = (4 * KiB, 64 * KiB, MiB)
    measurement = measure_flash(tmp_path, sizes, min_window_s=0.002, share_s=0)
    assert [p.nbytes for p in measurement.weight_reads] == list(sizes)
    assert all(p.read_s > 0 and p.reads >= 1 for p in measurement.weight_reads)
    tier = measurement.fit()
    assert [n for n, _ in tier.weights_read_curve.points] == list(sizes)
    assert tier.weights_read_curve.points[0][1] == measurement.weight_reads[0].read_s
    assert measurement.to_dict()["weight_reads"][0]["nbytes"] == sizes[0]
    assert os.listdir(tmp_path) == []  # the probe weight file is gone with the pages
