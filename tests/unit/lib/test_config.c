/* Config: precedence flag > env > file > default, strict values, errors that name the option and
 * the source, argv handling. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"

typedef struct {
    char *nats_url;
    int64_t max_conns;
    bool verbose;
    char *name;
    int64_t offset;
} test_cfg_t;

static const sp_cfg_opt_t table[] = {
    SP_CFG_STR_OPT("nats-url", test_cfg_t, nats_url, "nats://127.0.0.1:4222", "NATS server URL"),
    SP_CFG_INT_OPT("max-conns", test_cfg_t, max_conns, 1, 65535, "100", "connection limit"),
    SP_CFG_BOOL_OPT("verbose", test_cfg_t, verbose, NULL, "log more"),
    SP_CFG_STR_OPT("name", test_cfg_t, name, NULL, "instance name"),
    SP_CFG_INT_OPT("offset", test_cfg_t, offset, INT64_MIN, INT64_MAX, "-5", "any integer"),
};
#define NOPT (sizeof(table) / sizeof(table[0]))

static char cfg_path[64];

static int setup(void **state)
{
    unsetenv("SPACE_NATS_URL");
    unsetenv("SPACE_MAX_CONNS");
    unsetenv("SPACE_VERBOSE");
    unsetenv("SPACE_NAME");
    unsetenv("SPACE_OFFSET");
    unsetenv("SPACE_CONFIG");
    snprintf(cfg_path, sizeof(cfg_path), "/tmp/space-test-config-XXXXXX");
    int fd = mkstemp(cfg_path);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

static int teardown(void **state)
{
    unlink(cfg_path);
    return 0;
}

static void write_file(const char *text)
{
    FILE *f = fopen(cfg_path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* Runs sp_config_load over a NULL-terminated argument list (argv[0] is added). */
