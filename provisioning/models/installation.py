"""This installation's identity: written into every VM's mark so two proxyhub installations
sharing a cluster never collect each other's VMs (DESIGN.md §2)."""

from __future__ import annotations

import secrets

from django.db import IntegrityError, models, transaction


def _new_id() -> str:
    return "ph-" + secrets.token_hex(6)


class Installation(models.Model):
    """A single row, created on first use and never changed."""

    singleton = models.BooleanField(default=True, unique=True, editable=False)
    installation_id = models.CharField(max_length=64, unique=True, default=_new_id, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(singleton=True), name="installation_single")
        ]

    def __str__(self) -> str:
        return self.installation_id

    @classmethod
    def current_id(cls) -> str:
        """The installation id, created the first time it is asked for. Services use
        ``services.installation.installation_id``, which also keeps it outside the database."""
        row = cls.objects.first()
        if row is not None:
            return row.installation_id
        return cls.create_once(None)

    @classmethod
    def create_once(cls, installation_id: str | None) -> str:
        """Create the single row (with ``installation_id``, or a new id), atomically: when
        another process created it first, its id wins."""
        try:
            with transaction.atomic():
                fields = {"installation_id": installation_id} if installation_id else {}
                return cls.objects.create(**fields).installation_id
        except IntegrityError:
            return cls.objects.get().installation_id
