/* egress-probe: a small static HTTP(S) client for tests/integration/egress.c and
 * `bench/run.sh egress`, copied into sandboxes through the files API (the tiny template has no
 * TLS client: busybox has no ssl_client and its wget crashes there). Linked statically with
 * OpenSSL so it runs in a rootfs without libc.
 *
 *   egress-probe [options] ADDRESS PORT
 *     --sni NAME        speak TLS with this SNI (--tls: TLS without SNI)
 *     --connect H:P     ADDRESS PORT is an HTTP proxy: CONNECT H:P first, then the rest
 *     --host H[,H...]   Host of each request, all on one connection (default: the SNI)
 *     --ca FILE         trust FILE only (default: OpenSSL's default paths, which honour
 *                       SSL_CERT_FILE; in a sandbox that is the deployment CA)
 *     --alpn P[,P...]   offer these ALPN protocols (default http/1.1)
 *     --path P          request target (default /)
 *     --header H        one more header line of each GET request ("Name: value")
 *     --next-path P     request target of the second and later requests (default: --path)
 *     --bench N         N requests, each timed; prints p50/p90/p99 in microseconds
 *     --new-conn        with --bench: a new connection (and handshake) per request
 *     --timeout-ms MS   per read/write (default 5000)
 *     --pause-ms MS     wait this long between the requests of --host H,H
 *     --post N          the requests are POSTs of N bytes (a fixed pattern); prints
 *                       "sent: N sha256:HEX" before each
 *     --chunk K         with --post: Transfer-Encoding chunked, chunks of K bytes (the first
 *                       with a chunk extension, a trailer field at the end)
 *     --ws MSG          the first request is a WebSocket handshake (RFC 6455 4.1) to --path:
 *                       prints "ws: <status line>", and after a 101 sends MSG as one masked
 *                       text frame and prints "ws: got <text>" for the frame that comes back;
 *                       after any other answer, the next --host requests follow on the same
 *                       connection
 * Prints "tls: ...", "cert: subject=... issuer=...", "verify: ok|fail <reason>", then each
 * response (or "bench: ..."). Exit 0 when every response arrived, 2 when the TLS handshake
 * failed, 3 on a connection error, 4 on a short or malformed response, 5 when the proxy refused
 * the CONNECT. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    const char *addr, *sni, *hosts, *ca, *alpn, *path, *next_path, *connect_to, *ws, *header;
    int port, bench, timeout_ms, pause_ms, post, chunk;
    int tls, new_conn;
} opts_t;

typedef struct {
    int fd;
    SSL *ssl;
} link_t;

static opts_t o = {.path = "/", .timeout_ms = 5000, .alpn = "http/1.1", .post = -1};
static SSL_CTX *ctx;

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int io_write(link_t *l, const void *b, size_t n)
{
    if (l->ssl)
        return SSL_write(l->ssl, b, (int)n) == (int)n ? 0 : -1;
    const char *p = b;
    while (n) {
        ssize_t w = write(l->fd, p, n);
        if (w <= 0)
            return -1;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

static ssize_t io_read(link_t *l, void *b, size_t n)
{
    if (l->ssl) {
        int r = SSL_read(l->ssl, b, (int)n);
        return r > 0 ? r : (SSL_get_error(l->ssl, r) == SSL_ERROR_ZERO_RETURN ? 0 : -1);
    }
    return read(l->fd, b, n);
}

static void print_cert(SSL *ssl)
{
    X509 *c = SSL_get1_peer_certificate(ssl);
    if (!c) {
        printf("cert: none\n");
        return;
    }
    char subj[256] = "", iss[256] = "";
    X509_NAME_oneline(X509_get_subject_name(c), subj, sizeof(subj));
    X509_NAME_oneline(X509_get_issuer_name(c), iss, sizeof(iss));
    printf("cert: subject=%s issuer=%s\n", subj, iss);
    X509_free(c);
}

static int open_link(link_t *l, int quiet)
{
    memset(l, 0, sizeof(*l));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o.port)};
    if (inet_pton(AF_INET, o.addr, &sa.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", o.addr);
        return 3;
    }
    l->fd = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {.tv_sec = o.timeout_ms / 1000, .tv_usec = (o.timeout_ms % 1000) * 1000};
    setsockopt(l->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(l->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    int one = 1;
    setsockopt(l->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(l->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        printf("connect: %s\n", strerror(errno));
        close(l->fd);
        return 3;
    }
    if (o.connect_to) {
        /* CONNECT through the proxy; its answer head must be a 200. */
        char req[600], head[2048];
        int n = snprintf(req, sizeof(req), "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n", o.connect_to,
                         o.connect_to);
        size_t have = 0;
        if (write(l->fd, req, (size_t)n) != n) {
            close(l->fd);
            return 3;
        }
        /* Byte by byte: nothing of the tunnel may be read here. */
        while (have < sizeof(head) - 1 &&
               (have < 4 || memcmp(head + have - 4, "\r\n\r\n", 4) != 0)) {
            if (read(l->fd, head + have, 1) != 1)
                break;
            have++;
        }
        head[have] = '\0';
        if (!quiet)
            printf("connect: %.*s\n", (int)strcspn(head, "\r\n"), head);
        if (strncmp(head, "HTTP/1.1 200", 12) != 0) {
            printf("%s", head);
            /* the rest of a refusal (its body) */
            char rest[1024];
            ssize_t r = read(l->fd, rest, sizeof(rest) - 1);
            if (r > 0)
                printf("%.*s\n", (int)r, rest);
            close(l->fd);
            return 5;
        }
    }
    if (!o.tls)
        return 0;
    l->ssl = SSL_new(ctx);
    SSL_set_fd(l->ssl, l->fd);
    if (o.sni) {
        SSL_set_tlsext_host_name(l->ssl, o.sni);
        SSL_set1_host(l->ssl, o.sni);
    }
    if (SSL_connect(l->ssl) != 1) {
        long vr = SSL_get_verify_result(l->ssl);
        unsigned long e = ERR_get_error();
        printf("tls: handshake failed (%s)\n", e ? ERR_reason_error_string(e) : "closed");
        if (vr != X509_V_OK)
            printf("verify: fail %s\n", X509_verify_cert_error_string(vr));
        print_cert(l->ssl);
        SSL_free(l->ssl);
        close(l->fd);
        return 2;
    }
    if (!quiet) {
        const unsigned char *alpn = NULL;
        unsigned alen = 0;
        SSL_get0_alpn_selected(l->ssl, &alpn, &alen);
        printf("tls: ok version=%s alpn=%.*s\n", SSL_get_version(l->ssl), (int)alen,
               alpn ? (const char *)alpn : "");
        print_cert(l->ssl);
        printf("verify: %s\n", SSL_get_verify_result(l->ssl) == X509_V_OK ? "ok" : "fail");
    }
    return 0;
}

