"""A Proxmox VE API simulator, strict where Proxmox is strict (DESIGN.md §7a).

Three parts: the thread-safe state engine (``engine.Engine``), an HTTPS server in front of it
(``server``), and an in-process transport for the seam (``inprocess.SimTransport``) that hands
``Call`` objects to the same engine without HTTP.
"""
