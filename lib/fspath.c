/* Sandbox paths of the files API (fspath.h). */
#include "fspath.h"

#include <errno.h>
#include <string.h>

#include "text.h"

const char *sp_fspath_home(const char *user)
{
    if (!user || !user[0] || strcmp(user, "root") == 0)
        return "/root";
    if (strcmp(user, "user") == 0)
        return "/home/user";
    return NULL;
}

/* Appends the components of p to out (length *n), resolving "." and ".." lexically. */
static int append(char *out, size_t *n, const char *p)
{
    while (*p) {
        while (*p == '/')
            p++;
        if (!*p)
            break;
        const char *end = strchr(p, '/');
        size_t k = end ? (size_t)(end - p) : strlen(p);
        if (k == 1 && p[0] == '.') {
            /* nothing */
        } else if (k == 2 && p[0] == '.' && p[1] == '.') {
            while (*n > 0 && out[*n - 1] != '/')
                (*n)--;
            if (*n > 0)
                (*n)--; /* the slash before the dropped component */
        } else {
            if (*n + 1 + k > SP_FSPATH_MAX)
                return -ENAMETOOLONG;
            out[(*n)++] = '/';
            memcpy(out + *n, p, k);
            *n += k;
            out[*n] = '\0';
        }
        p += k;
    }
    return 0;
}

int sp_fspath_resolve(const char *path, const char *home, char out[SP_FSPATH_MAX + 1])
{
    size_t n = 0;
    int rc;

    if (!path || !path[0] || !home || home[0] != '/')
        return -EINVAL;
    if (strlen(path) > SP_FSPATH_MAX)
        return -ENAMETOOLONG;
    if (!sp_text_valid(path, SP_FSPATH_MAX, 0))
        return -EINVAL;
    if (path[0] != '/' && (rc = append(out, &n, home)) < 0)
        return rc;
    if ((rc = append(out, &n, path)) < 0)
        return rc;
    if (n == 0)
        out[n++] = '/';
    out[n] = '\0';
    return 0;
}

bool sp_fspath_canonical(const char *s)
{
    if (!s || s[0] != '/' || !sp_text_valid(s, SP_FSPATH_MAX, 0))
        return false;
    if (s[1] == '\0')
        return true;
    for (const char *p = s; *p;) {
        /* p is at a slash: a component follows. */
        const char *c = p + 1;
        const char *end = strchr(c, '/');
        size_t k = end ? (size_t)(end - c) : strlen(c);
        if (k == 0 || (k == 1 && c[0] == '.') || (k == 2 && c[0] == '.' && c[1] == '.'))
            return false;
        p = c + k;
    }
    return true;
}

bool sp_fspath_within(const char *path, const char *dir)
{
    size_t n = strlen(dir);
    if (strcmp(dir, "/") == 0)
        return path[0] == '/';
    return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}
