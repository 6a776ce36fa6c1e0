"""SSH transport (paramiko): connect (honouring ~/.ssh/config aliases and ProxyJump), check the
board, push the agent archive over SFTP only when the board lacks that exact archive, and run
`edge-remat-agent serve --stdio` over an exec channel.

Host keys: "strict" refuses a host whose key is not in known_hosts and says how to add it;
"accept-new" trusts a first-seen key and appends it to known_hosts; neither accepts a key that
differs from the recorded one.
"""

from __future__ import annotations

import base64
import errno
import hashlib
import ipaddress
import json
import os
import re
import shlex
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional
from urllib.parse import unquote_plus

from ..devices import DeviceConfig
from .errors import (AuthRefused, BoardMissingPython, BoardOutOfDisk, BoardUnreachable,
                     HostKeyChanged, HostKeyUnknown, LinkLost, SshConfigError, TransportError)
from .hints import MIN_PYTHON, python_hint
from .session import AgentSession
from .zipapp import AgentArchive, build_agent_archive

DISK_MARGIN = 1 << 20

# Runs on the board with whatever Python is there (even 2.7, to report it is too old): the
# version, torch presence, free disk, and whether agents/NAME already has the wanted hash.
PROBE = r"""
import sys, os, json, hashlib
r = {"python": list(sys.version_info[:3]), "cwd": os.getcwd(), "has_agent": False,
     "current": None, "torch": None, "free": None}
try:
    import importlib.util
    r["torch"] = importlib.util.find_spec("torch") is not None
except Exception:
    pass
try:
    st = os.statvfs(".")
    r["free"] = st.f_bavail * st.f_frsize
except Exception:
    pass
p = os.path.join("agents", sys.argv[1])
if os.path.isfile(p):
    h = hashlib.sha256()
    f = open(p, "rb")
    h.update(f.read())
    f.close()
    r["has_agent"] = h.hexdigest() == sys.argv[2]
if os.path.isfile("agent.current"):
    f = open("agent.current")
    r["current"] = f.read().strip()
    f.close()
sys.stdout.write("\nEDGE-REMAT-PROBE " + json.dumps(r) + "\n")
"""


@dataclass
class Hop:
    """One SSH server on the way: the board itself, or a ProxyJump host before it."""
    alias: str
    hostname: str
    port: int
    user: Optional[str]
    key_files: List[str] = field(default_factory=list)
    key_setting: str = ""  # where key_files were given, for a message; "" = the device's `key`

    def label(self) -> str:
        user = f"{self.user}@" if self.user else ""
        return f"{user}{self.hostname}:{self.port}"


@dataclass
class _SshConfigFile:
    """The parsed ssh_config, with its path as the device config names it: an error in one of
    its values names the file, the host entry and the value."""
    path: str
    parsed: object  # paramiko.SSHConfig

    def lookup(self, alias: str) -> dict:
        return self.parsed.lookup(alias)

    def port(self, alias: str, line: str, text: str) -> int:
        """`text`, from the `line` it came from in host `alias`'s entry, as a port number."""
        if re.fullmatch(r"[0-9]{1,5}", text.strip()) and 0 < int(text) < 65536:
            return int(text)
        # bad input, as a file paramiko cannot parse (QA: int() raised out of a check thread)
        raise self.bad_line(alias, line, f"{text!r} is not a port number (1 to 65535)")

    def bad_line(self, alias: str, line: str, why: str) -> SshConfigError:
        """The one-line error for a value of host `alias`'s entry that cannot be used: the
        file (and the line's number, where the line is found in it), the line and why."""
        return SshConfigError(f"cannot use {self._where(line)}: host {alias!r} has `{line}`, "
                              f"and {why}: fix that line (`ssh -G {alias}` shows how OpenSSH "
                              "reads it), or give host, port, user and key in the device "
                              "config and set ssh_config = \"none\"")

    def _where(self, line: str) -> str:
        keyword, _, value = line.partition(" ")
        try:
            with open(os.path.expanduser(self.path), errors="replace") as handle:
                for number, text in enumerate(handle, 1):
                    found = re.match(r"\s*(\w+)(?:\s*=\s*|\s+)(.*?)\s*$", text)
                    if found and found.group(1).lower() == keyword.lower() and \
                            found.group(2).strip('"') == value:
                        return f"{self.path} line {number}"
        except OSError:
            pass
        return self.path


