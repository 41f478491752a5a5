from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    """The claim's index gains claim_token after (status, queue): a claim's range is the unclaimed
    rows only. The new index is built before the old ones go, so claims never lack one. The
    (status, queue, run_after) index goes too: every run's every step changed it."""

    dependencies = [
        ("jobs", "0006_notifications"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddIndex(
            model_name="jobexecution",
            index=models.Index(
                fields=["status", "queue", "claim_token", "-priority", "run_after", "id"],
                name="execution_unclaimed_idx",
            ),
        ),
        migrations.RemoveIndex(
            model_name="jobexecution",
            name="execution_claim_order_idx",
        ),
        migrations.RemoveIndex(
            model_name="jobexecution",
            name="execution_claim_idx",
        ),
    ]
