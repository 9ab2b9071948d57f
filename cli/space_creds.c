/* `space creds add|ls|rm|rotate`: credentials through the API (docs/credentials.md). A value
 * is read from stdin (first line), never from the command line: argv is visible to every local
 * user (/proc/<pid>/cmdline) and kept in shell history. `space creds rotate-master`: a new
 * master key for this home's credstore, which re-wraps every credential under it while it
 * serves (no API: the key never leaves the host's files). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cred.h"

#include "buf.h"
#include "error.h"
#include "httpc.h"
#include "json.h"
#include "space_stack.h"
#include "xmalloc.h"

static int read_value(char *out, size_t cap)
{
    if (!fgets(out, (int)cap, stdin))
        return -1;
    out[strcspn(out, "\r\n")] = '\0';
    return out[0] ? 0 : -1;
}

static int usage(void)
{
    sp_client_usage("creds", stderr);
    return SP_STACK_EXIT_USAGE;
}

int sp__client_creds(const sp_api_t *api, int argc, char **argv)
{
    if (argc < 1)
        return usage();
    const char *sub = argv[0];
    char value[4200];
    sp_buf_t b;
    sp_buf_init(&b);
    const char *method = "GET";
    char *path = NULL;
    int want = 200;
    /* ls prints the API's JSON as it is, so --json changes nothing. */
    if (strcmp(sub, "ls") == 0 && (argc == 1 || (argc == 2 && strcmp(argv[1], "--json") == 0))) {
        path = sp_xstrdup("/v1/credentials");
    } else if (strcmp(sub, "rm") == 0 && argc == 2) {
        path = sp_xasprintf("/v1/credentials/%s", argv[1]);
        method = "DELETE";
        want = 204;
    } else if (strcmp(sub, "rotate") == 0 && argc == 2) {
        if (read_value(value, sizeof(value)) < 0)
            return usage();
        path = sp_xasprintf("/v1/credentials/%s", argv[1]);
        method = "PUT";
        sp_buf_puts(&b, "{\"value\":");
        sp_buf_json_str(&b, value);
        sp_buf_putc(&b, '}');
    } else if (strcmp(sub, "add") == 0 && argc >= 4) {
        if (read_value(value, sizeof(value)) < 0)
            return usage();
        path = sp_xstrdup("/v1/credentials");
        method = "POST";
        want = 201;
        sp_buf_puts(&b, "{\"name\":");
        sp_buf_json_str(&b, argv[1]);
        sp_buf_puts(&b, ",\"hosts\":[");
        char *hosts = sp_xstrdup(argv[2]), *save = NULL;
        int n = 0;
        for (char *h = strtok_r(hosts, ",", &save); h; h = strtok_r(NULL, ",", &save)) {
            if (n++)
                sp_buf_putc(&b, ',');
            sp_buf_json_str(&b, h);
        }
        free(hosts);
        char type[80];
        snprintf(type, sizeof(type), "%s", argv[3]);
        char *colon = strchr(type, ':');
        if (colon)
            *colon++ = '\0';
        sp_buf_puts(&b, "],\"inject\":{\"type\":");
        sp_buf_json_str(&b, type);
        if (colon) {
            sp_buf_puts(&b, strcmp(type, "basic") == 0 ? ",\"user\":" : ",\"name\":");
            sp_buf_json_str(&b, colon);
        }
        sp_buf_puts(&b, ",\"value\":");
        sp_buf_json_str(&b, value);
        sp_buf_putc(&b, '}');
        for (int i = 4; i < argc; i++) {
            const char *eq = strchr(argv[i], '=');
            if (!eq)
                return usage();
            size_t kl = (size_t)(eq - argv[i]);
            if (kl == 7 &&
                (strncmp(argv[i], "project", 7) == 0 || strncmp(argv[i], "sandbox", 7) == 0)) {
                sp_buf_printf(&b, ",\"scope\":{\"%.7s\":", argv[i]);
                sp_buf_json_str(&b, eq + 1);
                sp_buf_putc(&b, '}');
            } else if (kl == 4 && strncmp(argv[i], "rate", 4) == 0) {
                sp_buf_printf(&b, ",\"rate_per_minute\":%ld", strtol(eq + 1, NULL, 10));
            } else if (kl == 7 && strncmp(argv[i], "expires", 7) == 0) {
                sp_buf_puts(&b, ",\"expires_at\":");
                sp_buf_json_str(&b, eq + 1);
            } else {
                return usage();
            }
        }
        sp_buf_putc(&b, '}');
    } else {
        return usage();
    }
    explicit_bzero(value, sizeof(value));
    sp_httpc_resp_t r;
    int rc = sp__api_call(api, method, path, NULL, b.len ? b.data : NULL, b.len, 30000, &r);
    if (b.data)
        explicit_bzero(b.data, b.len);
    sp_buf_dispose(&b);
    free(path);
    if (rc < 0)
        return SP_STACK_EXIT_FAIL;
    int code = SP_STACK_EXIT_OK;
    if (r.status != want) {
        code = sp__api_error("space creds", &r);
    } else if (r.body_len) {
        printf("%.*s\n", (int)r.body_len, r.body);
    }
    sp_httpc_resp_free(&r);
    return code;
}

