"""This process's model requests, in the registry of `journal.metrics`.

Read from the providers at scrape time (`chat.providers.registry`): requests
open now, requests started and HTTP retries since each provider was built in
this process. Labelled by provider name only (a name from the configuration,
never a key, a URL or a model's answer). Registered once, by `ChatConfig.ready`.
"""

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from journal import metrics

from .providers import registry


class ProviderCollector(Collector):
    def collect(self):
        providers = registry.built()
        yield GaugeMetricFamily(
            "hermes_provider_requests_in_flight",
            "Model requests open in this process (0 when idle).",
            value=registry.active_requests(),
        )
        started = CounterMetricFamily(
            "hermes_provider_requests",
            "Model requests started by this process, by provider.",
            labels=["provider"],
        )
        retries = CounterMetricFamily(
            "hermes_provider_http_retries",
            "Model requests this process sent again after a retryable HTTP error.",
            labels=["provider"],
        )
        for name, provider in sorted(providers.items()):
            started.add_metric([name], getattr(provider, "requests_started", 0))
            retries.add_metric([name], getattr(provider, "http_retries", 0))
        yield started
        yield retries


def register() -> None:
    metrics.REGISTRY.register(ProviderCollector())
