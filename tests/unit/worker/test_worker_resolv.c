/* The resolver the worker writes into a sandbox's rootfs (worker/worker_resolv.c): written when
 * the template names no nameserver (missing, empty, comments only, a link), the template's other
 * lines kept; a template's own nameserver left as it is; nothing written through a link, out of
 * the rootfs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../../worker/worker_resolv.c" /* NOLINT(bugprone-suspicious-include) */

#include <ftw.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "wk_fail_stub.h"

#define GW_TEXT "nameserver 10.200.0.1\n"

static uint32_t gw(void)
{
    return htonl(0x0ac80001u); /* 10.200.0.1 */
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return NULL;
    static char buf[8192];
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    return buf;
}

static int rm_one(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb;
    (void)type;
    (void)ftw;
    return remove(path);
}

/* A rootfs with /etc (unless no_etc) in a fresh temporary directory. */
static void rootfs_new(char dir[64], bool no_etc)
{
    snprintf(dir, 64, "/tmp/test-resolv-XXXXXX");
    assert_non_null(mkdtemp(dir));
    char p[128];
    snprintf(p, sizeof(p), "%s/etc", dir);
    if (!no_etc)
        assert_int_equal(mkdir(p, 0755), 0);
}

static void rootfs_free(const char *dir)
{
    assert_int_equal(nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
}

static void test_has_nameserver(void **state)
{
    (void)state;
    const char *yes[] = {"nameserver 192.0.2.53", "search x\nnameserver\t1.2.3.4\n",
                         "# c\nnameserver 10.0.0.1\r\n"};
    const char *no[] = {"",
                        "\n\n",
                        "# nameserver 192.0.2.53\n",
                        "; nameserver 192.0.2.53\n",
                        " nameserver 192.0.2.53\n",
                        "nameserver\n",
                        "nameserver   \n",
                        "nameservers 1.2.3.4\n",
                        "search example.test\noptions ndots:2\n"};
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++)
        assert_true(wk__resolv_has_nameserver(yes[i], strlen(yes[i])));
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        assert_false(wk__resolv_has_nameserver(no[i], strlen(no[i])));
}

/* No file (tiny), an empty one (base), comments only: the gateway, mode 0644. */
static void test_written_when_none(void **state)
{
    (void)state;
    const char *before[] = {NULL, "", "# nameserver 192.0.2.53\n"};
    for (size_t i = 0; i < 3; i++) {
        char dir[64], path[128], err[WK_ERR_MAX] = "";
        rootfs_new(dir, false);
        snprintf(path, sizeof(path), "%s/etc/resolv.conf", dir);
        if (before[i])
            write_text(path, before[i]);
        assert_int_equal(wk__resolv_install(dir, gw(), err), 1);
        const char *text = read_text(path);
        assert_non_null(text);
        assert_non_null(strstr(text, "\n" GW_TEXT));
        assert_true(wk__resolv_has_nameserver(text, strlen(text)));
        struct stat st;
        assert_int_equal(lstat(path, &st), 0);
        assert_true(S_ISREG(st.st_mode));
        assert_int_equal(st.st_mode & 07777, 0644);
        /* A second create of the same rootfs finds its own line and leaves it. */
        assert_int_equal(wk__resolv_install(dir, htonl(0x0ac80005u), err), 0);
        assert_non_null(strstr(read_text(path), GW_TEXT));
        rootfs_free(dir);
    }
}

/* A template's own nameserver stays exactly as it is (the firewall redirects it). */
static void test_template_nameserver_kept(void **state)
{
    (void)state;
    char dir[64], path[128], err[WK_ERR_MAX] = "";
    rootfs_new(dir, false);
    snprintf(path, sizeof(path), "%s/etc/resolv.conf", dir);
    const char *own = "search corp.example.test\nnameserver 192.0.2.53\noptions ndots:1\n";
    write_text(path, own);
    assert_int_equal(wk__resolv_install(dir, gw(), err), 0);
    assert_string_equal(read_text(path), own);
    rootfs_free(dir);
}

/* search and options without a nameserver: ours first, theirs after it. */
static void test_other_lines_kept(void **state)
{
    (void)state;
    char dir[64], path[128], err[WK_ERR_MAX] = "";
    rootfs_new(dir, false);
    snprintf(path, sizeof(path), "%s/etc/resolv.conf", dir);
    write_text(path, "search corp.example.test\noptions ndots:1\n");
    assert_int_equal(wk__resolv_install(dir, gw(), err), 1);
    const char *text = read_text(path);
    const char *ns = strstr(text, GW_TEXT), *search = strstr(text, "search corp.example.test\n");
    assert_non_null(ns);
    assert_non_null(search);
    assert_true(ns < search);
    assert_non_null(strstr(text, "options ndots:1\n"));
    rootfs_free(dir);
}

/* resolv.conf a link (absolute, out of the rootfs; or dangling into /run): the link is replaced
 * by a file, its target never written. */
static void test_link_replaced_not_followed(void **state)
{
    (void)state;
    char dir[64], path[128], outside[128], err[WK_ERR_MAX] = "";
    rootfs_new(dir, false);
    snprintf(path, sizeof(path), "%s/etc/resolv.conf", dir);
    snprintf(outside, sizeof(outside), "%s.outside", dir);
    write_text(outside, "host file\n");
    assert_int_equal(symlink(outside, path), 0);
    assert_int_equal(wk__resolv_install(dir, gw(), err), 1);
    assert_string_equal(read_text(outside), "host file\n");
    struct stat st;
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_non_null(strstr(read_text(path), GW_TEXT));
    unlink(path);
    assert_int_equal(symlink("../run/systemd/resolve/stub-resolv.conf", path), 0);
    assert_int_equal(wk__resolv_install(dir, gw(), err), 1);
    assert_int_equal(lstat(path, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    unlink(outside);
    rootfs_free(dir);
}

/* /etc itself a link out of the rootfs: nothing is written there. /etc missing: made. A
 * directory in resolv.conf's place: left. */
static void test_etc_link_and_odd_files(void **state)
{
    (void)state;
    char dir[64], p[160], outside[128], err[WK_ERR_MAX] = "";
    rootfs_new(dir, true);
    snprintf(outside, sizeof(outside), "%s.etc", dir);
    assert_int_equal(mkdir(outside, 0755), 0);
    snprintf(p, sizeof(p), "%s/etc", dir);
    assert_int_equal(symlink(outside, p), 0);
    assert_int_equal(wk__resolv_install(dir, gw(), err), 0);
    snprintf(p, sizeof(p), "%s/resolv.conf", outside);
    assert_int_equal(access(p, F_OK), -1);
    rootfs_free(outside);
    rootfs_free(dir);

    rootfs_new(dir, true);
    assert_int_equal(wk__resolv_install(dir, gw(), err), 1);
    snprintf(p, sizeof(p), "%s/etc/resolv.conf", dir);
    assert_non_null(strstr(read_text(p), GW_TEXT));
    rootfs_free(dir);

    rootfs_new(dir, false);
    snprintf(p, sizeof(p), "%s/etc/resolv.conf", dir);
    assert_int_equal(mkdir(p, 0755), 0);
    assert_int_equal(wk__resolv_install(dir, gw(), err), 0);
    struct stat st;
    assert_int_equal(lstat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    rootfs_free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_has_nameserver),
        cmocka_unit_test(test_written_when_none),
        cmocka_unit_test(test_template_nameserver_kept),
        cmocka_unit_test(test_other_lines_kept),
        cmocka_unit_test(test_link_replaced_not_followed),
        cmocka_unit_test(test_etc_link_and_odd_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
