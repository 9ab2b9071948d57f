/* A resolver for sandboxes whose template names none (docs/egress.md, "DNS"). The firewall
 * sends every DNS query of a guest, whatever address it is for, to space-egressd's resolver
 * (worker_nft.c), so a template's own nameserver lines work as they are and are left alone.
 * A template without any (tiny has no /etc/resolv.conf, base an empty one, an image may have a
 * link to systemd-resolved's stub under /run) leaves glibc, musl and busybox on 127.0.0.1,
 * which is inside gVisor's netstack and never reaches the veth. At create, after the snapshot
 * and before runsc sees the rootfs, the worker then writes "nameserver <gateway>" there.
 *
 * Never at restore: gVisor restores against the rootfs as it was at the checkpoint
 * (docs/machine-notes.md), and a gateway that changed with the resume is covered by the
 * firewall, which redirects the query for the old address too.
 *
 * The rootfs is a template's, built by anyone: /etc and /etc/resolv.conf are opened relative
 * to the rootfs directory with O_NOFOLLOW, a link is replaced by a regular file (rename over
 * the link itself), and nothing is ever followed out of the rootfs. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fdio.h"
#include "worker_runtime_int.h"
#include "xmalloc.h"

/* A resolv.conf larger than this is not one a resolver reads (glibc stops at 3 nameservers,
 * musl reads lines of 256 bytes): left alone. */
#define RESOLV_MAX (64 * 1024)
#define RESOLV_TMP ".resolv.conf.space"

bool wk__resolv_has_nameserver(const char *text, size_t len)
{
    /* glibc (res_init.c) and musl (resolvconf.c) take "nameserver" at the very start of a
     * line, followed by a blank, then an address; busybox's nslookup reads it the same way. */
    static const char kw[] = "nameserver";
    const size_t kwlen = sizeof(kw) - 1;
    for (size_t at = 0; at < len;) {
        const char *line = text + at;
        const char *nl = memchr(line, '\n', len - at);
        size_t n = nl ? (size_t)(nl - line) : len - at;
        if (n > kwlen && memcmp(line, kw, kwlen) == 0 &&
            (line[kwlen] == ' ' || line[kwlen] == '\t')) {
            for (size_t i = kwlen; i < n; i++) {
                if (line[i] != ' ' && line[i] != '\t' && line[i] != '\r')
                    return true;
            }
        }
        at += n + 1;
    }
    return false;
}

/* The whole of the regular file fd (at most RESOLV_MAX bytes) into a heap buffer. 1 when read,
 * 0 when it is no regular file or too large (left alone), < 0 on error. */
static int read_small(int fd, char **ret_text, size_t *ret_len)
{
    struct stat st;
    if (fstat(fd, &st) < 0)
        return -errno;
    if (!S_ISREG(st.st_mode) || st.st_size > RESOLV_MAX)
        return 0;
    char *text = sp_xmalloc(RESOLV_MAX + 1);
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, text + len, RESOLV_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            int rc = -errno;
            free(text);
            return rc;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > RESOLV_MAX) { /* grew since the fstat */
            free(text);
            return 0;
        }
    }
    *ret_text = text;
    *ret_len = len;
    return 1;
}

/* Writes head + keep as etc/resolv.conf: a new file beside it, then renamed over whatever is
 * there (a link is replaced, never followed). */
static int replace(int etc, const char *head, const char *keep, size_t keep_len)
{
    int fd = openat(etc, RESOLV_TMP, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST && unlinkat(etc, RESOLV_TMP, 0) == 0)
        fd = openat(etc, RESOLV_TMP, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    int rc = sp_write_all(fd, head, strlen(head));
    if (rc == 0)
        rc = sp_write_all(fd, keep, keep_len);
    if (rc == 0 && fchmod(fd, 0644) < 0) /* whatever the worker's umask */
        rc = -errno;
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && renameat(etc, RESOLV_TMP, etc, "resolv.conf") < 0)
        rc = -errno;
    if (rc < 0)
        (void)unlinkat(etc, RESOLV_TMP, 0);
    return rc;
}

int wk__resolv_install(const char *rootfs, uint32_t gateway_be, char err[WK_ERR_MAX])
{
    int root = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        return wk__fail(err, -errno, "open %s: %s", rootfs, strerror(errno));
    int etc = -1, fd = -1, rc = 0;
    char *old = NULL;
    size_t old_len = 0;
    const char *step = "etc";

    etc = openat(root, "etc", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (etc < 0 && errno == ENOENT && mkdirat(root, "etc", 0755) == 0)
        etc = openat(root, "etc", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (etc < 0) {
        /* /etc is a link or no directory: nothing of it is the rootfs's own to write. */
        if (errno == ELOOP || errno == ENOTDIR)
            goto out;
        rc = -errno;
        goto out;
    }
    step = "etc/resolv.conf";
    /* O_NONBLOCK: a FIFO in its place must not hang the create (it is left alone). */
    fd = openat(etc, "resolv.conf", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
        rc = read_small(fd, &old, &old_len);
        if (rc <= 0) /* an error, or no regular file we could rewrite sensibly */
            goto out;
        if (wk__resolv_has_nameserver(old, old_len)) {
            rc = 0; /* the template's own: the firewall makes it work */
            goto out;
        }
    } else if (errno != ENOENT && errno != ELOOP) {
        /* ELOOP: a link (O_NOFOLLOW), replaced below by a file of our own. */
        rc = -errno;
        goto out;
    }
    char gw[INET_ADDRSTRLEN], head[160];
    struct in_addr a = {.s_addr = gateway_be};
    inet_ntop(AF_INET, &a, gw, sizeof(gw));
    snprintf(head, sizeof(head),
             "# SPACE: the sandbox's gateway; every DNS query goes to egressd there "
             "(docs/egress.md)\nnameserver %s\n",
             gw);
    /* What else the template said (search, options) stays, after our line. */
    rc = replace(etc, head, old ? old : "", old_len);
    if (rc == 0)
        rc = 1;
out:
    if (fd >= 0)
        close(fd);
    if (etc >= 0)
        close(etc);
    close(root);
    free(old);
    if (rc < 0)
        return wk__fail(err, rc, "resolver configuration (%s): %s", step, strerror(-rc));
    return rc;
}
