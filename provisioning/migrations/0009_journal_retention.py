"""Beat's journal pruning schedule on the control queue (issue 11, audit: journal retention).

Only the new schedule is written: an operator's edits to the other schedules' intervals stay."""

from django.db import migrations


NAME = "proxyhub: journal pruning"


def create(apps, schema_editor):
    from provisioning.schedules import SCHEDULES, ensure_schedules

    ensure_schedules(
        apps.get_model("django_celery_beat", "PeriodicTask"),
        apps.get_model("django_celery_beat", "IntervalSchedule"),
        schedules={NAME: SCHEDULES[NAME]},
    )


def remove(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=NAME).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0008_quotas"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create, remove)]
