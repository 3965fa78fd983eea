"""Which namespaces' claims may share one device's MPS control daemon: pure.

Every client that reaches a daemon's pipe directory can send it any control command (`quit`,
`set_default_*`), and every client maps the daemon's shm directory read-write, so the clients of
one daemon can stop it, reconfigure it and read each other's shared memory. A GPU has one MPS
server, so two claims on a device either share its daemon or cannot both use MPS there. The
boundary is the namespace, the unit Kubernetes grants "may create pods and claims" to: claims of
one namespace share a device's daemon; a claim of another namespace is refused while the daemon
serves one, unless the operator lists both in one group of `--mps-shared-namespaces`
(`MpsTenancy`), namespaces that trust each other.

The flag's value is groups separated by ';', each the namespaces of one group separated by ','
(`team-a,team-a-batch;ml-1,ml-2`). A namespace is in at most one group, so trust is the same
whichever claim came first and through whichever claim of a group the daemon was started.
"""

from __future__ import annotations

from collections.abc import Iterable

from deviceplugin.model.kubenames import dns_label_problem
from deviceplugin.model.record import record

SHARED_NAMESPACES_FLAG = "--mps-shared-namespaces"
SHARED_NAMESPACES_ENV = "DP_DRA_MPS_SHARED_NAMESPACES"

Groups = tuple[tuple[str, ...], ...]


@record(frozen=True)
class MpsTenancy:
    """The groups of namespaces whose claims may share one daemon; any two other namespaces
    never do."""

    groups: Groups = ()

    def trusted(self, one: str, other: str) -> bool:
        return one == other or any(one in group and other in group for group in self.groups)

    def refusal(self, device: str, namespace: str, serving: Iterable[str]) -> str | None:
        """Why a claim of `namespace` may not use `device`'s daemon, which serves claims of the
        namespaces `serving`; None when it may."""
        others = sorted({n for n in serving if not self.trusted(namespace, n)})
        if not others:
            return None
        which = f"namespace {others[0]}" if len(others) == 1 else f"namespaces {', '.join(others)}"
        return (
            f"{device} runs an MPS daemon for {which}; a claim of namespace {namespace} may not"
            " share it: the clients of one MPS daemon can read each other's shared memory and"
            f" stop or reconfigure the daemon ({SHARED_NAMESPACES_FLAG} lists namespaces that"
            " may share one)"
        )

    def mixed(self, serving: Iterable[str]) -> list[str]:
        """The namespaces of `serving` that do not all trust each other (sorted); [] when they
        do. A driver restarted with other groups can find such a daemon."""
        names = sorted(set(serving))
        if all(self.trusted(names[0], n) for n in names[1:]):
            return []
        return names


def shared_namespaces(value: str | None) -> Groups:
    """The groups of `--mps-shared-namespaces` (unset: none). Raises ValueError saying what is
    wrong, naming the group."""
    if not value or not value.strip():
        return ()
    groups: list[tuple[str, ...]] = []
    seen: dict[str, int] = {}
    for number, text in enumerate(value.split(";"), 1):
        where = f"group {number} ({text.strip()!r})"
        names = tuple(name.strip() for name in text.split(","))
        if any(not name for name in names):
            raise ValueError(
                f"{where} has an empty namespace name: groups are separated by ';' and the"
                " namespaces of a group by ','"
            )
        if len(names) < 2:
            raise ValueError(
                f"{where} names one namespace: a group lists two or more namespaces whose"
                " claims may share one MPS daemon (a namespace's own claims always do)"
            )
        for name in names:
            if (problem := dns_label_problem(name)) is not None:
                raise ValueError(f"{where}: {problem}, so no namespace's name")
            if seen.get(name) == number:
                raise ValueError(f"{where}: namespace {name} is named twice")
            if name in seen:
                raise ValueError(
                    f"{where}: namespace {name} is in group {seen[name]} as well: a namespace is"
                    " in one group (to let two groups share a daemon, make them one)"
                )
            seen[name] = number
        groups.append(names)
    return tuple(groups)
