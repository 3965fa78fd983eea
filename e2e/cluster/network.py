"""The node's network on the host: the pod bridge `dpe2e0`, which also carries the node's
address, and the one DNAT rule that makes the `kubernetes` Service (10.0.0.1:443) reach the API
server on 127.0.0.1:6443; no default route, no masquerading, no kube-proxy, no cluster DNS.
`remove_network` puts back what `prepare_network` changed."""

from __future__ import annotations

from pathlib import Path

from e2e.cluster.layout import API_PORT, API_SERVICE_IP, BRIDGE, NODE_IP, STATE
from e2e.cluster.shell import run

NAT_CHAIN = "DPE2E-SERVICES"
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
SAVED_IP_FORWARD = STATE / "ip_forward"


def prepare_network() -> None:
    """The bridge with the node's address, and the NAT rule from it to the API server."""
    # The bridge plugin turns IPv4 forwarding on (the node's address is the pods' gateway);
    # `remove_network` puts back what the host had.
    if not SAVED_IP_FORWARD.exists():
        STATE.mkdir(parents=True, exist_ok=True)
        SAVED_IP_FORWARD.write_text(IP_FORWARD.read_text())
    if run(["ip", "link", "show", BRIDGE], check=False, quiet=True) == "":
        run(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run(["ip", "addr", "add", f"{NODE_IP}/24", "dev", BRIDGE])
    run(["ip", "link", "set", BRIDGE, "up"])
    # DNAT to 127.0.0.1 from another interface needs route_localnet on that interface.
    Path(f"/proc/sys/net/ipv4/conf/{BRIDGE}/route_localnet").write_text("1\n")
    if run(["iptables", "-t", "nat", "-n", "-L", NAT_CHAIN], check=False, quiet=True) == "":
        run(["iptables", "-t", "nat", "-N", NAT_CHAIN])
        run(
            [
                "iptables",
                "-t",
                "nat",
                "-A",
                NAT_CHAIN,
                "-d",
                f"{API_SERVICE_IP}/32",
                "-p",
                "tcp",
                "--dport",
                "443",
                "-j",
                "DNAT",
                "--to-destination",
                f"127.0.0.1:{API_PORT}",
            ]
        )
        run(["iptables", "-t", "nat", "-I", "PREROUTING", "-i", BRIDGE, "-j", NAT_CHAIN])


def remove_network() -> None:
    """The pods' network namespaces, the NAT rule, the bridge; IPv4 forwarding as it was."""
    for netns in run(["ip", "netns", "list"], check=False).split("\n"):
        name = netns.split(" ")[0]
        if name.startswith("cni-"):
            run(["ip", "netns", "delete", name], check=False)
    run(
        ["iptables", "-t", "nat", "-D", "PREROUTING", "-i", BRIDGE, "-j", NAT_CHAIN],
        check=False,
        quiet=True,
    )
    run(["iptables", "-t", "nat", "-F", NAT_CHAIN], check=False, quiet=True)
    run(["iptables", "-t", "nat", "-X", NAT_CHAIN], check=False, quiet=True)
    run(["ip", "link", "delete", BRIDGE], check=False, quiet=True)
    if SAVED_IP_FORWARD.exists():
        IP_FORWARD.write_text(SAVED_IP_FORWARD.read_text())
        SAVED_IP_FORWARD.unlink()
