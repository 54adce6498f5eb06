"""Two LANs behind masquerading routers and one "wan", built from network namespaces.

Topology (names carry a per-run prefix, so parallel runs never collide):

    <p>l1 192.168.1.2 --- 192.168.1.1 <p>r1 10.77.1.1 --- 10.77.1.2 \\
                                                                   <p>w (routes between
    <p>l2 192.168.2.2 --- 192.168.2.1 <p>r2 10.77.2.1 --- 10.77.2.2 /   10.77.1/24 and 2/24)

Each router masquerades what leaves its wan side (nftables; Linux keeps the source port
when it is free) and, like a home router, drops what arrives there unsolicited (only
`ct state established,related` passes). Dropping instead of answering with a reset
matters: TCP hole punching needs a SYN that arrives before the local one left to be
ignored, not refused.

Invariants: `NatNet.create` either returns a complete topology or deletes whatever it
made and raises; `NatNet.delete` removes every namespace (their veths go with them) and
never raises. Requires root (CAP_NET_ADMIN), `ip` and `nft`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


def unavailable_reason() -> str | None:
    """Why namespaces cannot be built here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root (CAP_NET_ADMIN) to create network namespaces"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"`{tool}` not found (apt-get install -y {package})"
    probe = f"swprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*args: str) -> None:
    done = subprocess.run(list(args), capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {done.stderr.strip()}")


@dataclass
class NatNet:
    prefix: str

    @property
    def wan(self) -> str:
        return f"{self.prefix}w"

    def lan(self, i: int) -> str:
        return f"{self.prefix}l{i}"

    def router(self, i: int) -> str:
        return f"{self.prefix}r{i}"

    def namespaces(self) -> list[str]:
        return [self.lan(1), self.lan(2), self.router(1), self.router(2), self.wan]

    @staticmethod
    def wan_addr(i: int) -> str:
        """The wan node's address as seen from LAN `i`."""
        return f"10.77.{i}.2"

    @classmethod
    def create(cls, prefix: str) -> NatNet:
        net = cls(prefix)
        try:
            net._build()
        except BaseException:
            net.delete()
            raise
        return net

    def _build(self) -> None:
        p = self.prefix
        for ns in self.namespaces():
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
        for i in (1, 2):
            lan, rtr, wan = self.lan(i), self.router(i), self.wan
            inner, outer = f"{p}b{i}", f"{p}c{i}"
            _run("ip", "link", "add", f"{p}a{i}", "type", "veth", "peer", "name", inner)
            _run("ip", "link", "set", f"{p}a{i}", "netns", lan)
            _run("ip", "link", "set", inner, "netns", rtr)
            _run("ip", "link", "add", outer, "type", "veth", "peer", "name", f"{p}d{i}")
            _run("ip", "link", "set", outer, "netns", rtr)
            _run("ip", "link", "set", f"{p}d{i}", "netns", wan)
            _run("ip", "-n", lan, "addr", "add", f"192.168.{i}.2/24", "dev", f"{p}a{i}")
            _run("ip", "-n", rtr, "addr", "add", f"192.168.{i}.1/24", "dev", inner)
            _run("ip", "-n", rtr, "addr", "add", f"10.77.{i}.1/24", "dev", outer)
            _run("ip", "-n", wan, "addr", "add", f"10.77.{i}.2/24", "dev", f"{p}d{i}")
            for ns, dev in ((lan, f"{p}a{i}"), (rtr, inner), (rtr, outer), (wan, f"{p}d{i}")):
                _run("ip", "-n", ns, "link", "set", dev, "up")
            _run("ip", "-n", lan, "route", "add", "default", "via", f"192.168.{i}.1")
            _run("ip", "-n", rtr, "route", "add", "default", "via", f"10.77.{i}.2")
            _run("ip", "netns", "exec", rtr, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            nft = ("ip", "netns", "exec", rtr, "nft")
            _run(*nft, "add table ip nat")
            _run(*nft, "add chain ip nat post { type nat hook postrouting priority 100 ; }")
            _run(*nft, f"add rule ip nat post oifname {outer} masquerade")
            _run(*nft, "add table inet fw")
            for chain, hook in (("fw_in", "input"), ("fw_fwd", "forward")):
                _run(*nft, f"add chain inet fw {chain} {{ type filter hook {hook} priority 0 ; }}")
                _run(*nft, f"add rule inet fw {chain} iifname {outer} ct state "
                     "established,related accept")  # fmt: skip
                _run(*nft, f"add rule inet fw {chain} iifname {outer} drop")
        _run("ip", "netns", "exec", self.wan, "sysctl", "-qw", "net.ipv4.ip_forward=1")

    def delete(self) -> None:
        for ns in self.namespaces():
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
