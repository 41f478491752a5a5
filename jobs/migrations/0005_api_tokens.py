"""API keys stored as digests: a new table, and every key REST framework's token table held in
clear moves into it as its digest (the key keeps working, it never expires, as before), then the
clear copy is deleted."""

import hashlib

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


def move_clear_keys(apps, schema_editor):
    ClearToken = apps.get_model("authtoken", "Token")
    ApiToken = apps.get_model("jobs", "ApiToken")
    for token in ClearToken.objects.all():
        ApiToken.objects.create(
            user_id=token.user_id,
            name="migrated",
            prefix=token.key[:8],
            digest=hashlib.sha256(token.key.encode()).hexdigest(),
            created_at=token.created,
            expires_at=None,
        )
    ClearToken.objects.all().delete()


class Migration(migrations.Migration):

    dependencies = [
        ('jobs', '0004_execution_arguments'),
        ('authtoken', '0004_alter_tokenproxy_options'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ApiToken',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(blank=True, default='', max_length=64)),
                ('prefix', models.CharField(max_length=12)),
                ('digest', models.CharField(max_length=64, unique=True)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('expires_at', models.DateTimeField(blank=True, null=True)),
                ('last_used_at', models.DateTimeField(blank=True, null=True)),
                ('user', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='api_tokens', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['user_id', 'created_at'],
            },
        ),
        migrations.RunPython(move_clear_keys, migrations.RunPython.noop),
    ]