static int load(test_cfg_t *cfg, int *argi, char **err, const char *const *args)
{
    char *argv[32] = {"prog"};
    int argc = 1;

    while (args && args[argc - 1]) {
        argv[argc] = (char *)args[argc - 1];
        argc++;
    }
    memset(cfg, 0, sizeof(*cfg));
    return sp_config_load(table, NOPT, cfg, argc, argv, argi, err);
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* Loads args that must fail; checks the message mentions every needle. */
static void expect_error(const char *const *args, const char *n1, const char *n2)
{
    test_cfg_t cfg;
    char *err = NULL;
    int argi = 12345;

    assert_int_equal(load(&cfg, &argi, &err, args), -EINVAL);
    assert_non_null(err);
    if (n1 && !strstr(err, n1))
        fail_msg("error '%s' does not mention '%s'", err, n1);
    if (n2 && !strstr(err, n2))
        fail_msg("error '%s' does not mention '%s'", err, n2);
    assert_int_equal(argi, 12345); /* ret_argi is written only on success */
    free(err);
    sp_config_dispose(table, NOPT, &cfg);
}

static void test_defaults(void **state)
{
    test_cfg_t cfg;
    int argi = -7;
    char *err = NULL;

    assert_int_equal(load(&cfg, &argi, &err, NULL), 0);
    assert_null(err);
    assert_int_equal(argi, 1);
    assert_string_equal(cfg.nats_url, "nats://127.0.0.1:4222");
    assert_int_equal(cfg.max_conns, 100);
    assert_false(cfg.verbose);
    assert_non_null(cfg.name); /* a NULL default is an empty string, never NULL */
    assert_string_equal(cfg.name, "");
    assert_int_equal(cfg.offset, -5);
    sp_config_dispose(table, NOPT, &cfg);
    assert_null(cfg.nats_url);
    assert_null(cfg.name);
}

/* Each option set at a different depth shows which source wins. */
static void test_precedence(void **state)
{
    test_cfg_t cfg;
    int argi;

    write_file("nats-url = nats://file:1\n"
               "max-conns = 10\n"
               "name = from-file\n"
               "verbose = true\n");
    setenv("SPACE_CONFIG", cfg_path, 1);
    setenv("SPACE_NATS_URL", "nats://env:2", 1);
    setenv("SPACE_MAX_CONNS", "20", 1);
    setenv("SPACE_VERBOSE", "false", 1);

    assert_int_equal(load(&cfg, &argi, NULL, ARGS("--max-conns=30")), 0);
    assert_int_equal(cfg.max_conns, 30);               /* flag > env > file */
    assert_string_equal(cfg.nats_url, "nats://env:2"); /* env > file */
    assert_false(cfg.verbose);                         /* env "false" > file "true" */
    assert_string_equal(cfg.name, "from-file");        /* file > default */
    assert_int_equal(cfg.offset, -5);                  /* default */
    sp_config_dispose(table, NOPT, &cfg);

    /* Without the flag, env wins; without env, the file. */
    assert_int_equal(load(&cfg, &argi, NULL, NULL), 0);
    assert_int_equal(cfg.max_conns, 20);
    sp_config_dispose(table, NOPT, &cfg);
    unsetenv("SPACE_MAX_CONNS");
    unsetenv("SPACE_VERBOSE");
    assert_int_equal(load(&cfg, &argi, NULL, NULL), 0);
    assert_int_equal(cfg.max_conns, 10);
    assert_true(cfg.verbose);
    sp_config_dispose(table, NOPT, &cfg);

    /* An empty environment value is a value. */
    setenv("SPACE_NAME", "", 1);
    assert_int_equal(load(&cfg, &argi, NULL, NULL), 0);
    assert_string_equal(cfg.name, "");
    sp_config_dispose(table, NOPT, &cfg);
}

/* --config beats SPACE_CONFIG; both forms of the flag work. */
static void test_config_flag(void **state)
{
    test_cfg_t cfg;
    int argi;

    write_file("max-conns = 77\n");
    setenv("SPACE_CONFIG", "/nonexistent/space.conf", 1);
    assert_int_equal(load(&cfg, &argi, NULL, ARGS("--config", cfg_path)), 0);
    assert_int_equal(cfg.max_conns, 77);
    assert_int_equal(argi, 3);
    sp_config_dispose(table, NOPT, &cfg);

    char flag[128];
    snprintf(flag, sizeof(flag), "--config=%s", cfg_path);
    assert_int_equal(load(&cfg, &argi, NULL, ARGS(flag)), 0);
    assert_int_equal(cfg.max_conns, 77);
    sp_config_dispose(table, NOPT, &cfg);

    /* The env path is used when there is no flag, and a missing file is an error. */
    expect_error(NULL, "/nonexistent/space.conf", "No such file");
    expect_error(ARGS("--config="), "--config", NULL);
    expect_error(ARGS("--config"), "--config", "needs a value");
}

static void test_flag_forms(void **state)
{
    test_cfg_t cfg;
    int argi;

    assert_int_equal(load(&cfg, &argi, NULL,
                          ARGS("--max-conns", "7", "--nats-url=nats://x:1", "--name", "a=b c",
                               "--offset=-9223372036854775808", "--verbose")),
                     0);
    assert_int_equal(cfg.max_conns, 7);
    assert_string_equal(cfg.nats_url, "nats://x:1");
    assert_string_equal(cfg.name, "a=b c");
    assert_int_equal(cfg.offset, INT64_MIN);
    assert_true(cfg.verbose);
    assert_int_equal(argi, 8);
    sp_config_dispose(table, NOPT, &cfg);

    /* The last occurrence wins; a value may start with '-' in the two-argument form. */
    assert_int_equal(load(&cfg, &argi, NULL, ARGS("--offset", "-3", "--offset", "4")), 0);
    assert_int_equal(cfg.offset, 4);
    sp_config_dispose(table, NOPT, &cfg);

    static const char *const yes[] = {"true", "1", "yes", "on", "TRUE", "On"};
    static const char *const no[] = {"false", "0", "no", "off", "False", "OFF"};
    for (size_t i = 0; i < 6; i++) {
        char f[32];
        snprintf(f, sizeof(f), "--verbose=%s", yes[i]);
        assert_int_equal(load(&cfg, &argi, NULL, ARGS(f)), 0);
        assert_true(cfg.verbose);
        sp_config_dispose(table, NOPT, &cfg);
        snprintf(f, sizeof(f), "--verbose=%s", no[i]);
        setenv("SPACE_VERBOSE", "1", 1);
        assert_int_equal(load(&cfg, &argi, NULL, ARGS(f)), 0);
        assert_false(cfg.verbose);
        sp_config_dispose(table, NOPT, &cfg);
        unsetenv("SPACE_VERBOSE");
    }
}

static void test_stops_at_positional(void **state)
{
    test_cfg_t cfg;
    int argi;

    /* A bare BOOL flag never takes the next argument. */
    assert_int_equal(load(&cfg, &argi, NULL, ARGS("--verbose", "run", "--max-conns=5")), 0);
    assert_true(cfg.verbose);
    assert_int_equal(argi, 2);
    assert_int_equal(cfg.max_conns, 100); /* after the subcommand: not parsed */
    sp_config_dispose(table, NOPT, &cfg);

    assert_int_equal(load(&cfg, &argi, NULL, ARGS("--max-conns=5", "--", "--verbose")), 0);
    assert_int_equal(cfg.max_conns, 5);
    assert_false(cfg.verbose);
    assert_int_equal(argi, 3);
    sp_config_dispose(table, NOPT, &cfg);

    assert_int_equal(load(&cfg, &argi, NULL, ARGS("-", "--verbose")), 0);
    assert_int_equal(argi, 1);
    assert_false(cfg.verbose);
    sp_config_dispose(table, NOPT, &cfg);

    assert_int_equal(load(&cfg, &argi, NULL, ARGS("--")), 0);
    assert_int_equal(argi, 2);
    sp_config_dispose(table, NOPT, &cfg);
}

static void test_unknown_and_missing(void **state)
{
    expect_error(ARGS("--bogus"), "--bogus", NULL);
    expect_error(ARGS("--bogus=1"), "--bogus", NULL);
    expect_error(ARGS("--max-conn=1"), "--max-conn", NULL);
    expect_error(ARGS("-v"), "-v", NULL);
    expect_error(ARGS("--max-conns"), "--max-conns", "needs a value");
    expect_error(ARGS("--help=yes"), "--help", NULL);
    expect_error(ARGS("--verbose", "--bogus"), "--bogus", NULL);

    /* ret_err is optional. */
    test_cfg_t cfg;
    assert_int_equal(load(&cfg, NULL, NULL, ARGS("--bogus")), -EINVAL);
    sp_config_dispose(table, NOPT, &cfg);
}

static void test_range_errors_name_option_and_source(void **state)
{
    expect_error(ARGS("--max-conns=0"), "--max-conns", "out of range [1, 65535]");
    expect_error(ARGS("--max-conns=65536"), "--max-conns", "out of range");
    expect_error(ARGS("--max-conns", "-1"), "--max-conns", "out of range");

    setenv("SPACE_MAX_CONNS", "70000", 1);
    expect_error(NULL, "SPACE_MAX_CONNS", "out of range");
    expect_error(NULL, "max-conns", "70000");
    unsetenv("SPACE_MAX_CONNS");

    write_file("# limits\n\nmax-conns = 99999\n");
    setenv("SPACE_CONFIG", cfg_path, 1);
    char where[128];
    snprintf(where, sizeof(where), "%s:3", cfg_path);
    expect_error(NULL, where, "out of range");
    expect_error(NULL, "max-conns", NULL);
    /* The bad file value is fine when a flag overrides it. */
    test_cfg_t cfg;
    assert_int_equal(load(&cfg, NULL, NULL, ARGS("--max-conns=3")), 0);
    assert_int_equal(cfg.max_conns, 3);
    sp_config_dispose(table, NOPT, &cfg);

    /* A bad default in the table is reported too. */
    unsetenv("SPACE_CONFIG");
    static const sp_cfg_opt_t bad_table[] = {
        SP_CFG_INT_OPT("port", test_cfg_t, max_conns, 1, 10, "11", "bad default"),
    };
    char *argv[] = {"prog", NULL};
    char *err = NULL;
    memset(&cfg, 0, sizeof(cfg));
    assert_int_equal(sp_config_load(bad_table, 1, &cfg, 1, argv, NULL, &err), -EINVAL);
    assert_non_null(strstr(err, "default"));
    assert_non_null(strstr(err, "port"));
    free(err);
}

static void test_strict_integers(void **state)
{
    static const char *const bad[] = {"12abc", " 12", "12 ", "+12", "",  "0x10",
                                      "1.5",   "1e3", "--1", "- 1", "١٢"};
    char flag[64];

    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(flag, sizeof(flag), "--offset=%s", bad[i]);
        expect_error(ARGS(flag), "--offset", "integer");
    }
    expect_error(ARGS("--offset=9223372036854775808"), "--offset", "64 bits");
    expect_error(ARGS("--offset=-9223372036854775809"), "--offset", "64 bits");
    expect_error(ARGS("--offset=99999999999999999999999"), "--offset", "64 bits");

    test_cfg_t cfg;
    assert_int_equal(load(&cfg, NULL, NULL, ARGS("--offset=9223372036854775807")), 0);
    assert_int_equal(cfg.offset, INT64_MAX);
    sp_config_dispose(table, NOPT, &cfg);
    assert_int_equal(load(&cfg, NULL, NULL, ARGS("--offset=007")), 0);
    assert_int_equal(cfg.offset, 7);
    sp_config_dispose(table, NOPT, &cfg);

    expect_error(ARGS("--verbose=maybe"), "--verbose", "boolean");
    setenv("SPACE_VERBOSE", "", 1);
    expect_error(NULL, "SPACE_VERBOSE", "boolean");
}

