"""Everything that speaks Proxmox VE. Plain Python: nothing here imports Django (DESIGN.md §3)."""
