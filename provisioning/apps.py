from django.apps import AppConfig


class ProvisioningConfig(AppConfig):
    """The catalogue (clusters, nodes, templates, machine types), proxies and the journal."""

    name = "provisioning"
    verbose_name = "Provisioning"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the control loop's system checks)
