"""The run becomes generic: what a run means to an app lives in that app.

Chat copies its fields into `chat.Turn` first (chat/0003 runs before this).
Dropping the legacy session column also drops its PostgreSQL foreign key.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("journal", "0004_run_subject"),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name="run",
            name="run_unique_idempotency_key",
        ),
        migrations.RemoveField(model_name="run", name="legacy_session_id"),
        migrations.RemoveField(model_name="run", name="model"),
        migrations.RemoveField(model_name="run", name="provider"),
        migrations.RemoveField(model_name="run", name="request"),
        migrations.RemoveField(model_name="run", name="usage"),
        migrations.RemoveField(model_name="run", name="diagnostics"),
        migrations.RemoveField(model_name="run", name="idempotency_key"),
        migrations.RemoveField(model_name="run", name="idempotency_hash"),
    ]
