"""A Proxmox VE API simulator, strict where Proxmox is strict (DESIGN.md §7a).

Three parts: the thread-safe state engine (``engine.Engine``), an HTTPS server in front of it
(``server``), and an in-process entry point (``inprocess.call``) that hands one API call to the
same engine without HTTP. pvesim imports nothing of ``provisioning``: proxyhub's seam is adapted
to it in ``tests/support/simtransport.py``.
"""