def _ssh_config(path: str, alias: str = "") -> _SshConfigFile:
    return _SshConfigFile(path, _parsed_ssh_config(path, alias))


def _parsed_ssh_config(path: str, alias: str):
    """The ssh_config file, parsed. One paramiko cannot parse is an error for a device whose
    host it names; for any other device it is skipped (its settings are not needed there)."""
    import paramiko
    expanded = os.path.expanduser(path)
    if not os.path.isfile(expanded):
        return paramiko.SSHConfig()
    try:
        return paramiko.SSHConfig.from_path(expanded)
    except (paramiko.ssh_exception.ConfigParseError, OSError, ValueError) as exc:
        if not _names_host(expanded, alias):
            return paramiko.SSHConfig()
        raise SshConfigError(f"cannot read {path} ({exc}), which names {alias!r}: fix that "
                             "line (`ssh -G HOST` shows how OpenSSH reads it), or give host, "
                             "port, user and key in the device config and set ssh_config = "
                             "\"none\"") from None


def _names_host(path: str, alias: str) -> bool:
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return True
    return bool(alias) and any(alias in line.split() for line in text.splitlines()
                               if line.strip().lower().startswith(("host ", "host=", "match")))


def _hop(config: _SshConfigFile, alias: str, port: Optional[int] = None,
         user: Optional[str] = None, key: Optional[str] = None) -> "tuple[Hop, Optional[str]]":
    """Resolve an alias through ssh_config; explicit values win, as on ssh's command line."""
    found = config.lookup(alias)
    keys = [os.path.expanduser(key)] if key else [os.path.expanduser(k) for k in
                                                  found.get("identityfile", [])]
    if port is None and "port" in found:
        port = config.port(alias, f"Port {found['port']}", found["port"])
    hop = Hop(alias=alias, hostname=found.get("hostname", alias), port=port or 22,
              user=user or found.get("user"), key_files=keys,
              key_setting="" if key else f"the IdentityFile of {alias!r} in {config.path}")
    jump = found.get("proxyjump")
    return hop, (None if not jump or jump.lower() == "none" else jump)


class _BadJump(ValueError):
    """A ProxyJump entry that is neither [user@]host[:port] nor ssh://[user@]host[:port]."""


_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")  # OpenSSH's valid_domain, in a URI


def _parse_jump(spec: str) -> "tuple[str, Optional[str], Optional[str]]":
    """(host, user, port as written, None when not given) of one ProxyJump entry: as OpenSSH
    reads it, an ssh:// URI (ssh://[user@]host[:port][/], the user URL-encoded, `;`
    parameters after it ignored, an IPv6 address in brackets) or [user@]host[:port]
    ([v6::addr]:port). One that is neither raises _BadJump, saying why. (OpenSSH 9.2 refuses
    an address in brackets in the URI form, which its host-name check does not let through;
    it is taken here, as the URI form means it.)"""
    scheme = _SCHEME.match(spec)
    if scheme:
        if scheme.group(1).lower() != "ssh":
            raise _BadJump(f"{scheme.group(1)}:// is no ssh:// URI (ProxyJump takes "
                           "[user@]host[:port] or ssh://[user@]host[:port])")
        return _parse_ssh_uri(spec, spec[scheme.end():])
    user, at, rest = spec.rpartition("@")
    if at and not user:
        raise _BadJump(f"{spec!r} has an empty user before '@'")
    host, port = rest, None
    if rest.startswith("["):  # [v6::addr]:port
        host, bracket, tail = rest[1:].partition("]")
        if not bracket or (tail and not tail.startswith(":")):
            raise _BadJump(f"{spec!r} has no closing ']' after its IPv6 address, or text "
                           "after it that is not :PORT")
        port = tail[1:] if tail else None
    elif rest.count(":") == 1:
        host, port = rest.split(":")
    if not host:
        raise _BadJump(f"{spec!r} names no host")
    return host, (user or None), (port or None)


