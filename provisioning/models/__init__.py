"""provisioning's models, one module per aggregate (STYLE.md: NetBox's models package)."""

from .catalogue import Cluster, MachineType, Node, Template
from .circuit import CircuitBreaker, CircuitState
from .durations import WorkDuration
from .gcround import GcRound
from .installation import Installation
from .inventory import GuestOwner, GuestType, InventoryGuest, InventoryRefresh
from .lease import JobLease
from .maintenance import MaintenanceWindow
from .operation import Operation, OperationStep
from .proxy import Proxy
from .quota import UserQuota
from .slot import SlotWaiter, TaskSlot

__all__ = [
    "CircuitBreaker",
    "CircuitState",
    "Cluster",
    "GcRound",
    "GuestOwner",
    "GuestType",
    "Installation",
    "InventoryGuest",
    "InventoryRefresh",
    "JobLease",
    "MachineType",
    "MaintenanceWindow",
    "Node",
    "Operation",
    "OperationStep",
    "Proxy",
    "SlotWaiter",
    "TaskSlot",
    "Template",
    "UserQuota",
    "WorkDuration",
]
