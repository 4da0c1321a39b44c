"""A tiny Confluent Schema Registry stand-in for tests: enough of the REST API for
confluent-kafka's ``SchemaRegistryClient`` and ``AvroSerializer``.

>>> with FakeSchemaRegistry() as registry:
...     schema_id = registry.register('"long"', subject="events-value")
...     registry.url.startswith("http://127.0.0.1:")
True
"""

from __future__ import annotations

import base64
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_SCHEMA_BY_ID = re.compile(r"^/schemas/ids/(\d+)$")
_SUBJECT_VERSION = re.compile(r"^/subjects/([^/]+)/versions/(latest|\d+)$")
_SUBJECT_VERSIONS = re.compile(r"^/subjects/([^/]+)/versions$")


class FakeSchemaRegistry:
    """Serves registered schemas over HTTP on 127.0.0.1 and records every path it serves.

    ``requests`` lists the paths (without query) in arrival order, so a test can count the
    fetches of one schema id. With ``basic_auth=("user", "password")`` every request must
    carry those credentials, else 401.
    """

    def __init__(self, basic_auth: tuple[str, str] | None = None):
        self._lock = threading.Lock()
        self._schemas: dict[int, dict] = {}  # id -> {"schema": str, "schemaType"?, "references"?}
        self._subjects: dict[str, list[int]] = {}  # subject -> ids by version
        self.requests: list[str] = []
        self._auth = None
        if basic_auth is not None:
            self._auth = "Basic " + base64.b64encode(":".join(basic_auth).encode()).decode()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self):
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.close()

    def register(
        self,
        schema_str: str,
        subject: str | None = None,
        schema_type: str = "AVRO",
        references: list[dict] | None = None,
    ) -> int:
        """Register ``schema_str`` (under ``subject`` if given); the same schema keeps its id."""
        entry = {"schema": schema_str}
        if schema_type != "AVRO":
            entry["schemaType"] = schema_type
        if references:
            entry["references"] = references
        with self._lock:
            schema_id = next((i for i, e in self._schemas.items() if e == entry), None)
            if schema_id is None:
                schema_id = len(self._schemas) + 1
                self._schemas[schema_id] = entry
            if subject is not None:
                versions = self._subjects.setdefault(subject, [])
                if schema_id not in versions:
                    versions.append(schema_id)
        return schema_id

    def paths_for(self, schema_id: int) -> list[str]:
        return [p for p in self.requests if p == f"/schemas/ids/{schema_id}"]

    # -- request handling -------------------------------------------------------------

    def _get(self, path: str) -> tuple[int, dict]:
        with self._lock:
            match = _SCHEMA_BY_ID.match(path)
            if match:
                entry = self._schemas.get(int(match.group(1)))
                if entry is None:
                    return 404, {"error_code": 40403, "message": "Schema not found"}
                return 200, dict(entry)
            match = _SUBJECT_VERSION.match(path)
            if match:
                subject, version = unquote(match.group(1)), match.group(2)
                versions = self._subjects.get(subject)
                if not versions:
                    return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
                number = len(versions) if version == "latest" else int(version)
                if not 1 <= number <= len(versions):
                    return 404, {"error_code": 40402, "message": "Version not found."}
                schema_id = versions[number - 1]
                return 200, {
                    "subject": subject,
                    "id": schema_id,
                    "version": number,
                    **self._schemas[schema_id],
                }
        return 404, {"error_code": 404, "message": f"no route for {path}"}

    def _post(self, path: str, body: dict) -> tuple[int, dict]:
        match = _SUBJECT_VERSIONS.match(path)
        if not match:
            return 404, {"error_code": 404, "message": f"no route for {path}"}
        schema_id = self.register(
            body["schema"],
            subject=unquote(match.group(1)),
            schema_type=body.get("schemaType", "AVRO"),
            references=body.get("references"),
        )
        return 200, {"id": schema_id}


def _handler_for(registry: FakeSchemaRegistry) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._serve(lambda path: registry._get(path))

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            self._serve(lambda path: registry._post(path, body))

        def _serve(self, route) -> None:
            path = urlsplit(self.path).path
            with registry._lock:
                registry.requests.append(path)
            if registry._auth is not None and self.headers.get("Authorization") != registry._auth:
                status, body = 401, {"error_code": 401, "message": "Unauthorized"}
            else:
                status, body = route(path)
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args) -> None:
            pass

    return Handler
