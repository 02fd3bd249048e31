#!/usr/bin/env python
"""Django's command-line utility for proxyhub (production settings unless
``DJANGO_SETTINGS_MODULE`` selects others; see ``proxyhub.settings``)."""

import sys


def main() -> None:
    from proxyhub.settings import select_default_settings_module

    select_default_settings_module()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
