"""deploy/grafana/hotline-dashboard.json: a dashboard Grafana can import, whose every query names
a metric that `voice.server.metrics` registers, and which shows every Hotline metric."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

import voice.server.metrics  # noqa: F401  (registers the metrics in the default registry)

DASHBOARD = Path(__file__).resolve().parent.parent / "deploy" / "grafana" / "hotline-dashboard.json"
DATASOURCE = "${DS_PROMETHEUS}"

# The series names a metric family of each type exposes.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "unknown": ("",),
}
PROMQL_WORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "offset",
    "and",
    "or",
    "unless",
    "inf",
    "nan",
}


def registered() -> dict[str, str]:
    """Every series name the default registry can expose, mapped to its metric family."""
    names: dict[str, str] = {}
    for family in REGISTRY.collect():
        for suffix in SUFFIXES.get(family.type, ("",)):
            names[family.name + suffix] = family.name
        for sample in family.samples:
            names[sample.name] = family.name
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"\$\{?\w+\}?", "", text)  # Grafana variables
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    # Grafana's label_values(metric, label): the label is no metric.
    text = re.sub(r"\blabel_values\(\s*([\w:]+)\s*,\s*\w+\s*\)", r"\1", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    found = re.findall(r"(?<![\w.:])([a-zA-Z_:][\w:]*)(?![\w:]|\s*\()", text)
    return {name for name in found if name.lower() not in PROMQL_WORDS}


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def panels() -> list[dict[str, Any]]:
    """Every panel but rows, those nested in collapsed rows included."""
    found: list[dict[str, Any]] = []
    for panel in dashboard()["panels"]:
        if panel["type"] == "row":
            found.extend(panel.get("panels", []))
        else:
            found.append(panel)
    return found


def queries() -> list[str]:
    exprs = [target["expr"] for panel in panels() for target in panel["targets"]]
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def test_metric_names_are_read_from_promql() -> None:
    expr = (
        'histogram_quantile(0.9, sum by (le, part) (rate(hotline_turn_latency_seconds_bucket{part="'
        'stt", instance=~"$instance"}[5m]))) / on (part) group_left hotline_nope offset 5m'
    )
    assert metric_names(expr) == {"hotline_turn_latency_seconds_bucket", "hotline_nope"}
    assert metric_names('label_values(hotline_active_calls{job="x"}, instance)') == {
        "hotline_active_calls"
    }
    assert metric_names("60 * sum(rate(hotline_transfers_total[5m]))") == {
        "hotline_transfers_total"
    }


def test_the_registry_names_every_series_of_the_hotline_metrics() -> None:
    names = registered()
    assert names["hotline_calls_admitted_total"] == "hotline_calls_admitted"
    assert names["hotline_turn_latency_seconds_bucket"] == "hotline_turn_latency_seconds"
    assert names["hotline_tool_seconds_count"] == "hotline_tool_seconds"
    assert names["hotline_active_calls"] == "hotline_active_calls"


def test_the_dashboard_is_importable_json() -> None:
    board = dashboard()
    assert isinstance(board["schemaVersion"], int) and board["schemaVersion"] >= 36
    assert board["title"] and board["uid"]
    assert board["id"] is None  # an import gets a fresh id
    (source,) = board["__inputs"]
    assert (source["name"], source["type"], source["pluginId"]) == (
        "DS_PROMETHEUS",
        "datasource",
        "prometheus",
    )
    ids = [panel["id"] for panel in board["panels"]] + [
        nested["id"] for panel in board["panels"] for nested in panel.get("panels", [])
    ]
    assert len(ids) == len(set(ids))
    assert len(panels()) >= 10
    for panel in panels():
        assert panel["title"] and panel["type"] in {"timeseries", "stat", "gauge", "bargauge"}
        assert panel["datasource"]["uid"] == DATASOURCE, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["datasource"]["uid"] == DATASOURCE, panel["title"]
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]


@pytest.mark.parametrize("expr", queries())
def test_every_query_names_registered_metrics(expr: str) -> None:
    names = metric_names(expr)
    assert names, f"no metric in {expr!r}"
    unknown = names - set(registered())
    assert not unknown, f"{sorted(unknown)} are not metrics of voice.server.metrics: {expr!r}"


def test_every_hotline_metric_is_on_the_dashboard() -> None:
    names = registered()
    shown = {names[name] for expr in queries() for name in metric_names(expr) if name in names}
    hotline = {family for family in names.values() if family.startswith("hotline_")}
    assert hotline - shown == set()


def test_latency_quantiles_come_from_the_histogram_buckets() -> None:
    latency = [expr for expr in queries() if "hotline_turn_latency_seconds" in expr]
    for quantile in ("0.5", "0.9", "0.99"):
        assert any(
            f"histogram_quantile({quantile}," in expr
            and "rate(hotline_turn_latency_seconds_bucket" in expr
            and "[5m]" in expr
            and "part" in expr
            for expr in latency
        ), quantile
