"""pvesim: a Proxmox VE API simulator, strict where Proxmox is strict (DESIGN.md §7a).

proxyhub's test double for a Proxmox cluster, kept apart from the product it checks: it imports
nothing of ``provisioning`` (nor Django), and ``provisioning`` reaches it only through
``manage.py pvesim`` and ``bin/run-local``; tests adapt proxyhub's seam to it in
``tests/support/simtransport.py``. Start it with ``python -m pvesim`` (or ``make sim``).

Its modules stand in three layers. A module imports from its own layer or the ones below it,
never from one above, and no two modules import each other, even through others
(``tests/pvesim/test_import_rules.py`` reads the list below and holds the code to it):

1. state and rules: protocol, replies, clock, profiles, ledger, faults, schema, vmconfig,
   access, state, permissions, defaults, seedreader, agent, resources, configupdate, power,
   fetch
2. engine: simtasks, router, handlers_access, handlers_agent, handlers_clone, handlers_cluster,
   handlers_create, handlers_lxc, handlers_qemu, handlers_storage, handlers_tasks, engine
3. front ends: control, simulator, inprocess, server, workdir, __main__

Layer 1 is the simulated cluster and Proxmox's rules about it: the request and answer shapes,
the official schema, guest configs, nodes, storages and guests, faults to inject, the ledger of
calls. Layer 2 answers ``/api2/json``: ``engine.Engine.handle`` authenticates, routes a request
through the schema to its handler (``router`` and ``handlers_*``) and runs Proxmox tasks
(``simtasks``). Layer 3 serves the engine: ``control`` is the ``/_sim`` back door tests use,
``simulator.Simulator`` mounts it beside the engine, ``server`` is the HTTPS front end,
``inprocess`` the same calls without HTTP, ``workdir`` and ``__main__`` the command line.
"""
