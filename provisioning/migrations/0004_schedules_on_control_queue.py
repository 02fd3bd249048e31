"""Beat's reconcile, GC and sweeper move to the ``control`` queue, and the sweeper runs every
ten seconds (issue 10: recovery in seconds, jobs that step traffic cannot starve).
``ensure_schedules`` updates the existing schedules by name."""

from django.db import migrations


def update(apps, schema_editor):
    from provisioning.schedules import ensure_schedules

    ensure_schedules(
        apps.get_model("django_celery_beat", "PeriodicTask"),
        apps.get_model("django_celery_beat", "IntervalSchedule"),
    )


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0003_control_loop"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(update, migrations.RunPython.noop)]
