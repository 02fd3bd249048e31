# proxyhub's one image: web (gunicorn, the default command), worker, Beat, migrate and the
# simulator all run from it with different commands (docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# gunicorn's number of worker processes; .env (env_file) can override it.
ENV WEB_CONCURRENCY=3
# Every command of the image runs with production's settings (also the default when unset).
ENV DJANGO_SETTINGS_MODULE=proxyhub.settings.production

# A fixed, unprivileged uid, so files on bind mounts (the Proxmox token and CA) can be given
# to it: chown 10001 or a group-readable file.
RUN groupadd --system --gid 10001 proxyhub \
    && useradd --system --uid 10001 --gid proxyhub --home-dir /app --no-create-home \
       --shell /usr/sbin/nologin proxyhub

WORKDIR /app

# Dependencies first, so a code change does not reinstall them. Every pin has a wheel for
# linux/amd64 and arm64 (psycopg[binary], cryptography), so no compiler is needed.
COPY requirements.txt requirements-otel.txt ./
RUN pip install -r requirements.txt
# The tracing extra: off unless OTEL_EXPORTER_OTLP_ENDPOINT is set (docs/operator-guide.md, 14).
RUN pip install -r requirements-otel.txt

COPY . .

# Static files for the admin, collected at build time into STATIC_ROOT (/app/var/static).
# Production's settings refuse to load without a secret key, a sealing key and a metrics token;
# these exist only for this command (which seals nothing and serves nothing) and are not in the
# image's environment.
RUN DJANGO_SECRET_KEY=collectstatic-at-build-time-only \
    PROXYHUB_SEALING_KEYS=Y29sbGVjdHN0YXRpYy1hdC1idWlsZC10aW1lLW9ubHk= \
    PROXYHUB_METRICS_PUBLIC=true \
    python manage.py collectstatic --noinput \
    && mkdir -p /app/var /etc/proxyhub/pvesim \
    && chown -R proxyhub:proxyhub /app/var /etc/proxyhub/pvesim

USER proxyhub

EXPOSE 8000
# gunicorn 27 opens a control socket under $HOME by default; the image's user has no home
# to write to and nothing uses it.
CMD ["gunicorn", "proxyhub.wsgi:application", "--bind", "0.0.0.0:8000", "--access-logfile", "-", "--no-control-socket"]
