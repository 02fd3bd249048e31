"""The console's optional second factor: TOTP (django-otp) for staff, required for superusers
when ``PROXYHUB_REQUIRE_2FA`` is set (issue 11).

- ``apps``: the admin's app config, whose default site is ``site.ConsoleAdminSite``.
- ``site``: the admin site and its login form, which asks for the one-time code.
- ``devices``: the services over TOTP devices (start an enrolment, confirm it, enrol by command).
- ``views``: the enrolment page, ``/admin/two-factor/``, for the signed-in user's own device.
- ``admin``: the device list for administrators, without keys or QR codes.
- ``management/commands/totp_enrol``: enrolment from the server's shell, for a superuser whom
  ``PROXYHUB_REQUIRE_2FA`` keeps out of the console until enrolled.
"""
