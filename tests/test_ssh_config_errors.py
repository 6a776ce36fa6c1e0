"""SSH settings that are wrong on this machine, not on the board: a Port or a ProxyJump port in
~/.ssh/config that is no port number, and a key file that is a folder, a public key or no key
at all. Each is one line naming the file and what is wrong, never "is the board on" nor a
traceback; `devices --check` turns whatever its check raises into a failed check."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from helpers.bad_inputs import BAD_INPUT, UNREACHABLE, cli, env, refused
from edge_remat import remote
from edge_remat.devices import load_device
from edge_remat.transport import AuthRefused, Board
from edge_remat.transport import ssh
from edge_remat.transport.errors import SshConfigError
from edge_remat.transport.ssh import resolve_route


def write_device(folder, ssh_config: str = "~/.ssh/config", **fields) -> "object":
    """A device config `myboard` reached as host "myboard" (its port left to ssh_config)."""
    lines = ['name = "myboard"', "[connection]", 'kind = "ssh"', 'host = "myboard"',
             'user = "nobody"', "connect_timeout_s = 2", "reconnect_timeout_s = 0",
             f'known_hosts = "{folder / "known_hosts"}"', f'ssh_config = "{ssh_config}"']
    lines += [f'{name} = "{value}"' for name, value in fields.items()]
    path = folder / "myboard.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def route_error(tmp_path, ssh_config_text: str) -> str:
    config = tmp_path / "ssh_config"
    config.write_text(ssh_config_text)
    with pytest.raises(SshConfigError) as err:
        resolve_route(load_device(write_device(tmp_path, str(config))))
    message = str(err.value)
    assert "\n" not in message and str(config) in message
    return message


# --- ~/.ssh/config values ------------------------------------------------------------------

def test_a_port_that_is_no_number_names_the_file_the_entry_and_the_value(tmp_path):
    message = route_error(tmp_path, "Host myboard\n  HostName 127.0.0.1\n  Port notaport\n")
    assert "'myboard'" in message and "Port notaport" in message


def test_a_port_out_of_range_is_refused_before_connecting(tmp_path):
    message = route_error(tmp_path, "Host myboard\n  HostName 127.0.0.1\n  Port 70000\n")
    assert "70000" in message and "1 to 65535" in message


def test_a_proxy_jump_port_that_is_no_number(tmp_path):
    message = route_error(tmp_path, "Host myboard\n  HostName 127.0.0.1\n"
                                    "  ProxyJump root@127.0.0.1:notaport\n")
    assert "'myboard'" in message and "ProxyJump root@127.0.0.1:notaport" in message


def test_a_jump_host_whose_own_port_is_no_number(tmp_path):
    message = route_error(tmp_path, "Host myboard\n  ProxyJump gateway\n"
                                    "Host gateway\n  Port twenty-two\n")
    assert "'gateway'" in message and "twenty-two" in message


def test_good_ports_still_resolve(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text("Host myboard\n  HostName 10.0.0.2\n  Port 2222\n"
                      "  ProxyJump admin@gate:2200\n")
    route = resolve_route(load_device(write_device(tmp_path, str(config))))
    assert [(hop.hostname, hop.port, hop.user) for hop in route] == [
        ("gate", 2200, "admin"), ("10.0.0.2", 2222, "nobody")]


def resolved(tmp_path, jump: str) -> "list[tuple]":
    config = tmp_path / "ssh_config"
    config.write_text(f"Host myboard\n  HostName 10.0.0.2\n  ProxyJump {jump}\n")
    return [(hop.hostname, hop.port, hop.user)
            for hop in resolve_route(load_device(write_device(tmp_path, str(config))))]


def test_a_proxy_jump_given_as_an_ssh_uri_is_read_as_openssh_reads_it(tmp_path):
    """QA: `ProxyJump ssh://admin@gate:2200`, which OpenSSH takes, made the jump host's user
    "ssh://admin" (the entry was cut at its last '@')."""
    board = ("10.0.0.2", 22, "nobody")
    assert resolved(tmp_path, "ssh://admin@gate:2200") == [("gate", 2200, "admin"), board]
    assert resolved(tmp_path, "ssh://gate") == [("gate", 22, None), board]
    assert resolved(tmp_path, "ssh://gate:2200/") == [("gate", 2200, None), board]
    # an IPv6 address in brackets; the user URL-encoded, `;` parameters after it ignored
    assert resolved(tmp_path, "ssh://ops%40lab;fingerprint=x@[2001:db8::1]:2201") == [
        ("2001:db8::1", 2201, "ops@lab"), board]
    # a chain, in OpenSSH's order (the first entry is reached first), forms mixed
    assert resolved(tmp_path, "ssh://a@gate:2200,b@[::1]:2201,ssh://c@inner") == [
        ("gate", 2200, "a"), ("::1", 2201, "b"), ("inner", 22, "c"), board]


@pytest.mark.parametrize("jump, why", [
    ("ssh://admin@gate:2200/boards", "has a path ('/boards')"),
    ("ssh://@gate", "empty user"),
    ("ssh://admin@", "no valid host name"),
    ("ssh://admin@[::1:2200", "no closing ']'"),
    ("ssh://admin@[gate]:2200", "no IP address in its [brackets]"),
    ("ssh://admin@gate:notaport", "'notaport' is not a port number"),
    ("ssh://admin@gate:70000", "'70000' is not a port number"),
    ("sftp://admin@gate", "sftp:// is no ssh:// URI"),
    ("gate,ssh://admin@g@te", "no valid host name ('g@te')"),
])
def test_a_malformed_proxy_jump_is_one_line_naming_the_config_line(tmp_path, jump, why):
    message = route_error(tmp_path, "Host other\n  User x\n"
                                    f"Host myboard\n  HostName 10.0.0.2\n  ProxyJump {jump}\n")
    assert f"line 5: host 'myboard' has `ProxyJump {jump}`" in message, message
    assert why in message and "ssh -G myboard" in message


def test_devices_check_with_a_bad_port_in_home_ssh_config(tmp_path):
    """QA: a thread traceback, then `internal error (KeyError: 'ok')`, exit 70; with --json
    `"check": {}` and the traceback on stderr."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "config").write_text("Host myboard\n  HostName 127.0.0.1\n"
                                          "  Port notaport\n")
    device = write_device(tmp_path)
    environ = env(HOME=str(home))

    table = cli("devices", device, "--check", environ=environ)
    refused(table, UNREACHABLE, "myboard")
    note = [line for line in table.stdout.splitlines() if line.startswith("myboard: ")]
    assert len(note) == 1 and all(w in note[0] for w in ("~/.ssh/config", "'myboard'",
                                                          "notaport")), table.stdout

    as_json = cli("devices", device, "--check", "--json", environ=environ)
    refused(as_json, UNREACHABLE, "myboard", json_out=True)
    check = json.loads(as_json.stdout)["devices"][0]["check"]
    assert check["ok"] is False and "notaport" in check["error"]

    # the other board commands: the case of an ssh_config that cannot be parsed
    refused(cli("job", "sysinfo", "--device", device, environ=environ), BAD_INPUT,
            "~/.ssh/config", "myboard", "notaport")