def _parse_ssh_uri(spec: str, rest: str) -> "tuple[str, Optional[str], Optional[str]]":
    """ssh://[user[;params]@]host[:port][/] after its scheme, as OpenSSH's parse_uri."""
    user = None
    userinfo, at, hostport = rest.partition("@")
    if not at:
        hostport = rest
    else:
        userinfo = userinfo.split(";", 1)[0]  # connection parameters: ignored, as by OpenSSH
        if not userinfo:
            raise _BadJump(f"{spec!r} has an empty user before '@'")
        if re.search(r"%(?![0-9A-Fa-f]{2})", userinfo):
            raise _BadJump(f"{spec!r} has a '%' in its user that is no %XX escape")
        user = unquote_plus(userinfo)
    if hostport.startswith("["):
        host, bracket, tail = hostport[1:].partition("]")
        if not bracket:
            raise _BadJump(f"{spec!r} has no closing ']' after its IPv6 address")
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise _BadJump(f"{spec!r} has no IP address in its [brackets]") from None
    else:
        cut = re.search(r"[:/]", hostport)
        host, tail = (hostport[:cut.start()], hostport[cut.start():]) if cut else (hostport, "")
        if not _HOST_NAME.fullmatch(host) or ".." in host:
            raise _BadJump(f"{spec!r} has no valid host name" + (f" ({host!r})" if host else ""))
    port = None
    if tail.startswith(":"):
        port, slash, path = tail[1:].partition("/")
        tail = slash + path
    if tail not in ("", "/"):
        raise _BadJump(f"{spec!r} has a path ({tail!r}), which an ssh:// URI in ProxyJump "
                       "may not have" if tail.startswith("/") else
                       f"{spec!r} has {tail!r} after its host, where :PORT or nothing goes")
    return host, user, (port or None)


def resolve_route(device: DeviceConfig) -> "list[Hop]":
    """The hops to the board: jump hosts first (ProxyJump, also a jump host's own), the board
    last. A jump host without an IdentityFile of its own uses the board's key."""
    conn = device.connection
    return _route_to(_ssh_config(conn.ssh_config, conn.host or ""), conn.host or "", conn.port,
                     conn.user, conn.key, 0)


def _route_to(config: _SshConfigFile, alias: str, port: Optional[int], user: Optional[str],
              key: Optional[str], depth: int) -> "list[Hop]":
    target, jump = _hop(config, alias, port, user, key)
    if not jump:
        return [target]
    if depth >= 5:
        raise TransportError(f"ProxyJump chain to {alias} is longer than 5 hops (a loop in "
                             "~/.ssh/config?)")
    route: "list[Hop]" = []
    for index, spec in enumerate(s.strip() for s in jump.split(",") if s.strip()):
        try:
            host, jump_user, port_text = _parse_jump(spec)
        except _BadJump as exc:
            raise config.bad_line(alias, f"ProxyJump {jump}", str(exc)) from None
        jump_port = None if port_text is None else config.port(alias, f"ProxyJump {jump}",
                                                               port_text)
        if index == 0:  # the first jump host may need its own jump, as with ssh -J
            route += _route_to(config, host, jump_port, jump_user, None, depth + 1)
        else:
            route.append(_hop(config, host, jump_port, jump_user)[0])
    for hop in route:
        if not hop.key_files:
            hop.key_files, hop.key_setting = list(target.key_files), target.key_setting
    return route + [target]


def fingerprint(key) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def _known_name(hop: Hop) -> str:
    return hop.hostname if hop.port == 22 else f"[{hop.hostname}]:{hop.port}"


class _HostKeyPolicy:
    """paramiko's missing-host-key hook: raise (strict) or remember (accept-new)."""

    def __init__(self, policy: str, known_hosts: Path, hop: Hop, device: DeviceConfig):
        self.policy = policy
        self.known_hosts = known_hosts
        self.hop = hop
        self.device = device

    def missing_host_key(self, client, hostname, key) -> None:
        if self.policy == "accept-new":
            self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self.known_hosts, "a") as handle:
                handle.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
            os.chmod(self.known_hosts, 0o600)
            client.get_host_keys().add(hostname, key.get_name(), key)
            return
        port_flag = f"-p {self.hop.port} " if self.hop.port != 22 else ""
        # its folder made first: on a fresh account there is no ~/.ssh for `>>` to append in
        folder, file = (shlex.quote(str(p)) for p in (self.known_hosts.parent, self.known_hosts))
        raise HostKeyUnknown(
            f"unknown host key for {hostname} ({key.get_name()} {fingerprint(key)}): after "
            f"checking it is the board's, trust it with `mkdir -p -m 700 {folder} && "
            f"ssh-keyscan {port_flag}{self.hop.hostname} >> {file}`, or set host_key_policy = "
            f"\"accept-new\" in {self.device.path}")


