"""``manage.py totp_enrol USERNAME [--replace]``: give a user an authenticator from the shell.

For a superuser that ``PROXYHUB_REQUIRE_2FA`` keeps out of the console until enrolled (anyone
else may enrol at /admin/two-factor/ too). Prints the key once, as an otpauth:// URI and a QR code
for the terminal, for the user to scan at once; it is stored only in the database.
"""

from __future__ import annotations

import io
from typing import Any

import qrcode
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from ...devices import totp_enrol


class Command(BaseCommand):
    help = "Give USERNAME a new TOTP authenticator and print its key (URI and QR code) once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--replace",
            action="store_true",
            help="replace the user's enrolled authenticator (the old one stops working)",
        )

    def handle(self, *args: Any, username: str, replace: bool, **options: Any) -> None:
        model = get_user_model()
        try:
            user = model._default_manager.get_by_natural_key(username)
        except model.DoesNotExist:
            raise CommandError(f"username: no user {username!r}") from None
        try:
            device = totp_enrol(user=user, replace=replace)
        except ValueError as exc:
            raise CommandError(str(exc)) from None
        uri = device.config_url
        code = qrcode.QRCode(border=1)
        code.add_data(uri)
        terminal = io.StringIO()
        code.print_ascii(out=terminal, invert=True)
        self.stdout.write(terminal.getvalue())
        self.stdout.write(uri)
        self.stdout.write(
            f"Scan this with {username}'s authenticator app now (or enter the URI's secret); "
            "it is not shown again. Sign-in now asks for its six-digit code."
        )
