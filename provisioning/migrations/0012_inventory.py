"""Issue 14, inventory: the per-cluster guest snapshot, its refresh record, and Beat's refresh
schedule on the control queue. Only the new schedule is written: an operator's edits to the other
schedules stay."""

import django.db.models.deletion
from django.db import migrations, models


SCHEDULE = "proxyhub: inventory refresh"


def create_schedule(apps, schema_editor):
    from provisioning.schedules import SCHEDULES, ensure_schedules

    ensure_schedules(
        apps.get_model("django_celery_beat", "PeriodicTask"),
        apps.get_model("django_celery_beat", "IntervalSchedule"),
        schedules={SCHEDULE: SCHEDULES[SCHEDULE]},
    )


def remove_schedule(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=SCHEDULE).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0011_task_durations"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [
        migrations.CreateModel(
            name="InventoryRefresh",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("refreshed_at", models.DateTimeField(blank=True, null=True)),
                ("attempted_at", models.DateTimeField(blank=True, null=True)),
                ("count", models.PositiveIntegerField(default=0)),
                ("listed", models.PositiveIntegerField(default=0)),
                ("truncated", models.BooleanField(default=False)),
                ("unread", models.PositiveIntegerField(default=0)),
                ("error", models.TextField(blank=True)),
                (
                    "cluster",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="inventory_refresh",
                        to="provisioning.cluster",
                    ),
                ),
            ],
            options={
                "verbose_name": "inventory refresh",
                "ordering": ["cluster__name"],
            },
        ),
        migrations.CreateModel(
            name="InventoryGuest",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("vmid", models.PositiveIntegerField(verbose_name="VMID")),
                ("name", models.CharField(blank=True, max_length=255)),
                ("node", models.CharField(max_length=63)),
                (
                    "type",
                    models.CharField(
                        choices=[("qemu", "qemu (VM)"), ("lxc", "lxc (container)")], max_length=8
                    ),
                ),
                ("status", models.CharField(max_length=32)),
                ("lock", models.CharField(blank=True, max_length=32)),
                ("tags", models.CharField(blank=True, max_length=1024)),
                ("hastate", models.CharField(blank=True, max_length=32, verbose_name="HA state")),
                ("template", models.BooleanField(default=False)),
                ("pool", models.CharField(blank=True, max_length=255)),
                (
                    "owner",
                    models.CharField(
                        choices=[
                            ("this", "this installation"),
                            ("other", "another installation"),
                            ("foreign", "foreign"),
                        ],
                        max_length=8,
                    ),
                ),
                ("mark_read", models.BooleanField(default=False)),
                ("refreshed_at", models.DateTimeField()),
                (
                    "cluster",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="inventory",
                        to="provisioning.cluster",
                    ),
                ),
            ],
            options={
                "verbose_name": "inventory guest",
                "ordering": ["cluster", "vmid"],
                "indexes": [models.Index(fields=["cluster", "owner"], name="inventory_owner")],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("cluster", "vmid"), name="inventory_one_row_per_vmid"
                    )
                ],
            },
        ),
        migrations.RunPython(create_schedule, remove_schedule),
    ]
