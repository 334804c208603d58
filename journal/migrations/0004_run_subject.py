from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("journal", "0003_run_idempotency_hash"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="subject",
            field=models.CharField(blank=True, db_index=True, default="", max_length=200),
            preserve_default=False,
        ),
    ]
