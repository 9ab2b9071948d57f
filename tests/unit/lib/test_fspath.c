/* Sandbox paths of the files API: lexical resolution and the canonical form events carry. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "fspath.h"

static const char *res(const char *path, const char *home)
{
    static char out[SP_FSPATH_MAX + 1];
    int rc = sp_fspath_resolve(path, home, out);
    return rc < 0 ? (rc == -ENAMETOOLONG ? "E2LONG" : "EINVAL") : out;
}

static void test_resolve(void **state)
{
    (void)state;
    assert_string_equal(res("/etc/hosts", "/root"), "/etc/hosts");
    assert_string_equal(res("a.txt", "/home/user"), "/home/user/a.txt");
    assert_string_equal(res("./a//b/", "/root"), "/root/a/b");
    /* ".." stops at the root: the path stays inside the sandbox's own tree. */
    assert_string_equal(res("../../etc/x", "/home/user"), "/etc/x");
    assert_string_equal(res("../../../../../x", "/home/user"), "/x");
    assert_string_equal(res("/..", "/root"), "/");
    assert_string_equal(res("/", "/root"), "/");
    assert_string_equal(res("..", "/root"), "/");
    assert_string_equal(res("", "/root"), "EINVAL");
    assert_string_equal(res("a\nb", "/root"), "EINVAL");
    assert_string_equal(res("\xff", "/root"), "EINVAL");
    char big[SP_FSPATH_MAX + 2];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    assert_string_equal(res(big, "/root"), "E2LONG");
    big[SP_FSPATH_MAX - 3] = '\0'; /* fits alone, not under /root */
    assert_string_equal(res(big, "/root"), "E2LONG");
    assert_string_equal(sp_fspath_home("user"), "/home/user");
    assert_string_equal(sp_fspath_home(""), "/root");
    assert_null(sp_fspath_home("nobody"));
}

static void test_canonical(void **state)
{
    (void)state;
    assert_true(sp_fspath_canonical("/"));
    assert_true(sp_fspath_canonical("/a/b.c/..d"));
    assert_false(sp_fspath_canonical(""));
    assert_false(sp_fspath_canonical("a"));
    assert_false(sp_fspath_canonical("/a/"));
    assert_false(sp_fspath_canonical("//a"));
    assert_false(sp_fspath_canonical("/a/./b"));
    assert_false(sp_fspath_canonical("/a/../b"));
    assert_false(sp_fspath_canonical("/a\x01"));
}

/* A watch's events must stay in its directory: a sibling that shares a prefix is not in it. */
static void test_within(void **state)
{
    (void)state;
    assert_true(sp_fspath_within("/root/w", "/root/w"));
    assert_true(sp_fspath_within("/root/w/x/y", "/root/w"));
    assert_true(sp_fspath_within("/etc", "/"));
    assert_false(sp_fspath_within("/root/wx", "/root/w"));
    assert_false(sp_fspath_within("/root", "/root/w"));
    assert_false(sp_fspath_within("/etc/w", "/root/w"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resolve),
        cmocka_unit_test(test_canonical),
        cmocka_unit_test(test_within),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
