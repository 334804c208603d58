"""Messages as a tree (`chat.tree`): the columns. chat/0008 fills them.

Separate from the data step: on PostgreSQL, rows updated in the transaction
that adds the columns' indexes refuse the index ("pending trigger events").
"""

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0006_session_always_allowed_tools'),
    ]

    operations = [
        migrations.AddField(
            model_name='message',
            name='parent',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='children', to='chat.message'),
        ),
        migrations.AddField(
            model_name='message',
            name='selected_at',
            field=models.DateTimeField(default=django.utils.timezone.now),
        ),
        migrations.AddField(
            model_name='turn',
            name='reply_to',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='chat.message'),
        ),
    ]
