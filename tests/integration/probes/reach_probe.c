/* reach-probe PID: what a process may do to another one, printed one line per attempt as
 * "<what>: ok" or "<what>: <errno name>"; PID 0: to a child of its own (which the probe can
 * reach: the control). Static, for sandboxes without tools (the tiny template):
 * integration.snapshots copies it into a sandbox and checks that root there cannot reach into
 * the agent (PID 1), which keeps CAP_SYS_ADMIN (proto/agent.proto, Claim). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static void report(const char *what, int rc)
{
    printf("%s: %s\n", what, rc < 0 ? strerrorname_np(errno) : "ok");
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: reach-probe PID\n");
        return 2;
    }
    pid_t pid = (pid_t)strtol(argv[1], NULL, 10), child = 0;
    if (pid == 0) {
        if ((child = fork()) < 0)
            return 1;
        if (child == 0) {
            pause();
            _exit(0);
        }
        pid = child;
    }
    long rc = ptrace(PTRACE_ATTACH, pid, NULL, NULL);
    report("ptrace_attach", (int)rc);
    if (rc == 0) {
        (void)waitpid(pid, NULL, __WALL);
        (void)ptrace(PTRACE_DETACH, pid, NULL, NULL);
    }
    rc = ptrace(PTRACE_SEIZE, pid, NULL, NULL);
    report("ptrace_seize", (int)rc);
    if (rc == 0)
        (void)ptrace(PTRACE_DETACH, pid, NULL, NULL);

    /* Memory: at an address of its own mappings when they can be read, else at a guess. */
    unsigned long addr = 0x400000;
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    FILE *f = fopen(path, "r");
    report("open_maps", f ? 0 : -1);
    if (f) {
        if (fgets(line, sizeof(line), f))
            addr = strtoul(line, NULL, 16);
        fclose(f);
    }
    char buf[16];
    struct iovec local = {buf, sizeof(buf)}, remote = {(void *)addr, sizeof(buf)};
    report("process_vm_readv", (int)process_vm_readv(pid, &local, 1, &remote, 1, 0));
    report("process_vm_writev", (int)process_vm_writev(pid, &local, 1, &remote, 1, 0));
    snprintf(path, sizeof(path), "/proc/%d/mem", (int)pid);
    int fd = open(path, O_RDWR);
    report("open_mem", fd);
    if (fd >= 0)
        close(fd);
    if (child > 0) {
        kill(child, SIGKILL);
        (void)waitpid(child, NULL, __WALL);
    }
    return 0;
}
