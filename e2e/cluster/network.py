"""The nodes' network on the host: each node's pod bridge (`dpe2e0`, `dpe2e1`), which also carries
the node's address, and the one DNAT rule that makes the `kubernetes` Service (10.0.0.1:443)
reach the API server on 127.0.0.1:6443 from every bridge; no default route, no masquerading, no
kube-proxy, no cluster DNS. Both nodes share the host's network namespace, so with two the host
routes between their bridges, and a chain of ours accepts that forwarding whatever the host's
FORWARD policy. `remove_network` puts back what `prepare_network` changed, for every node."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from e2e.cluster.layout import API_PORT, API_SERVICE_IP, FIRST, NODES, STATE, Node
from e2e.cluster.shell import run

NAT_CHAIN = "DPE2E-SERVICES"
FORWARD_CHAIN = "DPE2E-FORWARD"
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
SAVED_IP_FORWARD = STATE / "ip_forward"


def prepare_network(nodes: Sequence[Node] = (FIRST,)) -> None:
    """Each node's bridge with its address, the NAT rule from each to the API server, and, with
    more than one node, forwarding between their bridges."""
    # The bridge plugin turns IPv4 forwarding on (the node's address is the pods' gateway);
    # `remove_network` puts back what the host had.
    if not SAVED_IP_FORWARD.exists():
        STATE.mkdir(parents=True, exist_ok=True)
        SAVED_IP_FORWARD.write_text(IP_FORWARD.read_text())
    for node in nodes:
        if run(["ip", "link", "show", node.bridge], check=False, quiet=True) == "":
            run(["ip", "link", "add", node.bridge, "type", "bridge"])
            run(["ip", "addr", "add", f"{node.ip}/24", "dev", node.bridge])
        run(["ip", "link", "set", node.bridge, "up"])
        # DNAT to 127.0.0.1 from another interface needs route_localnet on that interface.
        Path(f"/proc/sys/net/ipv4/conf/{node.bridge}/route_localnet").write_text("1\n")
    if not chain_exists(NAT_CHAIN):
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
        for node in nodes:
            run(["iptables", "-t", "nat", "-I", "PREROUTING", "-i", node.bridge, "-j", NAT_CHAIN])
    if len(nodes) > 1 and not chain_exists(FORWARD_CHAIN, table="filter"):
        run(["iptables", "-N", FORWARD_CHAIN])
        for rule in forward_rules(nodes):
            run(["iptables", "-A", FORWARD_CHAIN, *rule])
        run(["iptables", "-I", "FORWARD", "-j", FORWARD_CHAIN])


def forward_rules(nodes: Sequence[Node]) -> list[list[str]]:
    """Accept what one node's bridge sends to another's: pod to pod across nodes."""
    return [
        ["-i", a.bridge, "-o", b.bridge, "-s", a.pod_subnet, "-d", b.pod_subnet, "-j", "ACCEPT"]
        for a in nodes
        for b in nodes
        if a != b
    ]


def chain_exists(chain: str, table: str = "nat") -> bool:
    return run(["iptables", "-t", table, "-n", "-L", chain], check=False, quiet=True) != ""


def remove_network() -> None:
    """The pods' network namespaces, the NAT and forward rules, every node's bridge; IPv4
    forwarding as it was."""
    for netns in run(["ip", "netns", "list"], check=False).split("\n"):
        name = netns.split(" ")[0]
        if name.startswith("cni-"):
            run(["ip", "netns", "delete", name], check=False)
    run(["iptables", "-D", "FORWARD", "-j", FORWARD_CHAIN], check=False, quiet=True)
    run(["iptables", "-F", FORWARD_CHAIN], check=False, quiet=True)
    run(["iptables", "-X", FORWARD_CHAIN], check=False, quiet=True)
    for node in NODES:
        run(
            ["iptables", "-t", "nat", "-D", "PREROUTING", "-i", node.bridge, "-j", NAT_CHAIN],
            check=False,
            quiet=True,
        )
    run(["iptables", "-t", "nat", "-F", NAT_CHAIN], check=False, quiet=True)
    run(["iptables", "-t", "nat", "-X", NAT_CHAIN], check=False, quiet=True)
    for node in NODES:
        run(["ip", "link", "delete", node.bridge], check=False, quiet=True)
    if SAVED_IP_FORWARD.exists():
        IP_FORWARD.write_text(SAVED_IP_FORWARD.read_text())
        SAVED_IP_FORWARD.unlink()
