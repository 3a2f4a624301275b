# Redis (the broker), Debian bookworm's redis-server 7.0, FROM the local debootstrap base.
ARG BASE=apg-farm/base:bookworm
FROM ${BASE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends redis-server redis-tools \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
    && install -d -o redis -g redis -m 0750 /data
USER redis
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["/usr/bin/tini", "--"]
# Without a config file redis-server would refuse other containers (protected mode).
CMD ["redis-server", "--dir", "/data", "--protected-mode", "no"]
