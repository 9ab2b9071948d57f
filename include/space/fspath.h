/* Paths inside a sandbox, as the files API names them (gateway, worker, event validation).
 *
 * A canonical path is absolute, at most SP_FSPATH_MAX bytes, valid UTF-8 text without control
 * characters (it goes into events and JSON), with no empty, "." or ".." component and no
 * trailing slash ("/" itself aside). Resolution is lexical: ".." drops the previous component
 * and stops at "/", as the guest's own kernel does for "/.." (symlinks are the guest's
 * business: the sandbox is its filesystem, nothing on the host is reachable through it). */
#ifndef SPACE_FSPATH_H
#define SPACE_FSPATH_H

#include <stdbool.h>
#include <stddef.h>

#define SP_FSPATH_MAX 4096

/* Writes the canonical form of path into out (SP_FSPATH_MAX + 1 bytes): an absolute path as
 * it is, a relative one under home (itself absolute). -EINVAL for an empty path or one that is
 * not text, -ENAMETOOLONG when the input or the result exceeds SP_FSPATH_MAX. */
int sp_fspath_resolve(const char *path, const char *home, char out[SP_FSPATH_MAX + 1]);
/* Whether s is canonical (see above). */
bool sp_fspath_canonical(const char *s);
/* Whether canonical path is dir (canonical too) or under it. */
bool sp_fspath_within(const char *path, const char *dir);
/* The home directory the files API resolves relative paths against: "/root" for "root" (or
 * ""), "/home/user" for "user"; NULL for any other user. */
const char *sp_fspath_home(const char *user);

#endif
