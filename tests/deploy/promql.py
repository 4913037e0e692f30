"""Metric names in a PromQL expression (Grafana's `$variables` allowed), without a PromQL parser.

Enough for the queries pdorch ships (deploy/grafana/, the PrometheusRule): what is left of an
expression once strings, label matchers `{...}`, ranges `[...]`, Grafana variables and
grouping clauses (`by (...)`, `on (...)`, ...) are removed is functions, operators, keywords,
numbers (with durations) and metric names; a name followed by `(` is a function.
"""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GRAFANA_VAR = re.compile(r"\$\{[^}]*\}|\$\w+")
_GROUPING = re.compile(
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "inf", "nan", "group_left", "group_right"}
)


def metric_names(expr: str) -> set[str]:
    """Every metric name `expr` selects (series names, with `_bucket`/`_sum`/... suffixes)."""
    text = _STRING.sub('""', expr)
    text = _GRAFANA_VAR.sub("", text)
    text = _MATCHERS.sub("", text)
    text = _RANGE.sub("", text)
    text = _GROUPING.sub("", text)
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        name = match.group()
        before = text[match.start() - 1] if match.start() else " "
        if before.isdigit() or before == ".":  # the unit of a duration or exponent: 5m, 1e3
            continue
        if text[match.end() :].lstrip().startswith("("):  # a function call
            continue
        if name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def exposed_names(exposition: str) -> set[str]:
    """Series names in a Prometheus text exposition (`/metrics`)."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{\s]", line, maxsplit=1)[0])
    return names
