from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("provisioning", "0018_template_builds"),
    ]

    operations = [
        migrations.AddField(
            model_name="proxy",
            name="config_digest",
            field=models.CharField(blank=True, editable=False, max_length=64),
        ),
    ]
