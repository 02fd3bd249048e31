# Seed 001 identity: the VM's SMBIOS UUID and vmgenid, and the error class of a mismatch.

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0014_cluster_pool"),
    ]

    operations = [
        migrations.AddField(
            model_name="proxy",
            name="smbios_uuid",
            field=models.CharField(
                blank=True, editable=False, max_length=36, verbose_name="SMBIOS UUID"
            ),
        ),
        migrations.AddField(
            model_name="proxy",
            name="vmgenid",
            field=models.CharField(
                blank=True, editable=False, max_length=36, verbose_name="vmgenid"
            ),
        ),
        migrations.AlterField(
            model_name="operation",
            name="error_class",
            field=models.CharField(
                blank=True,
                choices=[
                    ("permanent", "Permanent"),
                    ("transient", "Transient"),
                    ("not_found", "Not Found"),
                    ("identity", "Identity mismatch"),
                ],
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="proxy",
            name="last_error_class",
            field=models.CharField(
                blank=True,
                choices=[
                    ("permanent", "Permanent"),
                    ("transient", "Transient"),
                    ("not_found", "Not Found"),
                    ("identity", "Identity mismatch"),
                ],
                max_length=16,
            ),
        ),
    ]
