"""Create Beat's node health schedules (healthchecks.schedules)."""

from django.db import migrations


def create(apps, schema_editor):
    from healthchecks.schedules import ensure_schedules

    ensure_schedules(
        apps.get_model("django_celery_beat", "PeriodicTask"),
        apps.get_model("django_celery_beat", "IntervalSchedule"),
    )


def remove(apps, schema_editor):
    from healthchecks.schedules import SCHEDULES

    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(
        name__in=list(SCHEDULES)
    ).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("healthchecks", "0001_initial"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(create, remove)]
