"""Page stores: every dtype and layout round-trips bit for bit, damage is caught, nothing is
left behind, and a full store or a full disk says so clearly."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import uuid

import pytest
import torch

from edge_remat_agent.pages import (FlashStore, LinkStore, MemoryStore, PageCorrupted, PageMissing,
                                    PageStoreError, PageStoreFull, PinnedStore, decode, encode)
from edge_remat_agent.pages.codec import reading_into

MiB = 2**20
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8,
          torch.uint8, torch.bool, torch.complex64]


def sample(dtype: torch.dtype, shape=(3, 4, 5)) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) > 0.5
    if dtype.is_floating_point or dtype.is_complex:
        values = torch.randn(shape, generator=generator, dtype=torch.float64) * 100
        flat = values.view(-1)
        flat[:4] = torch.tensor([float("nan"), float("inf"), -0.0, float("-inf")])[:flat.numel()]
        return values.to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=generator, dtype=dtype)


def bits(tensor: torch.Tensor) -> torch.Tensor:
    """The raw bytes of the values in logical order, so NaN and -0.0 compare exactly."""
    return tensor.detach().resolve_conj().resolve_neg().contiguous().reshape(-1).view(torch.uint8)


def assert_same(original: torch.Tensor, restored: torch.Tensor) -> None:
    assert restored.dtype == original.dtype
    assert restored.shape == original.shape
    assert torch.equal(bits(restored), bits(original))
    assert not restored.requires_grad


@pytest.fixture(params=["flash", "flash-uncached", "memory", "link"])
def store(request, tmp_path):
    if request.param.startswith("flash"):  # uncached: read around the page cache (O_DIRECT)
        with FlashStore(tmp_path / "pages", drop_cache=request.param == "flash-uncached") as flash:
            yield flash
    elif request.param == "memory":
        yield MemoryStore()
    else:
        host = MemoryStore()
        yield LinkStore(host.put_bytes, host.get_bytes, host.drop_bytes)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_every_dtype_round_trips_bitwise(store, dtype):
    tensor = sample(dtype)
    store.put("node", tensor)
    assert_same(tensor, store.get("node"))


LAYOUTS = {
    "0-dim": lambda: torch.tensor(3.25),
    "empty": lambda: torch.zeros(0, 3),
    "transposed": lambda: sample(torch.float32, (4, 6)).t(),
    "channels_last": lambda: sample(torch.float32, (2, 3, 4, 5)).to(
        memory_format=torch.channels_last),
    "sliced": lambda: sample(torch.float32, (6, 8))[1:5:2, ::3],
    "expanded": lambda: torch.arange(4.0).expand(3, 4),
    "offset view": lambda: sample(torch.int64, (10,))[3:7],
    "conjugated": lambda: sample(torch.complex64, (3, 4)).conj(),
    "negated view": lambda: sample(torch.complex64, (5,)).conj().imag,
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layouts_round_trip(store, layout):
    tensor = LAYOUTS[layout]()
    store.put(layout, tensor)
    restored = store.get(layout)
    assert_same(tensor, restored)
    assert not restored.is_conj() and not restored.is_neg()
    if layout in ("transposed", "channels_last", "conjugated"):  # dense: come back as they were
        assert restored.stride() == tensor.stride()
    elif layout != "negated view":  # a tensor with gaps or overlaps comes back contiguous
        assert restored.is_contiguous()


def test_values_detached_and_independent(store):
    leaf = torch.randn(8, requires_grad=True)
    store.put(1, leaf)
    restored = store.get(1)
    assert_same(leaf, restored)
    with torch.no_grad():
        leaf.add_(1.0)  # the page is a copy: changing the original changes nothing
    assert not torch.equal(store.get(1), leaf.detach())


def test_get_keeps_page_until_discarded(store):
    store.put("a", torch.ones(4))
    store.put("b", torch.zeros(4))
    assert sorted(store.keys()) == ["a", "b"] and store.bytes_held > 0
    assert_same(torch.ones(4), store.pop("a"))
    assert "a" not in store and store.discard("a") is False
    with pytest.raises(PageMissing) as missing:
        store.get("a")
    assert isinstance(missing.value, KeyError) and "'a'" in str(missing.value)
    store.put("b", torch.full((100,), 2.0))  # replacing a page frees the old one
    assert_same(torch.full((100,), 2.0), store.get("b"))
    assert len(store) == 1
    store.clear()
    assert len(store) == 0 and store.bytes_held == 0


def test_only_dense_tensors_are_paged(store):
    with pytest.raises(TypeError, match="sparse"):
        store.put("s", torch.eye(3).to_sparse())
    assert len(store) == 0


def test_bytes_held_counts_header_and_payload(store):
    held = store.put("x", torch.zeros(1000, dtype=torch.float16))
    assert 2000 < held < 2400 and store.bytes_held == held


# Corruption ------------------------------------------------------------------------------------

def test_flash_detects_a_flipped_payload_byte(tmp_path):
    with FlashStore(tmp_path) as flash:
        flash.put(7, torch.arange(1000, dtype=torch.float32))
        path = flash.path_of(7)
        with open(path, "r+b") as page:
            page.seek(-10, os.SEEK_END)
            byte = page.read(1)
            page.seek(-10, os.SEEK_END)
            page.write(bytes([byte[0] ^ 0x01]))
        with pytest.raises(PageCorrupted) as error:
            flash.get(7)
        assert error.value.key == 7 and path in str(error.value) and "CRC32" in str(error.value)


@pytest.mark.parametrize("damage, expected", [
    (lambda data: data[:-1], "truncated"),
    (lambda data: data + b"!", "longer"),
    (lambda data: b"XXXX" + data[4:], "not a page"),
    (lambda data: data[:16] + b"#" + data[17:], "header CRC32"),
    (lambda data: data[:8] + b"\xff\xff\xff\x7f" + data[12:], "implausible"),
    (lambda data: data[:4] + b"\x09" + data[5:], "page version 9"),
], ids=["truncated", "extended", "magic", "header", "header length", "version"])
@pytest.mark.parametrize("drop_cache", [False, True], ids=["cached", "uncached"])
def test_flash_detects_damaged_files(tmp_path, damage, expected, drop_cache):
    with FlashStore(tmp_path, drop_cache=drop_cache) as flash:
        flash.put("n", torch.ones(64))
        path = flash.path_of("n")
        with open(path, "rb") as page:
            data = page.read()
        with open(path, "wb") as page:
            page.write(damage(data))
        with pytest.raises(PageCorrupted, match=expected):
            flash.get("n")


def test_flash_reports_a_removed_file(tmp_path):
    with FlashStore(tmp_path) as flash:
        flash.put("n", torch.ones(4))
        os.unlink(flash.path_of("n"))
        with pytest.raises(PageCorrupted, match="removed"):
            flash.get("n")


def test_link_detects_damage_on_the_way_back():
    host = MemoryStore()

    def fetch_damaged(key):
        data = bytearray(host.get_bytes(key))
        data[-1] ^= 0x80
        return bytes(data)

    link = LinkStore(host.put_bytes, fetch_damaged, host.drop_bytes, where="host over tcp")
    link.put(3, torch.randn(16))
    with pytest.raises(PageCorrupted, match="host over tcp"):
        link.get(3)


def test_codec_is_shared_between_stores(tmp_path):
    tensor = sample(torch.bfloat16)
    with FlashStore(tmp_path) as flash:
        flash.put("k", tensor)
        with open(flash.path_of("k"), "rb") as page:
            assert_same(tensor, decode(page.read(), "k", "a flash file"))
    assert encode(tensor).to_bytes() == open_bytes_of(MemoryStore(), tensor)


def open_bytes_of(memory: MemoryStore, tensor: torch.Tensor) -> bytes:
    memory.put("k", tensor)
    return memory.get_bytes("k")


# Clean-up --------------------------------------------------------------------------------------

def test_flash_cleans_up_after_step_close_and_exception(tmp_path):
    page_dir = tmp_path / "pages"
    flash = FlashStore(page_dir)
    flash.put("a", torch.ones(10))
    flash.put("b", torch.ones(10))
    assert len(os.listdir(flash.directory)) == 2
    flash.discard("a")  # its file is kept as a spare, for the next page of its size
    assert flash.keys() == ["b"] and len(os.listdir(flash.directory)) == 2
    flash.clear()  # end of step: both files spares
    assert flash.bytes_held == 0 and flash.spare_bytes > 0
    flash.clear()  # a step that took neither: they go
    assert os.listdir(flash.directory) == [] and flash.spare_bytes == 0
    flash.put("a", torch.ones(10))
    flash.close()
    assert os.listdir(page_dir) == []  # the page dir itself is the user's and stays
    with pytest.raises(PageStoreError, match="closed"):
        flash.put("c", torch.ones(1))

    with pytest.raises(RuntimeError, match="boom"):
        with FlashStore(page_dir) as flash:
            flash.put("a", torch.ones(10))
            raise RuntimeError("boom")
    assert os.listdir(page_dir) == []


def test_flash_rewrites_a_cleared_pages_file_in_place_the_next_step(tmp_path):
    with FlashStore(tmp_path, fsync=True, drop_cache=True) as flash:
        flash.put("x", torch.arange(5000.0))
        flash.put("y", torch.ones(3))
        first = os.stat(flash.path_of("x")).st_ino
        flash.clear()  # the step ends
        # The next step pages the same tensors (new values): the same files, written over.
        flash.put("x", torch.arange(5000.0) * 2)
        flash.put("y", torch.zeros(3))
        assert os.stat(flash.path_of("x")).st_ino == first
        assert_same(torch.arange(5000.0) * 2, flash.get("x"))
        assert_same(torch.zeros(3), flash.get("y"))
        assert len(os.listdir(flash.directory)) == 2 and flash.spare_bytes == 0
        # A header a byte longer or shorter (its CRC32 has another number of digits) fits the
        # same blocks: the file is cut to the page's length, and reads back whole.
        flash.clear()
        flash.put("z", torch.tensor([1.0, 2.0, 3.0]))
        assert_same(torch.tensor([1.0, 2.0, 3.0]), flash.get("z"))
        assert os.path.getsize(flash.path_of("z")) == flash.bytes_held


def test_flash_spares_count_against_the_capacity(tmp_path):
    with FlashStore(tmp_path, capacity_bytes=MiB) as flash:
        flash.put("a", torch.zeros(600 * 1024, dtype=torch.uint8))
        flash.clear()  # a 600 KiB spare: a page of another size needs its room
        flash.put("b", torch.zeros(700 * 1024, dtype=torch.uint8))
        assert flash.spare_bytes == 0 and len(os.listdir(flash.directory)) == 1
        assert_same(torch.zeros(700 * 1024, dtype=torch.uint8), flash.get("b"))


def test_flash_cleans_up_when_forgotten(tmp_path):
    flash = FlashStore(tmp_path)
    flash.put("a", torch.ones(10))
    del flash  # never closed: the finalizer removes its directory
    assert os.listdir(tmp_path) == []


def test_two_stores_share_a_page_dir_without_clashing(tmp_path):
    with FlashStore(tmp_path) as one, FlashStore(tmp_path) as two:
        one.put(1, torch.zeros(3))
        two.put(1, torch.ones(3))
        assert_same(torch.zeros(3), one.get(1))
        assert_same(torch.ones(3), two.get(1))


# Full ------------------------------------------------------------------------------------------

def test_flash_capacity_exceeded_is_clear(tmp_path):
    with FlashStore(tmp_path, capacity_bytes=1 * MiB) as flash:
        flash.put("first", torch.zeros(600 * 1024, dtype=torch.uint8))
        held = flash.bytes_held
        with pytest.raises(PageStoreFull) as error:
            flash.put("second", torch.zeros(600 * 1024, dtype=torch.uint8))
        message = str(error.value)
        assert error.value.needed_bytes > 600 * 1024
        assert str(error.value.needed_bytes) in message and str(tmp_path) in message
        assert "capacity" in message and "Remedy" in message
        assert flash.bytes_held == held and flash.keys() == ["first"]
        assert len(os.listdir(flash.directory)) == 1
        flash.put("first", torch.zeros(900 * 1024, dtype=torch.uint8))  # a replacement fits


def test_memory_and_link_capacity(tmp_path):
    host = MemoryStore(capacity_bytes=MiB)
    link = LinkStore(host.put_bytes, host.get_bytes, host.drop_bytes)
    link.put(1, torch.zeros(MiB // 2, dtype=torch.uint8))
    with pytest.raises(PageStoreFull, match="host memory"):  # refused by the host's own limit
        link.put(2, torch.zeros(MiB // 2, dtype=torch.uint8))
    assert link.keys() == [1] and host.keys() == [1]
    capped = LinkStore(host.put_bytes, host.get_bytes, host.drop_bytes, capacity_bytes=100)
    with pytest.raises(PageStoreFull, match="the host"):
        capped.put(3, torch.zeros(200, dtype=torch.uint8))
    link.clear()
    assert host.bytes_held == 0 and host.keys() == []


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A real 1 MiB tmpfs, so the kernel itself answers ENOSPC."""
    mount_point = tmp_path / f"tiny-{uuid.uuid4().hex[:8]}"
    mount_point.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a 1 MiB tmpfs to make a real full disk (needs root and "
                    f"CAP_SYS_ADMIN): {done.stderr.strip() or done.returncode}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)


@pytest.mark.parametrize("drop_cache", [False, True], ids=["buffered", "around-the-cache"])
def test_disk_full_is_a_clear_error_and_leaves_nothing(tiny_filesystem, drop_cache):
    """around-the-cache is how the executor writes (O_DIRECT where the filesystem takes it, as
    tmpfs does on Linux 6.6+): QA filled the page dir mid-run and the job failed with
    'BufferError: cannot close exported pointers exist', the disk-full error lost."""
    with FlashStore(tiny_filesystem, drop_cache=drop_cache) as flash:
        flash.put("small", torch.ones(1000))
        with pytest.raises(PageStoreFull) as error:
            flash.put("big", torch.zeros(2 * MiB, dtype=torch.uint8))
        full = error.value
        assert isinstance(full.__cause__, OSError) and full.__cause__.errno == errno.ENOSPC
        assert full.free_bytes is not None and full.free_bytes < MiB
        message = str(full)
        assert "No space left on device" in message and str(tiny_filesystem) in message
        assert str(full.needed_bytes) in message and "bytes are free" in message
        # deploy and run have no --page-dir: the remedy names where the folder is set
        assert "[hardware] page_dir in the device config" in message
        assert sorted(os.listdir(flash.directory)) == [os.path.basename(flash.path_of("small"))]
        assert flash.keys() == ["small"]
        assert_same(torch.ones(1000), flash.get("small"))  # the store still works
    assert os.listdir(tiny_filesystem) == []


def test_pinned_store_keeps_values_and_layout_and_its_capacity():
    """PinnedStore is the host tier of runs on CUDA (tests/test_cuda.py runs it there); with a
    CPU tensor it keeps an ordinary copy, which this machine can check."""
    store = PinnedStore(capacity_bytes=1000)
    value = sample(torch.float32, (5, 6)).t()
    assert store.put("a", value) == 120
    into = torch.empty_strided(value.shape, value.stride())
    with reading_into(lambda nbytes, dtype, shape, stride, key: into):
        back = store.get("a")
    assert back is into and torch.equal(back.view(torch.int32), value.view(torch.int32))
    value.fill_(0)  # the page is a copy
    assert not torch.equal(store.get("a").view(torch.int32), value.view(torch.int32))
    with pytest.raises(PageStoreFull):
        store.put("b", torch.zeros(1000))
    with pytest.raises(PageMissing):
        store.get("b")
    assert store.discard("a") and not store.discard("a") and store.bytes_held == 0


def test_a_page_folder_that_cannot_be_made_says_which_field_to_change(tmp_path):
    """A page_dir under a file stands in for a read-only one (root writes anywhere else). QA:
    "cannot create a page directory under ...: Read-only file system", no remedy, and only
    after the capture."""
    from edge_remat_agent.executor.jobs import _check_page_dir
    from edge_remat_agent.formats import Instruction, Plan
    from edge_remat_agent.pages import FlashStore, PageStoreError
    (tmp_path / "a-file").write_text("not a folder")
    page_dir = tmp_path / "a-file" / "pages"
    with pytest.raises(PageStoreError, match=r"Remedy: point page_dir at a writable folder.*"
                                             r"\[hardware\] page_dir"):
        FlashStore(str(page_dir))

    def plan(*instructions) -> Plan:
        return Plan(graph_fingerprint="x", budget_bytes=1, stages=[list(instructions)])
    with pytest.raises(ValueError, match=r"cannot hold pages: .*Remedy: point page_dir"):
        _check_page_dir(plan(Instruction("page_out", "n", "flash")), str(page_dir))
    _check_page_dir(plan(Instruction("compute", "n")), str(page_dir))  # no flash: fine
    # a page_dir that is itself a file (QA: "File exists")
    with pytest.raises(PageStoreError, match=r"a-file is a file, not a folder\. Remedy"):
        FlashStore(str(tmp_path / "a-file"))


def test_the_page_folder_check_before_the_capture_imports_no_torch(tmp_path):
    """The run job checks its page folder before the board captures the graph, and the capture
    child must not find torch resident in the job beside it: the check once imported torch
    (through the flash store), and gpt-mini under 600 MiB was killed while capturing."""
    import subprocess
    import sys
    code = f"""
import sys
from edge_remat_agent.executor.jobs import _check_page_dir
from edge_remat_agent.formats import Instruction, Plan
plan = Plan(graph_fingerprint="x", budget_bytes=1, stages=[[Instruction("page_out", "n", "flash")]])
_check_page_dir(plan, {str(tmp_path / 'pages')!r})
print("torch" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_page_folder_whose_parent_is_missing_is_refused_not_made_with_it(tmp_path):
    """A page folder on a drive that is not mounted (/mnt/ssd/pages, /mnt/ssd absent) was made
    with all its parents, and the pages silently landed on the card the system runs from. Now
    only the last component is made; a missing parent is refused in one line naming the folder
    and where it is set, by the store, the run job's check and `devices --check`."""
    from edge_remat_agent.daemon.sysinfo import page_dir_status
    from edge_remat_agent.executor.jobs import _check_page_dir
    from edge_remat_agent.formats import Instruction, Plan
    from edge_remat_agent.pages import FlashStore, PageStoreError
    drive = tmp_path / "mnt" / "ssd"
    page_dir = drive / "pages"
    said = rf"{re.escape(str(page_dir))}: its parent folder {re.escape(str(drive))} does not " \
           r"exist .*\[hardware\] page_dir in the device config, or the agent's --page-dir"
    with pytest.raises(PageStoreError, match=said):
        FlashStore(str(page_dir))
    plan = Plan(graph_fingerprint="x", budget_bytes=1,
                stages=[[Instruction("page_out", "n", "flash")]])
    with pytest.raises(ValueError, match=r"cannot hold pages: .*does not exist.*page_dir") as job:
        _check_page_dir(plan, str(page_dir))
    status = page_dir_status(page_dir)
    assert "\n" not in str(job.value) and not status["ok"]
    assert f"its parent folder {drive} does not exist" in status["error"]
    assert not (tmp_path / "mnt").exists()  # nothing made on the way
    drive.mkdir(parents=True)  # mounted: the last component is made, as before
    with FlashStore(str(page_dir)) as flash:
        flash.put("a", torch.ones(3))
    assert page_dir.is_dir() and page_dir_status(page_dir)["ok"]


# Several pages at once (a parameter group and its optimizer state) ------------------------------

def group_of_tensors() -> dict[str, torch.Tensor]:
    """A layer's parameters: a few large tensors and small ones between them."""
    return {"q.weight": sample(torch.float32, (64, 64)), "q.bias": sample(torch.float32, (64,)),
            "norm.weight": sample(torch.bfloat16, (7,)),
            "ffn.weight": sample(torch.float32, (256, 64)).t(),  # transposed: its strides kept
            "step": torch.tensor(3.0)}


def test_put_many_and_get_many_round_trip_in_any_order(store):
    values = group_of_tensors()
    held = store.put_many(list(values.items()))
    assert held == store.bytes_held
    names = list(values)
    for order in (names, names[::-1], names[1:3]):
        for name, restored in zip(order, store.get_many(order)):
            assert_same(values[name], restored)
            assert restored.stride() == values[name].stride()
    assert_same(values["norm.weight"], store.get("norm.weight"))  # one page from the middle


@pytest.mark.parametrize("drop_cache", [False, True], ids=["cached", "uncached"])
def test_flash_writes_a_group_as_one_file_kept_while_any_page_is(tmp_path, drop_cache):
    values = group_of_tensors()
    with FlashStore(tmp_path, fsync=True, drop_cache=drop_cache) as flash:
        flash.put_many(list(values.items()))
        assert len(os.listdir(flash.directory)) == 1
        assert {flash.path_of(name) for name in values} == {flash.path_of("q.weight")}
        assert os.path.getsize(flash.path_of("q.weight")) == flash.bytes_held
        # Pages discarded one by one: the file holds the rest until the last goes, then is
        # a spare that a group of the same size is written over in place the next step.
        inode = os.stat(flash.path_of("q.weight")).st_ino
        for name in list(values)[:-1]:
            flash.discard(name)
            assert flash.spare_bytes == 0
        assert_same(values["step"], flash.get("step"))
        flash.discard("step")
        assert flash.bytes_held == 0 and flash.spare_bytes > 0
        again = {name: value * 2 for name, value in values.items()}
        flash.put_many(list(again.items()))
        assert os.stat(flash.path_of("q.bias")).st_ino == inode and flash.spare_bytes == 0
        for name, restored in zip(again, flash.get_many(list(again))):
            assert_same(again[name], restored)


def test_flash_put_many_replacing_pages_drops_a_file_once_all_its_pages_are_replaced(tmp_path):
    with FlashStore(tmp_path) as flash:
        flash.put_many([("a", torch.ones(10)), ("b", torch.ones(20))])
        old = flash.path_of("a")
        flash.put_many([("a", torch.zeros(10)), ("c", torch.zeros(5))])  # "b" is still in old
        assert os.path.exists(old) and flash.path_of("b") == old
        flash.put("b", torch.full((20,), 2.0))
        assert not os.path.exists(old)
        assert_same(torch.zeros(10), flash.get("a"))
        assert_same(torch.full((20,), 2.0), flash.get("b"))
        assert len(os.listdir(flash.directory)) == 2


def capped_store(kind: str, tmp_path, capacity: int):
    if kind == "flash":
        return FlashStore(tmp_path, capacity_bytes=capacity)
    if kind == "link":
        host = MemoryStore()
        return LinkStore(host.put_bytes, host.get_bytes, host.drop_bytes, capacity_bytes=capacity)
    return {"memory": MemoryStore, "pinned": PinnedStore}[kind](capacity_bytes=capacity)


@pytest.mark.parametrize("kind", ["flash", "link", "memory", "pinned"])
def test_put_many_over_capacity_keeps_the_pages_it_would_replace(tmp_path, kind):
    # The in-memory stores put page by page: "a" is replaced before "b" fails, and put back.
    with capped_store(kind, tmp_path, 100_000) as store:
        store.put_many([("a", torch.ones(1000)), ("b", torch.ones(1000))])
        held = store.bytes_held
        with pytest.raises(PageStoreFull) as error:
            store.put_many([("a", torch.zeros(1000)), ("b", torch.zeros(200_000)),
                            ("c", torch.zeros(10))])
        assert "'b'" in str(error.value)
        assert sorted(store.keys()) == ["a", "b"] and store.bytes_held == held
        for restored in store.get_many(["a", "b"]):
            assert_same(torch.ones(1000), restored)
        if kind == "flash":
            assert len(os.listdir(store.directory)) == 1


@pytest.mark.parametrize("drop_cache", [False, True], ids=["cached", "uncached"])
def test_flash_detects_damage_inside_a_group_file(tmp_path, drop_cache):
    values = group_of_tensors()
    with FlashStore(tmp_path, drop_cache=drop_cache) as flash:
        flash.put_many(list(values.items()))
        path = flash.path_of("q.weight")
        with open(path, "rb") as page:
            data = bytearray(page.read())
        data[len(data) // 2] ^= 0x01  # inside the transposed ffn weight's payload
        with open(path, "wb") as page:
            page.write(data)
        assert_same(values["q.bias"], flash.get("q.bias"))  # the other pages read whole
        with pytest.raises(PageCorrupted, match="CRC32") as error:
            flash.get_many(list(values))
        assert error.value.key == "ffn.weight"
        with open(path, "wb") as page:
            page.write(data[:-3])  # the last page cut short
        with pytest.raises(PageCorrupted, match="truncated"):
            flash.get("step")


def test_put_many_takes_distinct_keys(tmp_path):
    with FlashStore(tmp_path) as flash:
        with pytest.raises(ValueError, match="distinct"):
            flash.put_many([("a", torch.ones(1)), ("a", torch.ones(1))])


def test_link_sends_a_group_in_one_round_trip_and_the_host_forgets_it_with_its_last_page():
    host, calls = MemoryStore(), []

    def send(key, data):
        calls.append(("send", key))
        return host.put_bytes(key, data)

    def fetch(key):
        calls.append(("fetch", key))
        return host.get_bytes(key)

    link = LinkStore(send, fetch, host.drop_bytes)
    values = group_of_tensors()
    link.put_many(list(values.items()))
    assert [op for op, _ in calls] == ["send"] and len(host) == 1
    for name, restored in zip(values, link.get_many(list(values))):
        assert_same(values[name], restored)
    assert [op for op, _ in calls] == ["send", "fetch"]
    for name in list(values)[:-1]:
        link.discard(name)
        assert len(host) == 1
    link.discard("step")
    assert len(host) == 0 and link.bytes_held == 0
    link.put("alone", torch.ones(3))  # a page put alone goes under its own key, as before
    assert calls[-1] == ("send", "alone")
