"""Drop the database's foreign key from events to runs; the model keeps it.

PostgreSQL checked every inserted row against its run at commit: a quarter of
its work on a tick of many runs (docs/benchmarks.md, finding 27). Events are
inserted only under their run's fenced UPDATE of its row, and a run's row is
locked before anything of it is deleted (`journal.models`), so no event
outlives its run without it. On SQLite this rebuilds the event table once.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("journal", "0007_event_run_one_index")]

    operations = [
        migrations.AlterField(
            model_name="event",
            name="run",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="events",
                to="journal.run",
            ),
        ),
    ]
