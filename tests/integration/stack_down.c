/* `space down --purge` releases exactly what `space up` made, whatever the caller's environment
 * (issue 13): the worker names its host resources after its id (SPACE_ID), and a `down` run
 * without it, or with another, used to tear down a worker of that other id and leave the real
 * one's nftables table and cgroup directories behind. The stack of this scenario is made by the
 * fixture with SPACE_ID=it-stack_down; the test purges it with SPACE_ID unset, makes it again
 * with `space up` and purges it with another SPACE_ID, and looks at the host each time as an
 * operator would (nft, /sys/fs/cgroup, /run/netns). Stack: eventlog, scheduler, worker,
 * gateway (one sandbox, for its cgroups and netns). */
#include <dirent.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "harness.h"
#include "hash.h"

static char home[PATH_MAX], tag[9];

static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int st = system(cmd); /* NOLINT(cert-env33-c): the test runs the CLI and nft as a user would */
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The worker's tag as it derives it (worker_runtime.c): SHA-256 of "<id>\n<state dir>". */
static void tag_of(const char *worker_id, char out[9])
{
    char key[PATH_MAX + 80], hex[SP_SHA256_HEX_LEN + 1];
    uint8_t d[SP_SHA256_LEN];
    int n = snprintf(key, sizeof(key), "%s\n%s/worker", worker_id, home);
    sp_sha256(key, (size_t)n, d);
    sp_hex_encode(d, SP_SHA256_LEN, hex);
    snprintf(out, 9, "%.8s", hex);
}

static bool table_exists(void)
{
    return sh("nft list table inet space_%s >/dev/null 2>&1", tag) == 0;
}

/* Directories named after the tag: cgroup parents space-<tag> under any controller, netns
 * sp-<tag>-*. */
static int held_dirs(void)
{
    int n = 0;
    char name[64];
    snprintf(name, sizeof(name), "space-%s", tag);
    DIR *d = opendir("/sys/fs/cgroup");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char p[PATH_MAX];
        snprintf(p, sizeof(p), "/sys/fs/cgroup/%s/%s", de->d_name, name);
        n += de->d_name[0] != '.' && access(p, F_OK) == 0;
    }
    if (d)
        closedir(d);
    snprintf(name, sizeof(name), "sp-%s-", tag);
    d = opendir("/run/netns");
    while (d && (de = readdir(d)))
        n += strncmp(de->d_name, name, strlen(name)) == 0;
    if (d)
        closedir(d);
    return n;
}

/* `space <args>` with the environment the test runs in, changed by env_prefix (env(1)
 * arguments: "-u SPACE_ID", "SPACE_ID=x"). */
static int space(const char *env_prefix, const char *args)
{
    return sh("env %s '%s/space' %s", env_prefix, sp_test_env("SPACE_BIN_DIR"), args);
}

static void assert_released(const char *how)
{
    if (table_exists())
        fail_msg("after down --purge (%s): nft table inet space_%s is still there", how, tag);
    int n = held_dirs();
    if (n)
        fail_msg("after down --purge (%s): %d cgroup or netns entries of tag %s left", how, n, tag);
    if (access(home, F_OK) == 0)
        fail_msg("after down --purge (%s): %s is still there", how, home);
}

static void test_purge_whatever_the_caller_id(void **state)
{
    (void)state;
    if (geteuid() != 0)
        skip();
    sp_test_stack_load();
    if (!realpath(sp_test_env("SPACE_HOME"), home))
        fail_msg("no stack at %s", sp_test_env("SPACE_HOME"));
    tag_of(sp_test_env("SPACE_ID"), tag);
    print_message("worker %s, tag %s\n", sp_test_env("SPACE_ID"), tag);

    /* What up made, and a sandbox: its cgroups (runsc's, under space-<tag>) and its netns. */
    char sbx[64];
    sp_test_create_sandbox(sp_test_api_port(), sp_test_env("SPACE_API_KEY"), "tiny", sbx);
    assert_true(table_exists());
    int held = held_dirs();
    print_message("with sandbox %s: %d cgroup and netns entries of the tag\n", sbx, held);
    assert_true(held >= 2);

    /* Round 1: down --purge from a shell that has no SPACE_ID (the worker's default is
     * worker-1, another tag). */
    assert_int_equal(space("-u SPACE_ID", "down --purge"), 0);
    assert_released("SPACE_ID unset");

    /* Round 2: up as before, down --purge with another SPACE_ID. */
    assert_int_equal(space("", "up >/dev/null"), 0);
    assert_true(table_exists());
    assert_int_equal(space("SPACE_ID=someone-else", "down --purge"), 0);
    assert_released("SPACE_ID=someone-else");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_purge_whatever_the_caller_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