static void close_link(link_t *l)
{
    if (l->ssl) {
        SSL_shutdown(l->ssl);
        SSL_free(l->ssl);
    }
    close(l->fd);
}

/* The body of --post: n bytes of a pattern, sent as they are or in chunks of o.chunk. */
static int send_body(link_t *l, long long n, int print)
{
    static char block[1 << 16];
    for (size_t i = 0; i < sizeof(block); i++)
        block[i] = (char)('a' + i % 26);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    long long left = n;
    int first = 1, rc = 0;
    while (left > 0 && rc == 0) {
        size_t k = left < (long long)sizeof(block) ? (size_t)left : sizeof(block);
        if (o.chunk > 0 && k > (size_t)o.chunk)
            k = (size_t)o.chunk;
        char size[64];
        int sl = snprintf(size, sizeof(size), "%zx%s\r\n", k, first ? ";probe=1" : "");
        first = 0;
        if (o.chunk > 0 && io_write(l, size, (size_t)sl) < 0)
            rc = 3;
        if (rc == 0 && io_write(l, block, k) < 0)
            rc = 3;
        if (rc == 0 && o.chunk > 0 && io_write(l, "\r\n", 2) < 0)
            rc = 3;
        EVP_DigestUpdate(md, block, k);
        left -= (long long)k;
    }
    static const char end[] = "0\r\nX-Probe-Trailer: 1\r\n\r\n";
    if (rc == 0 && o.chunk > 0 && io_write(l, end, sizeof(end) - 1) < 0)
        rc = 3;
    unsigned char d[32];
    EVP_DigestFinal_ex(md, d, NULL);
    EVP_MD_CTX_free(md);
    if (print) {
        printf("sent: %lld sha256:", n);
        for (int i = 0; i < 32; i++)
            printf("%02x", d[i]);
        printf("\n");
    }
    if (rc)
        printf("write failed\n");
    return rc;
}

