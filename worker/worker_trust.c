/* The deployment CA in every sandbox (docs/egress.md, "Trust"). space-egressd terminates a
 * sandbox's TLS with leaves minted from the CA that `space up` made; the guest's clients must
 * trust that CA. At create, before runsc sees the rootfs (files copied in later are not seen
 * by the running sandbox, runtime-notes.md), the worker writes into the sandbox's own snapshot:
 *
 *   /etc/ssl/certs/space-deployment-ca.pem     the CA certificate alone
 *   /etc/ssl/certs/ca-certificates.crt         the system bundle (Debian's path), the CA
 *                                              appended (created when the template has none)
 *   /usr/local/share/ca-certificates/space-deployment-ca.crt
 *                                              when that directory exists, so a later
 *                                              update-ca-certificates keeps it
 *   /usr/lib/ssl/{cert.pem,certs}              links to the above when the template has no
 *                                              OpenSSL directory (tiny), so OpenSSL's default
 *                                              paths find the bundle
 *   /etc/profile.d/space-ca.sh                 SSL_CERT_FILE, REQUESTS_CA_BUNDLE,
 *                                              NODE_EXTRA_CA_CERTS for login shells
 *
 * and the OCI process environment carries the same three variables (worker_runsc.c). Only the
 * certificate: what the worker loads is refused if it holds anything but certificates, so a
 * misconfigured path can never carry the CA key into a guest. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "worker_runtime_int.h"
#include "xmalloc.h"

#define CA_PEM_MAX (64 * 1024)

const char *const wk__trust_env[WK_TRUST_ENV_N] = {
    "SSL_CERT_FILE=" WK_TRUST_BUNDLE,
    "REQUESTS_CA_BUNDLE=" WK_TRUST_BUNDLE,
    "NODE_EXTRA_CA_CERTS=" WK_TRUST_CA,
};

int wk__trust_load(const char *path, char **ret_pem, char err[WK_ERR_MAX])
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return wk__fail(err, -errno, "open %s: %s", path, strerror(errno));
    char *pem = sp_xmalloc(CA_PEM_MAX + 1);
    size_t len = 0;
    int rc = 0;
    for (;;) {
        ssize_t n = read(fd, pem + len, CA_PEM_MAX + 1 - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = wk__fail(err, -errno, "read %s: %s", path, strerror(errno));
            break;
        }
        if (n == 0)
            break;
        len += (size_t)n;
        if (len > CA_PEM_MAX) {
            rc = wk__fail(err, -EFBIG, "%s is over %d bytes", path, CA_PEM_MAX);
            break;
        }
    }
    close(fd);
    if (rc == 0) {
        pem[len] = '\0';
        /* Certificates only: a key, or anything else PEM, never goes into a guest. */
        int certs = 0;
        for (const char *p = pem; (p = strstr(p, "-----BEGIN ")); p += 11) {
            if (strncmp(p, "-----BEGIN CERTIFICATE-----", 27) != 0) {
                rc = wk__fail(err, -EINVAL, "%s holds something other than certificates", path);
                break;
            }
            certs++;
        }
        if (rc == 0 && (certs == 0 || strlen(pem) != len))
            rc = wk__fail(err, -EINVAL, "%s is not a PEM certificate", path);
    }
    if (rc < 0) {
        free(pem);
        return rc;
    }
    *ret_pem = pem;
    return 0;
}

/* mkdir -p of rel (relative, no "..") under the directory fd root. */
static int mkdirs_at(int root, const char *rel)
{
    char p[256];
    snprintf(p, sizeof(p), "%s", rel);
    for (char *s = p;; s++) {
        if (*s == '/' || *s == '\0') {
            char c = *s;
            *s = '\0';
            if (mkdirat(root, p, 0755) < 0 && errno != EEXIST)
                return -errno;
            *s = c;
            if (!c)
                return 0;
        }
    }
}

/* Writes text to rel under root (O_NOFOLLOW on the last component); append or replace. */
static int put_at(int root, const char *rel, const char *text, bool append, mode_t mode)
{
    int fd = openat(
        root, rel,
        /* read access too when appending: the last byte is looked at */
        (append ? O_RDWR | O_APPEND : O_WRONLY | O_TRUNC) | O_CREAT | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd < 0)
        return -errno;
    size_t len = strlen(text), off = 0;
    int rc = 0;
    if (append) {
        /* A bundle that does not end with a newline would glue two PEM blocks together. */
        struct stat st;
        char last = '\n';
        if (fstat(fd, &st) == 0 && st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) == 1 &&
            last != '\n' && write(fd, "\n", 1) != 1)
            rc = -errno;
    }
    while (rc == 0 && off < len) {
        ssize_t n = write(fd, text + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            rc = -errno;
        else
            off += (size_t)n;
    }
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

int wk__trust_install(const wk_host_t *h, const char *rootfs, char err[WK_ERR_MAX])
{
    if (!h->ca_pem)
        return 0;
    int root = open(rootfs, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0)
        return wk__fail(err, -errno, "open %s: %s", rootfs, strerror(errno));
    int rc;
    const char *step = "etc/ssl/certs";
    struct stat st;
    if ((rc = mkdirs_at(root, "etc/ssl/certs")) < 0)
        goto out;
    step = WK_TRUST_CA;
    if ((rc = put_at(root, &WK_TRUST_CA[1], h->ca_pem, false, 0644)) < 0)
        goto out;
    step = WK_TRUST_BUNDLE;
    if ((rc = put_at(root, &WK_TRUST_BUNDLE[1], h->ca_pem, true, 0644)) < 0)
        goto out;
    if (fstatat(root, "usr/local/share/ca-certificates", &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode)) {
        step = "usr/local/share/ca-certificates";
        if ((rc = put_at(root, "usr/local/share/ca-certificates/space-deployment-ca.crt", h->ca_pem,
                         false, 0644)) < 0)
            goto out;
    }
    if (fstatat(root, "usr/lib/ssl", &st, AT_SYMLINK_NOFOLLOW) < 0 && errno == ENOENT) {
        step = "usr/lib/ssl";
        if ((rc = mkdirs_at(root, "usr/lib/ssl")) < 0 ||
            (symlinkat(WK_TRUST_BUNDLE, root, "usr/lib/ssl/cert.pem") < 0 && errno != EEXIST) ||
            (symlinkat("/etc/ssl/certs", root, "usr/lib/ssl/certs") < 0 && errno != EEXIST)) {
            rc = rc < 0 ? rc : -errno;
            goto out;
        }
    }
    step = "etc/profile.d/space-ca.sh";
    char script[512];
    snprintf(script, sizeof(script),
             "# SPACE: trust the deployment CA egress TLS is terminated with (docs/egress.md)\n"
             "export %s\nexport %s\nexport %s\n",
             wk__trust_env[0], wk__trust_env[1], wk__trust_env[2]);
    if ((rc = mkdirs_at(root, "etc/profile.d")) < 0 ||
        (rc = put_at(root, "etc/profile.d/space-ca.sh", script, false, 0644)) < 0)
        goto out;
    rc = 0;
out:
    close(root);
    return rc < 0 ? wk__fail(err, rc, "install the deployment CA (%s): %s", step, strerror(-rc))
                  : 0;
}