def _connect_hop(hop: Hop, device: DeviceConfig, sock=None):
    import paramiko

    conn = device.connection
    known_hosts = Path(os.path.expanduser(conn.known_hosts))
    client = paramiko.SSHClient()
    if known_hosts.is_file():
        try:
            client.load_host_keys(str(known_hosts))
        except (OSError, paramiko.SSHException) as exc:
            raise TransportError(f"cannot read {known_hosts}: {exc}") from None
    client.set_missing_host_key_policy(
        _HostKeyPolicy(conn.host_key_policy, known_hosts, hop, device))
    _check_key_files_open(hop, device)
    started = time.monotonic()
    try:
        client.connect(hop.hostname, port=hop.port, username=hop.user or None,
                       key_filename=hop.key_files or None, look_for_keys=not hop.key_files,
                       allow_agent=True, timeout=conn.connect_timeout_s,
                       banner_timeout=conn.connect_timeout_s,
                       auth_timeout=conn.connect_timeout_s, sock=sock)
    except (HostKeyUnknown, TransportError):
        client.close()
        raise
    except paramiko.BadHostKeyException as exc:
        client.close()
        port_flag = f"[{hop.hostname}]:{hop.port}" if hop.port != 22 else hop.hostname
        raise HostKeyChanged(
            f"the host key of {hop.label()} CHANGED (now {fingerprint(exc.key)}): someone may be "
            f"intercepting the connection; if the board was reinstalled, remove the old key "
            f"with `ssh-keygen -R '{port_flag}' -f {known_hosts}` and connect again") from None
    except paramiko.PasswordRequiredException:
        client.close()
        raise AuthRefused(f"the SSH key for {hop.label()} is encrypted: load it into your agent "
                          "with `ssh-add KEY` first") from None
    except paramiko.AuthenticationException as exc:
        client.close()
        _raise_if_a_key_is_unusable(hop, device)
        tried = ", ".join(hop.key_files) or "your default keys and ssh-agent"
        raise AuthRefused(
            f"{hop.label()} refused authentication ({exc}; tried {tried}): add the public key "
            f"to the board's ~/.ssh/authorized_keys, e.g. `ssh-copy-id -i KEY.pub -p {hop.port} "
            f"{hop.user + '@' if hop.user else ''}{hop.hostname}`") from None
    except socket.gaierror as exc:
        client.close()
        raise BoardUnreachable(f"cannot resolve host name {hop.hostname!r} ({exc.strerror}); "
                               f"check `host` in {device.path} or your ~/.ssh/config") from None
    except (OSError, paramiko.SSHException, EOFError) as exc:
        authenticating = _session_is_up(client)
        client.close()
        if _not_ssh(exc):
            said = _what_it_said(exc, hop, sock, time.monotonic() - started,
                                 conn.connect_timeout_s)
            raise BoardUnreachable(
                f"{hop.hostname}:{hop.port} accepted the connection but did not speak SSH: "
                f"{said}: is that the board's sshd? check host and port in "
                f"{device.path}") from None
        if authenticating:  # paramiko's words for a key file it could not load
            _raise_if_a_key_is_unusable(hop, device)
        underlying = list((getattr(exc, "errors", None) or {}).values())  # NoValidConnections
        first = underlying[0] if underlying else exc
        reason = getattr(first, "strerror", None) or str(first) or type(first).__name__
        raise BoardUnreachable(f"cannot reach {hop.label()}: {reason} (is the board on, on the "
                               "network, and running sshd?)") from None
    if conn.keepalive_s:
        client.get_transport().set_keepalive(int(max(conn.keepalive_s, 1)))
    _no_delay(client.get_transport().sock)
    return client


def _key_setting(hop: Hop, device: DeviceConfig) -> str:
    return hop.key_setting or f"`key` in {device.path}"