/* The new key goes to <key>.next (written as .next.tmp, then renamed: credstore never reads a
 * part of it); credstore, polling every 500 ms, re-wraps every row under it and renames it over
 * the key file. Done when the key file holds the new key. */
int sp__creds_rotate_master(const char *home)
{
    char *path = sp_xasprintf("%s/credstore/master.key", home);
    char *next = sp_xasprintf("%s.next", path), *tmp = sp_xasprintf("%s.next.tmp", path);
    sp_cred_key_t cur, nk;
    int r = SP_STACK_EXIT_FAIL, rc;
    memset(&nk, 0, sizeof(nk));
    if ((rc = sp_cred_key_load(path, &cur)) < 0) {
        fprintf(stderr, "space creds rotate-master: %s: %s\n", path, sp_strerror(rc));
        goto out;
    }
    if (access(next, F_OK) == 0) {
        fprintf(stderr,
                "space creds rotate-master: a rotation is not finished (%s exists): credstore "
                "completes it while running or at its next start\n",
                next);
        goto out;
    }
    (void)unlink(tmp);
    if ((rc = sp_cred_key_create(tmp)) < 0 || (rc = sp_cred_key_load(tmp, &nk)) < 0 ||
        (rename(tmp, next) < 0 && (rc = -errno) < 0)) {
        fprintf(stderr, "space creds rotate-master: %s: %s\n", next, sp_strerror(rc));
        (void)unlink(tmp);
        goto out;
    }
    char *dir = sp_xasprintf("%s/credstore", home);
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd); /* the rename survives a crash */
        close(dfd);
    }
    free(dir);
    printf("master key %s -> %s: credstore re-wraps the credentials while serving\n", cur.id,
           nk.id);
    fflush(stdout);
    for (int i = 0; i < 300; i++) {
        sp_cred_key_t now;
        if (access(next, F_OK) < 0 && sp_cred_key_load(path, &now) == 0) {
            bool done = strcmp(now.id, nk.id) == 0;
            sp_cred_key_wipe(&now);
            if (done) {
                printf("master key rotated: %s (the previous key is gone)\n", nk.id);
                r = SP_STACK_EXIT_OK;
                goto out;
            }
        }
        usleep(100 * 1000);
    }
    fprintf(stderr,
            "space creds rotate-master: credstore has not taken the new key within 30 s (is it "
            "running? `space up` starts it, and its start completes the rotation; the log says "
            "why): %s stays\n",
            next);
out:
    sp_cred_key_wipe(&cur);
    sp_cred_key_wipe(&nk);
    free(path);
    free(next);
    free(tmp);
    return r;
}
