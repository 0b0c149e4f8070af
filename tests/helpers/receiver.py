"""A local webhook receiver for the alert tests: a real HTTP server on a free loopback port."""

from __future__ import annotations

import http.server
import json
import threading


class Receiver:
    """An HTTP server on a free loopback port that answers 500 to the first `failures` POSTs."""

    def __init__(self, failures: int = 0) -> None:
        self.bodies: list[dict] = []
        self.attempts = 0
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.attempts += 1
                if receiver.attempts <= failures:
                    self.send_response(500)
                else:
                    receiver.bodies.append(body)
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