def _private_key_path(key_file: str) -> str:
    """The file paramiko reads for `key_file`: a certificate (KEY-cert.pub) stands for KEY."""
    suffix = "-cert.pub"
    return key_file[:-len(suffix)] if key_file.endswith(suffix) else key_file


def _check_key_files_open(hop: Hop, device: DeviceConfig) -> None:
    """Refuse, before connecting, a key file that cannot even be opened: paramiko raises
    OSError out of connect for one (tries no other key), which read as an unreachable board."""
    for key_file in hop.key_files:
        path = _private_key_path(key_file)
        setting = _key_setting(hop, device)
        if os.path.isdir(path):
            raise AuthRefused(f"SSH key {path} (for {hop.label()}) is a folder, not a key "
                              f"file: set {setting} to the private key file in it (e.g. "
                              f"{os.path.join(path, 'id_ed25519')})")
        if not os.path.exists(path):
            raise AuthRefused(f"SSH key {path} (for {hop.label()}) does not exist: create "
                              f"one with `ssh-keygen -t ed25519` or fix {setting}")
        try:
            open(path, "rb").close()
        except OSError as exc:
            raise AuthRefused(f"cannot read SSH key {path} (for {hop.label()}): "
                              f"{exc.strerror}: make it readable by you (`chmod 600`, owned "
                              f"by you), or fix {setting}") from None


def _raise_if_a_key_is_unusable(hop: Hop, device: DeviceConfig) -> None:
    """After a failed login: a key file that is no private key paramiko can use is the cause to
    name (paramiko said "not a valid OPENSSH private key file", read as an unreachable board).
    Checked only then: with such a file, ssh-agent's keys may still log in, as with ssh."""
    for key_file in hop.key_files:
        why = _why_not_a_private_key(_private_key_path(key_file))
        if why:
            raise AuthRefused(f"SSH key {key_file} (for {hop.label()}) {why}: fix "
                              f"{_key_setting(hop, device)}") from None


PUBLIC_KEY = re.compile(rb"\s*((ssh|ecdsa|sk)-\S+\s+AAAA|---- BEGIN SSH2 PUBLIC KEY)")


def _why_not_a_private_key(path: str) -> Optional[str]:
    """Why paramiko cannot use this file as a private key, or None where it can (an encrypted
    one too: the agent may hold it; connect says so itself)."""
    import paramiko
    try:
        with open(path, "rb") as handle:
            head = handle.read(4096)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if PUBLIC_KEY.match(head):
        private = path[:-len(".pub")] if path.endswith(".pub") else ""
        guess = f" ({private}?)" if private and os.path.isfile(private) else ""
        return f"is a public key, where the private key is needed{guess}"
    for kind in (paramiko.RSAKey, paramiko.ECDSAKey, paramiko.Ed25519Key):  # as connect tries
        try:
            kind.from_private_key_file(path)
            return None
        except paramiko.PasswordRequiredException:
            return None
        except (paramiko.SSHException, ValueError, OSError):
            continue
    return ("is not a private key paramiko can read (RSA, ECDSA or Ed25519, as ssh-keygen "
            "writes them)")


def _session_is_up(client) -> bool:
    """Whether the SSH session began (banner and key exchange done): a failure after that is a
    login's, before it the network's or the server's."""
    transport = client.get_transport()
    return transport is not None and transport.is_active()


def _what_it_said(exc: BaseException, hop: Hop, sock, waited_s: float,
                  timeout_s: float) -> str:
    """What a port that is not sshd did instead of greeting: what it sent (looked at again on
    a fresh connection: paramiko keeps no copy of a line that is not SSH's), that it closed
    the connection, or that it stayed silent for the whole timeout."""
    # a close reads as EOF, or as a reset where paramiko's own greeting was still unread there
    closed = isinstance(exc.__context__, (EOFError, ConnectionError))
    if waited_s < timeout_s and sock is None:  # a direct hop: a jump host's channel is gone
        first = _first_line(hop, min(timeout_s, 2.0))
        if first and not first.startswith("SSH-"):  # an sshd that was busy then: no answer
            return f"it answered {first!r}" + (" and closed the connection" if closed else "")
    if closed:
        return "it closed the connection without a word"
    if waited_s < timeout_s:
        return "it sent something that is not an SSH greeting"
    return f"it sent nothing within {timeout_s:g} s"


