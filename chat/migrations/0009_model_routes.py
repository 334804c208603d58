"""The provider an admin chose per model (`chat.models.ModelRoute`)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('chat', '0008_branches_chain'),
    ]

    operations = [
        migrations.CreateModel(
            name='ModelRoute',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('model', models.CharField(help_text="the model's name as its provider knows it, e.g. claude-sonnet-4-5", max_length=200, unique=True)),
                ('provider', models.CharField(help_text='the name of a provider configured in the settings', max_length=80)),
                ('enabled', models.BooleanField(default=True, help_text='off: the settings choose the provider again')),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'verbose_name': 'model route',
                'ordering': ['model'],
            },
        ),
    ]