/* One request and its whole response (Content-Length, or until the end). body_bytes gets the
 * body size; print: echo the response. */
static int request(link_t *l, const char *host, int last, int print, long long *body_bytes)
{
    static int requests;
    const char *path = requests++ > 0 && o.next_path ? o.next_path : o.path;
    char req[1024];
    int n;
    if (o.post < 0)
        n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: %s\r\n%s%s\r\n",
                     path, host, last ? "close" : "keep-alive", o.header ? o.header : "",
                     o.header ? "\r\n" : "");
    else if (o.chunk > 0)
        n = snprintf(req, sizeof(req),
                     "POST %s HTTP/1.1\r\nHost: %s\r\nConnection: %s\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n",
                     path, host, last ? "close" : "keep-alive");
    else
        n = snprintf(req, sizeof(req),
                     "POST %s HTTP/1.1\r\nHost: %s\r\nConnection: %s\r\nContent-Length: %d\r\n\r\n",
                     path, host, last ? "close" : "keep-alive", o.post);
    if (io_write(l, req, (size_t)n) < 0) {
        printf("write failed\n");
        return 3;
    }
    if (o.post >= 0 && send_body(l, o.post, print) != 0)
        return 3;
    static char buf[1 << 16];
    size_t have = 0;
    char *end = NULL;
    while (!end) {
        if (have == sizeof(buf) - 1)
            return 4;
        ssize_t r = io_read(l, buf + have, sizeof(buf) - 1 - have);
        if (r <= 0) {
            if (print && have)
                printf("%.*s", (int)have, buf);
            printf("\nresponse: %s\n", have ? "short head" : "none");
            return 4;
        }
        have += (size_t)r;
        buf[have] = '\0';
        end = strstr(buf, "\r\n\r\n");
    }
    size_t head = (size_t)(end + 4 - buf);
    long long cl = -1;
    for (char *p = buf; p < end;) {
        char *eol = strstr(p, "\r\n");
        if (strncasecmp(p, "content-length:", 15) == 0)
            cl = strtoll(p + 15, NULL, 10);
        p = eol + 2;
    }
    if (print)
        fwrite(buf, 1, have, stdout);
    long long got = (long long)(have - head);
    while (cl < 0 || got < cl) {
        ssize_t r = io_read(l, buf, sizeof(buf));
        if (r <= 0)
            break;
        if (print)
            fwrite(buf, 1, (size_t)r, stdout);
        got += r;
    }
    if (print)
        fflush(stdout);
    *body_bytes = got;
    if (cl >= 0 && got < cl) {
        printf("\nresponse: short body\n");
        return 4;
    }
    return 0;
}

