# The farm's image: apg-farm with its ops extras (Flower), run as `farm` (uid 1000).
# Built FROM the local debootstrap base (images/base.sh), never from a registry image.
ARG BASE=apg-farm/base:bookworm
FROM ${BASE}

# python3 is in the base; venv for an isolated install, the OpenSSH client and curl for operators.
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3-venv openssh-client ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin

# The dependencies first, from pyproject.toml alone: that layer stays cached while the code changes.
COPY pyproject.toml /src/pyproject.toml
RUN python3 -m venv /opt/apg-farm \
    && python3 -c "import tomllib; p = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['ops']))" > /tmp/requirements.txt \
    && PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
       /opt/apg-farm/bin/pip install --no-cache-dir --disable-pip-version-check -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY . /src
RUN PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    /opt/apg-farm/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps /src \
    && rm -rf /src

# The farm user owns its home and the folders its volumes mount on: a fresh named volume takes
# the owner of the folder it is mounted over, so `farm-home` is writable by the farm.
RUN useradd --create-home --uid 1000 --user-group --shell /bin/bash farm \
    && install -d -o farm -g farm -m 0700 /home/farm/.apg-farm /home/farm/.ssh

ENV PATH=/opt/apg-farm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    APG_FARM_HOME=/home/farm/.apg-farm
USER farm
WORKDIR /home/farm
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["apg-farm", "--help"]
