/* The metrics listener (metrics.h): one thread, one poll loop, a handful of connections, one
 * request each. Every client is hostile: the head is bounded (SP_METRICS_HEAD_MAX), so is the
 * time to send it and to read the answer (SP_METRICS_TIMEOUT_MS), and so is the number of
 * connections (a new one closes the oldest), so a client that connects and sends nothing
 * delays nobody. The daemon's own loop never waits for it: the scrape runs on this thread. */
#include "metrics.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "xmalloc.h"

typedef struct {
    int fd; /* -1: free slot */
    int64_t deadline_ms;
    uint64_t seq; /* accept order: the smallest is the oldest */
    bool writing;
    char head[SP_METRICS_HEAD_MAX];
    size_t head_len;
    sp_buf_t out;
    size_t out_off;
} conn_t;

struct sp_metrics_server {
    sp_metrics_t *reg;
    int listen_fd, wake[2], port;
    uint64_t accepted;
    char *port_file; /* the file we wrote, removed at the end */
    pthread_t thread;
    conn_t conns[SP_METRICS_CONNS_MAX];
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void conn_close(conn_t *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->writing = false;
    c->head_len = 0;
    c->out_off = 0;
    /* Not kept: a scrape's text is the largest thing here. */
    sp_buf_dispose(&c->out);
    sp_buf_init(&c->out);
}

static void respond(sp_metrics_server_t *s, conn_t *c, int status, const char *reason,
                    const char *extra)
{
    sp_buf_t body;
    sp_buf_init(&body);
    if (status == 200)
        sp_metrics_scrape(s->reg, &body);
    else
        sp_buf_printf(&body, "%d %s\n", status, reason);
    sp_buf_printf(&c->out,
                  "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: "
                  "close\r\n\r\n",
                  status, reason,
                  status == 200 ? "text/plain; version=0.0.4; charset=utf-8"
                                : "text/plain; charset=utf-8",
                  body.len, extra ? extra : "");
    sp_buf_append(&c->out, body.data, body.len);
    sp_buf_dispose(&body);
    c->writing = true;
    c->out_off = 0;
    c->deadline_ms = now_ms() + SP_METRICS_TIMEOUT_MS;
}

/* The request line of a complete head: "GET /metrics HTTP/1.1" (RFC 9112 section 3), a query
 * allowed. Headers are not looked at: nothing in them changes the answer. */
static void handle_head(sp_metrics_server_t *s, conn_t *c)
{
    char *line = c->head, *eol = strstr(line, "\r\n");
    *eol = '\0';
    char *sp1 = strchr(line, ' '), *sp2 = sp1 ? strchr(sp1 + 1, ' ') : NULL;
    if (!sp1 || !sp2 || sp1 == line || sp2 == sp1 + 1 || strchr(sp2 + 1, ' ') ||
        (strcmp(sp2 + 1, "HTTP/1.1") != 0 && strcmp(sp2 + 1, "HTTP/1.0") != 0)) {
        respond(s, c, 400, "Bad Request", NULL);
        return;
    }
    *sp1 = *sp2 = '\0';
    const char *target = sp1 + 1;
    size_t plen = strcspn(target, "?");
    if (plen != 8 || memcmp(target, "/metrics", 8) != 0)
        respond(s, c, 404, "Not Found", NULL);
    else if (strcmp(line, "GET") != 0)
        respond(s, c, 405, "Method Not Allowed", "Allow: GET\r\n");
    else
        respond(s, c, 200, "OK", NULL);
}

static void on_readable(sp_metrics_server_t *s, conn_t *c)
{
    ssize_t n = recv(c->fd, c->head + c->head_len, sizeof(c->head) - 1 - c->head_len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        conn_close(c);
        return;
    }
    c->head_len += (size_t)n;
    c->head[c->head_len] = '\0';
    if (memchr(c->head, '\0', c->head_len)) {
        respond(s, c, 400, "Bad Request", NULL);
        return;
    }
    if (strstr(c->head, "\r\n\r\n"))
        handle_head(s, c);
    else if (c->head_len == sizeof(c->head) - 1)
        respond(s, c, 431, "Request Header Fields Too Large", NULL);
}

static void on_writable(conn_t *c)
{
    ssize_t n = send(c->fd, c->out.data + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        conn_close(c);
        return;
    }
    c->out_off += (size_t)n;
    if (c->out_off == c->out.len) {
        /* Everything sent: half-close, so the client sees the end before we close. */
        shutdown(c->fd, SHUT_WR);
        conn_close(c);
    }
}

static void on_accept(sp_metrics_server_t *s)
{
    int fd = accept4(s->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return;
    conn_t *slot = NULL, *oldest = NULL;
    for (size_t i = 0; i < SP_METRICS_CONNS_MAX; i++) {
        conn_t *c = &s->conns[i];
        if (c->fd < 0) {
            slot = c;
            break;
        }
        if (!oldest || c->seq < oldest->seq)
            oldest = c;
    }
    if (!slot) {
        conn_close(oldest);
        slot = oldest;
    }
    slot->fd = fd;
    slot->seq = ++s->accepted;
    slot->deadline_ms = now_ms() + SP_METRICS_TIMEOUT_MS;
}

static void *serve_main(void *arg)
{
    sp_metrics_server_t *s = arg;
    for (;;) {
        struct pollfd p[2 + SP_METRICS_CONNS_MAX];
        conn_t *who[2 + SP_METRICS_CONNS_MAX];
        nfds_t n = 0;
        int64_t now = now_ms(), wait = SP_METRICS_TIMEOUT_MS;
        p[n++] = (struct pollfd){.fd = s->wake[0], .events = POLLIN};
        p[n++] = (struct pollfd){.fd = s->listen_fd, .events = POLLIN};
        for (size_t i = 0; i < SP_METRICS_CONNS_MAX; i++) {
            conn_t *c = &s->conns[i];
            if (c->fd < 0)
                continue;
            if (now >= c->deadline_ms) {
                conn_close(c);
                continue;
            }
            if (c->deadline_ms - now < wait)
                wait = c->deadline_ms - now;
            who[n] = c;
            p[n++] = (struct pollfd){.fd = c->fd, .events = c->writing ? POLLOUT : POLLIN};
        }
        if (poll(p, n, (int)wait) < 0 && errno != EINTR)
            break;
        if (p[0].revents)
            break;
        for (nfds_t i = 2; i < n; i++) {
            if (!p[i].revents)
                continue;
            if (who[i]->writing)
                on_writable(who[i]);
            else
                on_readable(s, who[i]);
        }
        if (p[1].revents & POLLIN)
            on_accept(s);
    }
    return NULL;
}

/* "host:port" or "[v6]:port", numeric host only (no resolver in a daemon's start). */
static int parse_addr(const char *addr, struct sockaddr_storage *ss, socklen_t *len)
{
    char host[64];
    const char *colon = strrchr(addr, ':'), *h = addr;
    size_t hlen;
    if (!colon)
        return -EINVAL;
    hlen = (size_t)(colon - addr);
    if (hlen >= 2 && addr[0] == '[' && addr[hlen - 1] == ']') {
        h = addr + 1;
        hlen -= 2;
    }
    if (hlen == 0 || hlen >= sizeof(host))
        return -EINVAL;
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    const char *ps = colon + 1;
    long port = 0;
    if (!*ps || strlen(ps) > 5)
        return -EINVAL;
    for (const char *q = ps; *q; q++) {
        if (*q < '0' || *q > '9')
            return -EINVAL;
        port = port * 10 + (*q - '0');
    }
    if (port > 65535)
        return -EINVAL;
    memset(ss, 0, sizeof(*ss));
    struct sockaddr_in *in4 = (struct sockaddr_in *)ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)ss;
    if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons((uint16_t)port);
        *len = sizeof(*in4);
    } else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons((uint16_t)port);
        *len = sizeof(*in6);
    } else {
        return -EINVAL;
    }
    return 0;
}

