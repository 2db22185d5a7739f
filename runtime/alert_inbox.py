"""A local alert inbox: an HTTP webhook on loopback that remembers every JSON body POSTed to it.

Point the ``streamstate_webhook`` Airflow connection at it (:attr:`AlertInbox.connection`) wherever
alerts are data of a run rather than pages for a person: the soak, the tests. An alert nobody can
receive fails its task by design, so such runs need somewhere to send them.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class AlertInbox:
    def __init__(self) -> None:
        self.received: list[dict] = []
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's API
                inbox.received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/alerts"
        #: the ``AIRFLOW_CONN_STREAMSTATE_WEBHOOK`` value that sends alerts here
        self.connection = json.dumps({"conn_type": "http", "host": self.url})
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of(self, application_id: str) -> list[tuple[str, str]]:
        """(condition, status) of every alert about ``application_id``, in arrival order."""
        return [(a["condition"], a["status"]) for a in self.received if a["application_id"] == application_id]

    def close(self) -> None:
        self.server.shutdown()