def test_a_check_that_raises_is_a_failed_check_not_a_thread_traceback(tmp_path, monkeypatch,
                                                                      capfd):
    def broken(device):
        raise ValueError("a bug in the check")
    monkeypatch.setattr(remote, "check_device", broken)
    device = load_device(write_device(tmp_path, "none"))
    [result] = remote.checked_at_once([device])
    assert result["ok"] is False
    assert "internal error (ValueError: a bug in the check)" in result["error"]
    assert "Traceback" not in capfd.readouterr().err


# --- key files -----------------------------------------------------------------------------

needs_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen")


def keygen(path, passphrase: str = ""):
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", passphrase, "-f", str(path)],
                   check=True)
    return path


def key_refused(device_path) -> str:
    """The AuthRefused of a board whose key file is wrong: said before connecting (the host,
    "myboard", resolves nowhere)."""
    with pytest.raises(AuthRefused) as err:
        Board(load_device(device_path), reconnect_timeout_s=0).hello()
    message = str(err.value)
    assert "\n" not in message and "is the board on" not in message
    return message


def test_a_key_that_is_a_folder_says_so_before_connecting(tmp_path):
    """QA: "SSH key ... does not exist" for a folder that exists."""
    (tmp_path / "keys").mkdir()
    device = write_device(tmp_path, "none", key=str(tmp_path / "keys"))
    message = key_refused(device)
    assert "is a folder" in message and str(tmp_path / "keys") in message
    assert "does not exist" not in message and str(device) in message


def test_a_missing_key_still_says_it_does_not_exist(tmp_path):
    assert "does not exist" in key_refused(write_device(tmp_path, "none",
                                                        key=str(tmp_path / "nope")))


def test_a_key_from_ssh_config_names_its_identity_file_line(tmp_path):
    config = tmp_path / "ssh_config"
    config.write_text(f"Host myboard\n  IdentityFile {tmp_path}\n")
    message = key_refused(write_device(tmp_path, str(config)))
    assert f"IdentityFile of 'myboard' in {config}" in message


@needs_keygen
def test_what_is_wrong_with_a_key_file(tmp_path):
    private = keygen(tmp_path / "id_ed25519")
    garbage = tmp_path / "garbage"
    garbage.write_text("not a key\n")
    why_not = ssh._why_not_a_private_key
    assert why_not(str(private)) is None
    assert why_not(str(keygen(tmp_path / "locked", "secret"))) is None  # the agent may hold it
    assert "not a private key" in why_not(str(garbage))
    public = why_not(f"{private}.pub")
    assert "public key" in public and f"({private}?)" in public
