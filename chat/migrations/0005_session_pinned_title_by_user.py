"""A chat can be pinned; a title the user gave is never replaced by a generated
one. Chats already named otherwise than "New chat" count as named by the user."""

from django.db import migrations, models


def named_by_user(apps, schema_editor):
    ChatSession = apps.get_model("chat", "ChatSession")
    ChatSession.objects.exclude(title="New chat").update(title_by_user=True)


class Migration(migrations.Migration):
    dependencies = [("chat", "0004_message_search")]

    operations = [
        migrations.AddField(
            model_name="chatsession",
            name="pinned",
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name="chatsession",
            name="title_by_user",
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(named_by_user, migrations.RunPython.noop),
    ]
