/* `space up` and templates (issue 17): up returns only when GET /v1/templates lists every
 * template SPACE_TEMPLATES names, a template that cannot be made makes it fail naming it, and a
 * second fresh SPACE_HOME on this host gets its templates from the host's template cache
 * instead of building them.
 *
 * The fixture's stack (eventlog, scheduler, worker, gateway; tiny) is the first home: its
 * worker made tiny or received it, and the cache holds it either way. The test makes two more
 * homes beside it with `space up` and purges them with `space down --purge`:
 * - a second one: its worker receives tiny from the cache (its log and up's report say so),
 *   and up's answer is what /v1/templates then lists; the time is printed, not asserted;
 * - a broken one, with its own template definitions and cache: SPACE_TEMPLATES=tiny,broken
 *   where broken.sh fails; up exits non-zero naming broken and its error; once broken.sh is
 *   mended, up again restarts the worker, which makes it, and succeeds. */
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

#include "buf.h"
#include "harness.h"
#include "ids.h"
#include "xmalloc.h"

static char stacks[PATH_MAX]; /* the directory the fixture's home is in */

static char *slurp(const char *path)
{
    sp_buf_t b;
    char chunk[4096];
    size_t n;
    FILE *f = fopen(path, "re");
    sp_buf_init(&b);
    while (f && (n = fread(chunk, 1, sizeof(chunk), f)) > 0)
        sp_buf_append(&b, chunk, n);
    if (f)
        fclose(f);
    sp_buf_putc(&b, '\0');
    return sp_buf_take(&b);
}

/* `space <args>` for the home <stacks>/<name> (SPACE_ID it-<name>), with extra env(1)
 * assignments; stdout and stderr into <stacks>/<name>.out. The exit status. */
static int space(const char *name, const char *env, const char *args)
{
    return sp_test_sh("env -u SPACE_API_URL -u SPACE_API_KEY -u SPACE_NATS_URL -u SPACE_PG_URL "
                      "SPACE_HOME='%s/%s' SPACE_ID='it-%s' %s '%s/space' %s >'%s/%s.out' 2>&1",
                      stacks, name, name, env, sp_test_env("SPACE_BIN_DIR"), args, stacks, name);
}

static char *output(const char *name)
{
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s.out", stacks, name);
    char *s = slurp(path);
    unlink(path);
    return s;
}

static int setup(void **state)
{
    (void)state;
    char home[PATH_MAX];
    if (!realpath(sp_test_env("SPACE_HOME"), home))
        fail_msg("no stack at %s", sp_test_env("SPACE_HOME"));
    snprintf(stacks, sizeof(stacks), "%s", home);
    *strrchr(stacks, '/') = '\0';
    return 0;
}

static void test_second_home_uses_the_cache(void **state)
{
    (void)state;
    const char *name = "templates-second";
    (void)space(name, "", "down --purge");
    int64_t t0 = sp_mono_ns();
    int rc = space(name, "SPACE_TEMPLATES=tiny", "up");
    double s = (double)(sp_mono_ns() - t0) / 1e9;
    char *out = output(name);
    if (rc != 0)
        fail_msg("space up of a second home: exit %d:\n%s", rc, out);
    print_message("space up of a second fresh home: %.2f s\n", s);
    const char *line = strstr(out, "templates       ready");
    assert_non_null(line);
    print_message("%.*s\n", (int)strcspn(line, "\n"), line);
    assert_non_null(strstr(line, "tiny (cache,"));
    free(out);

    /* The worker says where tiny came from; the API lists it (up waited for that). */
    char path[PATH_MAX + 64];
    snprintf(path, sizeof(path), "%s/%s/log/space-worker.log", stacks, name);
    char *log = slurp(path);
    assert_non_null(strstr(log, "msg=\"template ready\" template=tiny source=cache"));
    free(log);
    snprintf(path, sizeof(path), "%s/%s/space.env", stacks, name);
    assert_int_equal(
        sp_test_sh("set -a; . '%s'; curl -sf -H \"Authorization: Bearer $SPACE_API_KEY\" "
                   "\"$SPACE_API_URL/v1/templates\" | grep -q '\"name\":\"tiny\"'",
                   path),
        0);
    assert_int_equal(space(name, "", "down --purge"), 0);
}

static void test_broken_template_fails_up(void **state)
{
    (void)state;
    const char *name = "templates-broken";
    char defs[PATH_MAX + 64], cache[PATH_MAX + 64], env[3 * PATH_MAX];
    snprintf(defs, sizeof(defs), "%s/%s-defs", stacks, name);
    snprintf(cache, sizeof(cache), "%s/%s-cache", stacks, name);
    (void)space(name, "", "down --purge");
    assert_int_equal(sp_test_sh("rm -rf '%s' '%s' && mkdir -p '%s'", defs, cache, defs), 0);
    assert_int_equal(
        sp_test_sh("printf '#!/bin/sh\\necho \"broken.sh: starting\"\\n"
                   "echo \"broken.sh: no such mirror\" >&2\\nexit 3\\n' >'%s/broken.sh'",
                   defs),
        0);
    /* Its own definitions and cache: the host's cache is not given a test's template. */
    snprintf(env, sizeof(env),
             "SPACE_TEMPLATES=tiny,broken SPACE_TEMPLATE_DEFS='%s' "
             "SPACE_TEMPLATE_CACHE='%s'",
             defs, cache);
    int rc = space(name, env, "up");
    char *out = output(name);
    print_message("space up with a broken template: exit %d\n", rc);
    if (rc == 0)
        fail_msg("space up succeeded with a broken template:\n%s", out);
    const char *why = strstr(out, "space up: template broken failed:");
    const char *error = why ? strstr(why, "no such mirror") : NULL;
    if (!error)
        fail_msg("space up did not name the template and its error:\n%s", out);
    const char *line = error ? why : out; /* why (fail_msg does not return) */
    print_message("%.*s\n", (int)strcspn(line, "\n"), line);
    free(out);

    /* Mended: up restarts the worker, which makes it. */
    assert_int_equal(
        sp_test_sh("printf '#!/bin/sh\\nmkdir -p \"$1/etc\" && echo mended >\"$1/etc/broken\"\\n' "
                   ">'%s/broken.sh'",
                   defs),
        0);
    rc = space(name, env, "up");
    out = output(name);
    if (rc != 0)
        fail_msg("space up after the template was mended: exit %d:\n%s", rc, out);
    assert_non_null(strstr(out, "restart  (template broken failed"));
    assert_non_null(strstr(out, "broken (built,"));
    free(out);
    assert_int_equal(space(name, env, "down --purge"), 0);
    assert_int_equal(sp_test_sh("rm -rf '%s' '%s'", defs, cache), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_second_home_uses_the_cache),
        cmocka_unit_test(test_broken_template_fails_up),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