/* Exactly n bytes, or -1. */
static int read_full(link_t *l, unsigned char *b, size_t n)
{
    while (n) {
        ssize_t r = io_read(l, b, n);
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

/* --ws: the handshake on l; 0 after a 101 and an echoed frame, 1 after another status (its
 * response read whole: HTTP goes on), 4 on a short or malformed answer. */
static int websocket(link_t *l, const char *host)
{
    unsigned char nonce[16];
    char key[32], req[1024], head[4096];
    RAND_bytes(nonce, sizeof(nonce));
    EVP_EncodeBlock((unsigned char *)key, nonce, sizeof(nonce));
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                     "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n",
                     o.path, host, key);
    if (io_write(l, req, (size_t)n) < 0)
        return 3;
    /* The head byte by byte: what follows it is the other protocol's, or the body. */
    size_t have = 0;
    while (have < sizeof(head) - 1 && (have < 4 || memcmp(head + have - 4, "\r\n\r\n", 4) != 0)) {
        if (io_read(l, head + have, 1) != 1)
            break;
        have++;
    }
    head[have] = '\0';
    printf("ws: %.*s\n", (int)strcspn(head, "\r\n"), head);
    if (have < 4 || memcmp(head + have - 4, "\r\n\r\n", 4) != 0)
        return 4;
    if (strncmp(head, "HTTP/1.1 101", 12) != 0) {
        /* HTTP goes on: the body by its Content-Length. */
        long long cl = 0;
        for (char *p = head; (p = strstr(p, "\r\n")) != NULL; p += 2)
            if (strncasecmp(p + 2, "content-length:", 15) == 0)
                cl = strtoll(p + 17, NULL, 10);
        char body[4096];
        if (cl < 0 || cl >= (long long)sizeof(body) ||
            read_full(l, (unsigned char *)body, (size_t)cl))
            return 4;
        printf("%.*s", (int)cl, body);
        return 1;
    }
    size_t ml = strlen(o.ws);
    unsigned char frame[256 + 8], mask[4];
    if (ml > 125)
        return 64;
    RAND_bytes(mask, sizeof(mask));
    frame[0] = 0x81; /* FIN, text */
    frame[1] = (unsigned char)(0x80 | ml);
    memcpy(frame + 2, mask, 4);
    for (size_t i = 0; i < ml; i++)
        frame[6 + i] = (unsigned char)o.ws[i] ^ mask[i % 4];
    if (io_write(l, frame, 6 + ml) < 0)
        return 3;
    unsigned char h[2], text[256];
    if (read_full(l, h, 2) || (h[1] & 0x7f) > 125 || read_full(l, text, h[1] & 0x7f))
        return 4;
    printf("ws: got %.*s\n", (int)(h[1] & 0x7f), (const char *)text);
    static const unsigned char close_frame[] = {0x88, 0x80, 0, 0, 0, 0};
    (void)io_write(l, close_frame, sizeof(close_frame));
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int bench(void)
{
    double *t = calloc((size_t)o.bench, sizeof(double));
    link_t l;
    int rc = 0;
    long long bytes = 0, b = 0;
    const char *host = o.hosts ? o.hosts : o.sni;
    double t0 = now_us();
    if (!o.new_conn && (rc = open_link(&l, 1)) != 0) {
        free(t);
        return rc;
    }
    for (int i = 0; i < o.bench; i++) {
        double s = now_us();
        if (o.new_conn && (rc = open_link(&l, 1)) != 0) {
            free(t);
            return rc;
        }
        rc = request(&l, host, o.new_conn || i == o.bench - 1, 0, &b);
        if (o.new_conn)
            close_link(&l);
        if (rc) {
            free(t);
            return rc;
        }
        t[i] = now_us() - s;
        bytes += o.post >= 0 ? o.post : b; /* what went the way that matters */
    }
    if (!o.new_conn)
        close_link(&l);
    double secs = (now_us() - t0) / 1e6;
    qsort(t, (size_t)o.bench, sizeof(double), cmp_d);
    printf("bench: n=%d p50_us=%.0f p90_us=%.0f p99_us=%.0f max_us=%.0f bytes=%lld secs=%.3f "
           "MBps=%.1f\n",
           o.bench, t[o.bench / 2], t[(o.bench * 9) / 10], t[(o.bench * 99) / 100], t[o.bench - 1],
           bytes, secs, (double)bytes / secs / 1e6);
    free(t);
    return 0;
}

/* A decimal number in 0..INT_MAX, or -1. */
static int num(const char *s)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    return end && *end == '\0' && end != s && v >= 0 && v <= 0x7fffffff ? (int)v : -1;
}

int main(int argc, char **argv)
{
    int i = 1;
    for (; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--tls") == 0) {
            o.tls = 1;
        } else if (strcmp(a, "--new-conn") == 0) {
            o.new_conn = 1;
        } else if (!v) {
            fprintf(stderr, "%s needs a value\n", a);
            return 64;
        } else if (strcmp(a, "--sni") == 0) {
            o.sni = v, o.tls = 1, i++;
        } else if (strcmp(a, "--connect") == 0) {
            o.connect_to = v, i++;
        } else if (strcmp(a, "--host") == 0) {
            o.hosts = v, i++;
        } else if (strcmp(a, "--ca") == 0) {
            o.ca = v, i++;
        } else if (strcmp(a, "--alpn") == 0) {
            o.alpn = v, i++;
        } else if (strcmp(a, "--path") == 0) {
            o.path = v, i++;
        } else if (strcmp(a, "--header") == 0) {
            o.header = v, i++;
        } else if (strcmp(a, "--next-path") == 0) {
            o.next_path = v, i++;
        } else if (strcmp(a, "--bench") == 0) {
            o.bench = num(v), i++;
        } else if (strcmp(a, "--post") == 0) {
            o.post = num(v), i++;
            if (o.post < 0) {
                fprintf(stderr, "bad number\n");
                return 64;
            }
        } else if (strcmp(a, "--chunk") == 0) {
            o.chunk = num(v), i++;
        } else if (strcmp(a, "--ws") == 0) {
            o.ws = v, i++;
        } else if (strcmp(a, "--pause-ms") == 0) {
            o.pause_ms = num(v), i++;
        } else if (strcmp(a, "--timeout-ms") == 0) {
            o.timeout_ms = num(v), i++;
        } else {
            fprintf(stderr, "unknown option %s\n", a);
            return 64;
        }
    }
    if (argc - i != 2 || (!o.hosts && !o.sni)) {
        fprintf(stderr, "usage: egress-probe [--sni NAME|--tls] [--host H[,H]] [--ca FILE] "
                        "[--alpn P] [--path P] [--bench N [--new-conn]] ADDRESS PORT\n");
        return 64;
    }
    o.addr = argv[i];
    o.port = num(argv[i + 1]);
    if (o.port <= 0 || o.port > 65535 || o.bench < 0 || o.timeout_ms <= 0 || o.pause_ms < 0) {
        fprintf(stderr, "bad number\n");
        return 64;
    }
    if (o.tls) {
        ctx = SSL_CTX_new(TLS_client_method());
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        if ((o.ca ? SSL_CTX_load_verify_locations(ctx, o.ca, NULL)
                  : SSL_CTX_set_default_verify_paths(ctx)) != 1) {
            printf("cannot load trust anchors\n");
            return 3;
        }
        /* ALPN wire format from a comma-separated list. */
        unsigned char wire[256];
        size_t w = 0;
        for (const char *p = o.alpn; *p && w < sizeof(wire) - 1;) {
            size_t k = strcspn(p, ",");
            if (k == 0 || k > 64 || w + 1 + k > sizeof(wire))
                break;
            wire[w++] = (unsigned char)k;
            memcpy(wire + w, p, k);
            w += k;
            p += k + (p[k] == ',');
        }
        SSL_CTX_set_alpn_protos(ctx, wire, (unsigned)w);
    }
    if (o.bench > 0)
        return bench();
    link_t l;
    int rc = open_link(&l, 0);
    if (rc)
        return rc;
    char hosts[1024];
    snprintf(hosts, sizeof(hosts), "%s", o.hosts ? o.hosts : o.sni);
    char *save = NULL;
    long long b = 0;
    char *h = strtok_r(hosts, ",", &save);
    if (o.ws && h) {
        rc = websocket(&l, h);
        fflush(stdout);
        if (rc != 1) {
            close_link(&l);
            return rc;
        }
        rc = 0;
        h = strtok_r(NULL, ",", &save);
    }
    for (; h; h = strtok_r(NULL, ",", &save)) {
        const char *next = save && *save ? save : NULL;
        rc = request(&l, h, next == NULL, 1, &b);
        if (rc)
            break;
        if (next && o.pause_ms > 0) {
            fflush(stdout);
            usleep((useconds_t)o.pause_ms * 1000);
        }
    }
    close_link(&l);
    return rc;
}