static void test_file_syntax(void **state)
{
    test_cfg_t cfg;

    write_file("# a comment\n"
               "   \t\n"
               "  # indented comment\n"
               "nats-url=nats://a:1/#frag\r\n"
               "  name   =   two words = and # more   \n"
               "max-conns\t=\t8\n"
               "verbose = \n"
               "offset = -1"); /* no final newline */
    setenv("SPACE_CONFIG", cfg_path, 1);
    /* "verbose = " is an empty value, not a boolean. */
    expect_error(NULL, ":7", "boolean");
    write_file("# a comment\n"
               "   \t\n"
               "  # indented comment\n"
               "nats-url=nats://a:1/#frag\r\n"
               "  name   =   two words = and # more   \n"
               "max-conns\t=\t8\n"
               "offset = -1");
    assert_int_equal(load(&cfg, NULL, NULL, NULL), 0);
    assert_string_equal(cfg.nats_url, "nats://a:1/#frag");
    assert_string_equal(cfg.name, "two words = and # more");
    assert_int_equal(cfg.max_conns, 8);
    assert_int_equal(cfg.offset, -1);
    sp_config_dispose(table, NOPT, &cfg);
}

static void test_file_errors_name_the_line(void **state)
{
    char where[128];

    setenv("SPACE_CONFIG", cfg_path, 1);

    write_file("max-conns = 5\n# ok\nbogus = 1\n");
    snprintf(where, sizeof(where), "%s:3", cfg_path);
    expect_error(NULL, where, "unknown option 'bogus'");

    write_file("max-conns = 5\njust some words\n");
    snprintf(where, sizeof(where), "%s:2", cfg_path);
    expect_error(NULL, where, "name = value");

    write_file("= 5\n");
    snprintf(where, sizeof(where), "%s:1", cfg_path);
    expect_error(NULL, where, "unknown option");

    write_file("max-conns = 5\n\nmax-conns = 6\n");
    snprintf(where, sizeof(where), "%s:3", cfg_path);
    expect_error(NULL, where, "line 1");

    write_file("config = /etc/other\n");
    expect_error(NULL, "unknown option 'config'", NULL);

    write_file("max-conns = abc\n");
    snprintf(where, sizeof(where), "%s:1", cfg_path);
    expect_error(NULL, where, "max-conns");

    /* A NUL byte inside a line. */
    FILE *f = fopen(cfg_path, "w");
    assert_non_null(f);
    fwrite("name = a\0b\n", 1, 11, f);
    fclose(f);
    expect_error(NULL, "NUL", NULL);

    /* An over-long line. */
    char *longline = malloc(10000);
    assert_non_null(longline);
    memset(longline, 'x', 9998);
    memcpy(longline, "name = ", 7);
    longline[9998] = '\n';
    longline[9999] = '\0';
    write_file(longline);
    free(longline);
    expect_error(NULL, "longer than", NULL);
}

