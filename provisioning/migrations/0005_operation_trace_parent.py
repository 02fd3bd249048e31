"""Each operation's reserved trace context (issue 13, tracing).

Operations still in flight get a value of their own, so their remaining steps form one trace
each; finished ones keep an empty value (nothing of theirs is traced any more). A plain
AddField with the callable default would give every existing row the same value.
"""

from django.db import migrations, models

import provisioning.models.operation

ACTIVE = ("queued", "running", "waiting", "unknown")


def reserve_for_unfinished(apps, schema_editor):
    operation = apps.get_model("provisioning", "Operation")
    for pk in operation.objects.filter(state__in=ACTIVE).values_list("pk", flat=True):
        operation.objects.filter(pk=pk).update(
            trace_parent=provisioning.models.operation.new_trace_parent()
        )


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0004_schedules_on_control_queue"),
    ]

    operations = [
        migrations.AddField(
            model_name="operation",
            name="trace_parent",
            field=models.CharField(default="", editable=False, max_length=55),
        ),
        migrations.RunPython(reserve_for_unfinished, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="operation",
            name="trace_parent",
            field=models.CharField(
                default=provisioning.models.operation.new_trace_parent,
                editable=False,
                max_length=55,
            ),
        ),
    ]
