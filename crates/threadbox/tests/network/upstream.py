# Test upstreams for crates/threadbox/tests/network.rs, run inside the test's own netns:
# an HTTP server (8080), a TCP sink that records every byte it receives (9000, held open),
# and a stub DNS resolver (UDP 53) that answers every A question with ADDR and records the
# names asked. Each writes to a file in DIR; DIR/ready appears once all are bound.
# With DIR/tls-cert.pem and DIR/tls-key.pem (a test CA's, written by upstream.rs), an
# HTTPS server (443, HTTP/1.1 keep-alive) records each request's path and headers.
import os
import socket
import ssl
import socketserver
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

addr, out = sys.argv[1], sys.argv[2]
lock = threading.Lock()


def record(name, data):
    with lock, open(f"{out}/{name}", "ab") as f:
        f.write(data)


class Http(BaseHTTPRequestHandler):
    def do_GET(self):
        record("http.log", (self.path + "\n").encode())
        body = b"hello from the upstream\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class Https(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        head = "".join(f"{k}: {v}\n" for k, v in self.headers.items())
        record("https.log", f"{self.path}\n{head}\n".encode())
        body = b"hello over tls\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class Sink(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            try:
                b = self.request.recv(4096)
            except OSError:
                return
            if not b:
                return
            record("sink.log", b)


class Threaded(socketserver.ThreadingMixIn, socketserver.TCPServer):
    allow_reuse_address = True
    daemon_threads = True


def dns(sock):
    ip = socket.inet_aton(addr)
    while True:
        q, peer = sock.recvfrom(512)
        if len(q) < 12:
            continue
        i, labels = 12, []
        while i < len(q) and q[i] != 0:
            n = q[i]
            labels.append(q[i + 1 : i + 1 + n].decode("ascii", "replace"))
            i += 1 + n
        qtype = struct.unpack("!H", q[i + 1 : i + 3])[0]
        question = q[12 : i + 5]
        record("dns.log", (".".join(labels).lower() + "\n").encode())
        answers = b""
        count = 0
        if qtype == 1:
            answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + ip
            count = 1
        header = q[:2] + struct.pack("!HHHHH", 0x8180, 1, count, 0, 0)
        sock.sendto(header + question + answers, peer)


http = ThreadingHTTPServer((addr, 8080), Http)
sink = Threaded((addr, 9000), Sink)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((addr, 53))
servers = [http.serve_forever, sink.serve_forever, lambda: dns(udp)]
if os.path.exists(f"{out}/tls-cert.pem"):
    https = ThreadingHTTPServer((addr, 443), Https)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(f"{out}/tls-cert.pem", f"{out}/tls-key.pem")
    https.socket = tls.wrap_socket(https.socket, server_side=True)
    servers.append(https.serve_forever)
for target in servers:
    threading.Thread(target=target, daemon=True).start()
open(f"{out}/ready", "w").close()
threading.Event().wait()
