#!/usr/bin/python3
"""A tiny "internet" for tests/integration/egress.c, run inside a network namespace the test
created (ip netns exec). Every address below is configured inside that namespace and routed
there from the host, so nothing the sandboxes send can leave the machine.

  198.18.53.53:53/udp   resolver for the test names (counts every query)
  198.18.1.10:80        "allowed" site        198.18.1.20:80  "forbidden" site
  169.254.169.254:80    fake metadata service (must never be reached)
  10.99.0.10, 172.16.99.10, 192.168.99.10, 100.64.99.10:80  "private" sites (the test only;
                        private.test resolves to the first)
  198.18.1.10:9999/udp  UDP sink (must never be reached)
  198.18.1.30:7777,7778 TCP echo (7777 allowed by a CIDR:port rule, 7778 not)
  198.18.1.10:443       HTTPS, certificates by SNI (allowed.test, www.wild.test, forbidden.test;
                        anything else gets allowed.test's), signed by the test public CA
  198.18.1.20:443       HTTPS, forbidden.test
  198.18.1.10:8443      HTTPS, allowed.test signed by a "rogue" CA egressd does not trust
  198.18.1.10:8080      plain HTTP, keep-alive (bench)
  On 443 and 8080: GET /big?n=BYTES (a download), POST (the body, by Content-Length or
  chunked, is counted and its SHA-256 answered), GET /ws with Upgrade: websocket (RFC 6455
  handshake, then every text frame echoed), GET /nows (a 200 to a WebSocket handshake).
  On 80, 443 and 8080: GET /echo/<anything>/<mode>... answers the request's target and headers
  in its body, between "ECHO-BEGIN" and "ECHO-END" lines, the way an httpbin-style echo or an
  error page quoting the request would: mode "length" (Content-Length, one write), "chunked"
  (one chunk per line; HTTP/1.1 only, so not on 80), "slow" (Content-Length, the body in writes
  of 5 bytes 2 ms apart, so an echoed value straddles reads and TLS records), "tail" (as
  "length", the body ending in the request's X-Tail value, without a newline); kept alive on
  HTTP/1.1 unless the request says Connection: close. What was
  received is also recorded as for /headers (credentials tests: the site must really have
  received the value that egressd then masks on its way back).

Counters are written to argv[1] (JSON) after every event. argv[2], when given, is the directory
of the PEM files the test made (public CA leaves <name>.crt/.key, rogue/allowed.test.*);
"bench" as argv[3] stops the counters (a file write per request would be what is measured).
"""
import base64
import hashlib
import json
import os
import socket
import ssl
import socketserver
import struct
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STATS_PATH = sys.argv[1]
# The first two octets of every address (bench/egress.sh uses another pair than the test, so
# both can run at once).
NET = os.environ.get("EGRESS_NET", "198.18")
CERTS = sys.argv[2] if len(sys.argv) > 2 else None
QUIET = len(sys.argv) > 3 and sys.argv[3] == "bench"
lock = threading.Lock()
stats = {"dns": 0, "dns_names": [], "http": {}, "udp": 0, "echo": {}, "tls": {}, "https": {},
         "https_hosts": [], "posts": [], "post_hosts": {}, "ws": 0}
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC11B56"
NAMES = {
    "allowed.test": NET + ".1.10",
    "forbidden.test": NET + ".1.20",
    "www.wild.test": NET + ".1.10",
    "mismatch.test": NET + ".1.10",
    "private.test": "10.99.0.10",
}
# Private-range addresses (RFC 1918, CGNAT) with a plain HTTP site each: egressd must refuse
# them under every mode unless a policy's CIDR entry names them. Served with EGRESS_PRIVATE=1
# only: the test adds them to this namespace and routes each into it first.
PRIVATE = ("10.99.0.10", "172.16.99.10", "192.168.99.10", "100.64.99.10")


def bump(fn):
    if QUIET and STATS_PATH is not None and os.path.exists(STATS_PATH):
        return
    with lock:
        fn(stats)
        tmp = STATS_PATH + ".tmp"
        with open(tmp, "w") as f:
            json.dump(stats, f)
        os.replace(tmp, STATS_PATH)


def echo_headers(handler):
    """GET /headers...: records the request target and every header as received into the stats
    ("seen", read by the test on the host) and answers without them: what the site got must
    not travel back into the guest (credentials tests: the guest must never see a value)."""
    text = "target:%s\n" % handler.path + "".join(
        "hdr:%s: %s\n" % (k, v) for k, v in handler.headers.items())
    bump(lambda s: s.setdefault("seen", []).append(text))
    body = ("seen %d bytes\n" % len(text)).encode()
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(body)))
    handler.send_header("Connection", "close")
    handler.close_connection = True
    handler.end_headers()
    handler.wfile.write(body)


