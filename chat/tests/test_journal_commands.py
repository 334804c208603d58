"""`replay_run` and `prune_journal` on chat's runs: what the chat API serves.

The commands themselves are tested in journal/tests/test_commands.py; here a
live chat run is followed, replayed frames are compared with what the SSE
endpoint sends, and a pruned run's readers get 410 while its session keeps
the transcript.
"""

import io
import json
from datetime import timedelta

import httpx
import pytest
from django.core.management import call_command
from django.utils import timezone

from chat.models import ChatSession, Message
from hermes_testing.api import new_session, start_run
from hermes_testing.fake_llm import Reply
from hermes_testing.harness import read_sse, running_run, wait_until
from hermes_testing.turns import running_turn
from journal.models import Event, Run
from journal.store import append

END = (
    "end",
    {"status": "completed", "terminal_state": "completed", "message_id": None},
)
TEXT = "Durable streams never lose a word; this one is followed live by replay_run."


def replay_out(*args) -> str:
    out = io.StringIO()
    call_command("replay_run", *args, stdout=out)
    return out.getvalue()


def test_replayed_sse_frames_are_what_the_stream_sends(server, alice):
    run = running_run(alice[0])
    append(
        run_id=run.id,
        token=1,
        events=[("start", {}), ("token", {"text": "Hello, «world»"}), END],
    )
    sse = replay_out(run.id, "--format", "sse")
    with httpx.Client(timeout=10) as client:
        body = client.get(
            f"{server.url}/api/runs/{run.id}/events/", headers=alice[1]
        ).text
    # Byte for byte, after the endpoint's `retry:` line.
    assert body == f"retry: 1000\n\n{sse}"


@pytest.mark.slow
def test_replay_run_follow_attaches_to_a_live_run_and_returns_at_end(
    server, alice, fake_llm, live_worker, fast_readers
):
    fake_llm.push(Reply(text=TEXT, chunk_chars=3, tokens_per_s=15))  # about 1.7 s
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "talk to me")
    wait_until(lambda: Event.objects.filter(run_id=run_id, type="token").exists())
    assert Run.objects.get(id=run_id).status == Run.Status.RUNNING  # attaching mid-run

    followed = replay_out(run_id, "--follow")

    run = Run.objects.get(id=run_id)
    assert run.status == Run.Status.COMPLETED
    message = Message.objects.get(run_id=run_id, role="assistant")
    assert followed == (
        f"[start model=fake-model provider=openai subject=chat.session:{session_id}]\n"
        f"{TEXT}\n"
        # the fake model's default usage frame
        "[usage input_tokens=12 output_tokens=34 total_tokens=46]\n"
        f"[end status=completed terminal_state=completed message_id={message.pk}]\n"
    )
    assert message.content == TEXT
    # What followed live is what a replay of the finished run prints.
    assert replay_out(run_id) == followed
    followed_jsonl = replay_out(
        run_id, "--follow", "--format", "jsonl"
    )  # ended: replay only
    assert [json.loads(line)["seq"] for line in followed_jsonl.splitlines()] == list(
        range(1, run.last_seq + 1)
    )


def test_a_pruned_run_is_gone_for_readers_and_its_session_keeps_the_transcript(
    server, alice
):
    session = ChatSession.objects.create(owner=alice[0], title="old chat")
    Message.objects.create(session=session, role="user", content="question")
    run = running_turn(alice[0], session=session)
    append(run_id=run.id, token=1, events=[("token", {"text": "answer"}), END])
    Message.objects.create(session=session, role="assistant", content="answer", run=run)
    Run.objects.filter(id=run.id).update(ended_at=timezone.now() - timedelta(days=40))
    call_command(
        "prune_journal", "--older-than", "30d", "--for-real", stdout=io.StringIO()
    )
    assert Run.objects.get(id=run.id).pruned_at is not None
    sse = read_sse(f"{server.url}/api/runs/{run.id}/events/", headers=alice[1])
    assert sse.status == 410
    page = httpx.get(f"{server.url}/api/runs/{run.id}/events.json", headers=alice[1])
    assert page.status_code == 410 and "pruned" in page.json()["error"]
    assert page.json()["session_id"] == session.pk
    assert list(session.messages.values_list("content", flat=True)) == [
        "question",
        "answer",
    ]
