/* `space creds add|ls|rm|rotate`: credentials through the API (docs/credentials.md). A value
 * is read from stdin (first line), never from the command line: argv is visible to every local
 * user (/proc/<pid>/cmdline) and kept in shell history. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    fprintf(stderr,
            "usage: space creds add NAME HOST[,HOST...] TYPE [project=P|sandbox=ID] [rate=N] "
            "[expires=YYYY-MM-DDTHH:MM:SSZ]   (the value on stdin)\n"
            "         TYPE: header:NAME | bearer | basic:USER | query:PARAM\n"
            "       space creds ls | rm ID... | rotate ID   (rotate: the new value on stdin)\n");
    return SP_STACK_EXIT_USAGE;
}

int sp__client_creds(const char *host, int port, const char *key, int argc, char **argv)
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
    if (strcmp(sub, "ls") == 0) {
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
    sp_httpc_req_t req = {.host = host,
                          .port = port,
                          .method = method,
                          .path = path,
                          .key = key,
                          .body = b.len ? b.data : NULL,
                          .body_len = b.len,
                          .timeout_ms = 30000};
    sp_httpc_resp_t r;
    int rc = sp_httpc_do(&req, &r);
    if (b.data)
        explicit_bzero(b.data, b.len);
    sp_buf_dispose(&b);
    free(path);
    if (rc < 0) {
        fprintf(stderr, "space creds: %s\n", sp_strerror(rc));
        return SP_STACK_EXIT_FAIL;
    }
    int code = SP_STACK_EXIT_OK;
    if (r.status != want) {
        fprintf(stderr, "space: HTTP %d: %s\n", r.status, r.body);
        code = SP_STACK_EXIT_FAIL;
    } else if (r.body_len) {
        printf("%.*s\n", (int)r.body_len, r.body);
    }
    sp_httpc_resp_free(&r);
    return code;
}
