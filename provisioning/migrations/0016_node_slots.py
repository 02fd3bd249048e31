"""Issue 12: task slots per node and storage, and the steps waiting for one (models/slot.py)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('provisioning', '0015_identity'),
    ]

    operations = [
        migrations.CreateModel(
            name='SlotWaiter',
            fields=[
                ('operation', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name='slot_wait', serialize=False, to='provisioning.operation')),
                ('key', models.CharField(max_length=96)),
                ('since', models.DateTimeField()),
                ('cluster', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='slot_waiters', to='provisioning.cluster')),
            ],
            options={
                'indexes': [models.Index(fields=['cluster', 'key', 'since'], name='slot_waiter_fifo_idx')],
            },
        ),
        migrations.CreateModel(
            name='TaskSlot',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('key', models.CharField(max_length=96)),
                ('seq', models.PositiveSmallIntegerField()),
                ('taken_at', models.DateTimeField(blank=True, null=True)),
                ('cluster', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='task_slots', to='provisioning.cluster')),
                ('operation', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='task_slots', to='provisioning.operation')),
            ],
            options={
                'constraints': [models.UniqueConstraint(fields=('cluster', 'key', 'seq'), name='task_slot_unique')],
            },
        ),
    ]