def _first_line(hop: Hop, timeout_s: float) -> str:
    """The first line a port sends on a new connection ("" if none), cut to 80 characters."""
    data = b""
    try:
        with socket.create_connection((hop.hostname, hop.port), timeout=timeout_s) as probe:
            deadline = time.monotonic() + timeout_s
            while b"\n" not in data and len(data) < 256 and time.monotonic() < deadline:
                chunk = probe.recv(256)
                if not chunk:
                    break
                data += chunk
    except OSError:
        pass
    line = data.decode("utf-8", "replace").strip().splitlines()
    return line[0][:80] if line else ""


def _not_ssh(exc: BaseException) -> bool:
    """paramiko's words for a port that answers with something other than an SSH greeting
    (or stays silent): its banner check, or a session that never began."""
    text = str(exc)
    return "protocol banner" in text or "No existing session" in text


def _no_delay(sock) -> None:
    """Turn off Nagle's algorithm: the agent protocol is request/reply, and a small request
    held back behind a small unacknowledged packet (paramiko's window adjustments) waits for
    the board's delayed ACK, 40 ms on Linux, on every request (benchmarks/transport.py saw
    1 MiB get_file chunks take 43 ms instead of 11). A jump host's channel has no such option;
    the first hop's TCP socket carries every hop's bytes anyway."""
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


def run_command(client, command: str, timeout: float, what: str = "") -> "tuple[int, str, str]":
    """(exit status, stdout, stderr) of one command on the board; `what` names it in the
    LinkLost of a link that drops while it runs."""
    chan = client.get_transport().open_session(timeout=timeout)
    chan.settimeout(timeout)
    chan.exec_command(command)
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    while True:
        if chan.recv_ready():
            out += chan.recv(1 << 16)
        elif chan.recv_stderr_ready():
            err += chan.recv_stderr(1 << 16)
        elif chan.exit_status_ready():
            while chan.recv_ready():
                out += chan.recv(1 << 16)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(1 << 16)
            break
        elif time.monotonic() > deadline:
            chan.close()
            raise LinkLost(f"`{command[:60]}...` did not finish within {timeout:g} s")
        else:
            time.sleep(0.01)
    status = chan.recv_exit_status()
    chan.close()
    transport = client.get_transport()
    if status == -1 and (transport is None or not transport.is_active()):
        # no exit status, and the link is down: it dropped while the command ran (QA: during
        # the probe that read as a Python that is none). A command killed by a signal also
        # has none, but its link stays up: that one is the command's failure.
        raise LinkLost(f"the connection closed while {what or f'`{command[:60]}...`'} ran")
    return status, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def shell_path(path: str) -> str:
    """Quote a path for the board's shell, keeping a leading ~/ expandable."""
    if path == "~":
        return "~"
    if path.startswith("~/"):
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)


