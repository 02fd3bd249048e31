from django.apps import AppConfig


class HealthchecksConfig(AppConfig):
    """Node health results from the checker (seed 000's ProviderHealth, DESIGN §2)."""

    name = "healthchecks"
    verbose_name = "Health checks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # provisioning must not import healthchecks (DESIGN §3): placement learns about node
        # health through this registration instead.
        from provisioning.services.placement import register_node_health

        from .placement import node_health_for_placement

        register_node_health(node_health_for_placement)
