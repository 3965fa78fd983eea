"""What Kubernetes allows in the names and UIDs that this package puts into file and socket
paths, checked before any path is built from them: a claim UID from the kubelet, a driver name
from a flag, a share ID from an allocation. Each check returns why a value is not allowed, or
None, so that the caller can say which field it was.

- a UID: a lowercase RFC 4122 UUID in 8-4-4-4-12 form, as the API server generates them (the
  `k8s-uuid` format of apimachinery's declarative validation);
- a DNS label (RFC 1123): at most 63 of `a-z`, `0-9`, `-`, starting and ending alphanumeric
  (namespaces);
- a DNS subdomain: dot-separated DNS labels, at most 253 characters (object names, DRA driver
  names, which the resource API further limits to 63).
"""

from __future__ import annotations

import re

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
DNS_LABEL_MAX = 63
DNS_SUBDOMAIN_MAX = 253
DRIVER_NAME_MAX = 63  # resource.k8s.io: a driver name is a DNS subdomain of at most 63


def uid_problem(value: str) -> str | None:
    """Why `value` is not a Kubernetes UID, or None."""
    if re.fullmatch(_UUID, value):
        return None
    return f"{value!r} is not a UID (a lowercase UUID such as 3f2b6c1e-8d4a-4c2e-9b1f-0a6d2e7c5b90)"


def dns_label_problem(value: str) -> str | None:
    """Why `value` is not a DNS label, or None."""
    if len(value) > DNS_LABEL_MAX:
        return f"{value!r} is longer than {DNS_LABEL_MAX} characters"
    if not re.fullmatch(_DNS_LABEL, value):
        return (
            f"{value!r} is not a DNS label (lowercase letters, digits and '-', starting and"
            " ending with a letter or digit)"
        )
    return None


def dns_subdomain_problem(value: str, limit: int = DNS_SUBDOMAIN_MAX) -> str | None:
    """Why `value` is not a DNS subdomain of at most `limit` characters, or None."""
    if len(value) > limit:
        return f"{value!r} is longer than {limit} characters"
    if not value or not all(re.fullmatch(_DNS_LABEL, label) for label in value.split(".")):
        return (
            f"{value!r} is not a DNS subdomain (dot-separated lowercase letters, digits and '-',"
            " each part starting and ending with a letter or digit)"
        )
    return None


_QUALIFIED_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?"


def is_extended_resource_name(name: str) -> bool:
    """Kubernetes' IsExtendedResourceName: `domain/name` outside kubernetes.io, the names a
    device plugin advertises and a DeviceClass's `extendedResourceName` may take."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    prefix, _, short = f"requests.{name}".partition("/")
    return (
        "/" not in short
        and dns_subdomain_problem(prefix) is None
        and len(short) <= 63
        and re.fullmatch(_QUALIFIED_NAME, short) is not None
    )
