/* Whole reads and writes on file descriptors, through EINTR and short counts. */
#ifndef SPACE_FDIO_H
#define SPACE_FDIO_H

#include <stddef.h>
#include <sys/types.h>

/* All len bytes of buf to fd: 0, or -errno (-EIO when the fd takes nothing). */
int sp_write_all(int fd, const void *buf, size_t len);
/* Up to len bytes from fd into buf, fewer only at the end of the input: the count, or -errno. */
ssize_t sp_read_full(int fd, void *buf, size_t len);

#endif
