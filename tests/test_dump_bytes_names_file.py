"""dump_bytes (every JSON, plan, graph and report file the tool writes) names the file it could
not write. QA: on a full disk `plan -o`, `graph -o` and `run --out` said only 'No space left on
device (check the path and its permissions)': a failed write or close names no file."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from helpers.bad_inputs import env

# A file-size limit (RLIMIT_FSIZE, SIGXFSZ ignored) makes the write itself fail, as a full disk
# does, with no root and no mount: the kernel answers EFBIG past 1000 bytes.
WRITE_PAST_THE_LIMIT = textwrap.dedent("""
    import os, resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1000, resource.RLIM_INFINITY))
    from edge_remat_agent.formats.fields import dump_bytes
    try:
        dump_bytes(b"x" * 5000, sys.argv[1])
    except OSError as exc:
        print(exc.errno, exc.filename, sorted(os.listdir(".")))
    else:
        print("written")
""")


def test_a_write_that_fails_names_the_file_and_leaves_nothing(tmp_path):
    (tmp_path / "sub").mkdir()
    proc = subprocess.run([sys.executable, "-c", WRITE_PAST_THE_LIMIT, "sub/p.json"],
                          cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    errno_, filename, left = proc.stdout.split(" ", 2)
    assert int(errno_) == 27, proc.stdout  # EFBIG
    assert filename == "sub/p.json", proc.stdout  # as given, not None nor the temporary file
    assert list((tmp_path / "sub").iterdir()) == [], "a temporary file was left behind"


def test_a_full_disk_carries_the_size_it_could_not_write(tmp_path):
    from edge_remat_agent.formats.fields import dump_bytes
    from helpers.small_disk import small_disk
    with small_disk(tmp_path / "disk", "1M") as disk:
        (disk / "filler").write_bytes(b"\0" * 2**20)
        try:
            dump_bytes(b"{}" * 3000, disk / "p.json")
        except OSError as exc:
            error = exc
        left = sorted(p.name for p in disk.iterdir())
    assert error.errno == 28 and error.filename == str(tmp_path / "disk" / "p.json"), error
    assert error.needed_bytes == 6000
    assert left == ["filler"], left