/* --help: usage on stdout, *ret_argi = -1, success. */
static void test_help(void **state)
{
    test_cfg_t cfg;
    int argi = 0;
    char out[8192];
    int fds[2], saved;
    ssize_t n;

    fflush(stdout);
    saved = dup(STDOUT_FILENO);
    assert_int_equal(pipe(fds), 0);
    dup2(fds[1], STDOUT_FILENO);
    close(fds[1]);
    int r = load(&cfg, &argi, NULL, ARGS("--verbose", "--help", "--bogus"));
    fflush(stdout);
    dup2(saved, STDOUT_FILENO);
    close(saved);
    n = read(fds[0], out, sizeof(out) - 1);
    close(fds[0]);
    assert_true(n > 0);
    out[n] = '\0';

    assert_int_equal(r, 0);
    assert_int_equal(argi, -1);
    assert_non_null(strstr(out, "Usage: prog"));
    assert_non_null(strstr(out, "--nats-url=STR"));
    assert_non_null(strstr(out, "SPACE_NATS_URL"));
    assert_non_null(strstr(out, "--max-conns=INT"));
    assert_non_null(strstr(out, "[1..65535]"));
    assert_non_null(strstr(out, "--verbose[=BOOL]"));
    assert_non_null(strstr(out, "--config=FILE"));
    assert_non_null(strstr(out, "nats://127.0.0.1:4222"));
    sp_config_dispose(table, NOPT, &cfg);
}

static void test_usage_to_stream(void **state)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);

    assert_non_null(f);
    sp_config_usage(f, "/usr/bin/space-eventlog", table, NOPT);
    fclose(f);
    assert_non_null(strstr(buf, "Usage: space-eventlog [OPTIONS]"));
    assert_non_null(strstr(buf, "instance name"));
    assert_non_null(strstr(buf, "SPACE_MAX_CONNS"));
    free(buf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_precedence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_flag, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flag_forms, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stops_at_positional, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_and_missing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_range_errors_name_option_and_source, setup, teardown),
        cmocka_unit_test_setup_teardown(test_strict_integers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_syntax, setup, teardown),
        cmocka_unit_test_setup_teardown(test_file_errors_name_the_line, setup, teardown),
        cmocka_unit_test_setup_teardown(test_help, setup, teardown),
        cmocka_unit_test_setup_teardown(test_usage_to_stream, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
