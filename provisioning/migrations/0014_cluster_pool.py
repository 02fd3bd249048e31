"""Issue 14: the resource pool every clone of a cluster joins (catalogue key ``pool``)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("provisioning", "0013_proxy_indexes")]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="pool",
            field=models.CharField(
                blank=True,
                help_text="Proxmox resource pool every clone joins; blank: none",
                max_length=64,
            ),
        ),
    ]