static int write_port_file(const char *path, int port)
{
    char *tmp = sp_xasprintf("%s.tmp", path);
    char text[16];
    int n = snprintf(text, sizeof(text), "%d\n", port), rc = 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = -errno;
        goto out;
    }
    if (write(fd, text, (size_t)n) != n) {
        rc = errno ? -errno : -EIO;
        close(fd);
        unlink(tmp);
        goto out;
    }
    close(fd);
    /* Readers never see a partial file. */
    if (rename(tmp, path) < 0) {
        rc = -errno;
        unlink(tmp);
    }
out:
    free(tmp);
    return rc;
}

int sp_metrics_serve(sp_metrics_t *r, const char *program, const char *addr, const char *port_file,
                     sp_metrics_server_t **ret, char err[SP_METRICS_ERR_MAX])
{
    struct sockaddr_storage ss;
    socklen_t len = 0;
    int rc;
    *ret = NULL;
    if (!addr || !*addr || strcmp(addr, "off") == 0)
        return 0;
    if ((rc = parse_addr(addr, &ss, &len)) < 0) {
        snprintf(err, SP_METRICS_ERR_MAX,
                 "metrics-addr '%.64s' is not host:port with a numeric host", addr);
        return rc;
    }
    sp_metrics_server_t *s = sp_xcalloc(1, sizeof(*s));
    s->reg = r;
    s->wake[0] = s->wake[1] = -1;
    for (size_t i = 0; i < SP_METRICS_CONNS_MAX; i++) {
        s->conns[i].fd = -1;
        sp_buf_init(&s->conns[i].out);
    }
    s->listen_fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    if (s->listen_fd < 0 ||
        setsockopt(s->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
        bind(s->listen_fd, (struct sockaddr *)&ss, len) < 0 || listen(s->listen_fd, 16) < 0) {
        rc = -errno;
        snprintf(err, SP_METRICS_ERR_MAX, "metrics-addr %.64s: %s", addr, strerror(errno));
        goto fail;
    }
    if (getsockname(s->listen_fd, (struct sockaddr *)&ss, &len) < 0) {
        rc = -errno;
        snprintf(err, SP_METRICS_ERR_MAX, "metrics listener: %s", strerror(errno));
        goto fail;
    }
    s->port = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
                                            : ((struct sockaddr_in6 *)&ss)->sin6_port);
    if (pipe2(s->wake, O_CLOEXEC | O_NONBLOCK) < 0) {
        rc = -errno;
        snprintf(err, SP_METRICS_ERR_MAX, "metrics listener: %s", strerror(errno));
        goto fail;
    }
    const char *home = getenv("SPACE_HOME");
    if (port_file && *port_file)
        s->port_file = sp_xstrdup(port_file);
    else if (home && *home && program && *program)
        s->port_file = sp_xasprintf("%s/run/%s" SP_METRICS_PORT_SUFFIX, home, program);
    if (s->port_file && (rc = write_port_file(s->port_file, s->port)) < 0) {
        snprintf(err, SP_METRICS_ERR_MAX, "metrics port file %.128s: %s", s->port_file,
                 strerror(-rc));
        free(s->port_file);
        s->port_file = NULL;
        goto fail;
    }
    if ((rc = -pthread_create(&s->thread, NULL, serve_main, s)) < 0) {
        snprintf(err, SP_METRICS_ERR_MAX, "metrics listener thread: %s", strerror(-rc));
        goto fail;
    }
    *ret = s;
    return 0;
fail:
    if (s->port_file)
        unlink(s->port_file);
    free(s->port_file);
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->wake[0] >= 0) {
        close(s->wake[0]);
        close(s->wake[1]);
    }
    for (size_t i = 0; i < SP_METRICS_CONNS_MAX; i++)
        sp_buf_dispose(&s->conns[i].out);
    free(s);
    return rc;
}

int sp_metrics_server_port(const sp_metrics_server_t *s)
{
    return s ? s->port : 0;
}

void sp_metrics_server_free(sp_metrics_server_t *s)
{
    if (!s)
        return;
    char b = 1;
    while (write(s->wake[1], &b, 1) < 0 && errno == EINTR)
        ;
    pthread_join(s->thread, NULL);
    for (size_t i = 0; i < SP_METRICS_CONNS_MAX; i++) {
        conn_close(&s->conns[i]);
        sp_buf_dispose(&s->conns[i].out);
    }
    close(s->listen_fd);
    close(s->wake[0]);
    close(s->wake[1]);
    if (s->port_file)
        unlink(s->port_file);
    free(s->port_file);
    free(s);
}
