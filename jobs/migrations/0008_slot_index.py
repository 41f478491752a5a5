from django.db import migrations, models


class Migration(migrations.Migration):
    """Lists of runs newest fire slot first (the dashboard's, the API's) read through an index
    instead of sorting the whole history: 0.77 s a page at 300,000 runs on MariaDB before. Built
    online by InnoDB (no table lock); neither column changes after a run's insert."""

    dependencies = [
        ("jobs", "0007_unclaimed_index"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="jobexecution",
            index=models.Index(fields=["scheduled_for", "attempt"], name="execution_slot_idx"),
        ),
    ]
