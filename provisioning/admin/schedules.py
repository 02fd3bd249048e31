"""Beat's schedules in the admin: django-celery-beat's page, with proxyhub's own jobs guarded.

A staff member holding ``change_periodictask`` may retune how often proxyhub's own schedules run
(the interval) and nothing else of them: what a schedule runs (task, arguments, queue, exchange,
routing key, headers), whether it runs at all (enabled, also through the enable/disable/toggle
actions), its name and its other timing fields are read-only, and it cannot be deleted. Nor may
they point any schedule at one of proxyhub's tasks. A superuser may do all of it (issue 11).

What is proxyhub's own is ``provisioning.schedules.is_own_schedule``: named ``proxyhub: ...`` or
running a ``proxyhub.*`` task, so healthchecks' schedules are covered too.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.translation import ngettext
from django_celery_beat.admin import PeriodicTaskAdmin, PeriodicTaskForm
from django_celery_beat.models import PeriodicTask

from ..schedules import OWN_NAME_PREFIX, OWN_TASK_PREFIX, is_own_schedule

# The one field a non-superuser may change on proxyhub's own schedules.
TUNABLE = "interval"


class ScheduleForm(PeriodicTaskForm):
    """django-celery-beat's form; only a superuser may name one of proxyhub's tasks."""

    may_run_own_tasks = False  # set per request by ScheduleAdmin.get_form

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        task = data.get("task") or ""
        if task.startswith(OWN_TASK_PREFIX) and not self.may_run_own_tasks:
            self.add_error(
                "task",
                f'task "{task}" is one of proxyhub\'s own; only a superuser may schedule it',
            )
        return data


class IntervalOnlyForm(PeriodicTaskForm):
    """The form of a proxyhub schedule for a non-superuser: the interval, nothing else.

    Every other field is read-only (excluded from the form, so a posted value is ignored); the
    registered-task chooser is dropped with them, and the base form's task check has no task to
    check.
    """

    regtask = None

    def clean(self) -> dict[str, Any]:
        return forms.ModelForm.clean(self) or {}


class ScheduleAdmin(PeriodicTaskAdmin):
    form = ScheduleForm

    def _restricted(self, request: HttpRequest, obj: PeriodicTask | None) -> bool:
        return (
            obj is not None
            and not request.user.is_superuser
            and is_own_schedule(name=obj.name, task=obj.task)
        )

    def get_fieldsets(self, request: HttpRequest, obj: PeriodicTask | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if not self._restricted(request, obj):
            return fieldsets
        return [
            (title, {**opts, "fields": [f for f in opts["fields"] if f != "regtask"]})
            for title, opts in fieldsets
        ]

    def get_readonly_fields(self, request: HttpRequest, obj: PeriodicTask | None = None) -> Any:
        readonly = list(super().get_readonly_fields(request, obj))
        if self._restricted(request, obj):
            for _title, opts in self.get_fieldsets(request, obj):
                readonly += [f for f in opts["fields"] if f != TUNABLE and f not in readonly]
        return readonly

    def get_form(
        self,
        request: HttpRequest,
        obj: PeriodicTask | None = None,
        change: bool = False,
        **kwargs: Any,
    ) -> Any:
        if self._restricted(request, obj):
            kwargs["form"] = IntervalOnlyForm
            return super().get_form(request, obj, change, **kwargs)
        form = super().get_form(request, obj, change, **kwargs)
        form.may_run_own_tasks = request.user.is_superuser
        return form

    def has_delete_permission(self, request: HttpRequest, obj: PeriodicTask | None = None) -> bool:
        if self._restricted(request, obj):
            return False
        return super().has_delete_permission(request, obj)

    def _changeable(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> QuerySet:
        """``queryset`` less proxyhub's own schedules unless the user is a superuser; says which
        were left alone."""
        if request.user.is_superuser:
            return queryset
        own = Q(name__startswith=OWN_NAME_PREFIX) | Q(task__startswith=OWN_TASK_PREFIX)
        kept = list(queryset.filter(own).values_list("name", flat=True))
        if kept:
            self.message_user(
                request,
                ngettext(
                    "%(names)s is one of proxyhub's own schedules; only a superuser may enable or "
                    "disable it.",
                    "%(names)s are proxyhub's own schedules; only a superuser may enable or "
                    "disable them.",
                    len(kept),
                )
                % {"names": ", ".join(sorted(kept))},
                level=messages.WARNING,
            )
        return queryset.exclude(own)

    @admin.action(description="Enable selected tasks")
    def enable_tasks(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        super().enable_tasks(request, self._changeable(request, queryset))

    @admin.action(description="Disable selected tasks")
    def disable_tasks(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        super().disable_tasks(request, self._changeable(request, queryset))

    @admin.action(description="Toggle activity of selected tasks")
    def toggle_tasks(self, request: HttpRequest, queryset: QuerySet[PeriodicTask]) -> None:
        super().toggle_tasks(request, self._changeable(request, queryset))


admin.site.unregister(PeriodicTask)
admin.site.register(PeriodicTask, ScheduleAdmin)
