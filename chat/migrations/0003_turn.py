"""Chat's own row for each run (`Turn`), filled from the journal's old columns.

Runs before journal/0005, which drops those columns from `journal.Run`.
"""

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.db.models import Value
from django.db.models.functions import Cast, Concat

BATCH = 2000
FIELDS = (
    "model",
    "provider",
    "usage",
    "diagnostics",
    "idempotency_key",
    "idempotency_hash",
)


def copy_to_turns(apps, schema_editor):
    Run = apps.get_model("journal", "Run")
    Turn = apps.get_model("chat", "Turn")
    runs = Run.objects.filter(legacy_session_id__isnull=False)
    # One statement names every chat run's subject: "chat.session:<id>".
    runs.update(
        subject=Concat(
            Value("chat.session:"),
            Cast("legacy_session_id", output_field=models.CharField()),
            output_field=models.CharField(),
        )
    )
    batch = []
    for run in runs.order_by("pk").iterator(chunk_size=BATCH):
        batch.append(
            Turn(
                run_id=run.pk,
                owner_id=run.owner_id,
                session_id=run.legacy_session_id,
                **{name: getattr(run, name) for name in FIELDS},
            )
        )
        if len(batch) >= BATCH:
            Turn.objects.bulk_create(batch)
            batch = []
    Turn.objects.bulk_create(batch)


def copy_back(apps, schema_editor):
    Run = apps.get_model("journal", "Run")
    Turn = apps.get_model("chat", "Turn")
    for turn in Turn.objects.order_by("pk").iterator(chunk_size=BATCH):
        Run.objects.filter(pk=turn.run_id).update(
            legacy_session_id=turn.session_id,
            **{name: getattr(turn, name) for name in FIELDS},
        )


class Migration(migrations.Migration):
    dependencies = [
        ("chat", "0002_initial"),
        ("journal", "0004_run_subject"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]
    run_before = [("journal", "0005_run_generic")]

    operations = [
        migrations.CreateModel(
            name="Turn",
            fields=[
                (
                    "run",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="turn",
                        serialize=False,
                        to="journal.run",
                    ),
                ),
                ("model", models.CharField(blank=True, max_length=200)),
                (
                    "provider",
                    models.CharField(blank=True, db_index=True, max_length=80),
                ),
                ("usage", models.JSONField(blank=True, default=dict)),
                ("diagnostics", models.JSONField(blank=True, default=dict)),
                ("idempotency_key", models.CharField(blank=True, max_length=200)),
                ("idempotency_hash", models.CharField(blank=True, max_length=64)),
                (
                    "owner",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="turns",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                (
                    "session",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="turns",
                        to="chat.chatsession",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        condition=models.Q(("idempotency_key", ""), _negated=True),
                        fields=("owner", "idempotency_key"),
                        name="turn_unique_idempotency_key",
                    )
                ],
            },
        ),
        migrations.RunPython(copy_to_turns, copy_back),
    ]
