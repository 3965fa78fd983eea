"""Whether a DaemonSet's pod may run on a node with given labels: its nodeSelector and required
node affinity, read as the scheduler reads them (terms ORed, a term's expressions ANDed, NotIn
and DoesNotExist true for an absent label). Lets the tests check that the device plugin's and the
DRA driver's DaemonSets are exclusive per node without a cluster."""

from __future__ import annotations

from typing import Any

Doc = dict[str, Any]


def runs_on(daemonset: Doc, labels: dict[str, str]) -> bool:
    spec = daemonset["spec"]["template"]["spec"]
    selector = spec.get("nodeSelector") or {}
    if any(labels.get(key) != value for key, value in selector.items()):
        return False
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is None:
        return True
    return any(_term_matches(term, labels) for term in required["nodeSelectorTerms"])


def _term_matches(term: Doc, labels: dict[str, str]) -> bool:
    assert "matchFields" not in term, "only label expressions are read here"
    return all(_expression_matches(e, labels) for e in term.get("matchExpressions") or [])


def _expression_matches(expression: Doc, labels: dict[str, str]) -> bool:
    key, operator = expression["key"], expression["operator"]
    values = expression.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return labels.get(key) not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    raise AssertionError(f"operator {operator} is not read here")


def merge_patch(base: Any, patch: Any) -> Any:
    """RFC 7386 merge of a patch into a document: maps merged key by key, null removes, anything
    else replaced. What `kubectl patch` and kustomize make of a strategic merge patch whose lists
    the base lacks (a list already in the base may merge differently there)."""
    if not isinstance(base, dict) or not isinstance(patch, dict):
        return patch
    merged = dict(base)
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(base.get(key), value)
    return merged
