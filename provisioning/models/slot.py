"""Task slots: how many Proxmox tasks proxyhub keeps in flight per node and per storage.

A row is one slot of one key (``node:<name>`` or ``storage:<name>``) of a cluster; an operation
holds it from just before its step submits a task until it sees that task end. Slots are taken
with a conditional UPDATE on one row (``services.slots``), so two workers never both take the
last one on PostgreSQL or SQLite. A step that finds none waits as a ``SlotWaiter`` row and is
handed the next slot its key frees, oldest first.
"""

from __future__ import annotations

from django.db import models

from .catalogue import Cluster
from .operation import Operation


class TaskSlot(models.Model):
    """One of a key's ``limit`` slots; free when ``operation`` is null."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="task_slots")
    key = models.CharField(max_length=96)
    seq = models.PositiveSmallIntegerField()
    operation = models.ForeignKey(
        Operation, on_delete=models.SET_NULL, null=True, blank=True, related_name="task_slots"
    )
    taken_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["cluster", "key", "seq"], name="task_slot_unique")
        ]

    def __str__(self) -> str:
        return f"{self.key}#{self.seq} ({'held' if self.operation_id else 'free'})"


class SlotWaiter(models.Model):
    """An operation whose next step waits for a slot of ``key`` (shown as its last note)."""

    operation = models.OneToOneField(
        Operation, on_delete=models.CASCADE, primary_key=True, related_name="slot_wait"
    )
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="slot_waiters")
    key = models.CharField(max_length=96)
    since = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["cluster", "key", "since"], name="slot_waiter_fifo_idx")]

    def __str__(self) -> str:
        return f"{self.operation_id} waits for {self.key}"
