# The caller's idempotency key of an enqueued run (unique per job), and the audit source "code".

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0010_fire_created_at_is_the_tick"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobexecution",
            name="idempotency_key",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddConstraint(
            model_name="jobexecution",
            constraint=models.UniqueConstraint(
                fields=("job", "idempotency_key"), name="execution_unique_idempotency_key"
            ),
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="source",
            field=models.CharField(
                choices=[
                    ("ui", "Dashboard"),
                    ("api", "API"),
                    ("admin", "Admin"),
                    ("cli", "CLI"),
                    ("code", "Code"),
                    ("system", "System"),
                ],
                max_length=16,
            ),
        ),
    ]
