"""Which addresses a replica added at run time may have (`coordinator.replica_allow`).

`POST /admin/pools/{pool}/replicas` makes the coordinator connect to a URL a caller chose
(its `/health` probe, every leg, `/metrics` scrapes, ZMQ KV events). Unchecked, that is a
server-side request forgery: the admin API would reach a cloud metadata service or any host
the coordinator can see. So every host in the body (url, metrics_url, the KV event
endpoints) is checked here before anything connects:

1. `denied_networks` first: an address inside one is refused whatever else allows it.
   Default: IPv4 link-local `169.254.0.0/16` (AWS/GCP/Azure/OpenStack metadata at
   169.254.169.254), IPv6 link-local `fe80::/10`, AWS's IPv6 metadata `fd00:ec2::254/128`,
   Alibaba's metadata `100.100.100.200/32`, and `0.0.0.0/8` / `::/128` ("this host",
   which Linux routes to loopback, a bypass of a loopback-only policy).
2. `denied_hosts` (names, case-insensitive): refused before resolution. Default: the metadata
   names `metadata.google.internal`, `metadata.goog`, `metadata`, `instance-data`.
3. `allowed_hosts` (names): allowed without resolving. Default: `localhost`.
4. Otherwise a name is resolved and EVERY address it resolves to must be inside
   `allowed_networks` (and in no denied network). Default: loopback `127.0.0.0/8`, `::1`,
   the private ranges fleets use: RFC 1918 `10.0.0.0/8`, `172.16.0.0/12`, `192.168.0.0/16`,
   carrier-grade NAT `100.64.0.0/10` (Kubernetes pod networks on some clouds), and IPv6 ULA
   `fc00::/7`.

A refusal names the field and the address (`AllowError`, a 403 at the admin API). The check
itself (`check_host`) is pure: the caller resolves the name and passes the addresses, so
the decision is testable without DNS. Resolving once and connecting later leaves DNS
rebinding open for names (not for literal addresses): for a hostile network, list literal
addresses or exact names only.

The static fleet file's own endpoints are not checked: whoever writes the file already
chooses where the coordinator connects.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_ALLOWED_NETWORKS = (
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
)
DEFAULT_DENIED_NETWORKS = (
    "169.254.0.0/16",
    "fe80::/10",
    "fd00:ec2::254/128",
    "100.100.100.200/32",
    "0.0.0.0/8",
    "::/128",
)
DEFAULT_DENIED_HOSTS = ("metadata.google.internal", "metadata.goog", "metadata", "instance-data")


class AllowError(ValueError):
    """A host the allow-list refuses; the message names the host and the address."""


class ReplicaAllowList(BaseModel):
    """Where run-time replicas may point (see the module docstring for the rules)."""

    model_config = ConfigDict(extra="forbid")

    allowed_networks: list[str] = Field(
        default_factory=lambda: list(DEFAULT_ALLOWED_NETWORKS),
        description="CIDRs a run-time replica's addresses must be in (default: loopback and "
        "private ranges).",
    )
    allowed_hosts: list[str] = Field(
        default_factory=lambda: ["localhost"],
        description="Host names allowed without resolving them.",
    )
    denied_networks: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DENIED_NETWORKS),
        description="CIDRs always refused, even inside an allowed network (link-local, metadata).",
    )
    denied_hosts: list[str] = Field(
        default_factory=lambda: list(DEFAULT_DENIED_HOSTS),
        description="Host names always refused (cloud metadata names).",
    )

    @field_validator("allowed_networks", "denied_networks")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"not a network (CIDR like 10.0.0.0/8): {cidr!r}") from None
        return value

    def networks(self, which: Sequence[str]) -> list[Network]:
        return [ipaddress.ip_network(cidr, strict=False) for cidr in which]


def literal_address(host: str) -> Address | None:
    """`host` as an IP address (brackets stripped), or None for a name."""
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _unmapped(address: Address) -> Address:
    # ::ffff:169.254.169.254 reaches the IPv4 address: judge it as that
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def check_host(
    field: str, host: str, addresses: Sequence[Address], allow: ReplicaAllowList
) -> None:
    """Raise `AllowError` unless `host` (resolved to `addresses`) may be connected to.

    `addresses` is what the caller resolved `host` to (for a literal address: itself); it
    is ignored for a name in `allowed_hosts`.
    """
    name = host.strip("[]").rstrip(".").lower()
    if name in {h.lower() for h in allow.denied_hosts}:
        raise AllowError(f"{field}: host {host!r} is a metadata name, refused")
    if literal_address(name) is None and name in {h.lower() for h in allow.allowed_hosts}:
        return
    if not addresses:
        raise AllowError(f"{field}: host {host!r} does not resolve")
    denied = allow.networks(allow.denied_networks)
    allowed = allow.networks(allow.allowed_networks)
    for raw in addresses:
        address = _unmapped(raw)
        for net in denied:
            if address.version == net.version and address in net:
                raise AllowError(
                    f"{field}: address {address} (host {host!r}) is in the denied network "
                    f"{net} (link-local / metadata), refused"
                )
        if not any(address.version == net.version and address in net for net in allowed):
            raise AllowError(
                f"{field}: address {address} (host {host!r}) is not in "
                "coordinator.replica_allow.allowed_networks, refused"
            )
