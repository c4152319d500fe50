"""A preview test's app, run inside the sandbox on 127.0.0.1 only: answers every request
with JSON of what it received (path and headers, so the test sees what reached the
sandbox), and answers `Upgrade: websocket` with 101, then echoes raw bytes."""

import http.server
import json
import sys

PORT = int(sys.argv[1])


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.headers.get("Upgrade", "").lower() == "websocket":
            self.send_response(101)
            self.send_header("Upgrade", "websocket")
            self.send_header("Connection", "Upgrade")
            self.end_headers()
            self.wfile.flush()
            while True:
                data = self.connection.recv(4096)
                if not data:
                    break
                self.connection.sendall(data)
            self.close_connection = True
            return
        length = int(self.headers.get("Content-Length", "0") or "0")
        body_in = self.rfile.read(length).decode() if length else ""
        body = json.dumps(
            {
                "port": PORT,
                "method": self.command,
                "path": self.path,
                "body": body_in,
                "headers": [[k.lower(), v] for k, v in self.headers.items()],
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


http.server.ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
