"""A run's results: one row per expectation (over `--repeat` attempts, flaky ones marked), as a
table for people and as JUnit XML for CI (`xml.etree`, the schema Jenkins, GitLab and GitHub
reporters read: a testsuite per scenario, a testcase per expectation)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from voice.evals.checks import Status
from voice.evals.runner import Attempt

_COLOURS = {"pass": "green", "fail": "red", "warn": "yellow", "skip": "dim"}


@dataclass(frozen=True)
class Row:
    """One expectation over every attempt: its worst status, and how many attempts passed."""

    scenario: str
    turn: int | None
    expectation: str
    status: Status
    detail: str
    passed: int
    runs: int

    @property
    def flaky(self) -> bool:
        return self.runs > 1 and 0 < self.passed < self.runs

    @property
    def where(self) -> str:
        return "call" if self.turn is None else f"turn {self.turn + 1}"


def rows(attempts: Sequence[Attempt]) -> list[Row]:
    """Every expectation's row, in the order first seen."""
    seen: dict[tuple[str, int | None, str], list[tuple[Status, str]]] = {}
    for attempt in attempts:
        for outcome in attempt.outcomes:
            seen.setdefault(outcome.key, []).append((outcome.status, outcome.detail))
    found = []
    for (scenario, turn, expectation), results in seen.items():
        statuses = [status for status, _ in results]
        order: tuple[Status, ...] = ("fail", "warn", "pass", "skip")
        worst: Status = next((s for s in order if s in statuses), "skip")
        detail = " | ".join(dict.fromkeys(d for s, d in results if s == worst))
        passed = statuses.count("pass")
        found.append(Row(scenario, turn, expectation, worst, detail, passed, len(results)))
    return found


def failed(table: Sequence[Row]) -> bool:
    return any(row.status == "fail" for row in table)


def result_text(row: Row) -> str:
    if row.runs == 1:
        return row.status.upper()
    text = f"{row.status.upper()} {row.passed}/{row.runs}"
    return text + " flaky" if row.flaky else text


def print_table(table: Sequence[Row], console: Console) -> None:
    """The rows as a table, then a line of totals."""
    view = Table(show_lines=False)
    for column in ("scenario", "turn", "expectation", "result", "what was heard"):
        view.add_column(column, overflow="fold")
    for row in table:
        colour = _COLOURS[row.status]
        view.add_row(
            row.scenario, row.where, row.expectation, f"[{colour}]{result_text(row)}[/]", row.detail
        )
    console.print(view)
    counts = {s: sum(1 for r in table if r.status == s) for s in ("pass", "fail", "warn", "skip")}
    flaky = sum(1 for r in table if r.flaky)
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    console.print(summary + (f", {flaky} flaky" if flaky else ""), highlight=False)


def junit(table: Sequence[Row]) -> ET.ElementTree[ET.Element]:
    """The rows as JUnit XML: a testsuite per scenario, a testcase per expectation; a failure
    carries what was heard, a skip why, a warning (a late reply, not strict) its figure."""
    root = ET.Element("testsuites", name="hotline test")
    suites: dict[str, ET.Element] = {}
    for row in table:
        suite = suites.get(row.scenario)
        if suite is None:
            suite = ET.SubElement(root, "testsuite", name=row.scenario)
            suites[row.scenario] = suite
        case = ET.SubElement(
            suite, "testcase", classname=row.scenario, name=f"{row.where}: {row.expectation}"
        )
        if row.status == "fail":
            message = f"{result_text(row)}: {row.detail}" if row.runs > 1 else row.detail
            ET.SubElement(case, "failure", message=message, type="expectation").text = row.detail
        elif row.status == "skip":
            ET.SubElement(case, "skipped", message=row.detail)
        else:
            ET.SubElement(case, "system-out").text = f"{result_text(row)}: {row.detail}"
    for name, suite in suites.items():
        mine = [r for r in table if r.scenario == name]
        suite.set("tests", str(len(mine)))
        suite.set("failures", str(sum(1 for r in mine if r.status == "fail")))
        suite.set("skipped", str(sum(1 for r in mine if r.status == "skip")))
        suite.set("errors", "0")
    root.set("tests", str(len(table)))
    root.set("failures", str(sum(1 for r in table if r.status == "fail")))
    return ET.ElementTree(root)


def write_junit(table: Sequence[Row], path: Path) -> None:
    tree = junit(table)
    ET.indent(tree)
    tree.write(path, encoding="utf-8", xml_declaration=True)
