# PostgreSQL (the store): Debian bookworm's PostgreSQL 15, FROM the local debootstrap base.
# Same interface as the registry's postgres image for what docker-compose.yml uses:
# POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB, data in /var/lib/postgresql/data, pg_isready.
ARG BASE=apg-farm/base:bookworm
FROM ${BASE}
# No cluster of Debian's own (createcluster.conf): the entrypoint makes one in PGDATA.
RUN mkdir -p /etc/postgresql-common \
    && echo 'create_main_cluster = false' > /etc/postgresql-common/createcluster.conf \
    && apt-get update \
    && apt-get install -y --no-install-recommends postgresql \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && install -d -o postgres -g postgres -m 0700 /var/lib/postgresql/data \
    && install -d -o postgres -g postgres -m 0775 /run/postgresql
COPY images/postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint
ENV PGDATA=/var/lib/postgresql/data
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/postgres-entrypoint"]
