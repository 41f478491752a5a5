# The caller's idempotency key of an enqueued run (unique per job), and the audit source "code".

from django.db import migrations, models


def keys_compare_bytes(apps, schema_editor):
    """On MariaDB/MySQL the column would take the table's collation, which compares text ignoring
    case, accents and trailing spaces: "Invoice-1" and "invoice-1 " would be one key to the unique
    index and two to the code. A binary collation without padding makes them bytes, as on SQLite."""
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    collation = "utf8mb4_nopad_bin" if connection.mysql_is_mariadb else "utf8mb4_0900_bin"
    table = schema_editor.quote_name("jobs_jobexecution")
    schema_editor.execute(
        f"ALTER TABLE {table} MODIFY idempotency_key varchar(200) "
        f"CHARACTER SET utf8mb4 COLLATE {collation} NULL"
    )


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
        migrations.RunPython(keys_compare_bytes, migrations.RunPython.noop, atomic=False),
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
