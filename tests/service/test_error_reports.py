"""Error reports (issue 11, errors and logs): the DEBUG page, its text form and the logged
error of a request that raises show no POST value, nested dict value or binary local that may
hold a secret, with DEBUG on.

The view below is reached through a real request of the test client (its URLconf is this
module, not production's), and Django renders its own technical 500 page with the filter the
settings name (``DEFAULT_EXCEPTION_REPORTER_FILTER``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.urls import path
from django.views.debug import ExceptionReporter

from proxyhub.error_reports import SensitiveReporterFilter
from proxyhub.logging import redact_value

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]


def _canary(what: str) -> str:
    """Built at run time, so no source line shown in a traceback holds the canary itself."""
    return "-".join(("CANARY", what, "5e1b7a"))


# POST field -> canary: every spelling of a field that may carry a secret.
SECRET_FIELDS = {
    "cloud_init": _canary("cloud_init"),
    "cloud-init": _canary("cloud-init"),
    "cloudInit": _canary("cloudInit"),
    "cloud_init_file": _canary("cloud_init_file"),
    "user-data": _canary("user-data"),
    "userData": _canary("userData"),
    "vendor_data": _canary("vendor_data"),
    "vendorData": _canary("vendorData"),
    "api_token": _canary("api_token"),
    "tokenFile": _canary("tokenFile"),
    "client_secret": _canary("client_secret"),
    "new_password": _canary("new_password"),
    "Password2": _canary("Password2"),
    "ca": _canary("ca"),
    "caFile": _canary("caFile"),
}
VISIBLE = "visible-name-93c1"


def failing_view(request: HttpRequest) -> HttpResponse:
    """Holds the secrets the ways real code does, then fails."""
    posted = request.POST  # noqa: F841 (a QueryDict local)
    payload = {  # noqa: F841 (nested keys in several spellings)
        "name": VISIBLE,
        "proxmox": {"tokenFile": _canary("nested-token"), "userData": _canary("nested-ud")},
        "items": [{"cloudInit": _canary("listed")}],
    }
    body = ("#cloud-config\nwrite_files: [" + _canary("body-bytes") + "]").encode()  # noqa: F841
    image = bytearray(_canary("bytearray").encode())  # noqa: F841
    view = memoryview(_canary("memoryview").encode())  # noqa: F841
    rendered = "#cloud-config\n" + _canary("str-local")  # noqa: F841 (named innocently)
    pem = (  # noqa: F841
        "-----BEGIN CERTIFICATE-----\n" + _canary("pem") + "\n-----END CERTIFICATE-----\n"
    )
    label = VISIBLE  # noqa: F841 (an ordinary local stays readable)
    raise RuntimeError("the view failed")


urlpatterns = [path("boom/", failing_view)]


def _all_canaries() -> list[str]:
    extra = ["nested-token", "nested-ud", "listed", "body-bytes", "bytearray", "memoryview"]
    return [*SECRET_FIELDS.values(), *(_canary(x) for x in [*extra, "str-local", "pem"])]


def _post(client: Client, accept: str) -> str:
    response = client.post("/boom/", data={**SECRET_FIELDS, "name": VISIBLE}, HTTP_ACCEPT=accept)
    assert response.status_code == 500
    return response.content.decode()


def test_the_debug_page_masks_secret_posts_nested_keys_and_binary_locals(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.DEBUG = True
    caplog.set_level(logging.DEBUG)
    client = Client(raise_request_exception=False)

    html = _post(client, "text/html")
    text = _post(client, "text/plain")

    assert "the view failed" in html and "the view failed" in text
    for where, report in (("html", html), ("text", text)):
        for canary in _all_canaries():
            assert canary not in report, f"{canary} on the {where} page"
    # The report still helps: the fields' names, an ordinary value and the binary sizes show.
    for field in SECRET_FIELDS:
        assert field in html, field
    assert VISIBLE in html and VISIBLE in text
    assert "bytes&gt;" in html  # <N bytes>, escaped
    logged = "\n".join(r.getMessage() + str(vars(r)) for r in caplog.records)
    assert "the view failed" in logged
    for canary in _all_canaries():
        assert canary not in logged


def test_the_text_report_of_an_exception_masks_the_same(rf: Any) -> None:
    request = rf.post("/boom/", data={**SECRET_FIELDS, "name": VISIBLE})
    try:
        failing_view(request)
    except RuntimeError:
        reporter = ExceptionReporter(request, *sys.exc_info())
        text = reporter.get_traceback_text()
        html = reporter.get_traceback_html()
    assert isinstance(reporter.filter, SensitiveReporterFilter)
    for canary in _all_canaries():
        assert canary not in text
        assert canary not in html
    assert VISIBLE in text


def test_a_form_field_named_innocently_keeps_its_value_unless_it_is_cloud_init() -> None:
    reporter_filter = SensitiveReporterFilter()
    kept = reporter_filter._cleanse("machine_type", "small")
    masked = reporter_filter._cleanse("notes", "#cloud-config\npassword: x")
    assert kept == "small"
    assert masked == reporter_filter.cleansed_substitute


def test_log_fields_are_masked_by_the_same_names() -> None:
    fields = {
        "cloudInit": "a",
        "user-data": "b",
        "vendor_data": "c",
        "proxmox": {"caFile": "d", "refresh_token": "e", "node": "pve1"},
        "payload": b"\x00" * 7,
    }
    masked = redact_value("fields", fields)
    assert masked == {
        "cloudInit": "[REDACTED]",
        "user-data": "[REDACTED]",
        "vendor_data": "[REDACTED]",
        "proxmox": {"caFile": "[REDACTED]", "refresh_token": "[REDACTED]", "node": "pve1"},
        "payload": "<7 bytes>",
    }
