"""`export_session` / `import_session`: a session round-trips exactly as JSON Lines."""

import io
import json

import pytest
from django.core.management import CommandError, call_command

from chat.models import ChatSession, Message
from hermes_testing.api import CALCULATOR_STEP, new_session, start_run, stream
from hermes_testing.fake_llm import Reply

FIELDS = ("role", "content", "reasoning", "tool_calls", "tool_call_id", "complete")
TOOL_CALLS = [
    {
        "id": "call_1",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "6*7"}'},
    }
]


def transcript(session) -> list[tuple]:
    return list(session.messages.order_by("id").values_list(*FIELDS))


@pytest.fixture
def rich_session(alice):
    session = ChatSession.objects.create(
        owner=alice[0],
        title="Über «tricky» chat",
        model="demo",
        system_prompt="Be brief.\nAlways.",
        archived=True,
    )
    for fields in (
        {"role": "user", "content": "what is 6*7?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning": "use the tool",
            "tool_calls": TOOL_CALLS,
        },
        {"role": "tool", "content": "42", "tool_call_id": "call_1"},
        {"role": "assistant", "content": "It is 4", "complete": False},
        {
            "role": "assistant",
            "content": '2 — 🦊 "quoted"\n\ttabbed',
            "reasoning": "r\u2028s",
        },
    ):
        Message.objects.create(session=session, **fields)
    return session


def test_export_then_import_round_trips_exactly(tmp_path, rich_session, alice, bob):
    path = tmp_path / "session.jsonl"
    err = io.StringIO()
    call_command(
        "export_session", str(rich_session.pk), "--output", str(path), stderr=err
    )
    assert (
        err.getvalue().strip()
        == f"exported session {rich_session.pk}: 5 message(s) to {path}"
    )
    lines = path.read_text(encoding="utf-8").splitlines()
    header = json.loads(lines[0])
    assert (header["type"], header["format"], header["version"]) == (
        "session",
        "hermes-session",
        1,
    )
    assert [json.loads(line)["role"] for line in lines[1:]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "assistant",
    ]

    out = io.StringIO()
    call_command("import_session", str(path), "--owner", "bob", stdout=out)
    imported = ChatSession.objects.exclude(pk=rich_session.pk).get()
    assert (
        out.getvalue().strip()
        == f"imported session {imported.pk} for bob: 5 message(s)"
    )
    assert imported.owner == bob[0]
    assert (
        imported.title,
        imported.model,
        imported.system_prompt,
        imported.archived,
    ) == (rich_session.title, rich_session.model, rich_session.system_prompt, True)
    assert transcript(imported) == transcript(rich_session)
    # And the copy exports to the same lines, but for ids and times.
    again = io.StringIO()
    call_command("export_session", str(imported.pk), stdout=again)
    assert [_stable(line) for line in again.getvalue().splitlines()] == [
        _stable(line) for line in lines
    ]


def _stable(line: str) -> dict:
    obj = json.loads(line)
    for volatile in ("id", "created_at", "updated_at", "run_id"):
        obj.pop(volatile, None)
    return obj


def test_a_session_the_worker_wrote_round_trips(server, alice, fake_llm, live_worker):
    fake_llm.push(CALCULATOR_STEP, Reply(text="It is 42.", reasoning="simple"))
    session_id = new_session(server, alice[1])
    run_id = start_run(server, alice[1], session_id, "what is 6*7?")
    assert stream(server, alice[1], run_id)[-1][1] == "end"
    exported = io.StringIO()
    call_command("export_session", str(session_id), stdout=exported)
    call_command(
        "import_session",
        "-",
        "--owner",
        "alice",
        stdin=io.StringIO(exported.getvalue()),
        stdout=io.StringIO(),
    )
    original, copy = ChatSession.objects.order_by("pk")
    assert transcript(copy) == transcript(original)
    assert [m[0] for m in transcript(copy)] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert copy.messages.filter(run__isnull=False).count() == 0  # runs stay behind


HEAD = '{"type": "session", "format": "hermes-session", "version": 1, "title": "t"}\n'


@pytest.mark.parametrize(
    ("content", "error"),
    [
        ("", "empty file"),
        (
            '{"type": "message", "role": "user", "content": "x"}\n',
            "line 1: not a hermes-session",
        ),
        (
            '{"type":"session","format":"hermes-session","version":9,"title":"t"}\n',
            "line 1: unsupported version 9",
        ),
        (
            HEAD
            + '{"type": "message", "role": "user", "content": "ok"}\n'
            + "\n"
            + '{"type": "message", "role": "wizard", "content": "x"}\n',
            "line 4: unknown role 'wizard'",
        ),
        (
            HEAD + '{"type": "message", "role": "user", "content": 5}\n',
            "line 2: 'content' must be str",
        ),
        (
            HEAD + '{"type": "message", "role": "user"\n',
            "line 2: invalid JSON",
        ),
        (
            '{"type": "session", "format": "hermes-session", "version": 1, "title": "'
            + "x" * 201
            + '"}\n',
            "line 1: 'title': Ensure this field has no more than 200 characters",
        ),
    ],
)
@pytest.mark.slow
def test_import_rejects_bad_files_and_keeps_nothing(tmp_path, alice, content, error):
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(CommandError, match=f"{error}.*nothing was imported"):
        call_command("import_session", str(path), "--owner", "alice")
    assert not ChatSession.objects.exists() and not Message.objects.exists()


def test_commands_name_what_is_missing(tmp_path, rich_session, alice):
    with pytest.raises(CommandError, match="no session 999999"):
        call_command("export_session", "999999")
    path = tmp_path / "s.jsonl"
    call_command(
        "export_session", str(rich_session.pk), "-o", str(path), stderr=io.StringIO()
    )
    with pytest.raises(CommandError, match="exists; not overwriting it"):
        call_command("export_session", str(rich_session.pk), "-o", str(path))
    with pytest.raises(CommandError, match="no user 'nobody'"):
        call_command("import_session", str(path), "--owner", "nobody")
    with pytest.raises(CommandError, match="cannot read"):
        call_command(
            "import_session", str(tmp_path / "missing.jsonl"), "--owner", "alice"
        )
