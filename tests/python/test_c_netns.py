"""Cross-host transfer over tcp between two network namespaces.

The test makes two namespaces joined by a veth pair with addresses in the
private 10.212.0.0/30, which exist only inside them, and runs one
netns_peer.py in each: send/recv both ways, write_imm and read, all with
byte checks.  The namespaces are always deleted afterwards.
"""

import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PEER = os.path.join(HERE, "netns_peer.py")

SERVER_ADDR, CLIENT_ADDR, PREFIX = "10.212.0.1", "10.212.0.2", 30

pytestmark = pytest.mark.timeout(180)


def ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True,
                          check=check, timeout=30)


@pytest.fixture
def namespaces():
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (run as root to test cross-host tcp)")
    if shutil.which("ip") is None:
        pytest.skip("the `ip` command (iproute2) is not installed")
    pid = os.getpid()
    server_ns, client_ns = f"dls-a-{pid}", f"dls-b-{pid}"
    made = []
    try:
        probe = ip("netns", "add", server_ns, check=False)
        if probe.returncode != 0:
            pytest.skip(f"`ip netns add` is unavailable here: {probe.stderr.strip()}")
        made.append(server_ns)
        ip("netns", "add", client_ns)
        made.append(client_ns)
        # Both ends are created directly inside the namespaces: nothing is
        # added to the host's own network.
        ip("link", "add", "dlsv0", "netns", server_ns, "type", "veth",
           "peer", "name", "dlsv1", "netns", client_ns)
        for ns, dev, addr in ((server_ns, "dlsv0", SERVER_ADDR),
                              (client_ns, "dlsv1", CLIENT_ADDR)):
            ip("-n", ns, "addr", "add", f"{addr}/{PREFIX}", "dev", dev)
            ip("-n", ns, "link", "set", "lo", "up")
            ip("-n", ns, "link", "set", dev, "up")
        yield server_ns, client_ns
    finally:
        for ns in made:
            ip("netns", "del", ns, check=False)


def test_tcp_between_network_namespaces(namespaces, tmp_path):
    server_ns, client_ns = namespaces
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("DLSLIME_HOST", None)
    env.pop("DLSLIME_TRANSPORT", None)

    def start(ns, role, addr):
        return subprocess.Popen(
            ["ip", "netns", "exec", ns, sys.executable, PEER, "--role", role,
             "--host", addr, "--dir", str(tmp_path)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    procs = {"server": start(server_ns, "server", SERVER_ADDR),
             "client": start(client_ns, "client", CLIENT_ADDR)}
    outputs = {}
    try:
        for role, proc in procs.items():
            outputs[role], _ = proc.communicate(timeout=120)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    for role, proc in procs.items():
        assert proc.returncode == 0, f"{role} failed:\n{outputs.get(role)}"
        assert f"NETNS PEER OK {role}" in outputs[role], outputs[role]
