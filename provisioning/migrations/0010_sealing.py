"""Issue 11, keys and sealed data: vendor-data sealed, cloud-init digests keyed.

Vendor-data moves from a clear text column into a sealed one. Cloud-init digests were plain
SHA-256; they become HMAC-SHA256 (``provisioning.sealing.digest``) here, eagerly rather than
lazily: the plain digests are what the issue asks to remove, and a lazy mark would leave them
in the database (and in the admin) until each proxy happened to be edited. Each proxy's
``spec_hash`` moves to the new digest only when it matched the old one, exactly as
``rotate_sealing_key`` does, so no proxy looks edited afterwards.

Rows are opened with the keys configured at migrate time (the legacy key derived from
``PROXYHUB_SECRETS_KEY``/``SECRET_KEY`` included). A cloud-init no key opens cannot be digested
again; its plain digest is replaced by the HMAC of that digest, which confirms no guess and keeps
the row's size and (unusable) seal for the operator to re-enter. The row stays unreadable, as it
already was.
"""

import hashlib

from django.db import migrations, models

from provisioning import sealing


def _spec_hash(proxy, digest):
    parts = [str(proxy.cluster_id), proxy.zone, proxy.machine_type, proxy.image, digest]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


def forwards(apps, schema_editor):
    Cluster = apps.get_model("provisioning", "Cluster")
    Proxy = apps.get_model("provisioning", "Proxy")
    for cluster in Cluster.objects.exclude(vendor_data="").iterator():
        cluster.vendor_data_sealed = sealing.seal(cluster.vendor_data.encode("utf-8"))
        cluster.save(update_fields=["vendor_data_sealed"])
    for proxy in Proxy.objects.exclude(cloud_init_sha256="").iterator():
        try:
            new = sealing.digest(sealing.unseal(bytes(proxy.cloud_init_sealed)))
        except sealing.SealError:
            new = sealing.digest(proxy.cloud_init_sha256.encode("ascii"))
        fields = ["cloud_init_sha256"]
        if proxy.spec_hash and proxy.spec_hash == _spec_hash(proxy, proxy.cloud_init_sha256):
            proxy.spec_hash = _spec_hash(proxy, new)
            fields.append("spec_hash")
        proxy.cloud_init_sha256 = new
        proxy.save(update_fields=fields)


def backwards(apps, schema_editor):
    Cluster = apps.get_model("provisioning", "Cluster")
    Proxy = apps.get_model("provisioning", "Proxy")
    for cluster in Cluster.objects.exclude(vendor_data_sealed=b"").iterator():
        cluster.vendor_data = sealing.unseal(bytes(cluster.vendor_data_sealed)).decode("utf-8")
        cluster.save(update_fields=["vendor_data"])
    for proxy in Proxy.objects.exclude(cloud_init_sha256="").iterator():
        try:
            old = hashlib.sha256(sealing.unseal(bytes(proxy.cloud_init_sealed))).hexdigest()
        except sealing.SealError:
            continue
        fields = ["cloud_init_sha256"]
        if proxy.spec_hash and proxy.spec_hash == _spec_hash(proxy, proxy.cloud_init_sha256):
            proxy.spec_hash = _spec_hash(proxy, old)
            fields.append("spec_hash")
        proxy.cloud_init_sha256 = old
        proxy.save(update_fields=fields)


class Migration(migrations.Migration):
    dependencies = [("provisioning", "0009_journal_retention")]

    operations = [
        migrations.AddField(
            model_name="cluster",
            name="vendor_data_sealed",
            field=models.BinaryField(default=b"", editable=False),
        ),
        migrations.RunPython(forwards, backwards),
        migrations.RemoveField(model_name="cluster", name="vendor_data"),
    ]
