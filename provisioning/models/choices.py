"""Choices shared by models, services, commands and the admin."""

from django.db import models


class Phase(models.TextChoices):
    """Where a proxy stands (DESIGN.md §4). ``Failed`` is latched until an operator retries."""

    PENDING = "Pending"
    CREATING = "Creating"
    PROVISIONING = "Provisioning"  # running, no address yet
    RUNNING = "Running"  # address known
    STOPPING = "Stopping"
    STOPPED = "Stopped"
    DELETING = "Deleting"
    FAILED = "Failed"


class DesiredState(models.TextChoices):
    PRESENT = "present"
    DELETED = "deleted"


class DesiredPower(models.TextChoices):
    ON = "on"
    OFF = "off"


class ErrorClass(models.TextChoices):
    PERMANENT = "permanent"
    TRANSIENT = "transient"
    NOT_FOUND = "not_found"
    # Seed 001: the VM at the proxy's VMID has its name and mark but another SMBIOS UUID or
    # vmgenid (restored from backup, or re-created). Never acted on; an operator decides.
    IDENTITY = "identity", "Identity mismatch"


class OperationKind(models.TextChoices):
    CREATE = "create"
    DELETE = "delete"
    REPLACE = "replace"
    START = "start"
    SHUTDOWN = "shutdown"
    REBOOT = "reboot"
    # Issue 14: set a drifted VM's cores, memory and net0 back to the catalogue.
    REPAIR = "repair"
    # Issue 14: build a template from a cloud image; no proxy, the catalogue gets the result.
    TEMPLATE_BUILD = "template_build"


class DriftPolicy(models.TextChoices):
    """What reconcile does about drift (``proxmox/drift.py``): show it, or also repair it."""

    REPORT = "report"
    REPAIR = "repair"


class OperationState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    WAITING = "waiting"  # a Proxmox task or a boot is in progress; the next step is scheduled
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    UNKNOWN = "unknown"  # a submission whose reply was lost, until observation settles it


ACTIVE_STATES = (
    OperationState.QUEUED,
    OperationState.RUNNING,
    OperationState.WAITING,
    OperationState.UNKNOWN,
)


class StepState(models.TextChoices):
    RUNNING = "running"
    WAITING = "waiting"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYING = "retrying"  # a transient failure; the step runs again after a backoff
    UNKNOWN = "unknown"


class RequestedVia(models.TextChoices):
    ADMIN = "admin"
    COMMAND = "command"
    BEAT = "beat"
