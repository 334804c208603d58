"""A worker process serves its own Prometheus metrics (`manage.py worker
--metrics-port`): what happens there is invisible to the web processes'
`/metrics`."""

import re

import httpx
import pytest

from hermes_testing.api import new_session, start_run, stream, text_of
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until
from hermes_testing.workers import spawn_worker_with_metrics
from journal.models import Run

EVENTS = "hermes_journal_events_appended_total"
FIRST_TOKENS = "hermes_model_first_token_seconds_count"
TICKS = "hermes_journal_tick_seconds_count"
OPENAI_REQUESTS = 'hermes_provider_requests_total{provider="openai"}'
IN_FLIGHT = "hermes_provider_requests_in_flight"


def scrape(url: str) -> tuple[dict[str, float], str]:
    response = httpx.get(url, timeout=10)
    assert response.status_code == 200
    samples = {}
    for line in response.text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples, response.text


@pytest.mark.slow
def test_a_worker_process_serves_the_metrics_of_the_turns_it_ran(
    server, alice, fake_llm, tmp_path
):
    proc, url = spawn_worker_with_metrics(fake_llm, tmp_path / "worker.log")
    try:
        assert url.startswith("http://127.0.0.1:")  # loopback unless told otherwise
        before, _ = scrape(url)
        assert before[EVENTS] == 0 and before[FIRST_TOKENS] == 0
        assert before[TICKS] == 0
        fake_llm.push(Reply(text="Counted in the worker."))
        session_id = new_session(server, alice[1])
        run_id = start_run(server, alice[1], session_id, "count me there")
        assert text_of(stream(server, alice[1], run_id)) == "Counted in the worker."
        after, body = scrape(url)
        wait_until(lambda: scrape(url)[0][IN_FLIGHT] == 0)  # its response closed
    finally:
        proc.terminate()
        proc.wait(30)
    run = Run.objects.get(id=run_id)
    assert run.status == "completed"
    assert after[EVENTS] >= run.last_seq  # the worker appended the run's events
    assert after[FIRST_TOKENS] == 1
    assert after[TICKS] >= 1  # its text went through the worker's journal ticks
    assert after[OPENAI_REQUESTS] == 1
    for private in (run_id, "alice", "count me there", "Counted in the worker."):
        assert private not in body
    assert set(re.findall(r"[{,](\w+)=", body)) <= {"le", "provider"}
