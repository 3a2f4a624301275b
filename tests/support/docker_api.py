"""A small HTTP server speaking the part of the Docker Engine API the mounts check uses.

Written from the API's documented shapes (docs.docker.com/reference/api/engine: `GET /_ping`,
`GET /version`, `GET /containers/json` with `all` and `filters`, `GET /containers/{id}/json`
returning ContainerInspectResponse with `Mounts` (MountPoint), `Config.Env`, `Config.Labels` and
`HostConfig`). Kept for the unit tests (fast, and over SSH through a `dial-stdio` stand-in);
the same check against a real Docker engine is tests/beds/test_mounts_engine.py.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

API_VERSION = "1.43"
_VERSIONED = re.compile(r"^/v[0-9]+\.[0-9]+(/.*)$")


def web_container(
    cid: str,
    *,
    project: str,
    approot: str,
    mounts: list[dict[str, Any]] | None = None,
    env: list[str] | None = None,
    privileged: bool = False,
    service: str = "web",
) -> dict[str, Any]:
    """A DDEV web container as `GET /containers/{id}/json` describes it."""
    labels = {
        "com.ddev.site-name": project,
        "com.ddev.approot": approot,
        "com.ddev.platform": "ddev",
        "com.docker.compose.project": f"ddev-{project}",
        "com.docker.compose.service": service,
    }
    default_mounts = [
        bind(approot, "/var/www/html"),
        bind(f"{approot}/.ddev", "/mnt/ddev_config", rw=False),
        volume("ddev-global-cache", "/mnt/ddev-global-cache"),
        volume("ddev-ssh-agent_socket_dir", "/home/.ssh-agent"),
    ]
    return {
        "Id": cid,
        "Created": "2026-05-01T10:00:00.000000000Z",
        "Path": "/start.sh",
        "Args": [],
        "State": {"Status": "running", "Running": True, "Pid": 4242, "ExitCode": 0},
        "Image": "sha256:" + "0" * 64,
        "Name": f"/ddev-{project}-{service}",
        "RestartCount": 0,
        "Driver": "overlay2",
        "HostConfig": {
            "Binds": [f"{approot}:/var/www/html"],
            "NetworkMode": f"ddev-{project}_default",
            "Privileged": privileged,
        },
        "Mounts": default_mounts + (mounts or []),
        "Config": {
            "Hostname": f"{project}-{service}",
            "Env": [
                "DDEV_PROJECT=" + project,
                "IS_DDEV_PROJECT=true",
                "MYSQL_PWD=db",
                "PGPASSWORD=db",
                "SSH_AUTH_SOCK=/home/.ssh-agent/socket",
                "TZ=UTC",
                *(env or []),
            ],
            "Labels": labels,
            "Image": f"ddev/ddev-webserver:v1.25.1-{project}-built",
        },
        "NetworkSettings": {"Networks": {}},
    }


def bind(source: str, target: str, *, rw: bool = True) -> dict[str, Any]:
    """A MountPoint of type bind."""
    return {
        "Type": "bind",
        "Source": source,
        "Destination": target,
        "Mode": "" if rw else "ro",
        "RW": rw,
        "Propagation": "rprivate",
    }


def volume(name: str, target: str) -> dict[str, Any]:
    """A MountPoint of type volume."""
    return {
        "Type": "volume",
        "Name": name,
        "Source": f"/var/lib/docker/volumes/{name}/_data",
        "Destination": target,
        "Driver": "local",
        "Mode": "z",
        "RW": True,
        "Propagation": "",
    }


def _summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The ContainerSummary `GET /containers/json` lists for an inspected container."""
    return {
        "Id": doc["Id"],
        "Names": [doc["Name"]],
        "Image": doc["Config"]["Image"],
        "ImageID": doc["Image"],
        "Command": doc["Path"],
        "Created": 1777629600,
        "Ports": [],
        "Labels": doc["Config"]["Labels"],
        "State": doc["State"]["Status"],
        "Status": "Up 2 hours",
        "HostConfig": {"NetworkMode": doc["HostConfig"]["NetworkMode"]},
        "NetworkSettings": {"Networks": {}},
        "Mounts": doc["Mounts"],
    }


class FakeDocker:
    """The engine's state: containers by id, and the requests it served."""

    def __init__(self) -> None:
        self.containers: dict[str, dict[str, Any]] = {}
        self.requests: list[str] = []
        self.url = ""

    def add(self, doc: dict[str, Any]) -> None:
        self.containers[doc["Id"]] = doc

    def list(self, filters: dict[str, list[str]]) -> list[dict[str, Any]]:
        wanted = filters.get("label", [])
        found = []
        for doc in self.containers.values():
            labels = doc["Config"]["Labels"]
            ok = True
            for item in wanted:
                key, sep, value = item.partition("=")
                if key not in labels or (sep and labels[key] != value):
                    ok = False
            if ok:
                found.append(_summary(doc))
        return found


def _handler(engine: FakeDocker) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _send(self, status: int, body: Any, *, text: bool = False) -> None:
            data = body.encode() if text else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Api-Version", API_VERSION)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            path = parts.path
            engine.requests.append(path)
            versioned = _VERSIONED.match(path)
            if versioned:
                path = versioned.group(1)
            query = parse_qs(parts.query)
            if path == "/_ping":
                self._send(200, "OK", text=True)
            elif path == "/version":
                self._send(
                    200,
                    {
                        "Version": "24.0.7",
                        "ApiVersion": API_VERSION,
                        "MinAPIVersion": "1.12",
                        "Os": "linux",
                        "Arch": "amd64",
                    },
                )
            elif path == "/containers/json":
                filters = json.loads(query.get("filters", ["{}"])[0] or "{}")
                if isinstance(filters.get("label"), dict):  # the map form of older clients
                    filters["label"] = [k for k, v in filters["label"].items() if v]
                self._send(200, engine.list(filters))
            elif m := re.fullmatch(r"/containers/([^/]+)/json", path):
                doc = engine.containers.get(m.group(1))
                if doc is None:
                    self._send(404, {"message": f"No such container: {m.group(1)}"})
                else:
                    self._send(200, doc)
            else:
                self._send(404, {"message": f"page not found: {path}"})

    return Handler


@contextmanager
def fake_docker() -> Iterator[FakeDocker]:
    """A FakeDocker listening on a loopback port; its `url` is a tcp:// DOCKER_HOST."""
    engine = FakeDocker()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(engine))
    engine.url = f"tcp://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        server.shutdown()
        server.server_close()
