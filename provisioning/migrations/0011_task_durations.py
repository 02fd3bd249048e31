"""Issue 12, duration-aware waits: a running estimate per cluster of each kind of Proxmox work
(a task type per node, boot to address per image), learned from finished waits."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0010_sealing"),
    ]

    operations = [
        migrations.CreateModel(
            name="WorkDuration",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("kind", models.CharField(max_length=32)),
                (
                    "scope",
                    models.CharField(help_text="the node, or the image for a boot", max_length=128),
                ),
                ("seconds", models.FloatField()),
                ("samples", models.PositiveIntegerField(default=0)),
                ("updated_at", models.DateTimeField(auto_now=True)),
                (
                    "cluster",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="durations",
                        to="provisioning.cluster",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("cluster", "kind", "scope"), name="workduration_unique_kind_scope"
                    )
                ],
            },
        ),
    ]
