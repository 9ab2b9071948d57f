/* Preloaded into the "base" template through /etc/ld.so.preload.
 *
 * The runsc in use (Debian 2022-12) rejects the flag AT_NO_AUTOMOUNT (0x800) with EINVAL in
 * both statx and newfstatat, and GNU coreutils (ls, stat, cp -a, find, du) pass it, so they
 * fail with "Invalid argument" (runtime-notes.md). These wrappers clear the flag and make the
 * system call themselves. Static binaries do not load the preload and are not helped.
 *
 * <sys/stat.h> is deliberately not included: its prototypes for statx/fstatat clash with
 * these definitions; the structures are only passed through.
 */
#define _GNU_SOURCE
#include <sys/syscall.h>
#include <unistd.h>

#define SHIM_AT_NO_AUTOMOUNT 0x800

struct stat;
struct statx;

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf);
int fstatat(int dirfd, const char *path, struct stat *buf, int flags);
int fstatat64(int dirfd, const char *path, struct stat *buf, int flags);

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf)
{
    return (int)syscall(SYS_statx, dirfd, path, flags & ~SHIM_AT_NO_AUTOMOUNT, mask, buf);
}

int fstatat(int dirfd, const char *path, struct stat *buf, int flags)
{
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~SHIM_AT_NO_AUTOMOUNT);
}

int fstatat64(int dirfd, const char *path, struct stat *buf, int flags)
{
    return (int)syscall(SYS_newfstatat, dirfd, path, buf, flags & ~SHIM_AT_NO_AUTOMOUNT);
}