class SshTransport:
    def __init__(self, device: DeviceConfig, archive: Optional[AgentArchive] = None):
        self.device = device
        self.archive = archive
        self.pushed_agent = False
        self.probe: dict = {}
        self._clients: list = []

    @property
    def board(self) -> str:
        return f"{self.device.name} ({self.device.address()})"

    @property
    def python(self) -> str:
        return self.device.connection.python or "python3"

    def open(self) -> AgentSession:
        self.close()
        route = resolve_route(self.device)
        sock = None
        for index, hop in enumerate(route):
            client = _connect_hop(hop, self.device, sock)
            self._clients.append(client)
            if index + 1 < len(route):
                nxt = route[index + 1]
                try:
                    sock = client.get_transport().open_channel(
                        "direct-tcpip", (nxt.hostname, nxt.port), ("127.0.0.1", 0),
                        timeout=self.device.connection.connect_timeout_s)
                except Exception as exc:  # noqa: BLE001 - paramiko.ChannelException and kin
                    self.close()
                    raise BoardUnreachable(f"jump host {hop.label()} could not reach "
                                           f"{nxt.label()}: {exc}") from None
        client = self._clients[-1]
        try:
            archive = self.archive = self.archive or build_agent_archive()
            self.probe = self._probe(client, archive)
            if not self.probe["has_agent"] and not self.device.connection.agent_port:
                self._push(client, archive)
            return self._start_agent(client, archive)
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        for client in reversed(self._clients):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a dead connection
                pass
        self._clients = []

    # -- steps -------------------------------------------------------------------------------
    def _probe(self, client, archive: AgentArchive) -> dict:
        conn = self.device.connection
        workdir = shell_path(conn.workdir)
        command = (f"mkdir -p {workdir} && cd {workdir} && exec {shlex.quote(self.python)} -c "
                   f"{shlex.quote(PROBE)} {archive.name} {archive.sha256}")
        status, out, err = run_command(client, command, timeout=conn.connect_timeout_s + 20,
                                       what=f"the probe of {self.board}")
        family = self.device.hardware.family
        if status == 127 or (status != 0 and "not found" in err and self.python in err):
            raise BoardMissingPython(f"{self.board} has no `{self.python}`: "
                                     f"{python_hint(family)}")
        line = next((l for l in out.splitlines() if l.startswith("EDGE-REMAT-PROBE ")), None)
        if status != 0 or line is None:
            raise self._probe_failed(status, out, err)
        probe = json.loads(line.split(" ", 1)[1])
        version = tuple(probe["python"])
        if version < MIN_PYTHON:
            raise BoardMissingPython(
                f"{self.board} runs Python {'.'.join(map(str, version))} as `{self.python}`, "
                f"the agent needs {'.'.join(map(str, MIN_PYTHON))} or newer: "
                f"{python_hint(family)}")
        return probe

    def _probe_failed(self, status: int, out: str, err: str) -> TransportError:
        """Why the probe said nothing, with the device config field to change: the workdir
        could not be made or entered (mkdir/cd in the probe's shell line), or `python` ran
        and printed no probe line (it is not a Python: /bin/true exits 0 saying nothing)."""
        last = (err.strip().splitlines() or out.strip().splitlines() or ["no output"])[-1]
        workdir = self.device.connection.workdir
        if re.match(r"^(\S+: )*(mkdir|cd)\b", last) or "can't cd" in last:
            return TransportError(f"{self.board} cannot use its workdir {workdir} ({last}): set "
                                  "workdir in the device config's [connection] to a folder the "
                                  "board's user can create and write")
        return TransportError(f"checking {self.board} failed: `{self.python}` exited with "
                              f"status {status} and did not answer the probe ({last}): set "
                              "python in the device config's [connection] to the board's "
                              "Python 3.8 or newer")

    def _push(self, client, archive: AgentArchive) -> None:
        free = self.probe.get("free")
        if free is not None and free < archive.size + DISK_MARGIN:
            raise BoardOutOfDisk(self._disk_message(free, archive.size))
        cwd = self.probe["cwd"]
        self._upload(client, archive.path.read_bytes(), f"{cwd}/agents/{archive.name}")
        self.pushed_agent = True

    def _upload(self, client, data: bytes, final: str) -> None:
        """Write a file on the board atomically (temp file + rename): over SFTP, or where the
        server has no SFTP (a bare Dropbear) through `cat` on an exec channel."""
        tmp = f"{final}.{os.getpid()}.tmp"
        try:
            try:
                sftp = client.open_sftp()
            except Exception:  # noqa: BLE001 - paramiko.SSHException: no sftp subsystem
                sftp = None
            if sftp is None:
                self._upload_by_exec(client, data, tmp, final)
                return
            try:
                folder = final.rsplit("/", 1)[0]
                try:
                    sftp.mkdir(folder)
                except OSError:
                    pass  # already there
                with sftp.open(tmp, "wb") as handle:
                    handle.set_pipelined(True)
                    handle.write(data)
                sftp.posix_rename(tmp, final)
            except OSError:
                try:
                    sftp.remove(tmp)
                except OSError:
                    pass
                raise
            finally:
                sftp.close()
        except OSError as exc:
            cwd = self.probe.get("cwd", ".")
            free_now = _remote_free(client, cwd, self.python)
            if (free_now is not None and free_now < len(data) + DISK_MARGIN) or \
                    _is_no_space(exc):
                raise BoardOutOfDisk(self._disk_message(free_now, len(data))) from None
            # QA: a read-only workdir said only "[Errno 2] No such file" or "Failure"
            folder = final.rsplit("/", 1)[0]
            raise TransportError(f"copying {final.rsplit('/', 1)[-1]} to {self.board} failed: "
                                 f"{exc}; the agent is written into {folder} there: check that "
                                 f"{self.device.connection.user or 'the SSH user'} may write "
                                 "it, or set workdir in the device config's [connection] to a "
                                 "folder that can be written") from None

    def _upload_by_exec(self, client, data: bytes, tmp: str, final: str) -> None:
        folder = final.rsplit("/", 1)[0]
        chan = client.get_transport().open_session(
            timeout=self.device.connection.connect_timeout_s)
        chan.exec_command(f"mkdir -p {shlex.quote(folder)} && cat > {shlex.quote(tmp)} && "
                          f"mv -f {shlex.quote(tmp)} {shlex.quote(final)}")
        chan.sendall(data)
        chan.shutdown_write()
        status = chan.recv_exit_status()
        err = _channel_stderr(chan)
        chan.close()
        if status != 0:
            raise OSError(errno.EIO, err or f"exit status {status}")

    def _disk_message(self, free: Optional[int], size: int) -> str:
        free_text = "almost no" if free is None else f"only {free} bytes"
        return (f"{self.board} is out of disk: {free_text} free in "
                f"{self.device.connection.workdir}, the agent needs {size} bytes plus 1 MiB: "
                "free some space (e.g. `sudo apt clean`, `pip cache purge`) or set workdir to "
                "a larger partition")

    def _start_agent(self, client, archive: AgentArchive) -> AgentSession:
        conn = self.device.connection
        transport = client.get_transport()
        if conn.agent_port:
            try:
                chan = transport.open_channel("direct-tcpip", ("127.0.0.1", conn.agent_port),
                                              ("127.0.0.1", 0), timeout=conn.connect_timeout_s)
            except Exception as exc:  # noqa: BLE001
                raise BoardUnreachable(
                    f"nothing answers on 127.0.0.1:{conn.agent_port} on {self.board} ({exc}): "
                    f"start `edge-remat-agent serve --tcp 127.0.0.1:{conn.agent_port}` there, "
                    "or remove agent_port to let the host start the agent") from None
            return self._hello(chan, None)
        cwd = self.probe["cwd"]
        if self.probe.get("current") != archive.name:
            self._write_current(client, cwd, archive.name)
        chan = transport.open_session(timeout=conn.connect_timeout_s)
        chan.exec_command(f"cd {shlex.quote(cwd)} && exec {shlex.quote(self.python)} "
                          f"agents/{archive.name} serve --stdio --workdir {shlex.quote(cwd)}")
        return self._hello(chan, chan)

    def _write_current(self, client, cwd: str, name: str) -> None:
        self._upload(client, (name + "\n").encode(), f"{cwd}/agent.current")

    def _hello(self, chan, exec_chan) -> AgentSession:
        from edge_remat_agent.wire.framing import FrameStream
        session = AgentSession(FrameStream(chan, skip_noise=True), board=self.board,
                               family=self.device.hardware.family)
        try:
            session.hello(timeout=self.device.connection.connect_timeout_s + 30)
        except LinkLost as exc:
            detail = _channel_stderr(exec_chan) if exec_chan is not None else ""
            session.close()
            raise TransportError(f"the agent did not start on {self.board}: "
                                 f"{detail or exc}") from None
        return session


def _channel_stderr(chan) -> str:
    err = bytearray()
    try:
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(1 << 16)
    except Exception:  # noqa: BLE001
        pass
    lines = err.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""


def _remote_free(client, cwd: str, python: str) -> Optional[int]:
    """Free bytes in the board's workdir, asked again after a failed upload."""
    script = "import os; s = os.statvfs('.'); print(s.f_bavail * s.f_frsize)"
    try:
        status, out, _ = run_command(client, f"cd {shlex.quote(cwd)} && {shlex.quote(python)} "
                                     f"-c {shlex.quote(script)}", timeout=20)
        return int(out.strip()) if status == 0 else None
    except (TransportError, ValueError, OSError):
        return None


def _is_no_space(exc: OSError) -> bool:
    return exc.errno in (errno.ENOSPC, errno.EDQUOT) or "space" in str(exc).lower()
