"""The user's notification stream names the session of every run notice.

A run's "finished" notice comes from the journal, which knows only the run's
subject; the stream adds the session id the page reads (`chat.sse.for_page`).
"""

import json
import threading

import httpx

from chat.sse import for_page
from hermes_testing.api import new_session, start_run, stream
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import wait_until


def _listen(url: str, headers: dict, notes: list, stop: threading.Event) -> None:
    """Keep every (event, data) of the stream until `stop` and one more line."""
    event = None
    with httpx.Client(timeout=30) as client:
        with client.stream("GET", url, headers=headers) as response:
            for line in response.iter_lines():
                if line.startswith("event: "):
                    event = line[len("event: ") :]
                elif line.startswith("data: ") and event is not None:
                    notes.append((event, json.loads(line[len("data: ") :])))
                if stop.is_set():
                    return


def test_run_notices_carry_the_run_and_its_session(
    server, alice, fake_llm, live_worker, fast_readers
):
    notes: list = []
    stop = threading.Event()
    listener = threading.Thread(
        target=_listen,
        args=(f"{server.url}/api/stream/", alice[1], notes, stop),
        daemon=True,
    )
    listener.start()
    wait_until(lambda: ("hello", {}) in notes)
    session_id = new_session(server, alice[1])
    fake_llm.push(Reply(text="done"))
    run_id = start_run(server, alice[1], session_id, "hi")
    stream(server, alice[1], run_id)  # to its end
    wait_until(lambda: [n for e, n in notes if n.get("action") == "finished"])
    stop.set()
    runs = [data for event, data in notes if event == "run"]
    assert runs == [
        {"action": "started", "run_id": run_id, "session_id": session_id},
        {
            "action": "finished",
            "run_id": run_id,
            "subject": f"chat.session:{session_id}",
            "session_id": session_id,
            "status": "completed",
        },
    ]


def test_a_notice_about_another_subject_names_no_session():
    assert for_page({"action": "finished", "subject": "demo:1"})["session_id"] is None
    created = {"action": "created", "session_id": 4}
    assert for_page(created) == created
