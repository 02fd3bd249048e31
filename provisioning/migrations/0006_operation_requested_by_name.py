"""Who asked for an operation, as text kept when the user is deleted (issue 11, audit).

Existing operations take their user's name now, while the user still exists.
"""

from django.conf import settings
from django.db import migrations, models


def names_from_users(apps, schema_editor):
    operation = apps.get_model("provisioning", "Operation")
    # proxyhub uses django.contrib.auth's User; a historical model has no USERNAME_FIELD.
    pending = operation.objects.filter(requested_by__isnull=False)
    for pk, name in pending.values_list("pk", "requested_by__username").iterator():
        operation.objects.filter(pk=pk).update(requested_by_name=str(name)[:150])


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0005_operation_trace_parent"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name="operation",
            name="requested_by_name",
            field=models.CharField(blank=True, max_length=150),
        ),
        migrations.RunPython(names_from_users, migrations.RunPython.noop),
    ]
