"""Local stand-ins for the on-call providers, each speaking the provider's wire format, so the real
provider notifiers (apache-airflow-providers-slack, -pagerduty, -smtp) can deliver to them in tests.

* :class:`SlackApi`: Slack's Web API ``chat.postMessage`` over HTTP; the Slack connection's
  ``base_url`` extra points the provider's ``WebClient`` at it.
* :class:`PagerdutyEventsApi`: PagerDuty Events API v2 (``POST /v2/enqueue``) behind a forward proxy.
  The provider's hook builds ``pagerduty.EventsApiV2Client(routing_key)``, whose base URL is fixed at
  ``https://events.pagerduty.com`` (the connection has no host), so it is reached the way a deployment
  behind a proxy reaches PagerDuty: ``HTTPS_PROXY`` names this proxy, which terminates the tunnel's
  TLS with a certificate for events.pagerduty.com signed by a throwaway CA (trusted through
  ``SSL_CERT_FILE``) and answers as PagerDuty does.
* :class:`SmtpServer`: an SMTP server (aiosmtpd) that requires STARTTLS, as a mail relay on port 587 does.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import socket
import ssl
import threading
from email import message_from_bytes, policy
from email.message import EmailMessage
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from aiosmtpd.controller import Controller
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

PAGERDUTY_EVENTS_HOST = "events.pagerduty.com"


class ThrowawayCa:
    """A CA and one server certificate for the stand-ins' names (PagerDuty's host, localhost)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        now = dt.datetime.now(dt.UTC)
        ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "streamstate-test-provider-ca")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        names = [
            x509.DNSName(PAGERDUTY_EVENTS_HOST),
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        server_cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, PAGERDUTY_EVENTS_HOST)]))
            .issuer_name(ca_name)
            .public_key(server_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        #: the file ``SSL_CERT_FILE`` names so clients trust the stand-ins
        self.ca_file = directory / "ca.pem"
        self.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
        server_pem = directory / "server.pem"
        server_pem.write_bytes(
            server_key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
            + server_cert.public_bytes(serialization.Encoding.PEM)
        )
        self.server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.server_context.load_cert_chain(server_pem)


def _serve(server: ThreadingHTTPServer) -> None:
    threading.Thread(target=server.serve_forever, daemon=True).start()


class SlackApi:
    """Slack's Web API: ``POST <base_url>chat.postMessage`` with a bot token, answered ``{"ok": true}``."""

    def __init__(self) -> None:
        #: every call: {"method", "authorization", "body"} (``body``: the JSON the client posted)
        self.calls: list[dict] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                method = self.path.removeprefix("/api/")
                api.calls.append({"method": method, "authorization": self.headers.get("Authorization"), "body": body})
                answer = {"ok": True, "channel": body.get("channel"), "ts": f"{len(api.calls)}.000100"}
                if method != "chat.postMessage":
                    answer = {"ok": False, "error": "unknown_method"}
                payload = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        #: the Slack connection's ``base_url`` extra
        self.base_url = f"http://127.0.0.1:{self.server.server_port}/api/"
        _serve(self.server)

    def messages(self) -> list[dict]:
        return [call["body"] for call in self.calls if call["method"] == "chat.postMessage"]

    def close(self) -> None:
        self.server.shutdown()


class PagerdutyEventsApi:
    """PagerDuty Events API v2 behind a forward proxy (``CONNECT events.pagerduty.com:443``).

    Answers ``/v2/enqueue`` as PagerDuty does: 202 with the event's dedup key, 400 for an event the
    real API rejects (a malformed routing key, an unknown action or severity, a summary over 1024
    characters).
    """

    def __init__(self, ca: ThrowawayCa) -> None:
        #: every event: {"host", "path", "body"}
        self.events: list[dict] = []
        #: the CONNECT targets clients asked for
        self.tunnels: list[str] = []
        api = self

        class EventsApi(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.events.append({"host": self.headers.get("Host"), "path": self.path, "body": body})
                problems = _event_problems(body) if self.path == "/v2/enqueue" else ["not found"]
                if problems:
                    status, answer = (
                        400,
                        {"status": "invalid event", "message": "Event object is invalid", "errors": problems},
                    )
                else:
                    status = 202
                    answer = {"status": "success", "message": "Event processed", "dedup_key": body.get("dedup_key")}
                payload = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args):
                pass

        class Proxy(BaseHTTPRequestHandler):
            def do_CONNECT(self):
                api.tunnels.append(self.path)
                if self.path != f"{PAGERDUTY_EVENTS_HOST}:443":
                    self.send_error(403, "this proxy only reaches PagerDuty's Events API")
                    return
                self.send_response(200, "Connection established")
                self.end_headers()
                tls = ca.server_context.wrap_socket(self.connection, server_side=True)
                try:
                    EventsApi(tls, self.client_address, self.server)  # serves the tunnel until it closes
                finally:
                    tls.close()
                self.close_connection = True

            def finish(self):
                try:
                    super().finish()
                except (OSError, ValueError):
                    pass  # the socket went to the TLS tunnel

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
        #: the ``HTTPS_PROXY`` value that routes PagerDuty's client here
        self.proxy_url = f"http://127.0.0.1:{self.server.server_port}"
        _serve(self.server)

    def enqueued(self) -> list[dict]:
        return [event["body"] for event in self.events if event["path"] == "/v2/enqueue"]

    def close(self) -> None:
        self.server.shutdown()


def _event_problems(event: dict) -> list[str]:
    """What PagerDuty's Events API v2 rejects an event for (the checks the stand-in makes)."""
    problems = []
    if len(event.get("routing_key") or "") != 32:  # an integration key has 32 characters
        problems.append("'routing_key' is invalid")
    if event.get("event_action") not in ("trigger", "acknowledge", "resolve"):
        problems.append("'event_action' is invalid")
    if event.get("event_action") != "trigger" and not event.get("dedup_key"):
        problems.append("'dedup_key' is required to acknowledge or resolve")
    if event.get("event_action") == "trigger":
        payload = event.get("payload") or {}
        if not payload.get("summary") or len(payload["summary"]) > 1024:
            problems.append("'payload.summary' must be 1 to 1024 characters")
        if not payload.get("source"):
            problems.append("'payload.source' is missing")
        if payload.get("severity") not in ("critical", "error", "warning", "info"):
            problems.append("'payload.severity' is invalid")
    return problems


class SmtpServer:
    """An SMTP relay on loopback that requires STARTTLS and keeps every message it accepts."""

    def __init__(self, ca: ThrowawayCa) -> None:
        #: every accepted message: {"mail_from", "rcpt_tos", "tls", "message"}
        self.received: list[dict] = []
        inbox = self

        class Handler:
            async def handle_DATA(self, server, session, envelope):
                inbox.received.append(
                    {
                        "mail_from": envelope.mail_from,
                        "rcpt_tos": list(envelope.rcpt_tos),
                        "tls": session.ssl is not None,
                        "message": message_from_bytes(envelope.original_content, policy=policy.default),
                    }
                )
                return "250 Message accepted for delivery"

        with socket.socket() as probe:  # aiosmtpd's controller needs a concrete port
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.controller = Controller(
            Handler(), hostname="127.0.0.1", port=self.port, tls_context=ca.server_context, require_starttls=True
        )
        self.controller.start()

    @staticmethod
    def html_body(message: EmailMessage) -> str:
        return message.get_body(preferencelist=("html",)).get_content()

    def close(self) -> None:
        self.controller.stop()
