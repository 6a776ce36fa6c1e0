"""A write refused as too large (EFBIG: past the process's file-size limit, RLIMIT_FSIZE or
`ulimit -f`, or the largest file its filesystem holds) says so with its remedy, not "check
the path and its permissions". QA, under `ulimit -f 1`: `plan -o p.json` said "error: p.json:
File too large (check the path and its permissions)". Real processes with the limit set
(SIGXFSZ ignored, as Python ignores it, so the write fails with EFBIG instead of killing)."""

from __future__ import annotations

import json
import resource
import signal
import subprocess
import sys
import textwrap

from helpers.bad_inputs import BAD_INPUT, COMMAND, env, refused, tiny_graph, tree

LIMIT = 1024  # bytes: a plan of the tiny graph is about 3 KiB


def limited() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def test_plan_past_the_file_size_limit_says_so_and_writes_nothing(tmp_path):
    graph = tiny_graph(tmp_path)
    before = tree(tmp_path)
    for json_out in (False, True):
        proc = subprocess.run([*COMMAND, "plan", "--graph", str(graph), "--budget", "1.0",
                               "-o", str(tmp_path / "p.json"), *(["--json"] * json_out)],
                              capture_output=True, text=True, timeout=120, env=env(),
                              preexec_fn=limited)
        line = refused(proc, BAD_INPUT, json_out=json_out)
        assert line.startswith(f"error: {tmp_path / 'p.json'}: File too large: the file is "
                               "larger than its filesystem or this process's file-size limit "
                               "allows ("), line
        assert "the limit, `ulimit -f`, is 1.00 KiB): raise the limit (`ulimit -f " \
               "unlimited`)" in line, line
        assert "permissions" not in line, line
        assert tree(tmp_path) == before  # no p.json, no temporary file
        if json_out:
            obj = json.loads(proc.stdout)
            assert obj["file_size_limit_bytes"] == LIMIT and obj["needed_bytes"] > LIMIT, obj


# The project's write helper (fields.dump_text) under the limit, its error classified.
WRITE = textwrap.dedent("""
    import json, os, resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = int(sys.argv[2])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    from edge_remat_agent.formats.fields import dump_text
    from edge_remat.errors import classify
    try:
        dump_text("x" * 5000, sys.argv[1])
    except OSError as exc:
        status, line, extra = classify(exc)
        print(json.dumps([status, line, extra, sorted(os.listdir(os.path.dirname(sys.argv[1])))]))
""")


def test_dump_text_past_the_limit_is_classified_with_the_remedy(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-c", WRITE, str(out / "big.json"), str(LIMIT)],
                          capture_output=True, text=True, timeout=60, env=env())
    status, line, extra, left = json.loads(proc.stdout)
    assert status == BAD_INPUT and left == [], (line, left)
    assert line == (f"{out / 'big.json'}: File too large: the file is larger than its "
                    "filesystem or this process's file-size limit allows (4.88 KiB to write; "
                    "the limit, `ulimit -f`, is 1.00 KiB): raise the limit (`ulimit -f "
                    "unlimited`) in the shell that starts the command"), line
    assert extra == {"needed_bytes": 5000, "file_size_limit_bytes": LIMIT}, extra


def test_efbig_without_a_limit_names_the_filesystem():
    import errno

    from edge_remat.errors import classify
    if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        import pytest
        pytest.skip("this process has a file-size limit")
    status, line, extra = classify(OSError(errno.EFBIG, "File too large", "/mnt/usb/p.pt"))
    assert status == BAD_INPUT and extra == {}
    assert line == ("/mnt/usb/p.pt: File too large: the file is larger than its filesystem or "
                    "this process's file-size limit allows: write it to a filesystem that "
                    "holds files this large (not FAT32: 4 GiB)"), line
