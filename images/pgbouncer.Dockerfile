# PgBouncer in front of PostgreSQL, Debian bookworm's package, FROM the local debootstrap base.
# Its configuration and auth file are written at start from the environment (docker-compose.yml).
ARG BASE=apg-farm/base:bookworm
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends pgbouncer postgresql-client \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
EXPOSE 6432
ENTRYPOINT ["/usr/bin/tini", "--"]
