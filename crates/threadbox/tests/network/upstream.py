# Test upstreams for crates/threadbox/tests/network.rs, run inside the test's own netns:
# an HTTP server (8080), a TCP sink that records every byte it receives (9000, held open),
# and a stub DNS resolver (UDP 53) that answers every A question with ADDR and records the
# names asked. Each writes to a file in DIR; DIR/ready appears once all are bound.
# With DIR/tls-cert.pem and DIR/tls-key.pem (a test CA's, written by upstream.rs), an
# HTTPS server (443, HTTP/1.1 keep-alive) records each request's path and headers.
# The HTTP server is also a local package index (issue 13, ADR 0067), built at start from a
# tiny package: PEP 503 pages under /simple/, wheels under /files/, an npm registry under
# /npm/ (`tbdemo`: Python `import tbdemo` and an npm module with a `tbdemo` bin).
import base64
import hashlib
import io
import json
import os
import socket
import ssl
import socketserver
import struct
import sys
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

addr, out = sys.argv[1], sys.argv[2]
# Optional: names starting with "rebind" answer this address instead (the rebinding cases).
rebind = sys.argv[3] if len(sys.argv) > 3 else None
lock = threading.Lock()


def record(name, data):
    with lock, open(f"{out}/{name}", "ab") as f:
        f.write(data)


def wheel(name, version, files):
    """A pure-Python wheel with a correct RECORD."""
    info = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: threadbox-test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n"
    )
    record_lines = []
    for path, text in files.items():
        data = text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record_lines.append(f"{path},sha256={digest.decode()},{len(data)}")
    record_lines.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record_lines) + "\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return buf.getvalue()


def npm_tarball(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for path, text in files.items():
            data = text.encode()
            ti = tarfile.TarInfo(f"package/{path}")
            ti.size = len(data)
            ti.mode = 0o755 if path.startswith("bin") else 0o644
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


WHEEL_NAME = "tbdemo-1.0-py3-none-any.whl"
WHEEL = wheel("tbdemo", "1.0", {"tbdemo/__init__.py": "VALUE = 'tbdemo works'\n"})
TGZ = npm_tarball(
    {
        "package.json": json.dumps(
            {"name": "tbdemo", "version": "1.0.0", "main": "index.js",
             "bin": {"tbdemo": "bin.js"}}
        ),
        "index.js": "module.exports = 'tbdemo works';\n",
        "bin.js": "#!/usr/bin/env node\nconsole.log(require('./index.js'));\n",
    }
)


def index_page(path, host):
    """(content type, body) of the package index at `path`, or None."""
    if path in ("/simple/tbdemo/", "/simple/tbdemo"):
        sha = hashlib.sha256(WHEEL).hexdigest()
        body = f'<html><body><a href="/files/{WHEEL_NAME}#sha256={sha}">{WHEEL_NAME}</a>'
        return "text/html", (body + "</body></html>\n").encode()
    if path == f"/files/{WHEEL_NAME}":
        return "application/octet-stream", WHEEL
    if path == "/npm/tbdemo":
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(TGZ).digest()).decode()
        version = {
            "name": "tbdemo", "version": "1.0.0", "bin": {"tbdemo": "bin.js"},
            "dist": {"tarball": f"http://{host}/npm/tbdemo/-/tbdemo-1.0.0.tgz",
                     "shasum": hashlib.sha1(TGZ).hexdigest(), "integrity": integrity},
        }
        doc = {"name": "tbdemo", "dist-tags": {"latest": "1.0.0"},
               "versions": {"1.0.0": version}}
        return "application/json", json.dumps(doc).encode()
    if path == "/npm/tbdemo/-/tbdemo-1.0.0.tgz":
        return "application/octet-stream", TGZ
    return None


def git_file(path):
    """A file of the dumb-HTTP git repositories under DIR/git (the tests make them), or None."""
    root = os.path.realpath(f"{out}/git")
    p = os.path.realpath(os.path.join(root, path[len("/git/"):].split("?")[0]))
    if not p.startswith(root + "/") or not os.path.isfile(p):
        return None
    with open(p, "rb") as f:
        return f.read()


class Http(BaseHTTPRequestHandler):
    def do_GET(self):
        record("http.log", (self.path + "\n").encode())
        if self.path.startswith("/git/"):
            data = git_file(self.path)
            self.send_response(200 if data is not None else 404)
            self.send_header("Content-Length", str(len(data or b"")))
            self.end_headers()
            self.wfile.write(data or b"")
            return
        page = index_page(self.path, self.headers.get("Host", addr))
        if page is not None:
            self.send_response(200)
            self.send_header("Content-Type", page[0])
            self.send_header("Content-Length", str(len(page[1])))
            self.end_headers()
            self.wfile.write(page[1])
            return
        if self.path.startswith(("/simple/", "/npm/", "/files/")):
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
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
    # The connection-exhaustion case opens hundreds at once.
    request_queue_size = 1024


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
            a = socket.inet_aton(rebind) if rebind and labels[:1] and labels[0].startswith("rebind") else ip
            answers = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 30, 4) + a
            count = 1
        header = q[:2] + struct.pack("!HHHHH", 0x8180, 1, count, 0, 0)
        sock.sendto(header + question + answers, peer)


def sink_on(port, log, family=socket.AF_INET, host=None):
    """A TCP server on `port` that records every byte it receives in `log`."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            while True:
                try:
                    b = self.request.recv(4096)
                except OSError:
                    return
                if not b:
                    return
                record(log, b)

    class Server(Threaded):
        address_family = family

    return Server((host or addr, port), Handler)


def udp_recorder(sock, log):
    while True:
        b, _ = sock.recvfrom(65535)
        record(log, b)


def icmp_recorder(sock):
    while True:
        b, _ = sock.recvfrom(65535)
        record("icmp.log", b)


http = ThreadingHTTPServer((addr, 8080), Http)
sink = Threaded((addr, 9000), Sink)
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.bind((addr, 53))
targets = [http.serve_forever, sink.serve_forever, lambda: dns(udp)]
# The bypass-class servers (security suite, ADR 0069): each records what reaches it.
http80 = ThreadingHTTPServer((addr, 80), Http)
targets.append(http80.serve_forever)
# 443: the HTTPS server when a test CA was written (the secrets tests), else a sink that
# records raw bytes (the bypass cases judge TLS without SNI by them).
tls_files = os.path.exists(f"{out}/tls-cert.pem")
sinks = [(53, "dnstcp.log"), (853, "dot.log")] + ([] if tls_files else [(443, "tls.log")])
for port, log in sinks:
    targets.append(sink_on(port, log).serve_forever)
if tls_files:
    https = ThreadingHTTPServer((addr, 443), Https)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(f"{out}/tls-cert.pem", f"{out}/tls-key.pem")
    https.socket = tls.wrap_socket(https.socket, server_side=True)
    targets.append(https.serve_forever)
udp443 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp443.bind((addr, 443))
targets.append(lambda: udp_recorder(udp443, "udp.log"))
udp_other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp_other.bind((addr, 5000))
targets.append(lambda: udp_recorder(udp_other, "udp.log"))
icmp = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
targets.append(lambda: icmp_recorder(icmp))
if len(sys.argv) > 4:
    targets.append(sink_on(9000, "sink6.log", socket.AF_INET6, sys.argv[4]).serve_forever)
for target in targets:
    threading.Thread(target=target, daemon=True).start()
open(f"{out}/ready", "w").close()
threading.Event().wait()
