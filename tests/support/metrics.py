"""A worker's `GET /metrics` read back in tests: every sample by name and labels, and how much
a scenario moved it (`Samples.since`)."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, frozenset[tuple[str, str]]]


@dataclass(frozen=True)
class Samples:
    """One scrape: sample name and labels -> value."""

    values: dict[Key, float]

    def get(self, name: str, **labels: str) -> float:
        """The sample `name` with exactly `labels`; 0 if there is none (not yet observed)."""
        return self.values.get((name, frozenset(labels.items())), 0.0)

    def total(self, name: str, **labels: str) -> float:
        """The sum of every sample `name` whose labels include `labels`."""
        wanted = set(labels.items())
        return sum(v for (n, ls), v in self.values.items() if n == name and wanted <= ls)

    def since(self, before: Samples) -> Samples:
        """How much each sample moved from `before` (counters and histograms only grow)."""
        return Samples({k: v - before.values.get(k, 0.0) for k, v in self.values.items()})


def scrape(server_url: str) -> Samples:
    """The worker's metrics now (blocking)."""
    response = httpx.get(f"{server_url}/metrics", timeout=10)
    response.raise_for_status()
    values = {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }
    return Samples(values)
