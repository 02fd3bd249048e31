"""proxyhub's admin console (issue 5): clusters, proxies, the operations journal, bulk create.

One module per page family (``clusters``, ``proxies``, ``operations``); the proxy actions live
in ``actions``, their bounded Proxmox reads in ``inspection`` (power) and ``plans`` (preview and
preflight), the bulk-create page in ``views``. Importing this package registers everything.
"""

from django.contrib import admin

from . import (  # noqa: F401  (registers)
    clusters,
    gcrounds,
    inventory,
    maintenance,
    operations,
    proxies,
    quotas,
    schedules,
)

admin.site.site_header = "proxyhub"
admin.site.site_title = "proxyhub"
admin.site.index_title = "Proxy fleet"