def echo_back(handler):
    """GET /echo/<anything>/<mode>...: the request as received, recorded, and sent back."""
    text = "target:%s\n" % handler.path + "".join(
        "hdr:%s: %s\n" % (k, v) for k, v in handler.headers.items())
    bump(lambda s: s.setdefault("seen", []).append(text))
    parts = handler.path.split("?", 1)[0].split("/")
    mode = parts[3] if len(parts) > 3 else "length"
    body = ("ECHO-BEGIN\n" + text + "ECHO-END\n" +
            (handler.headers.get("X-Tail", "") if mode == "tail" else "")).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "text/plain")
    if (handler.protocol_version != "HTTP/1.1" or
            handler.headers.get("Connection", "").lower() == "close"):
        handler.send_header("Connection", "close")
        handler.close_connection = True
    if mode == "chunked" and handler.protocol_version == "HTTP/1.1":
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for line in body.splitlines(keepends=True):
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
        handler.wfile.write(b"0\r\n\r\n")
        return
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if mode != "slow":
        handler.wfile.write(body)
        return
    handler.wfile.flush()
    handler.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for i in range(0, len(body), 5):
        handler.wfile.write(body[i:i + 5])
        handler.wfile.flush()
        time.sleep(0.002)


class Http(BaseHTTPRequestHandler):
    def do_GET(self):
        me = self.connection.getsockname()[0]
        bump(lambda s: s["http"].__setitem__(me, s["http"].get(me, 0) + 1))
        if self.path.startswith("/headers"):
            echo_headers(self)
            return
        if self.path.startswith("/echo/"):
            echo_back(self)
            return
        site = {NET + ".1.10": "allowed", NET + ".1.20": "forbidden"}.get(
            me, "metadata" if me == "169.254.169.254" else "private")
        body = ("site:%s host:%s target:%s\n" % (site, self.headers.get("Host", ""),
                                                  self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


BIG = b"x" * (1 << 20)


class Https(BaseHTTPRequestHandler):
    """HTTP/1.1 with keep-alive, over TLS or not; /big?n=BYTES sends that many bytes."""
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        # Head and body are two writes: without this, Nagle and the client's delayed ACK
        # add 40 ms to every kept-alive request.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def read_chunked(self):
        """A chunked body, strictly (RFC 9112 7.1); None when malformed."""
        body = b""
        while True:
            line = self.rfile.readline(1024)
            if not line.endswith(b"\r\n"):
                return None
            size = line[:-2].split(b";", 1)[0]
            try:
                n = int(size, 16)
            except ValueError:
                return None
            if n == 0:
                break
            body += self.rfile.read(n)
            if self.rfile.read(2) != b"\r\n":
                return None
        while True:  # trailers
            line = self.rfile.readline(1024)
            if line == b"\r\n":
                return body
            if not line.endswith(b"\r\n"):
                return None

    def do_POST(self):
        me = "%s:%d" % self.connection.getsockname()[:2]
        host = self.headers.get("Host", "")
        te = self.headers.get("Transfer-Encoding", "")
        if te.lower() == "chunked":
            body = self.read_chunked()
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if body is None:
            self.close_connection = True
            return
        digest = hashlib.sha256(body).hexdigest()
        bump(lambda s: (s["https"].__setitem__(me, s["https"].get(me, 0) + 1),
                        s["post_hosts"].__setitem__(host, s["post_hosts"].get(host, 0) + 1),
                        s["posts"].append("%s %s %s %d %s" % (me, host, te or "length",
                                                              len(body), digest[:16]))))
        out = ("posted:%d sha256:%s host:%s\n" % (len(body), digest, host)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def websocket(self):
        """RFC 6455 4.2.2 handshake, then each text frame from the client echoed back."""
        key = self.headers.get("Sec-WebSocket-Key", "")
        accept = base64.b64encode(hashlib.sha1(key.encode() + WS_GUID).digest()).decode()
        bump(lambda s: s.__setitem__("ws", s["ws"] + 1))
        self.send_response(101, "Switching Protocols")
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        self.close_connection = True
        while True:
            hdr = self.rfile.read(2)
            if len(hdr) < 2 or hdr[0] & 0x0f == 8:  # end, or a close frame
                return
            n = hdr[1] & 0x7f
            if n == 126:
                n = struct.unpack(">H", self.rfile.read(2))[0]
            elif n == 127:
                return
            mask = self.rfile.read(4) if hdr[1] & 0x80 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(n)))
            out = b"echo:" + data
            self.wfile.write(bytes([0x81, len(out)]) + out if len(out) < 126 else
                             bytes([0x81, 126]) + struct.pack(">H", len(out)) + out)
            self.wfile.flush()

    def do_GET(self):
        me = "%s:%d" % self.connection.getsockname()[:2]
        host = self.headers.get("Host", "")
        sni = getattr(self.connection, "sni", None) or ""
        bump(lambda s: (s["https"].__setitem__(me, s["https"].get(me, 0) + 1),
                        s["https_hosts"].append("%s %s %s" % (me, sni, host))))
        if self.path.startswith("/headers"):
            echo_headers(self)
            return
        if self.path.startswith("/echo/"):
            echo_back(self)
            return
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            self.websocket()
            return
        if self.path.startswith("/big?n="):
            n = int(self.path[7:])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            while n > 0:
                k = min(n, len(BIG))
                self.wfile.write(BIG[:k])
                n -= k
            return
        site = {NET + ".1.10": "allowed", NET + ".1.20": "forbidden"}.get(
            self.connection.getsockname()[0], "?")
        body = ("site:%s host:%s sni:%s port:%d target:%s\n" % (
            site, host, sni, self.connection.getsockname()[1], self.path)).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        if self.headers.get("Connection", "").lower() == "close":
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def tls_context(crt, key):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(CERTS, crt), os.path.join(CERTS, key))
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


