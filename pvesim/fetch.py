"""What a node's ``download-url`` worker fetches: the URL's bytes, for real (pve-reference §7.8).

Proxmox's ``download`` task runs ``wget`` on the node against the operator's URL. The simulator
does the same with the standard library, so a test proves that the URL it sent is the one the
node fetched and that the bytes stored are the bytes served. It is a test double, and tests must
never reach the internet: only loopback hosts (``127.0.0.0/8``, ``::1``, ``localhost``) are
fetched; any other host fails the task, saying so.
"""

from __future__ import annotations

import hashlib
import ipaddress
import urllib.error
import urllib.request
from urllib.parse import urlsplit

# Seconds a fetch may take before the task fails (wget's own default is far longer; tests serve
# from loopback, so anything slow is a broken test server).
FETCH_TIMEOUT = 30.0
# The largest body the simulator keeps in memory: cloud images in tests are a few KiB.
MAX_BYTES = 64 * 1024 * 1024


class FetchFailed(Exception):
    """The download could not complete; the text becomes the task's error."""


def loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def fetch(url: str) -> bytes:
    """The body at ``url`` (loopback only; see the module docstring)."""
    if not loopback(url):
        raise FetchFailed(f"pvesim fetches only loopback URLs, not '{url}'")
    # The schema pattern (https?://) and the loopback check above bound what is opened.
    request = urllib.request.Request(url, headers={"User-Agent": "pvesim-download"})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT) as response:  # noqa: S310
            data = response.read(MAX_BYTES + 1)
    except urllib.error.HTTPError as err:
        raise FetchFailed(f"download failed: {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise FetchFailed(f"download failed: {reason}") from None
    if len(data) > MAX_BYTES:
        raise FetchFailed(f"download failed: more than {MAX_BYTES} bytes")
    return data


def digest(algorithm: str, data: bytes) -> str:
    """The hex digest Proxmox compares (``get_file_hash``), lower case."""
    return hashlib.new(algorithm, data).hexdigest()
