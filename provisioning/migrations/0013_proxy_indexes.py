"""Indexes for the proxy list's machine type and image filters (issue 12: the list at 100,000
proxies). The other filters (phase, cluster, node) and the default ordering (the unique name)
had theirs already."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0012_inventory"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="proxy",
            index=models.Index(fields=["machine_type"], name="proxy_machine_type_idx"),
        ),
        migrations.AddIndex(
            model_name="proxy",
            index=models.Index(fields=["image"], name="proxy_image_idx"),
        ),
    ]
