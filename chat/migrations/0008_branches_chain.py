"""Messages as a tree (`chat.tree`): existing sessions become one chain.

Each message's parent is the message before it, except that the answer of a
retried run (assistant or tool messages following another run's answer) hangs
under the question it answered again, beside the earlier answer: the branch
`chat.runner.session_history` already sent. Each turn learns the message it
answers.
"""

from django.db import migrations
from django.db.models import F

BATCH = 2000
ANSWER = ("assistant", "tool")


def _parents(messages):
    """(message, parent id, question id) for one session's messages in order."""
    prev = question = None
    for m in messages:
        parent = prev.pk if prev else None
        retried = (
            prev is not None
            and m.role in ANSWER
            and prev.role in ANSWER
            and m.run_id != prev.run_id
        )
        if retried and question is not None:
            parent = question
        yield m, parent, question
        if m.role not in ANSWER:
            question = m.pk
        prev = m


def chain(apps, schema_editor):
    Message = apps.get_model("chat", "Message")
    Turn = apps.get_model("chat", "Turn")
    Message.objects.update(selected_at=F("created_at"))
    batch, replies, session = [], {}, None
    rows = Message.objects.order_by("session_id", "id").only(
        "id", "session_id", "role", "run_id"
    )
    current: list = []

    def flush_session():
        for m, parent, question in _parents(current):
            if parent is not None:
                m.parent_id = parent
                batch.append(m)
            if m.run_id and m.run_id not in replies:
                replies[m.run_id] = m.pk if m.role == "user" else question
        current.clear()

    for m in rows.iterator(chunk_size=BATCH):
        if m.session_id != session:
            flush_session()
            session = m.session_id
        current.append(m)
        if len(batch) >= BATCH:
            Message.objects.bulk_update(batch, ["parent"], batch_size=BATCH)
            batch = []
    flush_session()
    Message.objects.bulk_update(batch, ["parent"], batch_size=BATCH)
    for run_id, question in replies.items():
        if question is not None:
            Turn.objects.filter(run_id=run_id).update(reply_to_id=question)



class Migration(migrations.Migration):
    dependencies = [("chat", "0007_branches")]

    operations = [migrations.RunPython(chain, migrations.RunPython.noop)]
