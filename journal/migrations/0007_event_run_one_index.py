"""Drop the event table's index on `run_id` alone (and PostgreSQL's `LIKE` twin).

`event_unique_run_seq` (run_id, seq) leads with the run and serves every
lookup by run; the extra index only doubled the index pages each append of a
tick dirties (docs/benchmarks.md). Plain `DROP INDEX` rather than Django's
`AlterField`, which rebuilds the whole table on SQLite.
"""

import django.db.models.deletion
from django.db import migrations, models

INDEX = "journal_event_run_id_e9eae894"


def drop(apps, schema_editor):
    schema_editor.execute(f'DROP INDEX IF EXISTS "{INDEX}"')
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f'DROP INDEX IF EXISTS "{INDEX}_like"')


def create(apps, schema_editor):
    schema_editor.execute(f'CREATE INDEX "{INDEX}" ON "journal_event" ("run_id")')
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f'CREATE INDEX "{INDEX}_like" ON "journal_event"'
            ' ("run_id" varchar_pattern_ops)'
        )


class Migration(migrations.Migration):
    dependencies = [("journal", "0006_run_waiting")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop, create)],
            state_operations=[
                migrations.AlterField(
                    model_name="event",
                    name="run",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="events",
                        to="journal.run",
                    ),
                )
            ],
        )
    ]
