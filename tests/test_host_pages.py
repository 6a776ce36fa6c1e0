"""The `host` page tier through the host's page service (edge_remat_agent.pages.service): the
service and a LinkStore over its client round-trip pages bitwise, refuse what does not fit and
catch damaged pages; the executor pages a plan's `host` pages out of its own process into the
service and trains to the same bits; `deploy` starts the service for the run job on a local
board; over SSH the board reaches it through a reverse port forward of the real sshd; a serial
board is refused in one line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
import threading
import time

import pytest
import torch
from typer.testing import CliRunner

from helpers.board_fixtures import (SshServer, local_bench_device, loopback_ssh_board, needs_sshd,
                            ssh_device_config, stop_agent)
from edge_remat_agent.pages import PageCorrupted, PageMissing, PageStoreFull
from edge_remat_agent.pages.link import connect_store
from edge_remat_agent.pages.service import PageClient, PageService, PageServiceError

pytestmark = [pytest.mark.slow, pytest.mark.loopback]


# -- the service and its client -----------------------------------------------------------------

def test_pages_round_trip_bitwise_through_the_service():
    tensors = {7: torch.randn(3, 5), "12": torch.arange(10, dtype=torch.int64),
               3: torch.randn(4, 6).t(), 9: torch.tensor([True, False])}
    with PageService() as service:
        assert service.host == "127.0.0.1" and service.port > 0
        store = connect_store(service.address)
        for key, tensor in tensors.items():
            assert store.put(key, tensor) > tensor.numel()
        assert service.stats()["pages"] == 4 and service.bytes_held == store.bytes_held > 0
        for key, tensor in tensors.items():
            back = store.get(key)
            assert back.dtype == tensor.dtype and back.stride() == tensor.stride()
            assert torch.equal(back, tensor)
        assert torch.equal(store.get(7), tensors[7])  # read twice: still there
        assert store.discard(7) and not store.discard(7)
        with pytest.raises(PageMissing):
            store.get(7)
        assert service.stats()["pages"] == 3
        store.put("12", torch.zeros(2))  # replacing a page
        assert torch.equal(store.get("12"), torch.zeros(2))
        peak = service.peak_bytes
        store.clear()
        assert service.bytes_held == 0 and service.peak_bytes == peak > 0
        store.close()
    with pytest.raises(PageServiceError, match="cannot reach the host page service"):
        connect_store(service.address)  # closed: nothing listens there any more


def test_a_full_service_and_a_damaged_page_are_clear_errors():
    with PageService(capacity_bytes=600) as service:
        store = connect_store(service.address)
        store.put(1, torch.zeros(16))
        with pytest.raises(PageStoreFull, match="600-byte capacity"):
            store.put(2, torch.zeros(1000))
        assert 2 not in store and service.stats()["pages"] == 1
        # the page changes on the way back: the codec's CRC32 catches it
        key = next(iter(service._pages))
        data = bytearray(service._pages[key])
        data[-1] ^= 0xFF
        service._pages[key] = bytes(data)
        with pytest.raises(PageCorrupted, match="CRC32"):
            store.get(1)
        store.close()


def test_the_client_reconnects_once_after_a_broken_connection():
    with PageService() as service:
        client = PageClient(service.address).connect()
        client.send("a", b"x" * 100_000)
        for conn in list(service._conns):  # the host side drops the connection
            conn.shutdown(socket.SHUT_RDWR)
        assert client.fetch("a") == b"x" * 100_000
        with pytest.raises(KeyError):
            client.fetch("b")
        client.close()


class Relay:
    """A TCP relay on a fixed 127.0.0.1 port to the page service: cut() closes its listener and
    every bridged connection at once, as a dropped SSH link closes the board's end of the
    forward; resume() listens on the same port again, as the host's new forward does."""

    def __init__(self, target: tuple[str, int]):
        self.target, self.port, self._socks = target, 0, []
        self.resume()

    def resume(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self.port = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener) -> None:
        while True:
            try:
                board_end, _ = listener.accept()
            except OSError:
                return
            self._admit(board_end)

    def _admit(self, board_end) -> None:
        """A connection the board made: bridged to the service at once."""
        self._bridge(board_end)

    def _bridge(self, board_end) -> None:
        host_end = socket.create_connection(self.target)
        self._socks += [board_end, host_end]
        for a, b in ((board_end, host_end), (host_end, board_end)):
            threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src, dst) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass

    def cut(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept() above (close alone does not)
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        for sock in self._socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._socks = []


def test_a_request_waits_for_a_dropped_link_to_come_back_and_is_applied_once():
    """The board's page client, when the link under it drops mid-run, keeps trying until the
    link is back (QA: it tried once at once, Connection refused, and the job failed)."""
    with PageService() as service:
        relay = Relay((service.host, service.port))
        client = PageClient(f"127.0.0.1:{relay.port}", wait_s=30).connect()
        page = bytes(range(256)) * 1000
        client.send("a", page)
        relay.cut()
        threading.Timer(1.5, relay.resume).start()  # the host forwards the port again
        started = time.monotonic()
        client.send("a", page)  # sent again after the drop: replaces, never adds
        assert time.monotonic() - started >= 1.0  # it waited for the link
        assert client.fetch("a") == page
        assert service.stats()["pages"] == 1 and service.bytes_held == len(page)
        relay.cut()
        client.close()


def test_a_link_that_stays_down_is_one_error_with_a_remedy():
    with PageService() as service:
        relay = Relay((service.host, service.port))
        client = PageClient(f"127.0.0.1:{relay.port}", wait_s=1.0).connect()
        client.stats()  # a round trip: the relay has bridged the connection before the cut
        relay.cut()
        started = time.monotonic()
        with pytest.raises(PageServiceError) as gave_up:
            client.fetch("a")
        assert 1.0 <= time.monotonic() - started < 10
        message = str(gave_up.value)
        assert "did not come back within 1 s" in message and "reconnect_timeout_s" in message
        assert "\n" not in message


class UnsteadyRelay(Relay):
    """A Relay whose link can hang and come back, and move slowly. hang(): what the bridged
    connections carry is lost on the way, silently (no reset, no close: a link that drops
    packets), and a connection made meanwhile is held, unread; heal(): the held ones are
    bridged (their bytes were never read, so none is lost) and the link carries again.
    `rate_bps`: at most that many bytes a second each way."""

    def __init__(self, target: tuple[str, int], rate_bps: float | None = None):
        self.rate_bps, self.hung, self._held = rate_bps, False, []
        self._lock = threading.Lock()
        super().__init__(target)

    def hang(self) -> None:
        self.hung = True

    def heal(self) -> None:
        with self._lock:
            self.hung = False
            held, self._held = self._held, []
        for board_end in held:
            self._bridge(board_end)

    def _admit(self, board_end) -> None:
        with self._lock:
            if self.hung:
                self._held.append(board_end)
                self._socks.append(board_end)
                return
        self._bridge(board_end)

    def _pump(self, src, dst) -> None:
        try:
            while data := src.recv(16 << 10):
                if self.hung:
                    continue  # lost on the way
                if self.rate_bps:
                    time.sleep(len(data) / self.rate_bps)
                dst.sendall(data)
        except OSError:
            pass


def test_a_hung_link_is_noticed_in_seconds_and_the_request_retried():
    """A link that hangs (packets lost, no reset) is a break once a request gets no reply for
    REQUEST_FLOOR_S, and the request is sent again on a new connection, as after a drop (QA:
    the board's page client waited out its 60 s socket timeout on one request before its
    reconnect logic began)."""
    with PageService() as service:
        relay = UnsteadyRelay((service.host, service.port))
        client = PageClient(f"127.0.0.1:{relay.port}", wait_s=60).connect()
        page = bytes(range(256)) * 512
        client.send("a", page)
        relay.hang()
        outcome: dict = {}

        def fetch():
            try:
                outcome["page"] = client.fetch("a")
            except Exception as exc:  # noqa: BLE001 - said by the assertion below
                outcome["error"] = exc

        started = time.monotonic()
        fetcher = threading.Thread(target=fetch, daemon=True)
        fetcher.start()
        try:
            while client.breaks == 0 and time.monotonic() - started < 30:
                time.sleep(0.05)
            noticed = time.monotonic() - started
            assert client.breaks == 1, f"a hung link was not noticed in {noticed:.0f} s"
            assert noticed < 15  # REQUEST_FLOOR_S, 10 s
        finally:
            relay.heal()  # the link is back: the request sent again goes through
            fetcher.join(30)
        assert outcome.get("page") == page, outcome
        assert client.breaks == 1 and client.lost is None
        relay.cut()
        client.close()


def test_a_slow_link_that_moves_bytes_is_never_cut():
    """A page that takes several times the request floor to cross a slow link (a Pi on a slow
    link moving a large page) goes through without a break: each chunk the link takes or
    gives restarts the clock, and the reply to a page sent may wait for the page's bytes at
    SLOWEST_LINK_BPS on top of the floor."""
    with PageService() as service:
        relay = UnsteadyRelay((service.host, service.port), rate_bps=128 << 10)
        client = PageClient(f"127.0.0.1:{relay.port}", timeout_s=1.0, wait_s=0.5).connect()
        page = bytes(range(256)) * (384 * 4)  # 384 KiB: 3 s each way
        started = time.monotonic()
        client.send("big", page)
        assert client.fetch("big") == page
        assert time.monotonic() - started >= 5.0  # it was slow: 5-6 s against a 1 s floor
        assert client.breaks == 0
        relay.cut()
        client.close()


# -- the executor pages to host through the service ---------------------------------------------

def host_plan(captured):
    """Every forward node recomputed, each recomputation a page round trip to `host`."""
    from helpers.executor_plans import FLASH, every_forward_recomputed, with_paging
    from edge_remat_agent.costs import build_costs
    from edge_remat_agent.formats import Instruction
    from edge_remat_agent.simulate import simulate
    graph = captured.graph
    plan = with_paging(every_forward_recomputed(graph), graph, every=1)
    stages = [[Instruction(i.op, i.node, "host") if i.tier == "flash" else i for i in stage]
              for stage in plan.stages]
    sim = simulate(graph, build_costs(graph, None, {"host": FLASH}), stages)
    return dataclasses.replace(plan, stages=stages, predicted=sim.summary(),
                               tiers={"host": FLASH})


@pytest.fixture(scope="module")
def captured():
    from helpers.executor_plans import EXAMPLE
    from edge_remat_agent.capture import capture_model
    return capture_model(EXAMPLE, batch=4, image=16)


def test_the_executor_pages_to_the_host_service_and_trains_bitwise(captured):
    from edge_remat_agent.executor import run_plan
    from edge_remat_agent.executor.stores import host_link_store
    plan = host_plan(captured)
    assert host_link_store(plan, None) is None  # no service given: pages stay in-process
    with PageService() as service:
        store = host_link_store(plan, service.address)
        try:
            report = run_plan(captured.graph, plan, 2, None, captured=captured, seed=3,
                              stores={"host": store})
        finally:
            store.close()
        seen = service.stats()
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    assert report["page_outs"] > 0 and report["page_ins"] > 0
    assert seen["peak_bytes"] > 0 and seen["puts"] >= report["page_outs"] and seen["gets"] > 0
    assert seen["bytes_held"] == 0 and seen["pages"] == 0  # every page dropped after the run
    tier = report["tiers"]["host"]
    assert tier["store"] == "ServiceStore" and service.address in tier["where"]
    assert tier["service"]["peak_bytes"] == seen["peak_bytes"]
    # the training process kept sizes only, never page bytes
    assert all(isinstance(size, int) and isinstance(offset, int)
               for _, size, offset in store._index.values())


def test_without_a_service_the_report_says_pages_stayed_in_process(captured):
    from edge_remat_agent.executor import run_plan
    report = run_plan(captured.graph, host_plan(captured), 1, None, captured=captured,
                      check_gradients=False)
    assert report["tiers"]["host"]["store"] == "MemoryStore"
    assert "frees no RAM" in report["tiers"]["host"]["note"]


# -- the host starts the service for the run job ------------------------------------------------

@pytest.fixture
def local_board(tmp_path, monkeypatch):
    folder, workdir = local_bench_device(tmp_path, monkeypatch)
    yield "bench"
    stop_agent(workdir)


def test_deploy_pages_to_the_host_service_on_a_local_board(captured, local_board, tmp_path):
    from edge_remat.cli import app
    graph_file, plan_file = tmp_path / "graph.json", tmp_path / "plan.json"
    captured.graph.save(graph_file)
    host_plan(captured).save(plan_file)
    result = CliRunner().invoke(app, ["deploy", str(plan_file), "--device", local_board,
                                      "--graph", str(graph_file), "--steps", "1",
                                      "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["status"] == "finished" and answer["result"]["grad_check"]["bitwise_equal"]
    assert "host pages: page service at 127.0.0.1:" in result.stderr
    report = json.loads((tmp_path / "out" / "run_report.json").read_text())
    tier = report["tiers"]["host"]
    assert report["page_outs"] > 0 and tier["store"] == "ServiceStore"
    assert tier["where"].startswith("host page service at 127.0.0.1:")
    assert tier["service"]["peak_bytes"] > 0


def test_keep_running_cannot_hold_a_job_that_pages_to_the_host(captured, local_board,
                                                               tmp_path):
    """The page service ends with `deploy`, and the job with it: Ctrl-C with --keep-running
    cancels the job and says why, instead of leaving it to fail on its next page."""
    import signal
    import subprocess

    from helpers.bad_inputs import COMMAND, INTERRUPTED, cli, env, refused
    graph_file, plan_file = tmp_path / "graph.json", tmp_path / "plan.json"
    captured.graph.save(graph_file)
    host_plan(captured).save(plan_file)
    proc = subprocess.Popen([*COMMAND, "deploy", str(plan_file), "--device", local_board,
                             "--graph", str(graph_file), "--steps", "100000", "--keep-running",
                             "--out", str(tmp_path / "out")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env())
    seen = []
    for line in proc.stderr:  # until the job trains on the board
        seen.append(line)
        if "/100000:" in line:  # a step done (progress may skip some)
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(seen) + err)
    line = refused(done, INTERRUPTED, "cancelled job", "page service")
    assert "keeps running" not in line
    assert any(l.startswith("warning: --keep-running does not hold") for l in seen), seen
    job_id = line.split("job ")[1].split()[0]
    state = json.loads(cli("job-status", job_id, "--device", local_board, "--json",
                           environ=env()).stdout)
    assert state["status"] == "cancelled" and "cancelled" in state["error"], state


def test_profile_measures_the_link_to_the_host_page_service(local_board, tmp_path):
    """`edge-remat profile` starts the page service for the profile job, which times page round
    trips to it: the profile's `host` tier, as a run's host pages would travel."""
    from edge_remat.cli import app
    from edge_remat_agent.formats import load_profile
    result = CliRunner().invoke(app, ["profile", "--device", local_board, "--out",
                                      str(tmp_path / "prof"), "--json", "--param",
                                      "sizes=64KiB,1MiB", "--param", "idle_s=0.1", "--param",
                                      "busy_s=0.1", "--param", "no_footprint=true"])
    assert result.exit_code == 0, result.output
    profile = load_profile(tmp_path / "prof" / "profile.json")
    host = profile.tiers["host"]
    assert host.read_bytes_per_s > 0 and host.write_bytes_per_s > 0
    method = profile.measurements["tiers"]["host"]["method"]
    assert "page service (127.0.0.1:" in method and method.startswith("ServiceStore")


def test_a_serial_board_refuses_the_host_tier_in_one_line():
    from edge_remat.transport import TransportError
    from edge_remat.transport.host_pages import host_pages

    class Serial:
        name = "uart"
        device = type("D", (), {"connection": type("C", (), {"kind": "serial"})()})()

    with host_pages(Serial(), False) as params:
        assert params == {}  # a plan that does not page to host needs nothing
    with pytest.raises(TransportError, match="serial link.*--paging flash") as refused:
        with host_pages(Serial(), True):
            pass
    assert "\n" not in str(refused.value)


@needs_sshd
def test_the_board_reaches_the_service_through_an_ssh_reverse_forward(tmp_path):
    from edge_remat.devices import find_device
    from edge_remat.transport import Board
    from edge_remat.transport.host_pages import host_pages
    (tmp_path / "sshd").mkdir()
    sshd = SshServer(tmp_path / "sshd").start()
    workdir = tmp_path / "board"
    config = ssh_device_config(tmp_path / "loopback.toml", sshd, workdir,
                               "connect_timeout_s = 10\n[hardware]\nsensor = \"none\"\n")
    said = []
    try:
        with Board(find_device(str(config))) as board:
            with host_pages(board, True, said.append) as params:
                address = params["host_pages"]
                assert address.startswith("127.0.0.1:") and "SSH reverse forward" in said[0]
                # the board's side of the forward is loopback on the same machine here
                store = connect_store(address)
                tensor = torch.randn(300, 100)
                store.put(5, tensor)
                assert torch.equal(store.get(5), tensor)
                store.close()
            with pytest.raises(PageServiceError):  # the forward is gone with the service
                connect_store(address, timeout_s=5).get(5)
    finally:
        stop_agent(workdir)
        sshd.stop()


@needs_sshd
def test_a_page_read_over_a_dropped_ssh_link_waits_for_the_reconnect(tmp_path):
    """The real sshd drops every session under a page read: the read waits, the host reconnects
    and forwards the same port again, and the read gets its page (QA: the job failed)."""
    from edge_remat.devices import find_device
    from edge_remat.transport import Board
    from edge_remat.transport.host_pages import host_pages
    with loopback_ssh_board(tmp_path) as (config, sshd, _):
        with Board(find_device(str(config))) as board:
            with host_pages(board, True) as params:
                assert params["host_pages_wait_s"] == 30 + 30  # reconnect_timeout_s + forward
                store = connect_store(params["host_pages"], wait_s=params["host_pages_wait_s"])
                tensor = torch.randn(300, 100)
                store.put(5, tensor)
                assert sshd.drop_connections() >= 1
                got = []
                reader = threading.Thread(target=lambda: got.append(store.get(5)))
                reader.start()
                time.sleep(1.0)
                board.jobs()  # the host notices the drop, reconnects, forwards again
                reader.join(60)
                assert got and torch.equal(got[0], tensor)
                store.close()


@needs_sshd
def test_deploy_over_ssh_pages_to_the_host_through_the_reverse_forward(captured, tmp_path):
    from edge_remat.cli import app
    graph_file, plan_file = tmp_path / "graph.json", tmp_path / "plan.json"
    captured.graph.save(graph_file)
    host_plan(captured).save(plan_file)
    with loopback_ssh_board(tmp_path) as (config, _, _):
        result = CliRunner().invoke(app, ["deploy", str(plan_file), "--device", str(config),
                                          "--graph", str(graph_file), "--steps", "1",
                                          "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    assert "SSH reverse forward" in result.stderr
    answer = json.loads(result.stdout)
    assert answer["status"] == "finished" and answer["result"]["grad_check"]["bitwise_equal"]
    report = json.loads((tmp_path / "out" / "run_report.json").read_text())
    tier = report["tiers"]["host"]
    assert report["page_outs"] > 0 and tier["store"] == "ServiceStore"
    assert tier["service"]["peak_bytes"] > 0 and tier["service"]["gets"] > 0