class TlsServer(ThreadingHTTPServer):
    """Certificates chosen by SNI; the handshake runs in the handler's thread."""
    by_name = {}
    default = None

    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]

    def get_request(self):
        sock, addr = self.socket.accept()
        tls = self.default.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return tls, addr

    def finish_request(self, request, client_address):
        try:
            request.do_handshake()
        except (ssl.SSLError, OSError):
            return
        super().finish_request(request, client_address)


def tls_server(addr, port, names, default_name, subdir=""):
    ctxs = {n: tls_context(subdir + n + ".crt", subdir + n + ".key") for n in names}
    default = ctxs[default_name]

    def pick(sock, name, ctx):
        sock.sni = name
        if name in ctxs:
            sock.context = ctxs[name]

    for c in ctxs.values():
        c.sni_callback = pick
    srv = type("Tls%d" % port, (TlsServer,), {"default": default})((addr, port), Https)
    return srv


def dns_server():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((NET + ".53.53", 53))
    while True:
        q, addr = s.recvfrom(2048)
        if len(q) < 12:
            continue
        off, labels = 12, []
        while off < len(q) and q[off] != 0:
            n = q[off]
            labels.append(q[off + 1: off + 1 + n].decode(errors="replace"))
            off += 1 + n
        name = ".".join(labels).lower()
        qtype = struct.unpack(">H", q[off + 1: off + 3])[0] if off + 3 <= len(q) else 0
        bump(lambda st: (st.__setitem__("dns", st["dns"] + 1), st["dns_names"].append(name)))
        question = q[12: off + 5]
        ip = NAMES.get(name)
        if ip and qtype == 1:
            flags, an = 0x8180, 1
            answer = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 30, 4) + socket.inet_aton(ip)
        else:
            flags, an, answer = (0x8183 if not ip else 0x8180), 0, b""
        hdr = q[:2] + struct.pack(">HHHHH", flags, 1, an, 0, 0)
        s.sendto(hdr + question + answer, addr)


def udp_sink():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((NET + ".1.10", 9999))
    while True:
        s.recvfrom(2048)
        bump(lambda st: st.__setitem__("udp", st["udp"] + 1))


class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        port = str(self.request.getsockname()[1])
        bump(lambda s: s["echo"].__setitem__(port, s["echo"].get(port, 0) + 1))
        data = self.request.recv(1024)
        self.request.sendall(b"echo:" + data)
        # "now..." asks for a close right after the answer, which may cross the client's own
        # close (egress.c, test_suspend_after_closes_cross). Otherwise the client closes first.
        if data.startswith(b"now"):
            return
        while self.request.recv(1024):
            pass


class Server(ThreadingHTTPServer):
    # HTTPServer.server_bind asks DNS for its own name (getfqdn): no DNS here.
    def server_bind(self):
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.server_address[:2]


class TlsSink(socketserver.BaseRequestHandler):
    def handle(self):
        me = self.request.getsockname()[0]
        data = self.request.recv(16384)
        if data[:1] == b"\x16":
            bump(lambda s: s["tls"].__setitem__(me, s["tls"].get(me, 0) + 1))


def serve(server):
    threading.Thread(target=server.serve_forever, daemon=True).start()


ThreadingHTTPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer.allow_reuse_address = True
for a in (NET + ".1.10", NET + ".1.20", "169.254.169.254") + (PRIVATE if os.environ.get("EGRESS_PRIVATE") else ()):
    serve(Server((a, 80), Http))
if CERTS:
    serve(tls_server(NET + ".1.10", 443, ["allowed.test", "www.wild.test", "forbidden.test"],
                     "allowed.test"))
    serve(tls_server(NET + ".1.20", 443, ["forbidden.test"], "forbidden.test"))
    serve(tls_server(NET + ".1.10", 8443, ["allowed.test"], "allowed.test", "rogue/"))
else:
    for a in (NET + ".1.10", NET + ".1.20"):
        serve(socketserver.ThreadingTCPServer((a, 443), TlsSink))
for a in (NET + ".1.10", NET + ".1.30"):
    serve(Server((a, 8080), Https))
for p in (7777, 7778):
    serve(socketserver.ThreadingTCPServer((NET + ".1.30", p), Echo))
threading.Thread(target=udp_sink, daemon=True).start()
bump(lambda s: None)
dns_server()
