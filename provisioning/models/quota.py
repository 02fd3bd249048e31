"""Per-user quotas: how many proxies one console user may declare in one bulk create."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from .catalogue import QUOTA_MAX


class UserQuota(models.Model):
    """A console user's own bulk-create limit, replacing ``PROXYHUB_MAX_BULK_CREATE`` for them
    (higher or lower). Users without a row get the setting; commands always do (they run as an
    operating-system user, not a console user)."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="proxyhub_quota"
    )
    max_bulk_create = models.PositiveIntegerField(
        validators=[MinValueValidator(1), MaxValueValidator(QUOTA_MAX)],
        help_text="proxies this user may declare in one bulk create",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["user__username"]
        verbose_name = "user quota"

    def __str__(self) -> str:
        return f"{self.user} may create {self.max_bulk_create} at once"
